/**
 * `kvroute epp`: the routing composition `kvroute serve` uses (compose.ts: the same Dispatcher, KvRouter, workers, KV
 * events, tokenizer and metrics from the same settings) behind a gRPC server that speaks Envoy's external processing
 * protocol as the Gateway API Inference Extension's Endpoint Picker (exchange.ts), gRPC health checking for
 * `liveness`, `readiness` and the ext_proc service, and /metrics + /health over HTTP on the metrics port.
 */
import { randomBytes } from 'node:crypto';
import { createServer, type Server as HttpServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import * as grpc from '@grpc/grpc-js';
import type { Logger } from 'pino';
import type { ServeConfig } from '../config/serve.ts';
import { sendJson } from '../http/body.ts';
import { EppMetrics } from '../metrics/epp.ts';
import { composeRouter, type RouterCore } from '../server/compose.ts';
import { sessionHeaderNames } from '../server/identity.ts';
import { createSecurity } from '../server/security/index.ts';
import type { LocalTokenizer } from '../tokenizer/local.ts';
import { type EppContext, Exchange, ProtocolError } from './exchange.ts';
import { EXT_PROC_SERVICE, type ProcessingRequest, type ProcessingResponse, protocols } from './protocol.ts';

/** Fallback endpoints listed after the pick. */
export const FALLBACKS = 2;

export interface EppOptions {
  readonly logger?: Logger;
  readonly tokenizer?: LocalTokenizer | null;
  /** False while the router is not ready to route (a NATS replica loading its snapshot): readiness is NOT_SERVING. */
  readonly readiness?: () => boolean;
}

export interface RunningEpp {
  /** host:port of the gRPC server. */
  readonly address: string;
  readonly port: number;
  readonly metricsUrl: string | null;
  readonly core: RouterCore;
  /** ext_proc streams open now. */
  streams(): number;
  /** Stops taking streams, lets open ones finish within the grace period, then closes everything. */
  close(graceMs?: number): Promise<void>;
}

/** grpc.health.v1.HealthCheckResponse.ServingStatus */
const SERVING = 1;
const NOT_SERVING = 2;
const SERVICE_UNKNOWN = 3;

function bind(server: grpc.Server, address: string): Promise<number> {
  return new Promise((resolve, reject) => {
    server.bindAsync(address, grpc.ServerCredentials.createInsecure(), (err, port) => (err ? reject(err) : resolve(port)));
  });
}

function listenHttp(server: HttpServer, port: number, host: string): Promise<string> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen({ port, host }, () => {
      server.off('error', reject);
      const p = (server.address() as AddressInfo).port;
      const h = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host;
      resolve(`http://${h.includes(':') ? `[${h}]` : h}:${p}`);
    });
  });
}

