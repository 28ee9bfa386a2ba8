/**
 * `kvroute epp`: the routing composition `kvroute serve` uses (compose.ts: the same Dispatcher, KvRouter, workers, KV
 * events, tokenizer and metrics from the same settings) behind a gRPC server that speaks Envoy's external processing
 * protocol as the Gateway API Inference Extension's Endpoint Picker (exchange.ts), over TLS unless told otherwise
 * (tls.ts). Its listeners are the reference picker's: ext_proc (with gRPC health) on --port, gRPC health alone in
 * plaintext on --grpc-health-port for kubelet probes, /metrics + /health + /debug/mrc on --metrics-port (HTTP, or HTTPS with
 * --metrics-cert-dir; /metrics behind Kubernetes token review with --metrics-auth kubernetes: metrics-auth.ts).
 */
import { randomBytes } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import * as grpc from '@grpc/grpc-js';
import type { Logger } from 'pino';
import { createServer as createHttpsServer } from 'node:https';
import type { EppConfig } from '../config/serve.ts';
import { sendJson } from '../http/body.ts';
import { EppMetrics } from '../metrics/epp.ts';
import { composeRouter, type RouterCore } from '../runtime/compose.ts';
import { sessionHeaderNames } from '../runtime/identity.ts';
import { hostBlocksOf } from '../runtime/mrc-feed.ts';
import { createSecurity } from '../runtime/security/index.ts';
import type { LocalTokenizer } from '../tokenizer/local.ts';
import { type EppContext, Exchange, ProtocolError } from './exchange.ts';
import { type MetricsGuard, metricsGuard } from './metrics-auth.ts';
import { EXT_PROC_SERVICE, type ProcessingRequest, type ProcessingResponse, protocols } from './protocol.ts';
import { extProcCredentials, watchedPair } from './tls.ts';

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
  /** How the ext_proc port is served: "plaintext", "TLS, self-signed certificate", ... */
  readonly tls: string;
  /** host:port of the plaintext gRPC health server. */
  readonly healthAddress: string;
  readonly metricsUrl: string;
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

function bind(server: grpc.Server, address: string, credentials: grpc.ServerCredentials): Promise<number> {
  return new Promise((resolve, reject) => {
    server.bindAsync(address, credentials, (err, port) => (err ? reject(err) : resolve(port)));
  });
}

function listenHttp(server: HttpServer, port: number, host: string, scheme: 'http' | 'https'): Promise<string> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen({ port, host }, () => {
      server.off('error', reject);
      const p = (server.address() as AddressInfo).port;
      const h = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host;
      resolve(`${scheme}://${h.includes(':') ? `[${h}]` : h}:${p}`);
    });
  });
}

const hostPort = (host: string, port: number) => `${host.includes(':') ? `[${host}]` : host}:${port}`;

