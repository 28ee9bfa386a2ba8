/**
 * One HTTP shell of `kvroute serve --processes N`: it listens on the shared public port (node:cluster), and for every
 * routed API does the per-request work a core can do alone (read and parse the body, tokenize, proxy the attempt with
 * its own connection pools, relay the stream), asking the primary's dispatcher for each decision over IPC and telling
 * it of first tokens and finishes. Every other path (/health, /metrics, /v1/models, /admin, /debug, /tokenize, ...) is
 * passed to the primary's internal listener as it came, so there is one answer for each, from the one router. The
 * request metrics it records stay in its own registry (src/metrics/shell-metrics.ts): the primary asks for them at
 * scrape time, and the shell also sends them a second after they change and when it stops.
 */
import { randomBytes } from 'node:crypto';
import cluster from 'node:cluster';
import type { IncomingMessage, ServerResponse } from 'node:http';
import pino, { type Logger } from 'pino';
import { Pool } from 'undici';
import type { DispatchAttempt, FinishReport, PrefillReport, Submission } from '../../core/dispatch/dispatcher.ts';
import { requestSeqHashes } from '../../core/multimodal.ts';
import type { RouteDecision } from '../../core/types.ts';
import type { ServeConfig } from '../../config/serve.ts';
import { HttpError } from '../../http/errors.ts';
import type { TokenizerCacheGauges } from '../../metrics/memory.ts';
import { ShellMetrics } from '../../metrics/shell-metrics.ts';
import { RemoteTokenizer } from '../../tokenizer/remote.ts';
import { buildSecurity } from '../app.ts';
import { createListener } from '../listener.ts';
import { answerError } from '../routes.ts';
import { buildTokenizer } from '../../runtime/compose.ts';
import { ROUTED_PATHS } from '../../apis/index.ts';
import { sessionHeaderNames } from '../../runtime/identity.ts';
import { handleInference, type InferenceContext } from '../inference.ts';
import type { LifecyclePort, NextStep } from '../../runtime/lifecycle.ts';
import { DisaggRequestIds, disaggMachineIdOf } from '../../engines/trtllm/ids.ts';
import type { PdWorker } from '../../runtime/prefill-leg.ts';
import { LOG_REDACT_PATHS, toHttpError } from '../../runtime/security/index.ts';
import { NO_TRACE } from '../../runtime/tracing.ts';
import { workerPool } from '../../runtime/workers.ts';
import { Outbox, type PrimaryMessage, type ShellMessage, type ShellWorkerInfo } from './protocol.ts';

const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'transfer-encoding', 'upgrade', 'proxy-connection', 'te', 'trailer', 'host']);

const outbox = new Outbox<ShellMessage>((m) => {
  if (process.connected) process.send?.(m);
});
const send = (m: ShellMessage) => outbox.push(m);

const EMPTY_HASHES = new BigUint64Array(0);
const NO_CANDIDATES: readonly never[] = [];

function fullStep(step: DispatchAttempt): DispatchAttempt {
  const d = step.decision as Partial<RouteDecision>;
  if (d.seqHashes && d.candidates) return step;
  const decision = { ...step.decision, seqHashes: EMPTY_HASHES, candidates: NO_CANDIDATES };
  const prefill = step.prefill
    ? { ...step.prefill, decision: { ...step.prefill.decision, seqHashes: EMPTY_HASHES, candidates: NO_CANDIDATES } }
    : undefined;
  return { ...step, decision, ...(prefill ? { prefill } : {}) };
}

/** The workers attempts are sent to, learnt from the primary's steps; one pool per worker, as the primary has. */
class ShellWorkers {
  private readonly byId = new Map<string, PdWorker>();

  constructor(private readonly upstreamTimeoutMs: number | undefined) {}

  learn(info: ShellWorkerInfo): PdWorker {
    const known = this.byId.get(info.id);
    if (known && known.url === info.url) return known;
    void known?.pool.close();
    const w: PdWorker = {
      id: info.id,
      url: info.url,
      sourceKeys: info.sourceKeys,
      bootstrapPort: info.bootstrapPort,
      pool: workerPool(new URL(info.url).origin, this.upstreamTimeoutMs, info.appProtocol),
      // What this shell's legs learn of the worker stays with it (one per shell process).
      handoffFields: { settings: info.handoffSettings ?? {}, refused: new Set() },
    };
    this.byId.set(info.id, w);
    return w;
  }

