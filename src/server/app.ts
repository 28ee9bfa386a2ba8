/**
 * `kvroute serve`: the HTTP front end. It takes the routing composition (src/runtime/compose.ts: the core, workers,
 * events, tokenizer, metrics), adds the security layer and tracing, and puts its listeners in front; each part lives
 * in its own module:
 *
 *   routes.ts      which path goes where                         listener.ts   the HTTP listener (timeouts, drain)
 *   inference.ts   every routed API, through the request flow    proxy.ts      one attempt on one worker (SSE relay)
 *   disagg-attempt.ts  a prefill leg, then the decode leg        passthrough.ts /tokenize, /detokenize, other /v1/*
 *   admin.ts       /admin/workers, /debug/state authorization    cluster/      --processes: HTTP shells, one core
 *
 * The shell owns sockets, timers and configuration; every routing choice is the core's.
 */
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from 'pino';
import type { Dispatcher } from '../core/dispatch/dispatcher.ts';
import type { KvRouter } from '../core/router.ts';
import type { ServeConfig } from '../config/serve.ts';
import { DisaggRequestIds, disaggMachineIdOf } from '../engines/trtllm/ids.ts';
import type { RouterMetrics } from '../metrics/registry.ts';
import type { LocalTokenizer } from '../tokenizer/local.ts';
import type { TokenizerService } from '../tokenizer/service.ts';
import { ROUTED_PATHS } from '../apis/index.ts';
import { composeRouter, type RouterCore } from '../runtime/compose.ts';
import { sessionHeaderNames } from '../runtime/identity.ts';
import type { Lifecycle } from '../runtime/lifecycle.ts';
import { createSecurity, loadApiKeys, parseAllowList, parseRateLimit, type Security } from '../runtime/security/index.ts';
import { NO_TRACE, type RequestTrace, type RequestTracer, tracingConfig } from '../runtime/tracing.ts';
import { startTracing } from '../runtime/tracing-start.ts';
import type { WorkerSet } from '../runtime/workers.ts';
import { type InferenceContext, RECENT_MAX, type RecentDecision } from './inference.ts';
import { createListener, listen } from './listener.ts';
import { passthroughPath } from './passthrough.ts';
import { answerError, serveRoutes } from './routes.ts';

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
  /** Other processes' tokenizer caches, added to router_tokenizer_cache_* (the HTTP shells of --processes). */
  readonly tokenizerCaches: RouterCore['tokenizerCaches'];
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

export async function startServer(config: ServeConfig, options: StartOptions = {}): Promise<RunningServer> {
  const core = await composeRouter(config, options);
  const { log, router, dispatcher, lifecycle, workers, metrics } = core;
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
  const inference = inferenceContext(core, guard, recent);
  let closing = false;
  const routes = serveRoutes({
    core,
    guard,
    inference,
    recent,
    readiness: options.readiness,
    closing: () => closing,
    inFlight: () => listener.inFlight(),
  });
  const listener = createListener(config, (req, res) => {
    const trace = traceOf(tracer, req);
    if (trace.enabled) res.on('close', () => trace.end(res.statusCode));
    routes.handle(req, res, trace).catch((err: unknown) => {
      const status = answerError(req, res, err, log);
      trace.end(status, (err as Error)?.message);
    });
  });

  const metricsServer = config.metricsPort !== undefined ? createServer((req, res) => routes.observabilityOnly(req, res)) : null;
  let metricsUrl: string | null = null;
  let url: string;
  try {
    if (metricsServer) metricsUrl = await listen(metricsServer, config.metricsPort ?? 0, config.metricsHost ?? config.host);
    url = await listener.listen(config.port, config.host);
  } catch (err) {
    metricsServer?.close();
    await Promise.all([core.close(), tracer?.close()]);
    throw err;
  }
  const { server } = listener;
  const port = (server.address() as AddressInfo).port;

  let closed: Promise<void> | null = null;
  const close = (graceMs = config.shutdownGraceMs): Promise<void> => {
    closed ??= (async () => {
      closing = true;
      // Queued requests are refused at once; those in flight get the grace period.
      lifecycle.close();
      await listener.drain(graceMs);
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
    tokenizer: core.tokenizer,
    tokenizerCaches: core.tokenizerCaches,
    inference,
    inFlight: listener.inFlight,
    close,
  };
}

/** The routed path's context: the composition, the security layer, request ids and the recent decisions. */
function inferenceContext(core: RouterCore, guard: Security, recent: RecentDecision[]): InferenceContext {
  const { config, dispatcher, events } = core;
  let seq = 0;
  const idPrefix = randomBytes(4).toString('hex');
  return {
    config,
    log: core.log,
    precheck: (model) => dispatcher.precheck(model, Date.now()),
    tokenizingWorker: core.tokenizingWorker,
    lifecycle: core.lifecycle,
    workers: core.workers,
    metrics: core.metrics,
    tokenizer: core.tokenizer,
    remote: core.remote,
    noteRouted: (d) => {
      events.routed(d.worker);
      recent.push(d);
      if (recent.length > RECENT_MAX) recent.shift();
    },
    nextRequestId: () => `kvr-${idPrefix}-${++seq}`,
    guard,
    sessionHeaders: sessionHeaderNames(config),
    pd: core.pd,
    disaggIds: new DisaggRequestIds(config.disaggMachineId ?? disaggMachineIdOf(config.replicaId)),
  };
}

/** A span per engine-facing request (routed or passed through); the router's own pages are not traced. */
function traceOf(tracer: RequestTracer | null, req: IncomingMessage): RequestTrace {
  const path = (req.url ?? '/').split('?')[0];
  const traced =
    tracer && ((req.method === 'POST' && ROUTED_PATHS.has(path)) || (path !== '/v1/models' && passthroughPath(req.method, path)));
  return traced
    ? tracer.request(`${req.method} ${ROUTED_PATHS.has(path) ? path : 'passthrough'}`, req.headers, {
        'http.request.method': req.method ?? 'GET',
        'url.path': path,
        'kvroute.api': ROUTED_PATHS.get(path)?.name ?? 'passthrough',
      })
    : NO_TRACE;
}