export async function startEpp(config: EppConfig, options: EppOptions = {}): Promise<RunningEpp> {
  const core = await composeRouter(config, { ...options, frontEnd: 'epp' });
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
    decisionTimeoutMs: config.decisionTimeoutMs,
  };
  const open = new Set<Exchange>();

  const ready = () => !closing && (options.readiness?.() ?? true) && workers.healthyCount() > 0;
  // The reference picker's names: liveness, readiness, the ext_proc service, and its Helm chart's single-replica probe
  // name inference-extension (llm-d/llm-d-router cmd/epp/runner/health.go, config/charts/routerlib/templates/
  // _deployment.yaml @ebab6879).
  const statusOf = (service: string): number | null => {
    if (service === '' || service === 'liveness') return closing ? NOT_SERVING : SERVING;
    if (service === 'readiness' || service === EXT_PROC_SERVICE || service === 'inference-extension') {
      return ready() ? SERVING : NOT_SERVING;
    }
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
  const healthService = {
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
  };
  const server = new grpc.Server({ 'grpc.max_receive_message_length': Math.max(4 * 1024 * 1024, config.bodyLimitBytes + 65536) });
  server.addService(ExternalProcessor.service, { Process: processStream });
  server.addService(Health.service, healthService);
  // Kubelet's gRPC probes speak plaintext: health has a listener of its own, as the reference picker's port 9003.
  const healthServer = new grpc.Server();
  healthServer.addService(Health.service, healthService);

  const tlsLog = { info: (o: object, m: string) => log.info(o, m), warn: (o: object, m: string) => log.warn(o, m) };
  const closers: (() => void)[] = [];
  let metricsServer: HttpServer | null = null;
  let metricsUrl = '';
  let port: number;
  let healthPort: number;
  let tls: string;
  try {
    const guard: MetricsGuard = await metricsGuard(config, { kubeconfig: config.kubeconfig, log: tlsLog });
    const handler = (req: IncomingMessage, res: ServerResponse) => {
      const path = (req.url ?? '/').split('?')[0];
      if (req.method === 'GET' && path === '/metrics') {
        guard
          .check(req)
          .then(async (verdict) => {
            if (verdict !== null) {
              sendJson(res, verdict.status, { error: { message: verdict.message } });
              return;
            }
            const text = await metrics.render();
            res.writeHead(200, { 'content-type': metrics.contentType });
            res.end(text);
          })
          .catch((err: unknown) => {
            log.error({ err }, 'metrics render failed');
            if (!res.headersSent) res.writeHead(500).end();
          });
        return;
      }
      if (req.method === 'GET' && path === '/debug/mrc') {
        // The miss-ratio curves' what-if answers (docs/cache-sizing.md), as serve's GET /debug/mrc; aggregates only (no
        // prompt, no hash), behind the same access check as /metrics.
        guard
          .check(req)
          .then((verdict) => {
            if (verdict !== null) return sendJson(res, verdict.status, { error: { message: verdict.message } });
            if (!core.mrc) return sendJson(res, 404, { error: { message: 'the miss-ratio curves are off (--mrc-sample-rate 0)' } });
            const query = (req.url ?? '').slice(path.length + 1);
            let host: number | undefined;
            try {
              host = hostBlocksOf(query);
            } catch (err) {
              return sendJson(res, 400, { error: { message: (err as Error).message } });
            }
            sendJson(res, 200, core.mrc.report(host));
          })
          .catch((err: unknown) => {
            log.error({ err }, '/debug/mrc failed');
            if (!res.headersSent) res.writeHead(500).end();
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
      sendJson(res, 404, { error: { message: `no route ${req.method} ${path} (this listener serves /metrics, /health and /debug/mrc)` } });
    };
    const metricsHost = config.metricsHost ?? config.host;
    if (config.metricsCertDir !== undefined) {
      const clientCa = config.metricsClientCaFile === undefined ? undefined : await readFile(config.metricsClientCaFile);
      let https: ReturnType<typeof createHttpsServer> | undefined;
      const watched = await watchedPair(config.metricsCertDir, tlsLog, 'metrics TLS', (pair) =>
        https?.setSecureContext({ cert: pair.cert, key: pair.key, ...(clientCa ? { ca: clientCa } : {}) }),
      );
      closers.push(watched.close);
      https = createHttpsServer(
        {
          cert: watched.pair.cert,
          key: watched.pair.key,
          minVersion: 'TLSv1.2',
          ...(clientCa ? { ca: clientCa, requestCert: true, rejectUnauthorized: true } : {}),
        },
        handler,
      );
      metricsServer = https as unknown as HttpServer;
      metricsUrl = await listenHttp(metricsServer, config.metricsPort, metricsHost, 'https');
    } else {
      metricsServer = createServer(handler);
      metricsUrl = await listenHttp(metricsServer, config.metricsPort, metricsHost, 'http');
    }
    const served = await extProcCredentials({ secure: config.secureServing, certPath: config.certPath }, tlsLog);
    closers.push(served.close);
    tls = served.describe;
    const host = config.host.includes(':') ? `[${config.host}]` : config.host;
    port = await bind(server, `${host}:${config.port}`, served.credentials);
    healthPort = await bind(healthServer, `${host}:${config.grpcHealthPort}`, grpc.ServerCredentials.createInsecure());
  } catch (err) {
    for (const c of closers) c();
    metricsServer?.close();
    server.forceShutdown();
    healthServer.forceShutdown();
    await core.close();
    throw err;
  }
  const shown = config.host === '0.0.0.0' || config.host === '::' ? '127.0.0.1' : config.host;
  const address = hostPort(shown, port);

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
      healthServer.forceShutdown();
      for (const c of closers) c();
      for (const ex of [...open]) ex.close();
      metricsServer?.closeAllConnections();
      metricsServer?.close();
      await core.close();
    })();
    return closed;
  };

  return { address, port, tls, healthAddress: hostPort(shown, healthPort), metricsUrl, core, streams: () => open.size, close };
}