  get(id: string): PdWorker | undefined {
    return this.byId.get(id);
  }

  async close(): Promise<void> {
    await Promise.all([...this.byId.values()].map((w) => w.pool.close().catch(() => {})));
  }
}

/** Models a shell keeps the LoRA adapter of (each learnt from a kvr.rehash): more are forgotten, oldest first. */
const MAX_ADAPTERS = 1024;

/**
 * A prompt's block hashes, computed in the shell as the primary's router would (src/core/multimodal.ts
 * requestSeqHashes, the configured block size): the routing core then reads 8 bytes per block instead of 4 per token.
 * The one input the shell cannot know, whether the model is a LoRA adapter on the fleet (its name then seeds the
 * hashes), it learns from the primary's kvr.rehash answers.
 */
export class ShellHasher {
  private readonly adapters = new Map<string, string>();

  constructor(private readonly blockSize: number) {}

  /** The submission as it crosses to the primary: hashes and prompt length for token ids (tokens as they are if hashing fails). */
  wire(sub: Submission): { sub: Submission; lora?: string | null } {
    const tokens = sub.tokens;
    if (!tokens) return { sub };
    const lora = this.adapters.get(sub.model) ?? null;
    let seqHashes: BigUint64Array;
    try {
      seqHashes = requestSeqHashes(tokens, this.blockSize, lora, sub.cacheSalt, sub.mmItems);
    } catch {
      return { sub: withTokens(sub) };
    }
    const { tokens: _t, mmItems: _m, ...rest } = sub;
    return { sub: { ...rest, seqHashes, promptTokens: tokens.length }, lora };
  }

  /** The primary hashes `model` with `lora`: remembered for the next submissions. */
  learn(model: string, lora: string | null): void {
    this.adapters.delete(model);
    if (lora === null) return;
    this.adapters.set(model, lora);
    if (this.adapters.size > MAX_ADAPTERS) this.adapters.delete(this.adapters.keys().next().value as string);
  }
}

/** Token ids as a typed array: the channel copies its bytes instead of serialising each number. */
function withTokens(sub: Submission): Submission {
  const tokens = sub.tokens && !(sub.tokens instanceof Uint32Array) ? Uint32Array.from(sub.tokens) : sub.tokens;
  return { ...sub, tokens };
}

/** The primary's Lifecycle seen from a shell: each step is the primary dispatcher's answer. */
class ForwardedLifecycle {
  private readonly waiters = new Map<string, (step: NextStep) => void>();
  /** Submissions waiting for their first step, kept for a kvr.rehash (how many they had, the API they came in on). */
  private readonly submitted = new Map<string, { sub: Submission; api: string; rehashes: number }>();
  /** The last kvr.firstToken queued: a kvr.finish of the same request right after it takes its place. */
  private lastFirst: { readonly k: 'kvr.firstToken'; readonly id: string } | null = null;

  constructor(
    private readonly workers: ShellWorkers,
    private readonly hasher: ShellHasher,
  ) {}

  /**
   * The primary routes with another adapter than the submission was hashed with: hashed again with it (and learnt),
   * or, the second time (the fleet's adapters changing meanwhile), sent as token ids for the primary to hash.
   */
  rehash(id: string, lora: string | null): void {
    const entry = this.submitted.get(id);
    if (!entry) return;
    entry.rehashes++;
    this.hasher.learn(entry.sub.model, lora);
    const wire = entry.rehashes > 1 ? { sub: withTokens(entry.sub) } : this.hasher.wire(entry.sub);
    if (this.waiters.has(id)) send({ k: 'kvr.submit', id, api: entry.api, ...wire });
  }

