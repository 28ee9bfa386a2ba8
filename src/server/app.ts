/**
 * `kvroute serve`: the composition root. It builds the core (KvRouter + Dispatcher), the shells around it (workers and
 * their probes, KV event ingestion, tokenizer, metrics) and the HTTP listeners, and wires them; each part lives in its
 * own module:
 *
 *   inference.ts  every routed API (apis/: one adapter each)      proxy.ts     one attempt on one worker (SSE relay)
 *   passthrough.ts /tokenize, /detokenize, other /v1/* paths     tracing.ts   OpenTelemetry spans (off by default)
 *   lifecycle.ts  the dispatcher's effects -> HTTP handlers      workers.ts   pools, health probes, model discovery
 *   admin.ts      /admin/workers, /debug/state authorization     events.ts    KV events -> index, stream health -> metrics
 *   refusals.ts   a refusal -> status, error, Retry-After
 *
 * The shell owns sockets, timers and configuration; every routing choice is the core's.
 */
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from 'pino';
import type { Dispatcher } from '../core/dispatch/dispatcher.ts';
import type { KvRouter } from '../core/router.ts';
import { sendJson } from '../http/body.ts';
import type { RouterMetrics } from '../metrics/registry.ts';
import type { LocalTokenizer } from '../tokenizer/local.ts';
import type { TokenizerService } from '../tokenizer/service.ts';
import { composeRouter } from '../runtime/compose.ts';
import type { Lifecycle } from '../runtime/lifecycle.ts';
import type { WorkerSet } from '../runtime/workers.ts';
import { HttpError, sendError } from '../http/errors.ts';
import { dashboardHandler } from '../metrics/dashboard.ts';
import { DisaggRequestIds, disaggMachineIdOf } from '../engines/trtllm/ids.ts';
import { sendAnthropicError } from '../apis/messages-request.ts';
import { authorizeDebug, handleAdmin } from './admin.ts';
import { anthropicPath, ROUTED_PATHS } from '../apis/index.ts';
import { handlePassthrough, passthroughPath } from './passthrough.ts';
import { NO_TRACE, type RequestTrace, type RequestTracer, startTracing, tracingConfig } from '../runtime/tracing.ts';
import type { ServeConfig } from '../config/serve.ts';
import { handleInference, type InferenceContext, RECENT_MAX, type RecentDecision } from './inference.ts';
import { sessionHeaderNames } from '../runtime/identity.ts';
import {
  createSecurity,
  httpServerTimeouts,
  loadApiKeys,
  parseAllowList,
  parseRateLimit,
  type Security,
  toHttpError,
} from '../runtime/security/index.ts';

export interface RunningServer {
  readonly url: string;
  readonly port: number;
  readonly server: Server;
  /** The separate /metrics + /dashboard listener, when --metrics-port is set. */
  readonly metricsUrl: string | null;
  readonly router: KvRouter;
  readonly dispatcher: Dispatcher;
  readonly lifecycle: Lifecycle;
  readonly workers: WorkerSet;
  readonly metrics: RouterMetrics;
  readonly tokenizer: TokenizerService | null;
  /** The routed path's context (HTTP shells of --processes report through its ports). */
  readonly inference: InferenceContext;
  /** Requests accepted and not yet answered in full. */
  inFlight(): number;
  /** Stop accepting, let in-flight requests finish within the grace period, then close everything. */
  close(graceMs?: number): Promise<void>;
}

export interface StartOptions {
  readonly logger?: Logger;
  /** Pre-loaded tokenizer (tests share one instead of loading per server). */
  readonly tokenizer?: LocalTokenizer | null;
  /** Security layer; built from the config's apiKeys/apiKeyFile/rateLimit/allowWorkerHosts when absent. */
  readonly security?: Security;
  /** False while the router is not ready to route (a NATS replica loading its snapshot): /health answers 503. */
  readonly readiness?: () => boolean;
  /** Where OTEL_* variables are read (default: process.env). */
  readonly env?: Readonly<Record<string, string | undefined>>;
}

