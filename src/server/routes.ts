/**
 * Which path of `kvroute serve` goes where: the routed APIs (inference.ts) and the engine paths passed through
 * (passthrough.ts), both behind the API keys and the rate limit; /v1/models; /health; /debug/state and /admin (admin.ts);
 * /metrics and /dashboard, here or on their own listener with --metrics-port.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import { sendJson } from '../http/body.ts';
import { HttpError, sendError } from '../http/errors.ts';
import { dashboardHandler } from '../metrics/dashboard.ts';
import { anthropicPath, ROUTED_PATHS } from '../apis/index.ts';
import { sendAnthropicError } from '../apis/messages-request.ts';
import type { RouterCore } from '../runtime/compose.ts';
import { hostBlocksOf } from '../runtime/mrc-feed.ts';
import type { Security } from '../runtime/security/index.ts';
import { toHttpError } from '../runtime/security/index.ts';
import type { RequestTrace } from '../runtime/tracing.ts';
import { authorizeDebug, handleAdmin } from './admin.ts';
import { handleInference, type InferenceContext, type RecentDecision } from './inference.ts';
import { handlePassthrough, passthroughPath } from './passthrough.ts';

export interface RouteDeps {
  readonly core: RouterCore;
  readonly guard: Security;
  readonly inference: InferenceContext;
  /** The recent decisions /debug/state lists. */
  readonly recent: readonly RecentDecision[];
  /** False while the router is not ready to route (a NATS replica loading its snapshot): /health answers 503. */
  readonly readiness?: () => boolean;
  readonly closing: () => boolean;
  readonly inFlight: () => number;
}

export interface ServeRoutes {
  handle(req: IncomingMessage, res: ServerResponse, trace: RequestTrace): Promise<void>;
  /** The separate --metrics-port listener: /metrics and /dashboard only. */
  observabilityOnly(req: IncomingMessage, res: ServerResponse): void;
}

export function serveRoutes(deps: RouteDeps): ServeRoutes {
  const { core, guard, inference } = deps;
  const { config, log, workers, metrics } = core;
  const admin = { config, log, guard, workers };
  const passthrough = { config, dispatcher: core.dispatcher, workers, metrics, log };
  const separateMetrics = config.metricsPort !== undefined;

  /** The engine-facing paths: routed APIs and pass-throughs, behind the API keys and the rate limit. */
  async function handleApi(req: IncomingMessage, res: ServerResponse, url: string, path: string, t0: number, trace: RequestTrace) {
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
    if (deps.closing()) {
      throw new HttpError(503, 'the router is shutting down', 'service_unavailable', 'shutting_down', null, { 'retry-after': '1' });
    }
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
        case '/health':
          return health(res);
        case '/debug/state':
          authorizeDebug(req, admin);
          return sendJson(res, 200, await debugState(deps));
        case '/debug/mrc':
          authorizeDebug(req, admin);
          return sendJson(res, 200, mrcReport(core, url.slice(path.length)));
      }
    }
    if (path.startsWith('/admin/')) return handleAdmin(admin, req, res, path);
    if (!separateMetrics && (await observability(req, res, path))) return;
    if (ROUTED_PATHS.has(path) || path === '/tokenize' || path === '/detokenize') {
      throw new HttpError(405, `method ${req.method} not allowed on ${path}`, 'invalid_request_error', 'method_not_allowed');
    }
    throw new HttpError(404, `no route ${req.method} ${path}`, 'not_found_error', 'not_found');
  }

  function health(res: ServerResponse): void {
    if (deps.readiness && !deps.readiness()) {
      sendJson(res, 503, { status: 'starting', healthyWorkers: 0, workers: workers.list().length });
      return;
    }
    const healthy = workers.healthyCount();
    const up = healthy > 0 && !deps.closing();
    sendJson(res, up ? 200 : 503, { status: up ? 'ok' : 'unavailable', healthyWorkers: healthy, workers: workers.list().length });
  }

  /** /metrics and /dashboard: on the main listener, or on their own when --metrics-port is set. */
  async function observability(req: IncomingMessage, res: ServerResponse, path: string): Promise<boolean> {
    if (req.method === 'GET' && path === '/metrics') {
      const text = await metrics.render();
      res.writeHead(200, { 'content-type': metrics.contentType });
      res.end(text);
      return true;
    }
    return dashboardHandler(req, res, () => metrics.dashboardState());
  }

  function observabilityOnly(req: IncomingMessage, res: ServerResponse): void {
    const path = (req.url ?? '/').split('?')[0];
    observability(req, res, path)
      .then((served) => {
        if (!served) {
          throw new HttpError(
            404,
            `no route ${req.method} ${path} (this listener serves /metrics and /dashboard)`,
            'not_found_error',
            'not_found',
          );
        }
      })
      .catch((err: unknown) => answerError(req, res, err, log));
  }

  return { handle, observabilityOnly };
}

/**
 * /debug/mrc[?host_blocks=N]: the miss-ratio curves' what-if answers (docs/cache-sizing.md); N adds the answer for a
 * host tier of N blocks per engine. Aggregates only: no prompt, no hash.
 */
function mrcReport(core: RouterCore, query: string): unknown {
  if (!core.mrc) throw new HttpError(404, 'the miss-ratio curves are off (--mrc-sample-rate 0)', 'not_found_error', 'not_found');
  return core.mrc.report(hostBlocksOf(query));
}

/** /debug/state: settings (secrets left out), the core's state, workers, events, queue, tokenizer, recent decisions. */
async function debugState(deps: RouteDeps): Promise<unknown> {
  const { config, router, dispatcher, workers, events, flowMetrics, tokenizer, remote } = deps.core;
  const { adminToken: _secret, apiKeys: _keys, workers: _w, ...settings } = config;
  const now = Date.now();
  const state = dispatcher.state(now);
  return {
    config: { ...settings, adminApi: Boolean(config.adminToken), security: deps.guard.enabled },
    router: router.state(),
    dispatcher: state,
    ledger: { total: router.ledger.total, bySource: Object.fromEntries(router.ledger.bySource) },
    workers: workers.list().map((w) => w.toJSON()),
    events: events.health(),
    queue: state.queue,
    flow: { outcomes: Object.fromEntries(flowMetrics.totals.byOutcome), sessions: flowMetrics.totals.sessions },
    inFlight: deps.inFlight(),
    tokenizer: tokenizer
      ? { local: true, mode: tokenizer.kind, ...(await tokenizer.info().catch(() => ({}))) }
      : { local: false, mode: remote?.mode ?? null, calls: remote?.calls, failures: remote?.failures, cache: remote?.cacheInfo },
    pins: { size: dispatcher.pins.size, evicted: dispatcher.pins.evicted, expired: dispatcher.pins.expired },
    recentDecisions: deps.recent,
  };
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