  /** A step from the primary (its decisions without hashes and candidates: empty ones put back). */
  step(id: string, wire: NextStep, workers: readonly ShellWorkerInfo[]): void {
    for (const w of workers) this.workers.learn(w);
    const step = wire.kind === 'dispatch' ? fullStep(wire) : wire;
    const waiter = this.waiters.get(id);
    if (!waiter) {
      // The handler gave up (its client left) while the primary decided: give the attempt back.
      if (step.kind === 'dispatch') send({ k: 'kvr.cancel', id });
      return;
    }
    this.waiters.delete(id);
    this.submitted.delete(id);
    waiter(step);
  }

  private wait(id: string, signal: AbortSignal, message: ShellMessage): Promise<NextStep> {
    return new Promise<NextStep>((resolve) => {
      if (signal.aborted) {
        resolve({ kind: 'aborted' });
        return;
      }
      const onAbort = () => {
        if (!this.waiters.delete(id)) return;
        this.submitted.delete(id);
        send({ k: 'kvr.cancel', id });
        resolve({ kind: 'aborted' });
      };
      this.waiters.set(id, (step) => {
        signal.removeEventListener('abort', onAbort);
        resolve(step);
      });
      signal.addEventListener('abort', onAbort, { once: true });
      send(message);
    });
  }

  submit(api: string, sub: Submission, signal: AbortSignal): Promise<NextStep> {
    const id = sub.requestId;
    if (!signal.aborted) this.submitted.set(id, { sub, api, rehashes: 0 });
    return this.wait(id, signal, { k: 'kvr.submit', id, api, ...this.hasher.wire(sub) });
  }

  failed(requestId: string, error: string, signal: AbortSignal): Promise<NextStep> {
    return this.wait(requestId, signal, { k: 'kvr.failed', id: requestId, error });
  }

  prefillFailed(requestId: string, error: string, signal: AbortSignal): Promise<NextStep> {
    return this.wait(requestId, signal, { k: 'kvr.prefillFailed', id: requestId, error });
  }

  prefillDone(requestId: string, report: PrefillReport): void {
    send({ k: 'kvr.prefillDone', id: requestId, report });
  }

  firstToken(requestId: string): void {
    const m = { k: 'kvr.firstToken', id: requestId } as const;
    this.lastFirst = m;
    send(m);
  }

  /**
   * Right after its kvr.firstToken, with nothing queued between (a whole answer: its first token is not observable apart
   * from its end), one kvr.finish with `firstToken` takes that message's place: the primary applies both, in that order.
   */
  finish(requestId: string, report: FinishReport, outputTokens?: number): void {
    const first = this.lastFirst;
    this.lastFirst = null;
    const fold = first !== null && first.id === requestId && outbox.last() === first;
    const m: ShellMessage = {
      k: 'kvr.finish',
      id: requestId,
      report,
      ...(outputTokens === undefined ? {} : { outputTokens }),
      ...(fold ? { firstToken: true as const } : {}),
    };
    if (fold) outbox.replaceLast(m);
    else send(m);
  }

  /** The primary is gone: nothing will answer. */
  abandon(): void {
    this.submitted.clear();
    for (const [id, w] of this.waiters) {
      this.waiters.delete(id);
      w({
        kind: 'reject',
        requestId: id,
        code: 'closed',
        message: 'the router is shutting down',
        queuedMs: 0,
        attempts: 0,
        tenant: 'default',
        band: 'default',
      });
    }
  }
}

/** The forwarded lifecycle as one API's requests use it: each submission names that API to the primary. */
class ApiLifecycle implements LifecyclePort {
  constructor(
    private readonly api: string,
    private readonly lc: ForwardedLifecycle,
  ) {}

  submit(sub: Submission, signal: AbortSignal): Promise<NextStep> {
    return this.lc.submit(this.api, sub, signal);
  }

  failed(requestId: string, error: string, signal: AbortSignal): Promise<NextStep> {
    return this.lc.failed(requestId, error, signal);
  }

  prefillFailed(requestId: string, error: string, signal: AbortSignal): Promise<NextStep> {
    return this.lc.prefillFailed(requestId, error, signal);
  }

  prefillDone(requestId: string, report: PrefillReport): void {
    this.lc.prefillDone(requestId, report);
  }

  firstToken(requestId: string): void {
    this.lc.firstToken(requestId);
  }