export async function buildSecurity(config: ServeConfig, log: Logger): Promise<Security> {
  const hasKeys = (config.apiKeys?.length ?? 0) > 0 || Boolean(config.apiKeyFile);
  const loaded = hasKeys ? await loadApiKeys({ flags: config.apiKeys, file: config.apiKeyFile }) : null;
  for (const w of loaded?.warnings ?? []) log.warn(w);
  return createSecurity({
    apiKeys: loaded?.keys ?? null,
    rateLimit: config.rateLimit ? parseRateLimit(config.rateLimit) : null,
    allowWorkerHosts: config.allowWorkerHosts?.length ? parseAllowList(config.allowWorkerHosts) : null,
  });
}

export function listen(server: Server, port: number, host: string): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    server.once('error', reject);
    // A deeper accept backlog than node's 511, so a connection storm queues in the kernel instead of being dropped.
    server.listen({ port, host, backlog: 4096 }, () => {
      server.off('error', reject);
      const p = (server.address() as AddressInfo).port;
      const h = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host;
      resolve(`http://${h.includes(':') ? `[${h}]` : h}:${p}`);
    });
  });
}

/**
 * Answers a handler's failure in the path's error shape (OpenAI's, or Anthropic's on /v1/messages); anything that is
 * not an HttpError is our bug. Returns the status answered.
 */
export function answerError(req: IncomingMessage, res: ServerResponse, err: unknown, log: Logger): number {
  const path = (req.url ?? '/').split('?')[0];
  const send = anthropicPath(path) ? sendAnthropicError : sendError;
  if (err instanceof HttpError) {
    if (err.status >= 500) log.warn({ status: err.status, code: err.code }, err.message);
    if (!req.complete && err.status !== 413) req.resume(); // an unread body must not stall the connection
    send(res, err);
    if (err.status === 413) req.destroy();
    return err.status;
  }
  log.error({ err }, 'unhandled error in request');
  send(res, new HttpError(500, 'internal router error', 'server_error', 'internal_error'));
  return 500;
}

