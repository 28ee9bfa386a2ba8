/**
 * `kvroute serve`: the OpenAI-compatible front of the router.
 *
 *   body -> validate -> token ids (as given | local tokenizer with segment cache | worker /tokenize)
 *        -> KvRouter.route (queue when all busy) -> proxy to the worker's undici Pool (retry next best before the
 *        first byte) -> stream chunks through (first chunk: firstToken) -> usage: finish with delivered cached tokens
 *
 * The shell owns sockets, timers and configuration; every routing choice is the core's.
 */
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import pino, { type Logger } from 'pino';
import type { Dispatcher } from 'undici';
import { KvRouter, TIER_CREDIT_ON } from '../core/router.ts';
import { sourceKey } from '../core/types.ts';
import { POLICY_NAMES } from '../core/scheduling/policies.ts';
import type { KvEvent, RouteDecision, RouteRequest, RouteResult } from '../core/types.ts';
import { EventIngest } from '../ingest/ingest.ts';
import { dashboardHandler } from '../metrics/dashboard.ts';
import { RouterMetrics } from '../metrics/registry.ts';
import type { EngineMirror } from '../metrics/scrape.ts';
import { LocalTokenizer } from '../tokenizer/local.ts';
import { inlineTokenizer, threadTokenizer, type TokenizerService } from '../tokenizer/service.ts';
import { RemoteTokenizer } from '../tokenizer/remote.ts';
import { workerFromUnknown, type ServeConfig, type WorkerSpec } from './config.ts';
import { readBody, sendJson } from '../http/body.ts';
import { badRequest, HttpError, sendError, sseErrorFrame } from '../http/errors.ts';
import { parseRequest, upstreamBody, type Endpoint, type ParsedRequest } from '../openai/request.ts';
import { RequestQueue } from './queue.ts';
import {
  adminAuthorized,
  checkJsonDepth,
  createSecurity,
  httpServerTimeouts,
  loadApiKeys,
  LOG_REDACT_PATHS,
  parseAllowList,
  parseRateLimit,
  toHttpError,
  type Security,
} from './security/index.ts';
import { readUsage, SseRelay } from './sse.ts';
import { type Worker, WorkerSet } from './workers.ts';

export interface RunningServer {
  readonly url: string;
  readonly port: number;
  readonly server: Server;
  readonly router: KvRouter;
  readonly workers: WorkerSet;
  readonly metrics: RouterMetrics;
  readonly queue: RequestQueue;
  readonly tokenizer: TokenizerService | null;
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
}

interface RecentDecision {
  requestId: string;
  at: number;
  model: string;
  worker: string;
  policy: string;
  promptTokens: number;
  islBlocks: number;
  overlapBlocks: number;
  bestOverlapBlocks: number;
  attempt: number;
}

const RECENT_MAX = 64;

/** Hop-by-hop and length headers are the proxy's own business; everything else from the engine passes through. */
const SKIP_RESPONSE_HEADERS = new Set(['connection', 'keep-alive', 'transfer-encoding', 'content-length', 'date', 'server']);

function copyHeaders(upstream: Dispatcher.ResponseData['headers'], extra: Record<string, string>): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(upstream)) {
    if (v === undefined || SKIP_RESPONSE_HEADERS.has(k)) continue;
    out[k] = v;
  }
  return { ...out, ...extra };
}