  finish(requestId: string, report: FinishReport, outputTokens?: number): void {
    this.lc.finish(requestId, report, outputTokens);
  }
}

export async function runShell(config: ServeConfig, primaryUrl: string): Promise<void> {
  // Messages that arrive while the shell starts up wait for their handler below instead of being lost. A kvr.close (the
  // router began to stop meanwhile) ends it at once: it listens on nothing and holds nothing yet. (A lost kvr.close left
  // the shell running until the primary's kill timer, the whole grace period.)
  const early: PrimaryMessage[] = [];
  const hold = (m: PrimaryMessage) => {
    if (m.k === 'kvr.close') process.exit(0);
    early.push(m);
  };
  process.on('message', hold);
  const log: Logger = pino({ level: config.logLevel, base: { shell: process.pid }, redact: LOG_REDACT_PATHS });
  const guard = await buildSecurity(config, log);
  const mode = config.tokenizerMode ?? (config.tokenizerDir ? 'local' : config.remoteTokenize ? 'remote' : null);
  const tokenizer = mode === 'local' ? await buildTokenizer(config, {}, log) : null;
  const remote =
    mode === 'render' || mode === 'remote'
      ? new RemoteTokenizer({ mode: mode === 'render' ? 'render' : 'tokenize', cacheBytes: Math.floor(config.tokenizerCacheMb * 2 ** 20) })
      : null;
  const workers = new ShellWorkers(config.upstreamTimeoutMs);
  const lifecycle = new ForwardedLifecycle(workers, new ShellHasher(config.blockSize));
  // Request metrics, recorded here; sent to the primary when asked (scrape time), when the shell stops, and
  // --shell-report-ms (0: never) after a change: the most a shell killed outright loses. Each report serialises the
  // registry, a cost per interval, not per request.
  const reportMs = config.shellReportMs;
  let reportTimer: NodeJS.Timeout | null = null;
  const report = async () => {
    if (reportTimer) clearTimeout(reportTimer);
    reportTimer = null;
    send({ k: 'kvr.snapshot', metrics: await metrics.snapshot() });
  };
  const metrics = new ShellMetrics(config.metricsPrefix, () => {
    if (reportMs > 0) reportTimer ??= setTimeout(() => void report(), reportMs).unref();
  });
  const targets = new Map<string, (w: ShellWorkerInfo | null) => void>();
  let targetSeq = 0;
  const idPrefix = randomBytes(4).toString('hex');
  let seq = 0;
  const ctx: InferenceContext = {
    config,
    log,
    precheck: () => null,
    tokenizingWorker: (model) =>
      new Promise((resolve) => {
        const id = `t${++targetSeq}`;
        targets.set(id, (info) => resolve(info ? workers.learn(info) : undefined));
        send({ k: 'kvr.target', id, model });
      }),
    lifecycle: new ApiLifecycle('unknown', lifecycle),
    workers,
    metrics,
    tokenizer,
    remote,
    // The primary notes each attempt it dispatches (recent decisions, blindness accounting): nothing to send.
    noteRouted: () => {},
    nextRequestId: () => `kvr-${idPrefix}-${++seq}`,
    guard,
    sessionHeaders: sessionHeaderNames(config),
    pd: metrics,
    // TensorRT-LLM's disagg_request_id must be unique across every process: each shell takes the next machine id after
    // the router's (cluster worker ids count from 1), so shells of one router never share one.
    disaggIds: new DisaggRequestIds(((config.disaggMachineId ?? disaggMachineIdOf(config.replicaId)) + (cluster.worker?.id ?? 0)) & 1023),
  };

  /** The context of one API's requests (made once per API): its lifecycle names the API in each submission. */
  const apiContexts = new Map<string, InferenceContext>();
  const contextOf = (api: string): InferenceContext => {
    let c = apiContexts.get(api);
    if (!c) {
      c = { ...ctx, lifecycle: new ApiLifecycle(api, lifecycle) };
      apiContexts.set(api, c);
    }
    return c;
  };

  const primary = new Pool(primaryUrl, { connections: 256, pipelining: 1 });
  let closing = false;

  /** Any path but the routed APIs: the primary answers, as it would on its own port. */
  async function forward(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const headers: Record<string, string | string[]> = {};
    for (const [k, v] of Object.entries(req.headers)) if (v !== undefined && !HOP_BY_HOP.has(k)) headers[k] = v;
    const hasBody = req.method !== 'GET' && req.method !== 'HEAD';
    const up = await primary.request({
      method: (req.method ?? 'GET') as 'GET',
      path: req.url ?? '/',
      headers,
      body: hasBody ? req : undefined,
    });
    const out: Record<string, string | string[]> = {};
    for (const [k, v] of Object.entries(up.headers)) if (v !== undefined && !HOP_BY_HOP.has(k)) out[k] = v;
    res.writeHead(up.statusCode, out);
    for await (const chunk of up.body) {
      if (!res.write(chunk)) await new Promise((r) => res.once('drain', r));
    }
    res.end();
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const t0 = performance.now();
    const url = req.url ?? '/';
    const q = url.indexOf('?');
    const path = q >= 0 ? url.slice(0, q) : url;
    const api = req.method === 'POST' ? ROUTED_PATHS.get(path) : undefined;
    if (!api) return forward(req, res);
    const denied = guard.checkApi(req);
    if (denied) throw toHttpError(denied);
    if (closing) {
      throw new HttpError(503, 'the router is shutting down', 'service_unavailable', 'shutting_down', null, { 'retry-after': '1' });
    }
    metrics.apiRequest(api.name);
    await handleInference(contextOf(api.name), api, path, req, res, t0, NO_TRACE);
  }

  const listener = createListener(config, (req, res) => {
    handle(req, res).catch((err: unknown) => {
      if (!(err instanceof HttpError) && !res.headersSent) {
        // The primary did not answer a forwarded request: the router's own failure, said as one.
        log.warn({ err: (err as Error).message, path: req.url }, 'forwarding to the routing core failed');
        answerError(req, res, new HttpError(502, 'the routing core did not answer', 'server_error', 'internal_error'), log);
        return;
      }
      answerError(req, res, err, log);
    });
  });

  const onMessage = (m: PrimaryMessage) => {
    if (m.k === 'kvr.batch') for (const one of m.msgs) onMessage(one);
    else if (m.k === 'kvr.step') lifecycle.step(m.id, m.step, m.workers);
    else if (m.k === 'kvr.rehash') lifecycle.rehash(m.id, m.lora);
    else if (m.k === 'kvr.target') {
      targets.get(m.id)?.(m.worker);
      targets.delete(m.id);
    } else if (m.k === 'kvr.cacheInfo') {
      const id = m.id;
      const read = tokenizer
        ? tokenizer.info().then((i) => i.cache as TokenizerCacheGauges | undefined)
        : Promise.resolve(remote?.cacheInfo);
      const cache = read.then(
        (c) => c ?? null,
        () => null,
      );
      void Promise.all([cache, metrics.snapshot()]).then(([c, snapshot]) => send({ k: 'kvr.cacheInfo', id, cache: c, metrics: snapshot }));
    } else if (m.k === 'kvr.close') void close(m.graceMs);
  };
  process.off('message', hold);
  process.on('message', onMessage);
  process.on('disconnect', () => {
    // The primary is gone: no decision can be had. Stop at once.
    lifecycle.abandon();
    process.exit(1);
  });

  /** The listen under way (null before it starts): from then on the cluster may hand this shell connections. */
  let listening: Promise<string> | null = null;
  const close = async (graceMs: number) => {
    if (closing) return;
    closing = true;
    // Told to stop before it listened: it holds nothing.
    if (!listening) process.exit(0);
    await listening.catch(() => {});
    outbox.flush();
    await listener.drain(graceMs);
    await report();
    outbox.flush();
    await Promise.all([tokenizer?.close(), workers.close(), primary.close().catch(() => {})]);
    process.exit(0);
  };

  for (const m of early.splice(0)) onMessage(m);
  listening = listener.listen(config.port, config.host);
  const url = await listening;
  send({ k: 'kvr.listening', url });
}