export async function startServer(config: ServeConfig, options: StartOptions = {}): Promise<RunningServer> {
  const core = await composeRouter(config, options);
  const { log, router, dispatcher, lifecycle, workers, metrics, flowMetrics, pd, events, tokenizer, remote } = core;
  const shells = await (async () => {
    const guard = options.security ?? (await buildSecurity(config, log));
    const traceConfig = tracingConfig(config, options.env ?? process.env);
    const tracer: RequestTracer | null = traceConfig ? await startTracing(traceConfig) : null;
    if (traceConfig) log.info({ url: traceConfig.url, protocol: traceConfig.protocol, sampler: traceConfig.sampler }, 'tracing to OTLP');
    return { guard, tracer };
  })().catch(async (err: unknown) => {
    await core.close();
    throw err;
  });
  const { guard, tracer } = shells;

  const recent: RecentDecision[] = [];
  let inFlight = 0;
  let closing = false;
  let seq = 0;
  const idPrefix = randomBytes(4).toString('hex');
  const inference: InferenceContext = {
    config,
    log,
    precheck: (model) => dispatcher.precheck(model, Date.now()),
    tokenizingWorker: core.tokenizingWorker,
    lifecycle,
    workers,
    metrics,
    tokenizer,
    remote,
    noteRouted: (d) => {
      events.routed(d.worker);
      recent.push(d);
      if (recent.length > RECENT_MAX) recent.shift();
    },
    nextRequestId: () => `kvr-${idPrefix}-${++seq}`,
    guard,
    sessionHeaders: sessionHeaderNames(config),
    pd,
    disaggIds: new DisaggRequestIds(config.disaggMachineId ?? disaggMachineIdOf(config.replicaId)),
  };
  const admin = { config, log, guard, workers };

  async function debugState(): Promise<unknown> {
    const { adminToken: _secret, apiKeys: _keys, workers: _w, ...settings } = config;
    const now = Date.now();
    return {
      config: { ...settings, adminApi: Boolean(config.adminToken), security: guard.enabled },
      router: router.state(),
      dispatcher: dispatcher.state(now),
      ledger: { total: router.ledger.total, bySource: Object.fromEntries(router.ledger.bySource) },
      workers: workers.list().map((w) => w.toJSON()),
      events: events.health(),
      queue: dispatcher.state(now).queue,
      flow: { outcomes: Object.fromEntries(flowMetrics.totals.byOutcome), sessions: flowMetrics.totals.sessions },
      inFlight,
      tokenizer: tokenizer
        ? { local: true, mode: tokenizer.kind, ...(await tokenizer.info().catch(() => ({}))) }
        : { local: false, mode: remote?.mode ?? null, calls: remote?.calls, failures: remote?.failures, cache: remote?.cacheInfo },
      pins: { size: dispatcher.pins.size, evicted: dispatcher.pins.evicted, expired: dispatcher.pins.expired },
      recentDecisions: recent,
    };
  }

  /** /metrics and /dashboard: on the main listener, or on their own when --metrics-port is set. */
  async function serveObservability(req: IncomingMessage, res: ServerResponse, path: string): Promise<boolean> {
    if (req.method === 'GET' && path === '/metrics') {
      const text = await metrics.render();
      res.writeHead(200, { 'content-type': metrics.contentType });
      res.end(text);
      return true;
    }
    return dashboardHandler(req, res, () => metrics.dashboardState());
  }

  const separateMetrics = config.metricsPort !== undefined;
  const passthrough = { config, dispatcher, workers, metrics, log };
  const shuttingDown = () =>
    new HttpError(503, 'the router is shutting down', 'service_unavailable', 'shutting_down', null, { 'retry-after': '1' });

  /** The engine-facing paths: routed APIs and pass-throughs, behind the API keys and the rate limit. */
  async function handleApi(
    req: IncomingMessage,
    res: ServerResponse,
    url: string,
    path: string,
    t0: number,
    trace: RequestTrace,
  ): Promise<boolean> {
    const api = req.method === 'POST' ? ROUTED_PATHS.get(path) : undefined;
    const isModels = req.method === 'GET' && path === '/v1/models';
    const other = !api && !isModels && !ROUTED_PATHS.has(path) && passthroughPath(req.method, path);
    // Every engine-facing path is behind the keys, whatever the method (a wrong method is nobody's business unauthenticated).
    if (api || isModels || other || ROUTED_PATHS.has(path) || path.startsWith('/v1/')) {
      const denied = guard.checkApi(req);
      if (denied) throw toHttpError(denied);
    }
    if (!api && !isModels && !other) return false;
    if (isModels) {
      sendJson(res, 200, { object: 'list', data: workers.models() });
      return true;
    }
    if (closing) throw shuttingDown();
    if (api) {
      metrics.apiRequest(api.name);
      await handleInference(inference, api, path, req, res, t0, trace);
    } else await handlePassthrough(passthrough, req, res, url, path, trace);
    return true;
  }

  async function handle(req: IncomingMessage, res: ServerResponse, trace: RequestTrace): Promise<void> {
    const t0 = performance.now();
    const url = req.url ?? '/';
    const q = url.indexOf('?');
    const path = q >= 0 ? url.slice(0, q) : url;
    if (await handleApi(req, res, url, path, t0, trace)) return;
    if (req.method === 'GET') {
      switch (path) {
        case '/health': {
          if (options.readiness && !options.readiness()) {
            return sendJson(res, 503, { status: 'starting', healthyWorkers: 0, workers: workers.list().length });
          }
          const healthy = workers.healthyCount();
          return sendJson(res, healthy > 0 && !closing ? 200 : 503, {
            status: healthy > 0 && !closing ? 'ok' : 'unavailable',
            healthyWorkers: healthy,
            workers: workers.list().length,
          });
        }
        case '/debug/state':
          authorizeDebug(req, admin);
          return sendJson(res, 200, await debugState());
      }
    }
    if (path.startsWith('/admin/')) return handleAdmin(admin, req, res, path);
    if (!separateMetrics && (await serveObservability(req, res, path))) return;
    if (ROUTED_PATHS.has(path) || path === '/tokenize' || path === '/detokenize') {
      throw new HttpError(405, `method ${req.method} not allowed on ${path}`, 'invalid_request_error', 'method_not_allowed');
    }
    throw new HttpError(404, `no route ${req.method} ${path}`, 'not_found_error', 'not_found');
  }

  const server = createServer(
    {
      keepAliveTimeout: 65_000,
      // Slow clients (slowloris) are cut while sending their request; responses may stream for as long as they take.
      ...httpServerTimeouts({ headersTimeoutMs: config.headerTimeoutMs, requestTimeoutMs: config.bodyTimeoutMs }),
    },
    (req, res) => {
      inFlight++;
      let counted = true;
      const done = () => {
        if (counted) {
          counted = false;
          inFlight--;
        }
      };
      res.on('close', done);
      res.on('finish', done);
      const path = (req.url ?? '/').split('?')[0];
      // A span per engine-facing request (routed or passed through); the router's own pages are not traced.
      const traced =
        tracer && ((req.method === 'POST' && ROUTED_PATHS.has(path)) || (path !== '/v1/models' && passthroughPath(req.method, path)));
      const trace = traced
        ? tracer.request(`${req.method} ${ROUTED_PATHS.has(path) ? path : 'passthrough'}`, req.headers, {
            'http.request.method': req.method ?? 'GET',
            'url.path': path,
            'kvroute.api': ROUTED_PATHS.get(path)?.name ?? 'passthrough',
          })
        : NO_TRACE;
      if (trace.enabled) res.on('close', () => trace.end(res.statusCode));
      handle(req, res, trace).catch((err: unknown) => {
        const status = answerError(req, res, err, log);
        trace.end(status, (err as Error)?.message);
      });
    },
  );
  server.maxRequestsPerSocket = 0;

  let metricsServer: Server | null = null;
  let metricsUrl: string | null = null;
  let url: string;
  try {
    if (separateMetrics) {
      metricsServer = createServer((req, res) => {
        const path = (req.url ?? '/').split('?')[0];
        serveObservability(req, res, path)
          .then((served) => {
            if (!served)
              throw new HttpError(
                404,
                `no route ${req.method} ${path} (this listener serves /metrics and /dashboard)`,
                'not_found_error',
                'not_found',
              );
          })
          .catch((err: unknown) => answerError(req, res, err, log));
      });
      metricsUrl = await listen(metricsServer, config.metricsPort ?? 0, config.metricsHost ?? config.host);
    }
    url = await listen(server, config.port, config.host);
  } catch (err) {
    metricsServer?.close();
    await Promise.all([core.close(), tracer?.close()]);
    throw err;
  }
  const port = (server.address() as AddressInfo).port;

  let closed: Promise<void> | null = null;
  const close = (graceMs = config.shutdownGraceMs): Promise<void> => {
    closed ??= (async () => {
      closing = true;
      server.close();
      server.closeIdleConnections();
      lifecycle.close();
      const deadline = Date.now() + graceMs;
      while (inFlight > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25));
      server.closeAllConnections();
      metricsServer?.closeAllConnections();
      metricsServer?.close();
      await core.close();
      await tracer?.close();
    })();
    return closed;
  };

  return {
    url,
    port,
    server,
    metricsUrl,
    router,
    dispatcher,
    lifecycle,
    workers,
    metrics,
    tokenizer,
    inference,
    inFlight: () => inFlight,
    close,
  };
}