export async function startServer(config: ServeConfig, options: StartOptions = {}): Promise<RunningServer> {
  const log = options.logger ?? pino({ level: config.logLevel, base: undefined, redact: LOG_REDACT_PATHS });
  let security = options.security;
  if (!security) {
    const hasKeys = (config.apiKeys?.length ?? 0) > 0 || Boolean(config.apiKeyFile);
    const loaded = hasKeys ? await loadApiKeys({ flags: config.apiKeys, file: config.apiKeyFile }) : null;
    for (const w of loaded?.warnings ?? []) log.warn(w);
    security = createSecurity({
      apiKeys: loaded?.keys ?? null,
      rateLimit: config.rateLimit ? parseRateLimit(config.rateLimit) : null,
      allowWorkerHosts: config.allowWorkerHosts?.length ? parseAllowList(config.allowWorkerHosts) : null,
    });
  }
  const guard = security;
  const router = new KvRouter({
    blockSize: config.blockSize,
    policy: config.policy,
    knobs: {
      prefillLoadScale: config.prefillLoadScale,
      overlapCredit: config.overlapCredit,
      temperature: config.temperature,
      ...(config.tierCredit ? TIER_CREDIT_ON : {}),
    },
    seed: config.seed,
    busy: { activeBlockFraction: config.busyKvFraction, activePrefillTokens: config.busyPrefillTokens },
    clock: () => performance.now(),
  });
  const metrics = new RouterMetrics({ router, prefix: config.metricsPrefix });
  const queue = new RequestQueue(config.queueLimit, config.queueTimeoutMs);
  const remote = config.remoteTokenize ? new RemoteTokenizer() : null;
  let tokenizer: TokenizerService | null = options.tokenizer ? inlineTokenizer(options.tokenizer) : null;
  if (!tokenizer && config.tokenizerDir) {
    tokenizer =
      config.tokenizerThreads > 0
        ? await threadTokenizer(config.tokenizerDir)
        : inlineTokenizer(await LocalTokenizer.load(config.tokenizerDir));
    log.info({ dir: config.tokenizerDir, mode: tokenizer.kind, ...(await tokenizer.info()) }, 'loaded tokenizer');
  }

  // KV events: one subscription per worker rank, delivered into the router's index.
  let ingest: EventIngest | null = null;
  const ensureIngest = (): EventIngest => {
    ingest ??= new EventIngest({
      routerBlockSize: config.blockSize,
      sink: (key: string, events: KvEvent[]) => {
        const r = router.applyEvents(key, events);
        metrics.eventsApplied(key, r);
      },
      onReset: (key: string, reason: string) => {
        router.resetSource(key); // counted for metrics by the ingest health poll below
        log.warn({ source: key, reason }, 'KV event stream reset: source treated as cold');
      },
      log: {
        info: (o, m) => log.info(o, m),
        warn: (o, m) => log.warn(o, m),
        error: (o, m) => log.error(o, m),
      },
    });
    return ingest;
  };

  const workers = new WorkerSet(
    router,
    {
      intervalMs: config.healthIntervalMs,
      timeoutMs: config.healthTimeoutMs,
      ejectAfter: config.ejectAfter,
      breakerThreshold: config.breakerThreshold,
      breakerCooldownMs: config.breakerCooldownMs,
      upstreamTimeoutMs: config.upstreamTimeoutMs,
    },
    {
      onAdded: async (w) => {
        if (w.spec.events) {
          await ensureIngest().addWorker({
            workerId: w.id,
            endpoint: w.spec.events,
            replayEndpoint: w.spec.replay ?? null,
            dpRanks: w.spec.dp ?? 1,
            flavor: w.spec.engine,
          });
        }
      },
      onRemoved: async (w) => {
        if (ingest) for (const k of w.sourceKeys) await ingest.removeSource(k);
      },
      onHealthChange: (w, healthy) => {
        for (const k of w.sourceKeys) metrics.setHealthy(k, healthy);
        if (healthy) {
          log.info({ worker: w.id }, 'worker healthy again: readmitted');
          queue.kick();
        } else log.warn({ worker: w.id, error: w.lastProbeError }, 'worker failed health checks: ejected');
      },
    },
  );
  for (const spec of config.workers) await workers.add(spec);
  workers.startHealthChecks();

  const recent: RecentDecision[] = [];
  let inFlight = 0;
  let closing = false;
  let seq = 0;
  const idPrefix = randomBytes(4).toString('hex');
  const sweepTimer = setInterval(() => {
    const freed = router.sweep(Date.now());
    if (freed.length > 0) {
      log.warn({ count: freed.length }, 'force-freed stale requests');
      queue.kick();
    }
  }, 10_000);
  sweepTimer.unref();

  // Engine-side prefix-cache counters mirrored next to the router's own (the honest comparison of hit rates).
  const mirror: EngineMirror | null =
    config.engineMetricsIntervalMs > 0
      ? metrics.mirrorEngines({
          targets: () => workers.list().map((w) => ({ workerId: w.id, url: w.url })),
          intervalMs: config.engineMetricsIntervalMs,
          // The kv-pressure policy weighs decode load by KV capacity: learn it from the engine unless blocks= says.
          onCapacity: (workerId, numGpuBlocks) => {
            const w = workers.get(workerId);
            if (!w || w.spec.blocks !== undefined) return;
            for (let r = 0; r < (w.spec.dp ?? 1); r++) router.setCapacity(sourceKey({ workerId, dpRank: r }), numGpuBlocks);
          },
        })
      : null;

  // Event-stream health into metrics: the ingest keeps cumulative counts per source, metrics take increments.
  const lastIngest = new Map<string, { gaps: number; replays: number; resets: number; decodeErrors: number }>();
  const ingestPoll = setInterval(() => {
    if (!ingest) return;
    for (const h of ingest.health()) {
      const prev = lastIngest.get(h.sourceKey) ?? { gaps: 0, replays: 0, resets: 0, decodeErrors: 0 };
      metrics.ingestCounters(h.sourceKey, {
        gaps: h.gaps - prev.gaps,
        replays: h.replays - prev.replays,
        resets: h.resets - prev.resets,
        decodeErrors: h.decodeErrors - prev.decodeErrors,
        blind: h.blind,
      });
      lastIngest.set(h.sourceKey, { gaps: h.gaps, replays: h.replays, resets: h.resets, decodeErrors: h.decodeErrors });
    }
  }, 2000);
  ingestPoll.unref();

  // ------------------------------------------------------------------ routing helpers

  /** Allowed sources for a model now, the LoRA adapter name to hash with, or an error to answer. */
  function eligible(model: string, now: number): { allow: Set<string>; lora: string | null } | HttpError {
    const all = workers.list();
    const serving = all.filter((w) => w.serves(model));
    if (serving.length === 0) {
      if (all.length === 0) return new HttpError(503, 'no workers configured', 'service_unavailable', 'no_workers');
      return new HttpError(404, `the model "${model}" does not exist on any worker`, 'not_found_error', 'model_not_found', 'model');
    }
    const allow = new Set<string>();
    let lora: string | null = null;
    for (const w of serving) {
      if (w.adapters.has(model)) lora = model;
      if (!w.routable(now)) continue;
      for (const k of w.sourceKeys) allow.add(k);
    }
    if (allow.size === 0) {
      return new HttpError(503, `no healthy worker serves "${model}" right now`, 'service_unavailable', 'no_healthy_workers', null, {
        'retry-after': String(Math.ceil(config.healthIntervalMs / 1000)),
      });
    }
    return { allow, lora };
  }

  async function tokensFor(req: ParsedRequest, allow: Set<string>): Promise<ArrayLike<number>> {
    if (req.promptIds) return req.promptIds;
    try {
      if (tokenizer) {
        if (req.promptText !== null) return await tokenizer.encodePrompt(req.promptText);
        if (req.chat) return await tokenizer.encodeChat(req.chat);
      }
      if (remote) {
        const worker = workers.list().find((w) => w.sourceKeys.some((k) => allow.has(k)));
        if (worker) {
          const ids =
            req.promptText !== null
              ? await remote.prompt(worker.url, req.model, req.promptText)
              : req.chat
                ? await remote.chat(worker.url, req.model, req.chat)
                : null;
          if (ids) return ids;
        }
      }
    } catch (err) {
      // A template that rejects these messages will be rejected by the engine too; route without affinity.
      log.debug({ err: (err as Error).message }, 'tokenization failed: routing without prefix affinity');
    }
    return [];
  }

  function workerOf(decision: RouteDecision): Worker | undefined {
    return workers.get(decision.source.workerId);
  }

  // ------------------------------------------------------------------ the proxied endpoints

  async function handleInference(endpoint: Endpoint, req: IncomingMessage, res: ServerResponse, t0: number): Promise<void> {
    const raw = await readBody(req, config.bodyLimitBytes);
    // Deep nesting would overflow the stack in JSON.stringify or the template; refuse it before parsing.
    const tooDeep = checkJsonDepth(raw, config.maxJsonDepth);
    if (tooDeep) throw tooDeep;
    let json: unknown;
    const text = raw.toString('utf8');
    try {
      json = JSON.parse(text);
    } catch (err) {
      throw badRequest(`request body is not valid JSON: ${(err as Error).message}`, null, 'invalid_json');
    }
    const parsed = parseRequest(endpoint, json);
    if (parsed.policy && !(POLICY_NAMES as readonly string[]).includes(parsed.policy)) {
      throw badRequest(`unknown policy "${parsed.policy}"; known: ${POLICY_NAMES.join(', ')}`, 'kvroute.policy');
    }
    const el = eligible(parsed.model, Date.now());
    if (el instanceof HttpError) throw el;

    const tTok = performance.now();
    const tokens = await tokensFor(parsed, el.allow);
    const tokenizeS = (performance.now() - tTok) / 1000;

    const abort = new AbortController();
    const onClose = () => {
      if (!res.writableFinished) abort.abort();
    };
    res.on('close', onClose);

    const requestId = `kvr-${idPrefix}-${++seq}`;
    // The client's own id, if any, travels upstream and back for tracing; the router keys its state by its own id,
    // which is unique even when clients reuse theirs.
    const clientRequestId = sanitizeRequestId(req.headers['x-request-id']);
    const body = upstreamBody(parsed, text);
    const path = endpoint === 'chat' ? '/v1/chat/completions' : '/v1/completions';
    const exclude = new Set<string>();
    let lastError = 'no attempt made';

    for (let attempt = 0; attempt <= config.retries; attempt++) {
      if (abort.signal.aborted) return;
      // Re-check eligibility on retries: a worker may have been ejected or its breaker opened meanwhile.
      const el2 = attempt === 0 ? el : eligible(parsed.model, Date.now());
      if (el2 instanceof HttpError) break;
      const routeReq: RouteRequest = {
        requestId,
        tokens,
        loraName: el2.lora,
        cacheSalt: parsed.cacheSalt,
        policy: parsed.policy,
        knobs: parsed.knobs,
        allow: el2.allow,
        exclude,
      };
      let result: RouteResult = router.route(routeReq, Date.now());
      if (result.kind === 'refused' && result.reason === 'all_busy') {
        if (queue.full) {
          metrics.refused('queue_full');
          throw new HttpError(503, 'all workers are busy and the queue is full', 'service_unavailable', 'all_busy', null, {
            'retry-after': '1',
          });
        }
        const waited = await queue.wait(() => router.route(routeReq, Date.now()), abort.signal);
        if (waited.kind === 'aborted') {
          metrics.outcome('cancelled');
          return;
        }
        if (waited.kind !== 'routed') {
          metrics.refused('queue_timeout');
          throw new HttpError(503, `all workers stayed busy for ${config.queueTimeoutMs} ms`, 'service_unavailable', 'all_busy', null, {
            'retry-after': String(Math.max(1, Math.ceil(config.queueTimeoutMs / 1000))),
          });
        }
        result = waited.decision;
      }
      if (result.kind === 'refused') {
        metrics.refused(result.reason);
        if (attempt > 0) break; // every candidate was tried
        throw new HttpError(503, `no worker can take the request (${result.reason})`, 'service_unavailable', result.reason, null, {
          'retry-after': '1',
        });
      }
      const decision = result;
      log.debug(
        {
          requestId,
          clientRequestId,
          worker: decision.sourceKey,
          policy: decision.policy,
          promptTokens: decision.promptTokens,
          islBlocks: decision.islBlocks,
          overlapBlocks: decision.overlapBlocks,
          bestOverlapBlocks: decision.bestOverlapBlocks,
          attempt,
        },
        'routed',
      );
      ingest?.noteRequestRouted(decision.sourceKey);
      recent.push({
        requestId,
        at: Date.now(),
        model: parsed.model,
        worker: decision.sourceKey,
        policy: decision.policy,
        promptTokens: decision.promptTokens,
        islBlocks: decision.islBlocks,
        overlapBlocks: decision.overlapBlocks,
        bestOverlapBlocks: decision.bestOverlapBlocks,
        attempt,
      });
      if (recent.length > RECENT_MAX) recent.shift();

      const worker = workerOf(decision);
      if (!worker) {
        router.finish(requestId, { outcome: 'retried' }, Date.now());
        exclude.add(decision.sourceKey);
        continue;
      }
      const outcome = await proxyOnce(worker, decision, parsed, body, path, res, abort.signal, t0, clientRequestId, tokenizeS);
      if (outcome.kind === 'done') return;
      // Failed before the first byte: free this attempt, steer away from the worker, try the next best.
      lastError = outcome.message;
      for (const k of worker.sourceKeys) exclude.add(k);
      log.warn({ requestId, worker: worker.id, attempt, error: outcome.message }, 'upstream failed before the first byte: retrying');
    }
    metrics.outcome('error');
    throw new HttpError(502, `upstream failure: ${lastError}`, 'upstream_error', 'upstream_error');
  }

  type ProxyOutcome = { kind: 'done' } | { kind: 'retry'; message: string };

  async function proxyOnce(
    worker: Worker,
    decision: RouteDecision,
    parsed: ParsedRequest,
    body: string,
    path: string,
    res: ServerResponse,
    signal: AbortSignal,
    t0: number,
    clientRequestId: string | null,
    tokenizeS: number,
  ): Promise<ProxyOutcome> {
    const requestId = decision.requestId;
    // The routing counts once this attempt is the request's final one (served, or given up by the client); an
    // attempt retried elsewhere never counts, in metrics as in the ledger ('retried').
    let committed = false;
    const commit = () => {
      if (committed) return;
      committed = true;
      metrics.routed(decision, { tokenize: tokenizeS });
    };
    // Before the engine answered: the client left (this attempt is final, cancelled), or the worker failed (the
    // attempt is taken back and the request moves on: 'retried', blamed on the worker).
    const cancelled = (): ProxyOutcome => {
      worker.released();
      commit();
      finishAndCount(requestId, { outcome: 'cancelled' }, Date.now());
      return { kind: 'done' };
    };
    const retry = (message: string): ProxyOutcome => {
      const now = Date.now();
      worker.completed(false, now);
      router.finish(requestId, { outcome: 'retried' }, now);
      return { kind: 'retry', message };
    };
    const headers: Record<string, string> = {
      'content-type': 'application/json',
      'x-request-id': clientRequestId ?? requestId,
    };
    if ((worker.spec.dp ?? 1) > 1) headers['x-data-parallel-rank'] = String(decision.source.dpRank);
    const ours = {
      'x-kvroute-worker': decision.sourceKey,
      'x-kvroute-overlap-blocks': String(decision.overlapBlocks),
      'x-kvroute-isl-blocks': String(decision.islBlocks),
      'x-kvroute-request-id': requestId,
      'x-request-id': clientRequestId ?? requestId,
    };
    worker.dispatched();
    let upstream: Dispatcher.ResponseData;
    try {
      upstream = await worker.pool.request({ method: 'POST', path, headers, body, signal });
    } catch (err) {
      return signal.aborted ? cancelled() : retry(`${worker.id}: ${(err as Error).message}`);
    }

    if (upstream.statusCode >= 500) {
      const text = await upstream.body.text().catch(() => '');
      return retry(`${worker.id} answered ${upstream.statusCode}: ${text.slice(0, 200)}`);
    }

    if (upstream.statusCode !== 200 || !parsed.stream) {
      // Non-streaming (or an engine error like 400): the answer comes whole; pass it through as is.
      let buf: Buffer;
      try {
        buf = Buffer.from(await upstream.body.arrayBuffer());
      } catch (err) {
        return signal.aborted ? cancelled() : retry(`${worker.id}: body failed: ${(err as Error).message}`);
      }
      commit();
      const now = Date.now();
      let cachedTokens: number | undefined;
      let outputTokens: number | undefined;
      if (upstream.statusCode === 200) {
        try {
          const usage = readUsage((JSON.parse(buf.toString('utf8')) as { usage?: unknown }).usage);
          cachedTokens = usage?.cachedTokens;
          outputTokens = usage?.completionTokens;
        } catch {
          /* not JSON: nothing to learn, still forward it */
        }
        // Non-streaming answers arrive whole: the first token is not observable apart from the end.
        router.firstToken(requestId, now);
        metrics.firstToken(decision.sourceKey, (performance.now() - t0) / 1000);
      }
      const ok = upstream.statusCode === 200;
      worker.completed(true, now); // a 4xx is the request's fault, not the worker's
      finishAndCount(requestId, { cachedTokens, outcome: ok ? 'ok' : 'error' }, now, outputTokens);
      if (!res.destroyed) {
        res.writeHead(upstream.statusCode, copyHeaders(upstream.headers, { ...ours, 'content-length': String(buf.length) }));
        res.end(buf);
      }
      return { kind: 'done' };
    }

    // Streaming: headers go out now; from here on failures are reported in-band.
    commit();
    res.writeHead(200, copyHeaders(upstream.headers, { ...ours, 'cache-control': 'no-cache' }));
    res.flushHeaders();
    const relay = new SseRelay(!parsed.clientWantsUsage);
    let first = true;
    let last = 0;
    let failure: string | null = null;
    // 'data' events rather than an async iterator: one promise less per chunk on the hottest path of the proxy.
    await new Promise<void>((resolve) => {
      const body = upstream.body;
      body.on('data', (chunk: Buffer) => {
        const out = relay.push(chunk);
        if (out.length === 0) return;
        const tNow = performance.now();
        if (first) {
          first = false;
          router.firstToken(requestId, Date.now());
          metrics.firstToken(decision.sourceKey, (tNow - t0) / 1000);
          queue.kick(); // prefill load just dropped
        } else {
          metrics.token(decision.sourceKey, (tNow - last) / 1000);
        }
        last = tNow;
        if (!res.write(out)) {
          // Backpressure: a slow client slows the upstream read instead of growing a buffer here. A client that
          // stops reading altogether would pin the request in the worker's active load: past the stall timeout it is
          // dropped like a disconnect (cancelled, the worker not blamed).
          body.pause();
          const stall = config.clientStallTimeoutMs > 0 ? setTimeout(() => res.destroy(), config.clientStallTimeoutMs) : undefined;
          res.once('drain', () => {
            clearTimeout(stall);
            body.resume();
          });
          res.once('close', () => clearTimeout(stall));
        }
      });
      body.once('end', () => {
        const rest = relay.flush();
        if (rest.length > 0 && !res.destroyed) res.write(rest);
        if (!relay.sawDone && !signal.aborted) failure = `${worker.id} closed the stream before [DONE]`;
        resolve();
      });
      body.once('error', (err: Error) => {
        if (!signal.aborted) failure = `${worker.id}: stream failed: ${err.message}`;
        resolve();
      });
    });
    const now = Date.now();
    if (signal.aborted || res.destroyed) {
      // The client went away: the upstream was aborted with it; free the load.
      if (!upstream.body.destroyed) upstream.body.destroy();
      worker.released();
      finishAndCount(requestId, { outcome: 'cancelled', cachedTokens: relay.usage?.cachedTokens }, now);
      return { kind: 'done' };
    }
    if (failure) {
      log.warn({ requestId, worker: worker.id, error: failure }, 'stream failed mid-way');
      worker.completed(false, now);
      finishAndCount(requestId, { outcome: 'error', cachedTokens: relay.usage?.cachedTokens }, now);
      res.end(sseErrorFrame(failure));
      return { kind: 'done' };
    }
    worker.completed(true, now);
    finishAndCount(
      requestId,
      { outcome: relay.sawError ? 'error' : 'ok', cachedTokens: relay.usage?.cachedTokens },
      now,
      relay.usage?.completionTokens,
    );
    res.end();
    return { kind: 'done' };
  }

  function finishAndCount(
    requestId: string,
    info: { cachedTokens?: number; outcome: 'ok' | 'cancelled' | 'error' },
    now: number,
    outputTokens?: number,
  ): void {
    const f = router.finish(requestId, info, now);
    if (f) metrics.finished(f, { outputTokens });
    metrics.outcome(info.outcome);
    queue.kick();
  }

  // ------------------------------------------------------------------ admin

  async function handleAdmin(req: IncomingMessage, res: ServerResponse, path: string): Promise<void> {
    if (!config.adminToken) {
      throw new HttpError(
        404,
        'the admin API is disabled (start with --admin-token or KVROUTE_ADMIN_TOKEN)',
        'not_found_error',
        'not_found',
      );
    }
    if (!adminAuthorized(req, config.adminToken)) {
      throw new HttpError(401, 'missing or wrong bearer token', 'authentication_error', 'invalid_token', null, {
        'www-authenticate': 'Bearer',
      });
    }
    if (path === '/admin/workers' && req.method === 'GET') {
      sendJson(res, 200, { workers: workers.list().map((w) => w.toJSON()) });
      return;
    }
    if (path === '/admin/workers' && req.method === 'POST') {
      const raw = await readBody(req, 64 * 1024);
      const tooDeep = checkJsonDepth(raw, config.maxJsonDepth);
      if (tooDeep) throw tooDeep;
      let value: unknown;
      try {
        value = JSON.parse(raw.toString('utf8'));
      } catch {
        throw badRequest('body must be JSON: {"url": ..., "events"?, "replay"?, "dp"?, "model"?, "id"?} or {"spec": "URL,..."}');
      }
      let spec: WorkerSpec;
      try {
        const v = value as { spec?: unknown };
        spec = workerFromUnknown(v && typeof v === 'object' && typeof v.spec === 'string' ? v.spec : value);
      } catch (err) {
        throw badRequest((err as Error).message);
      }
      const refused = guard.checkWorker(spec);
      if (refused) throw toHttpError(refused);
      let worker: Worker;
      try {
        worker = await workers.add(spec);
      } catch (err) {
        throw new HttpError(409, (err as Error).message, 'invalid_request_error', 'worker_exists');
      }
      log.info({ worker: worker.id, url: worker.url }, 'worker added through the admin API');
      queue.kick();
      sendJson(res, 201, worker.toJSON());
      return;
    }
    const m = /^\/admin\/workers\/([^/]+)$/.exec(path);
    if (m && req.method === 'DELETE') {
      const id = decodeURIComponent(m[1]);
      if (!(await workers.remove(id))) throw new HttpError(404, `no worker "${id}"`, 'not_found_error', 'worker_not_found');
      log.info({ worker: id }, 'worker removed through the admin API');
      sendJson(res, 200, { removed: id });
      return;
    }
    throw new HttpError(404, `no admin route ${req.method} ${path}`, 'not_found_error', 'not_found');
  }

  // ------------------------------------------------------------------ dispatch

  async function debugState(): Promise<unknown> {
    const { adminToken: _secret, apiKeys: _keys, workers: _w, ...settings } = config;
    return {
      config: { ...settings, adminApi: Boolean(config.adminToken), security: guard.enabled },
      router: router.state(),
      ledger: { total: router.ledger.total, bySource: Object.fromEntries(router.ledger.bySource) },
      workers: workers.list().map((w) => w.toJSON()),
      events: ingest ? ingest.health() : [],
      queue: { length: queue.length, limit: queue.limit, timeoutMs: queue.timeoutMs },
      inFlight,
      tokenizer: tokenizer ? { local: true, mode: tokenizer.kind, ...(await tokenizer.info().catch(() => ({}))) } : { local: false },
      recentDecisions: recent,
    };
  }

  async function dispatch(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const t0 = performance.now();
    const url = req.url ?? '/';
    const q = url.indexOf('?');
    const path = q >= 0 ? url.slice(0, q) : url;
    if (path.startsWith('/v1/')) {
      const denied = guard.checkApi(req);
      if (denied) throw toHttpError(denied);
    }
    if (req.method === 'POST' && (path === '/v1/chat/completions' || path === '/v1/completions')) {
      if (closing) {
        throw new HttpError(503, 'the router is shutting down', 'service_unavailable', 'shutting_down', null, { 'retry-after': '1' });
      }
      return handleInference(path === '/v1/chat/completions' ? 'chat' : 'completions', req, res, t0);
    }
    if (req.method === 'GET') {
      switch (path) {
        case '/v1/models':
          return sendJson(res, 200, { object: 'list', data: workers.models() });
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
        case '/metrics': {
          const text = await metrics.render();
          res.writeHead(200, { 'content-type': metrics.contentType });
          res.end(text);
          return;
        }
        case '/debug/state':
          return sendJson(res, 200, await debugState());
      }
    }
    if (path.startsWith('/admin/')) return handleAdmin(req, res, path);
    if (dashboardHandler(req, res, () => metrics.dashboardState())) return;
    if (path === '/v1/chat/completions' || path === '/v1/completions' || path === '/v1/models') {
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
      dispatch(req, res).catch((err: unknown) => {
        if (err instanceof HttpError) {
          if (err.status >= 500) log.warn({ status: err.status, code: err.code }, err.message);
          if (!req.complete && err.status !== 413) req.resume(); // an unread body must not stall the connection
          sendError(res, err);
          if (err.status === 413) req.destroy();
          return;
        }
        // Anything else is our bug; still answer in the OpenAI shape, and log it with its stack.
        log.error({ err }, 'unhandled error in request');
        sendError(res, new HttpError(500, 'internal router error', 'server_error', 'internal_error'));
      });
    },
  );
  server.maxRequestsPerSocket = 0;

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    // A deeper accept backlog than node's 511, so a connection storm queues in the kernel instead of being dropped.
    server.listen({ port: config.port, host: config.host, backlog: 4096 }, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const host = config.host === '0.0.0.0' || config.host === '::' ? '127.0.0.1' : config.host;
  const url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;

  let closed: Promise<void> | null = null;
  const close = (graceMs = config.shutdownGraceMs): Promise<void> => {
    closed ??= (async () => {
      closing = true;
      server.close();
      server.closeIdleConnections();
      queue.close();
      const deadline = Date.now() + graceMs;
      while (inFlight > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25));
      server.closeAllConnections();
      clearInterval(sweepTimer);
      clearInterval(ingestPoll);
      await mirror?.stop();
      await tokenizer?.close();
      await workers.destroy();
      if (ingest) await ingest.close();
    })();
    return closed;
  };

  return {
    url,
    port,
    server,
    router,
    workers,
    metrics,
    queue,
    tokenizer,
    inFlight: () => inFlight,
    close,
  };
}

/** A client's x-request-id, if it is a short printable token; anything else is ignored rather than echoed. */
export function sanitizeRequestId(value: string | string[] | undefined): string | null {
  if (typeof value !== 'string') return null;
  return /^[\x21-\x7e]{1,128}$/.test(value) ? value : null;
}