export async function startEpp(config: ServeConfig, options: EppOptions = {}): Promise<RunningEpp> {
  const core = await composeRouter(config, options);
  const { log, metrics, workers } = core;
  const eppMetrics = new EppMetrics(metrics.registry, metrics.prefix);
  let closing = false;
  let seq = 0;
  const idPrefix = randomBytes(4).toString('hex');
  const ctx: EppContext = {
    core,
    metrics: eppMetrics,
    guard: createSecurity(),
    sessionHeaders: sessionHeaderNames(config),
    nextRequestId: () => `epp-${idPrefix}-${++seq}`,
    fallbacks: FALLBACKS,
  };
  const open = new Set<Exchange>();

  const ready = () => !closing && (options.readiness?.() ?? true) && workers.healthyCount() > 0;
  const statusOf = (service: string): number | null => {
    if (service === '' || service === 'liveness') return closing ? NOT_SERVING : SERVING;
    if (service === 'readiness' || service === EXT_PROC_SERVICE) return ready() ? SERVING : NOT_SERVING;
    return null;
  };

  function processStream(call: grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>): void {
    if (closing) {
      call.emit('error', { code: grpc.status.UNAVAILABLE, details: 'the endpoint picker is shutting down' });
      return;
    }
    let ended = false;
    const endCall = () => {
      if (ended) return;
      ended = true;
      call.end();
    };
    const ex = new Exchange(
      ctx,
      (msg) => {
        if (!ended && !call.destroyed) call.write(msg);
      },
      endCall,
    );
    open.add(ex);
    eppMetrics.streamOpened();
    let closed = false;
    const done = () => {
      if (closed) return;
      closed = true;
      open.delete(ex);
      eppMetrics.streamClosed();
      ex.close();
    };
    const fail = (err: unknown) => {
      if (closed) return;
      const protocol = err instanceof ProtocolError;
      if (protocol) log.warn({ error: (err as Error).message }, 'ext_proc stream broke the protocol: closed');
      else log.error({ err }, 'ext_proc stream failed');
      ex.protocolError();
      done();
      if (!ended) {
        ended = true;
        call.emit('error', {
          code: protocol ? grpc.status.INVALID_ARGUMENT : grpc.status.INTERNAL,
          details: protocol ? (err as Error).message : 'internal endpoint picker error',
        });
      }
    };
    // Messages are handled in order: routing is asynchronous (tokenizing, a queue), the protocol is a sequence.
    let chain = Promise.resolve();
    call.on('data', (msg: ProcessingRequest) => {
      chain = chain.then(() => (closed ? undefined : ex.handle(msg))).catch(fail);
    });
    call.on('end', () => {
      chain = chain.then(() => {
        done();
        endCall();
      });
    });
    call.on('cancelled', done);
    call.on('error', done);
    call.on('close', done);
  }

  const { ExternalProcessor, Health } = protocols();
  const server = new grpc.Server({ 'grpc.max_receive_message_length': Math.max(4 * 1024 * 1024, config.bodyLimitBytes + 65536) });
  server.addService(ExternalProcessor.service, { Process: processStream });
  server.addService(Health.service, {
    Check(call: grpc.ServerUnaryCall<{ service?: string }, unknown>, callback: grpc.sendUnaryData<unknown>) {
      const status = statusOf(call.request?.service ?? '');
      if (status === null) callback({ code: grpc.status.NOT_FOUND, details: `unknown service "${call.request?.service}"` });
      else callback(null, { status });
    },
    Watch(call: grpc.ServerWritableStream<{ service?: string }, unknown>) {
      const service = call.request?.service ?? '';
      let last = -1;
      const push = () => {
        const status = statusOf(service) ?? SERVICE_UNKNOWN;
        if (status !== last && !call.destroyed) {
          last = status;
          call.write({ status });
        }
      };
      push();
      const timer = setInterval(push, 500);
      const stop = () => clearInterval(timer);
      call.on('cancelled', stop);
      call.on('close', stop);
      call.on('error', stop);
    },
  });

  let metricsServer: HttpServer | null = null;
  let metricsUrl: string | null = null;
  let port: number;
  try {
    if (config.metricsPort !== undefined) {
      metricsServer = createServer((req, res) => {
        const path = (req.url ?? '/').split('?')[0];
        if (req.method === 'GET' && path === '/metrics') {
          metrics
            .render()
            .then((text) => {
              res.writeHead(200, { 'content-type': metrics.contentType });
              res.end(text);
            })
            .catch((err: unknown) => {
              log.error({ err }, 'metrics render failed');
              res.writeHead(500).end();
            });
          return;
        }
        if (req.method === 'GET' && path === '/health') {
          const healthy = workers.healthyCount();
          sendJson(res, ready() ? 200 : 503, {
            status: ready() ? 'ok' : 'unavailable',
            healthyWorkers: healthy,
            workers: workers.list().length,
          });
          return;
        }
        sendJson(res, 404, { error: { message: `no route ${req.method} ${path} (this listener serves /metrics and /health)` } });
      });
      metricsUrl = await listenHttp(metricsServer, config.metricsPort, config.metricsHost ?? config.host);
    }
    const host = config.host.includes(':') ? `[${config.host}]` : config.host;
    port = await bind(server, `${host}:${config.port}`);
  } catch (err) {
    metricsServer?.close();
    server.forceShutdown();
    await core.close();
    throw err;
  }
  const shown = config.host === '0.0.0.0' || config.host === '::' ? '127.0.0.1' : config.host;
  const address = `${shown.includes(':') ? `[${shown}]` : shown}:${port}`;

  let closed: Promise<void> | null = null;
  const close = (graceMs = config.shutdownGraceMs): Promise<void> => {
    closed ??= (async () => {
      closing = true;
      core.lifecycle.close();
      await new Promise<void>((resolve) => {
        const force = setTimeout(() => {
          server.forceShutdown();
          resolve();
        }, graceMs);
        server.tryShutdown(() => {
          clearTimeout(force);
          resolve();
        });
      });
      for (const ex of [...open]) ex.close();
      metricsServer?.closeAllConnections();
      metricsServer?.close();
      await core.close();
    })();
    return closed;
  };

  return { address, port, metricsUrl, core, streams: () => open.size, close };
}
