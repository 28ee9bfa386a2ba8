/**
 * The request lifecycle, in the core: pure, synchronous, clock-injected. The HTTP server, the simulator (and later the
 * gateway endpoint picker) are shells around this one object, so a simulated decision is the live one.
 *
 *   submit    token budget of the tenant -> eligibility (worker-level filters, evaluated now) -> KvRouter.route
 *             (exclude, busy, scorers, picker, session affinity) -> dispatch | queue (all busy) | shed (a sheddable
 *             band at a saturated fleet) | reject (precise reason; a TTFT deadline that cannot be met is refused early)
 *   queue     flow control (src/core/dispatch/flow.ts: priority bands, fair queuing across tenants, FCFS or EDF,
 *             TTL per band), re-evaluated from scratch on every try (a worker that left while a request waited is never
 *             picked); tried when load frees up (first token, finish, failure), when the fleet changes, and on tick()
 *   failed    the attempt failed before the engine answered: the attempt is taken back ('retried'), the worker's
 *             breaker counts a failure, the request moves to the next best source without that worker (bounded)
 *   finish    delivered cached tokens to the ledger, the breaker's verdict, load freed
 *   cancel    the client left: queued -> dropped; in flight -> finished as cancelled (the worker is not blamed)
 *   tick      queue timeouts, stale requests, breakers cooling down; call it at nextWakeAt()
 *
 * Disaggregated prefill/decode (a fleet with prefill workers for the model): the decode leg is routed first on the
 * decode pool (pd-decode); when the uncached part of the prompt on that worker is at most `pd.minUncachedTokens`, or the
 * request has several sequences (n > 1, several prompts: one handoff cannot serve them), it is served there alone
 * (path decode_rule); otherwise the prefill leg is routed on the prefill pool of the same engine flavour (pd-prefill) and
 * the attempt carries both legs (path disaggregated). No usable prefill worker: decode alone (decode_fallback).
 *
 *   prefillDone     the prefill answered: its load drops; its record (and delivered cached tokens) closes when the
 *                   decode side has the KV (the decode's first token), so leased blocks count until pulled
 *   prefillFailed   the prefill failed before answering: a new prefill leg elsewhere (bounded by retries), else decode alone
 *   failed          the decode leg failed before answering: both legs taken back, a new pair (vLLM: the old lease is gone)
 *   cancel          both legs finished as cancelled
 * The ledger counts the prefill leg of a disaggregated request (the prefix hit that matters) and the decode leg only
 * when it is served alone. Paths, fallbacks and handoff failures are counted in `pdStats`.
 *
 * Every call returns the effects the shell must carry out (send an attempt, answer a refusal, count a finished request),
 * in order. The core never calls back into a shell.
 */
import type { FinishedRequest, KvRouter } from '../router.ts';
import { PD_DECODE_POLICY } from '../scheduling/policies.ts';
import {
  DisaggLegs,
  type LegTracked,
  type PdOptions,
  type PdPath,
  type PdStats,
  type PrefillLeg,
  type PrefillReport,
  type PrefillState,
} from './disagg-legs.ts';

export {
  HANDOFF_FAILURES,
  type HandoffFailure,
  PD_PATHS,
  type PdOptions,
  type PdPath,
  type PdStats,
  type PrefillLeg,
  type PrefillReport,
} from './disagg-legs.ts';
import type { KvKnobs, MmItem, RouteDecision } from '../types.ts';
import type { BreakerOptions, BreakerState } from './breaker.ts';
import { type EligibilityRefusal, eligibility, hashLoraOf, type WorkerRole } from '../scheduling/filters.ts';
import { type EngineFlavor, type WorkerConfig, WorkerState } from './worker-state.ts';
import { type PinOptions, PinTable } from './pins.ts';
import { TokenBudgets } from './budget.ts';
import { type FlowItem, type FlowOptions, FlowQueue } from './flow.ts';
import { type SessionEntry, SessionTable } from './sessions.ts';

export interface DispatchOptions {
  /** Requests allowed to wait while every eligible source is busy; beyond: queue_full. */
  readonly queueLimit: number;
  /** Longest wait in the queue, ms; beyond: queue_timeout. */
  readonly queueTimeoutMs: number;
  /** Further attempts on other workers after one fails before answering. */
  readonly retries: number;
  readonly breaker: BreakerOptions;
  /** Period of the stale-request sweep, ms. Default 10 s. */
  readonly sweepIntervalMs?: number;
  /** Disaggregated prefill/decode. */
  readonly pd?: PdOptions;
  /** Pins of continued state (stored responses) to the worker holding it. Default 100,000 pins of 1 h. */
  readonly pins?: PinOptions;
  /** Priority bands, fair queuing across tenants (docs/flow-control.md). Default: one band, fair across tenants. */
  readonly flow?: FlowOptions;
  /** Tokens per minute by tenant (`*`: every other tenant); unlimited when absent. */
  readonly tokenBudgets?: Readonly<Record<string, number>>;
  /** Session affinity: TTL after last use, table size, and the bounded-load factor. */
  readonly sessions?: { readonly ttlMs?: number; readonly capacity?: number; readonly maxBytes?: number; readonly loadFactor?: number };
  /**
   * Prefill throughput per source for TTFT estimates (tokens per second) before enough first tokens were seen to learn
   * it; 0 or absent: deadlines are judged only once learned.
   */
  readonly prefillTokensPerSecond?: number;
}

/** Tenant of requests that name none. */
export const DEFAULT_TENANT = 'default';

export interface Submission {
  readonly requestId: string;
  readonly model: string;
  /** Prompt token ids; or `seqHashes` + `promptTokens` already computed. */
  readonly tokens?: ArrayLike<number>;
  readonly seqHashes?: BigUint64Array;
  readonly promptTokens?: number;
  readonly cacheSalt?: string | null;
  /** Image / audio items of the prompt (their placeholders are in `tokens`): hashed into their blocks' keys. */
  readonly mmItems?: readonly MmItem[];
  /** Per-request policy and knob overrides. */
  readonly policy?: string;
  readonly knobs?: Partial<KvKnobs>;
  /** Roles the leg accepts (default: both, decode). */
  readonly roles?: ReadonlySet<WorkerRole>;
  /** Source keys the request is restricted to (a gateway's endpoint subset). */
  readonly subset?: ReadonlySet<string>;
  /** Sequences the request asks for (n × prompts). More than one cannot share one handoff: served on decode alone. */
  readonly sequences?: number;
  /** Why this request cannot be handed over between a prefill and a decode worker at all (e.g. 'api'): decode alone. */
  readonly noHandoff?: string;
  /** The request continues state pinned under this key (a previous_response_id): it goes where the pin says. */
  readonly pinKey?: string;
  /** Who is asking (the API key's name, or a header); default `default`. */
  readonly tenant?: string;
  /** Lower runs first (vLLM's meaning). Default 0. */
  readonly priority?: number;
  /** The client's TTFT objective, ms from submission: refused early when it can no longer be met. */
  readonly sloTtftMs?: number;
  /** Session id: the request prefers the source its session last used. */
  readonly sessionId?: string;
}

export type RefusalCode =
  | EligibilityRefusal
  | 'queue_full'
  | 'queue_timeout'
  | 'shed'
  | 'token_budget_exceeded'
  | 'deadline_unmeetable'
  | 'upstream_failed'
  | 'duplicate_request'
  | 'closed';

/** What happened to a request's session on this attempt (for metrics and replicas). */
export interface SessionOutcome {
  readonly id: string;
  /** new: first request of the session (or it expired); kept: its source again; moved: elsewhere, `reason` says why. */
  readonly outcome: 'new' | 'kept' | 'moved';
  readonly reason?: 'overloaded' | 'unavailable';
  readonly entry: SessionEntry;
}

export interface DispatchAttempt {
  readonly kind: 'dispatch';
  readonly requestId: string;
  /** The model the request asked for (its submission's). */
  readonly model: string;
  /** 0 for the first attempt, then 1, 2, ... for retries. */
  readonly attempt: number;
  readonly decision: RouteDecision;
  readonly workerId: string;
  /** This attempt is the half-open breaker's one trial on the worker. */
  readonly trial: boolean;
  /** Time spent queued before this attempt, ms (0 when it never waited). */
  readonly queuedMs: number;
  /** Why the previous attempt failed (retries only). */
  readonly previousError?: string;
  /** How the request is served; the decision above is the decode (or only) leg. */
  readonly path: PdPath;
  /** The prefill leg, when disaggregated: send it first (vLLM) or together with the decode leg (SGLang). */
  readonly prefill?: PrefillLeg;
  /** The engine flavour of the worker(s): the handoff protocol. */
  readonly engine: EngineFlavor;
  /** The request followed a pin to this worker. */
  readonly pinned: boolean;
  readonly tenant: string;
  /** The request's band (flow control). */
  readonly band: string;
  readonly session?: SessionOutcome;
}

export interface DispatchRefusal {
  readonly kind: 'reject';
  readonly requestId: string;
  readonly code: RefusalCode;
  readonly message: string;
  readonly queuedMs: number;
  readonly attempts: number;
  readonly tenant: string;
  readonly band: string;
  /** When retrying can help: how long to wait, ms. */
  readonly retryAfterMs?: number;
}

export interface DispatchFinished {
  readonly kind: 'finished';
  readonly request: FinishedRequest;
}

export type DispatchEffect = DispatchAttempt | DispatchRefusal | DispatchFinished;

export interface FinishReport {
  readonly outcome: 'ok' | 'error' | 'cancelled';
  /** usage.prompt_tokens_details.cached_tokens; undefined when the engine did not say (unknown, not zero). */
  readonly cachedTokens?: number;
  /** The worker is to blame (a broken stream); an engine's 4xx answer is the request's fault, not the worker's. */
  readonly workerFault?: boolean;
  /** State the engine stored under this key (a response id): later requests naming it are pinned to this worker. */
  readonly pinKey?: string;
  /** Generated tokens (charged to the tenant's token budget). */
  readonly outputTokens?: number;
}

interface Tracked extends LegTracked {
  /** Without its token ids once the first routing hashed them (keepHashes). */
  sub: Submission;
  /** Attempts dispatched so far. */
  attempts: number;
  readonly excluded: Set<string>;
  /** Hashes of the first routing, reused by later tries (no re-hashing while queued or retried). */
  seqHashes?: BigUint64Array;
  promptTokens?: number;
  enqueuedAt?: number;
  queuedMs: number;
  worker?: WorkerState;
  lastError?: string;
  path?: PdPath;
  /** The decode (or only) leg's decision of the attempt in flight. */
  decision?: RouteDecision;
  prefill?: PrefillState;
  /** The decode leg produced its first token (the KV is on the decode side). */
  decodeStarted: boolean;
  prefillAttempts: number;
  /** Prefill sources excluded by failed prefill legs. */
  readonly prefillExcluded: Set<string>;
  /** The source of the current attempt. */
  sourceKey?: string;
  readonly tenant: string;
  readonly priority: number;
  readonly band: string;
  /** Absolute TTFT deadline. */
  readonly deadline?: number;
  /** For the prefill-rate estimate: when the attempt was sent, prefill queued ahead of it there, its own prefill. */
  dispatchedAt?: number;
  prefillAhead?: number;
  ownPrefill?: number;
  /** The session outcome of the current attempt. */
  session?: SessionOutcome;
  /** The current attempt followed a pin. */
  pinned?: boolean;
  /** Source keys one try is restricted to (the worker a gateway's proxy really sent the request to). */
  only?: ReadonlySet<string>;
}

/**
 * The first routing's hashes stand for the prompt in every later try (queued, retried, a prefill leg): the token ids
 * are let go, so a request in flight or queued holds no copy of its prompt (a 2,048-id array, or a long chat's ids) for
 * the garbage collector to copy and promote while its answer is under way.
 */
function keepHashes(t: Tracked, seqHashes: BigUint64Array, promptTokens: number | undefined): void {
  t.seqHashes = seqHashes;
  t.promptTokens = promptTokens;
  // (The queue's cost falls back to the ids' count without a prompt length: they stay then.)
  if (t.sub.tokens !== undefined && promptTokens !== undefined) t.sub = { ...t.sub, tokens: undefined };
}

type TryResult =
  | { kind: 'dispatch'; effect: DispatchAttempt }
  | { kind: 'busy' }
  | { kind: 'refused'; code: RefusalCode; message: string; retryAfterMs?: number };

/** Prefill throughput learned per source from first tokens: an EWMA of tokens per ms. */
class PrefillRates {
  private readonly rates = new Map<string, { rate: number; samples: number }>();
  private fleet = { rate: 0, samples: 0 };

  constructor(private readonly priorPerMs: number) {}

  observe(sourceKey: string, tokens: number, elapsedMs: number): void {
    if (!(tokens > 0) || !(elapsedMs > 0)) return;
    const sample = tokens / elapsedMs;
    const cur = this.rates.get(sourceKey) ?? { rate: sample, samples: 0 };
    cur.rate = cur.samples === 0 ? sample : 0.8 * cur.rate + 0.2 * sample;
    cur.samples++;
    this.rates.set(sourceKey, cur);
    this.fleet = { rate: this.fleet.samples === 0 ? sample : 0.8 * this.fleet.rate + 0.2 * sample, samples: this.fleet.samples + 1 };
  }

  /** Tokens per ms for a source (its own, else the fleet's, else the prior); 0 when unknown. */
  rateOf(sourceKey?: string): number {
    const own = sourceKey ? this.rates.get(sourceKey) : undefined;
    if (own && own.samples >= 3) return own.rate;
    if (this.fleet.samples >= 3) return this.fleet.rate;
    return this.priorPerMs;
  }
}

export class Dispatcher {
  private readonly workerStates = new Map<string, WorkerState>();
  private readonly tracked = new Map<string, Tracked>();
  private readonly queue: FlowQueue;
  private readonly budgets: TokenBudgets;
  readonly sessions: SessionTable;
  private readonly sessionLoadFactor: number;
  private readonly rates: PrefillRates;
  private readonly sweepMs: number;
  private nextSweepAt = 0;
  private closed = false;
  private readonly legs: DisaggLegs;
  /** Paths and handoff failures of disaggregated requests (disagg-legs.ts). */
  readonly pdStats: PdStats;
  readonly pins: PinTable;

  constructor(
    readonly router: KvRouter,
    readonly options: DispatchOptions,
  ) {
    this.sweepMs = options.sweepIntervalMs ?? 10_000;
    this.legs = new DisaggLegs(router, this.workerStates, options.pd?.minUncachedTokens ?? 0, options.pd?.prefillPolicy);
    this.pdStats = this.legs.stats;
    this.pins = new PinTable(options.pins ?? { limit: 100_000, ttlMs: 3_600_000 });
    this.queue = new FlowQueue(options.flow);
    this.budgets = new TokenBudgets(options.tokenBudgets ?? {});
    this.sessions = new SessionTable(
      options.sessions?.ttlMs ?? 600_000,
      options.sessions?.capacity ?? 100_000,
      options.sessions?.maxBytes ?? Number.POSITIVE_INFINITY,
    );
    this.sessionLoadFactor = options.sessions?.loadFactor ?? 0.5;
    this.rates = new PrefillRates((options.prefillTokensPerSecond ?? 0) / 1000);
  }

  /** The name of the band a priority falls in. */
  bandOf(priority: number): string {
    return this.queue.bands[this.queue.bandOf(priority)].name;
  }

  /** The flow-control bands, in the order they are served. */
  get bands(): readonly string[] {
    return this.queue.bands.map((b) => b.name);
  }

  // ------------------------------------------------------------------------------------------ the fleet

  /** Adds a worker: its ranks become router sources. Throws when the id exists (a configuration error). */
  addWorker(config: WorkerConfig, now: number): DispatchEffect[] {
    if (this.workerStates.has(config.id)) throw new Error(`worker "${config.id}" already exists`);
    const w = new WorkerState(config, this.options.breaker);
    this.workerStates.set(w.id, w);
    for (let r = 0; r < w.sourceKeys.length; r++) {
      this.router.addSource({ workerId: w.id, dpRank: r }, { mode: config.mode, capacityBlocks: config.capacityBlocks });
    }
    return this.drain(now);
  }

  /** Removes a worker: its sources leave the router (blocks, overlay, load). Requests in flight there finish on their own. */
  removeWorker(id: string, now: number): DispatchEffect[] | null {
    const w = this.workerStates.get(id);
    if (!w) return null;
    this.workerStates.delete(id);
    this.router.removeWorker(id);
    this.pins.dropWorker(id);
    return this.drain(now);
  }

  /** Health probe verdicts from the shell. */
  setHealthy(id: string, healthy: boolean, now: number): DispatchEffect[] {
    const w = this.workerStates.get(id);
    if (!w || w.healthy === healthy) return [];
    w.healthy = healthy;
    return this.drain(now);
  }

  /**
   * The adapter a submission's blocks would be hashed with if it were routed now (null: none). A submission that comes
   * with `seqHashes` computed elsewhere (an HTTP shell of `serve --processes`) is routed with them as they are: its
   * sender checks they were seeded with this one first.
   */
  hashLoraOf(sub: Pick<Submission, 'model' | 'roles' | 'pinKey'>, now: number): string | null {
    const pinned = sub.pinKey !== undefined ? this.pins.peek(sub.pinKey, now) : undefined;
    return hashLoraOf(this.workerStates.values(), { model: sub.model, roles: sub.roles, pinned }, now);
  }

  /** Models and adapters discovered from the engine (ignored when the configuration names the models). */
  setModels(id: string, models: Iterable<string>, adapters: Iterable<string>, now: number): DispatchEffect[] {
    const w = this.workerStates.get(id);
    if (!w || w.fixedModels) return [];
    w.models = new Set(models);
    w.adapters = new Set(adapters);
    return this.drain(now);
  }

  /** KV capacity the engine reported, per rank (ignored when the configuration gives blocks=). */
  learnCapacity(id: string, capacityBlocks: number): boolean {
    const w = this.workerStates.get(id);
    if (!w || w.fixedCapacity || !(capacityBlocks > 0)) return false;
    for (const k of w.sourceKeys) this.router.setCapacity(k, capacityBlocks);
    return true;
  }

  worker(id: string): WorkerState | undefined {
    return this.workerStates.get(id);
  }

  workers(): WorkerState[] {
    return [...this.workerStates.values()];
  }

  /** The breaker state of a worker as of now (an open breaker past its cooldown reads half-open). */
  breakerState(id: string, now: number): BreakerState | undefined {
    return this.workerStates.get(id)?.breaker.state(now);
  }

  // ------------------------------------------------------------------------------------------ requests

  /**
   * The worker a request that needs no prefix affinity goes to (a pass-through: /tokenize, /detokenize, other engine
   * paths): the worker-level filters for its model (any model when null), then the fewest requests in flight, ties by
   * the order workers joined; only sources in `subset` when given (a gateway's endpoint subset). Nothing is tracked:
   * these requests are not part of the routing accounting.
   */
  passthroughTarget(
    model: string | null,
    now: number,
    subset?: ReadonlySet<string>,
  ): { workerId: string } | { code: RefusalCode; message: string } {
    if (this.closed) return { code: 'closed', message: 'the router is shutting down' };
    const el = eligibility(this.workerStates.values(), model === null ? { model: '', anyModel: true, subset } : { model, subset }, now);
    if (el.kind === 'ineligible') return { code: el.reason, message: el.message };
    let best: WorkerState | undefined;
    for (const w of el.workers.values()) if (!best || w.inFlight < best.inFlight) best = w;
    return { workerId: best!.id };
  }

  /** A cheap check before the shell spends time tokenizing: would this model be refused right now? */
  precheck(model: string, now: number, roles?: ReadonlySet<WorkerRole>): { code: RefusalCode; message: string } | null {
    if (this.closed) return { code: 'closed', message: 'the router is shutting down' };
    const el = eligibility(this.workerStates.values(), { model, roles }, now);
    return el.kind === 'ineligible' ? { code: el.reason, message: el.message } : null;
  }

  submit(sub: Submission, now: number): DispatchEffect[] {
    const id = sub.requestId;
    const tenant = sub.tenant || DEFAULT_TENANT;
    const priority = sub.priority ?? 0;
    const band = this.queue.bands[this.queue.bandOf(priority)];
    const refuse = (code: RefusalCode, message: string, retryAfterMs?: number): DispatchEffect[] => [
      {
        kind: 'reject',
        requestId: id,
        code,
        message,
        queuedMs: 0,
        attempts: 0,
        tenant,
        band: band.name,
        ...(retryAfterMs !== undefined ? { retryAfterMs } : {}),
      },
    ];
    if (this.closed) return refuse('closed', 'the router is shutting down');
    if (this.tracked.has(id)) return refuse('duplicate_request', `request id "${id}" is already in flight`);
    const promptTokens = sub.promptTokens ?? sub.tokens?.length ?? 0;
    const budget = this.budgets.admit(tenant, promptTokens, now);
    if (!budget.ok) {
      return refuse(
        'token_budget_exceeded',
        `tenant "${tenant}" used its budget of ${this.budgets.limitOf(tenant)} tokens per minute; retry later`,
        budget.retryAfterMs,
      );
    }
    const t: Tracked = {
      sub,
      attempts: 0,
      excluded: new Set(),
      queuedMs: 0,
      decodeStarted: false,
      prefillAttempts: 0,
      prefillExcluded: new Set(),
      tenant,
      priority,
      band: band.name,
      ...(sub.sloTtftMs !== undefined ? { deadline: now + sub.sloTtftMs } : {}),
    };
    this.tracked.set(id, t);
    const r = this.tryRoute(t, now);
    if (r.kind === 'dispatch') {
      const late = this.lateBy(t, r.effect, now);
      if (late === undefined) return [r.effect];
      this.takeBack(t, now);
      this.untrack(t);
      return refuse('deadline_unmeetable', `the TTFT objective of ${sub.sloTtftMs} ms cannot be met (about ${Math.round(late)} ms late)`);
    }
    if (r.kind === 'refused') {
      this.untrack(t);
      return refuse(r.code, r.message, r.retryAfterMs);
    }
    // Saturated: shed, refuse a deadline that waiting cannot meet, or wait.
    if (band.sheddable) {
      this.untrack(t);
      return refuse('shed', `the fleet is saturated and band "${band.name}" is sheddable; retry later`, 1000);
    }
    if (this.unmeetable(t, now)) {
      this.untrack(t);
      return refuse('deadline_unmeetable', `the TTFT objective of ${sub.sloTtftMs} ms cannot be met: every worker is busy`);
    }
    if (this.queue.length >= this.options.queueLimit) {
      this.untrack(t);
      return refuse('queue_full', 'all workers are busy and the queue is full', 1000);
    }
    this.enqueue(t, now, false);
    return [];
  }

  /** The attempt failed before the engine answered (connection error, 5xx, timeout): retry elsewhere or give up. */
  failed(requestId: string, error: string, now: number): DispatchEffect[] {
    const t = this.tracked.get(requestId);
    if (!t?.worker) return [];
    const w = t.worker;
    t.worker = undefined;
    t.sourceKey = undefined;
    w.inFlight = Math.max(0, w.inFlight - 1);
    w.breaker.failure(requestId, now);
    this.router.finish(requestId, { outcome: 'retried' }, now);
    if (t.prefill) {
      // The decode side failed: the prefill's lease (vLLM) or its bootstrap room (SGLang) is lost with it. The prefill
      // worker did its part and is not blamed; the whole pair is routed again.
      this.pdStats.handoffFailures.decode_failed++;
      this.legs.drop(t, 'retried');
    }
    for (const k of w.sourceKeys) t.excluded.add(k);
    t.lastError = error;
    const out: DispatchEffect[] = [];
    if (t.attempts > this.options.retries) {
      this.tracked.delete(requestId);
      out.push(this.reject(t, 'upstream_failed', `upstream failure: ${error}`, now));
    } else {
      const r = this.tryRoute(t, now);
      if (r.kind === 'dispatch') out.push(r.effect);
      else if (r.kind === 'busy') this.enqueue(t, now, true);
      else {
        this.tracked.delete(requestId);
        out.push(this.reject(t, r.code, r.message, now, r.retryAfterMs));
      }
    }
    return this.drain(now, out);
  }

  /**
   * A gateway's proxy sent the attempt to another worker than the one picked (one of the fallbacks the picker listed,
   * after the pick failed to connect): the attempt is taken back as a failure of the picked worker (its breaker
   * counts it) and the request is routed again on `workerId` alone, so load, ledger and metrics count it where it is
   * served. Returns the new attempt (its effect), or a refusal when that worker cannot take it in the core's view
   * (busy, ineligible): the request is then no longer tracked (it runs uncounted). A disaggregated attempt is left as
   * it is (its prefill leg is done; the decode side pulls the KV wherever it runs), as is any attempt of a P/D fleet: no
   * effect.
   */
  servedElsewhere(requestId: string, workerId: string, error: string, now: number): DispatchEffect[] {
    const t = this.tracked.get(requestId);
    const target = this.workerStates.get(workerId);
    if (!t?.worker || t.path !== 'aggregated' || t.worker.id === workerId) return [];
    const w = t.worker;
    t.worker = undefined;
    t.sourceKey = undefined;
    w.inFlight = Math.max(0, w.inFlight - 1);
    w.breaker.failure(requestId, now);
    this.router.finish(requestId, { outcome: 'retried' }, now);
    for (const k of w.sourceKeys) t.excluded.add(k);
    t.lastError = error;
    const out: DispatchEffect[] = [];
    if (!target) {
      this.tracked.delete(requestId);
      out.push(this.reject(t, 'upstream_failed', `served by ${workerId}, which is not in the fleet`, now));
      return this.drain(now, out);
    }
    t.only = new Set(target.sourceKeys);
    const r = this.tryRoute(t, now);
    t.only = undefined;
    if (r.kind === 'dispatch') out.push(r.effect);
    else {
      this.tracked.delete(requestId);
      const why = r.kind === 'busy' ? `${workerId} is busy` : r.message;
      out.push(this.reject(t, 'upstream_failed', `served by ${workerId}, not routable there: ${why}`, now));
    }
    return this.drain(now, out);
  }

  /** The first output token arrived: its prefill stops counting as load. */
  firstToken(requestId: string, now: number): DispatchEffect[] {
    const first = this.router.firstTokenPending(requestId);
    if (!this.router.firstToken(requestId, now)) return [];
    const t = this.tracked.get(requestId);
    if (first && t?.worker && t.dispatchedAt !== undefined) {
      this.rates.observe(t.sourceKey ?? '', (t.prefillAhead ?? 0) + (t.ownPrefill ?? 0), now - t.dispatchedAt);
    }
    const out: DispatchEffect[] = [];
    if (t && !t.decodeStarted) {
      t.decodeStarted = true;
      if (t.prefill) {
        this.pdStats.transferredTokens += t.promptTokens ?? 0;
        // The decode side holds the KV now: the prefill worker's leased blocks are free.
        if (t.prefill.done) this.closePrefill(t, 'ok', now, out);
      }
    }
    return this.drain(now, out);
  }

  /** The prefill leg answered (the KV is computed and, for vLLM, leased until the decode side pulls it). */
  prefillDone(requestId: string, report: PrefillReport, now: number): DispatchEffect[] {
    const t = this.tracked.get(requestId);
    const p = t?.prefill;
    if (!t || !p || p.done) return [];
    p.done = true;
    p.cachedTokens = report.cachedTokens;
    if (report.transferParams === false) this.pdStats.handoffFailures.no_kv_transfer_params++;
    this.router.firstToken(p.leg.legId, now);
    p.worker.breaker.success(p.leg.legId);
    const out: DispatchEffect[] = [];
    if (t.decodeStarted) this.closePrefill(t, 'ok', now, out);
    return this.drain(now, out);
  }

  /**
   * The prefill leg failed before answering: a new prefill leg on another prefill worker (bounded by retries), or the
   * request is served on its decode worker alone. The decode leg keeps its worker (it did nothing wrong).
   */
  prefillFailed(requestId: string, error: string, now: number): DispatchEffect[] {
    const t = this.tracked.get(requestId);
    const p = t?.prefill;
    if (!t || !p || p.done || !t.worker) return [];
    this.pdStats.handoffFailures.prefill_failed++;
    p.worker.breaker.failure(p.leg.legId, now);
    for (const k of p.worker.sourceKeys) t.prefillExcluded.add(k);
    this.legs.drop(t, 'retried');
    t.lastError = error;
    const out: DispatchEffect[] = [];
    const w = t.worker;
    const decision = this.currentDecision(t);
    let leg: PrefillState | undefined;
    let cause = 'prefill_retries_exhausted';
    if (t.prefillAttempts <= this.options.retries && decision) {
      const r = this.legs.routePrefill(t, w.engine, now);
      if (r.kind === 'routed') leg = r.state;
      else cause = r.kind === 'busy' ? 'prefill_busy' : r.cause;
    }
    if (!decision) return this.drain(now, out);
    if (leg) {
      this.pdStats.prefillRetries++;
      t.prefill = leg;
      out.push(this.attemptEffect(t, w, decision, t.attempts - 1, false, 'disaggregated'));
    } else {
      this.router.account(requestId);
      t.path = 'decode_fallback';
      this.legs.countDecodeOnly(cause);
      out.push(this.attemptEffect(t, w, decision, t.attempts - 1, false, 'decode_fallback'));
    }
    return this.drain(now, out);
  }

  finish(requestId: string, report: FinishReport, now: number): DispatchEffect[] {
    const t = this.tracked.get(requestId);
    if (!t?.worker) return [];
    this.tracked.delete(requestId);
    const w = t.worker;
    w.inFlight = Math.max(0, w.inFlight - 1);
    if (report.outcome === 'cancelled') w.breaker.release(requestId);
    else if (report.outcome === 'error' && report.workerFault) w.breaker.failure(requestId, now);
    else w.breaker.success(requestId);
    if (report.outcome === 'ok' && report.pinKey) this.pins.pin(report.pinKey, w.id, now);
    if (report.outputTokens) this.budgets.charge(t.tenant, report.outputTokens, now);
    const f = this.router.finish(requestId, { outcome: report.outcome, cachedTokens: report.cachedTokens }, now);
    const out: DispatchEffect[] = f ? [{ kind: 'finished', request: f }] : [];
    if (t.prefill) {
      if (report.outcome === 'cancelled' && !t.decodeStarted) this.pdStats.handoffFailures.cancelled++;
      this.closePrefill(t, t.prefill.done ? 'ok' : 'cancelled', now, out);
    }
    const path = t.path ?? 'aggregated';
    this.pdStats.paths[path]++;
    // The task ends: nothing of the dispatcher's reads its hashes again (the lifecycle's finish listeners, the
    // recorder's among them, ran before this call), so the router may reuse their memory once its own holds end.
    if (t.seqHashes) this.router.releaseHashes(t.seqHashes);
    return this.drain(now, out);
  }

  /** The client left. A queued request is dropped; one in flight is finished as cancelled. */
  cancel(requestId: string, now: number): DispatchEffect[] {
    const t = this.tracked.get(requestId);
    if (!t) return [];
    if (t.worker) return this.finish(requestId, { outcome: 'cancelled' }, now);
    this.queue.remove(requestId);
    this.tracked.delete(requestId);
    if (t.seqHashes) this.router.releaseHashes(t.seqHashes);
    return [];
  }

  /** Queue timeouts, the stale-request sweep and breakers that cooled down. */
  tick(now: number): DispatchEffect[] {
    const out: DispatchEffect[] = [];
    for (const q of this.queue.expire(now)) {
      const t = this.tracked.get(q.requestId);
      if (!t) continue;
      this.tracked.delete(q.requestId);
      const ttl = q.expiresAt - q.enqueuedAt;
      out.push(this.reject(t, 'queue_timeout', `all workers stayed busy for ${ttl} ms`, now));
    }
    if (now >= this.nextSweepAt) {
      this.nextSweepAt = now + this.sweepMs;
      this.sessions.sweep(now);
      for (const id of this.router.sweep(now)) {
        const t = this.tracked.get(id);
        if (!t?.worker) continue;
        this.tracked.delete(id);
        t.worker.inFlight = Math.max(0, t.worker.inFlight - 1);
        t.worker.breaker.release(id);
        if (t.prefill) this.legs.drop(t, 'cancelled');
      }
    }
    return this.drain(now, out);
  }

  /** When tick() next has work: a queue deadline, a breaker reopening for waiting requests, the sweep. */
  nextWakeAt(now: number): number | undefined {
    let at = this.queue.earliestExpiry();
    for (const q of this.queue.inOrder()) {
      const d = this.tracked.get(q.requestId)?.deadline;
      if (d !== undefined && d > now && (at === undefined || d < at)) at = d;
    }
    if (this.queue.length > 0) {
      for (const w of this.workerStates.values()) {
        const r = w.breaker.reopensAt;
        if (r !== undefined && r > now && (at === undefined || r < at)) at = r;
      }
    }
    if (this.tracked.size > 0 && (at === undefined || this.nextSweepAt < at)) at = this.nextSweepAt;
    return at;
  }

  /** Stops admitting; every queued request is refused. */
  close(now: number): DispatchEffect[] {
    this.closed = true;
    const out: DispatchEffect[] = [];
    for (const q of this.queue.inOrder()) {
      this.queue.remove(q.requestId);
      const t = this.tracked.get(q.requestId);
      this.tracked.delete(q.requestId);
      if (t) out.push(this.reject(t, 'closed', 'the router is shutting down', now));
    }
    return out;
  }

  /** A session entry learned from a peer replica. */
  rememberSession(sessionId: string, entry: SessionEntry): void {
    this.sessions.merge(sessionId, entry);
  }

  get queueLength(): number {
    return this.queue.length;
  }

  /** Requests admitted and not finished (queued or in flight). */
  get pending(): number {
    return this.tracked.size;
  }

  state(now: number): {
    queue: { length: number; limit: number; timeoutMs: number; bands: string[]; waiting: ReturnType<FlowQueue['census']> };
    sessions: number;
    workers: Array<{
      id: string;
      role: WorkerRole;
      healthy: boolean;
      breaker: ReturnType<WorkerState['breaker']['toJSON']>;
      inFlight: number;
    }>;
    pd: PdStats;
  } {
    return {
      pd: this.pdStats,
      queue: {
        length: this.queue.length,
        limit: this.options.queueLimit,
        timeoutMs: this.options.queueTimeoutMs,
        bands: [...this.bands],
        waiting: this.queue.census(),
      },
      sessions: this.sessions.size,
      workers: this.workers().map((w) => {
        w.breaker.state(now);
        return { id: w.id, role: w.role, healthy: w.healthy, breaker: w.breaker.toJSON(), inFlight: w.inFlight };
      }),
    };
  }

  /** Waiting requests by band and tenant. */
  census(): ReturnType<FlowQueue['census']> {
    return this.queue.census();
  }

  // ------------------------------------------------------------------------------------------ internals

  private enqueue(t: Tracked, now: number, retry: boolean): void {
    t.enqueuedAt = now;
    const band = this.queue.bands[this.queue.bandOf(t.priority)];
    const item: FlowItem = {
      requestId: t.sub.requestId,
      tenant: t.tenant,
      priority: t.priority,
      cost: t.promptTokens ?? t.sub.promptTokens ?? t.sub.tokens?.length ?? 1,
      enqueuedAt: now,
      expiresAt: now + (band.ttlMs ?? this.options.queueTimeoutMs),
      ...(t.deadline !== undefined ? { deadline: t.deadline } : {}),
      seq: this.queue.nextSeq(),
    };
    this.queue.push(item, retry);
  }

  /** A request refused at submission leaves: the router may reuse its hashes' memory (route() may have computed them). */
  private untrack(t: Tracked): void {
    this.tracked.delete(t.sub.requestId);
    if (t.seqHashes) this.router.releaseHashes(t.seqHashes);
  }

  /** Every refusal ends the request's task (its entry already left `tracked`): the router may reuse its hashes' memory. */
  private reject(t: Tracked, code: RefusalCode, message: string, now: number, retryAfterMs?: number): DispatchRefusal {
    if (t.seqHashes) this.router.releaseHashes(t.seqHashes);
    return {
      kind: 'reject',
      requestId: t.sub.requestId,
      code,
      message,
      queuedMs: t.queuedMs + (t.enqueuedAt !== undefined ? now - t.enqueuedAt : 0),
      attempts: t.attempts,
      tenant: t.tenant,
      band: t.band,
      ...(retryAfterMs !== undefined ? { retryAfterMs } : {}),
    };
  }

  /** Undoes a dispatch the dispatcher itself decided against (a deadline the pick cannot meet). */
  private takeBack(t: Tracked, now: number): void {
    const w = t.worker;
    if (!w) return;
    t.worker = undefined;
    w.inFlight = Math.max(0, w.inFlight - 1);
    w.breaker.release(t.sub.requestId);
    if (t.prefill) this.legs.drop(t, 'retried');
    this.router.finish(t.sub.requestId, { outcome: 'retried' }, now);
  }

  /** By how much the attempt's estimated first token misses the request's deadline (undefined: it makes it, or unknown). */
  private lateBy(t: Tracked, a: DispatchAttempt, now: number): number | undefined {
    if (t.deadline === undefined) return undefined;
    const rate = this.rates.rateOf(a.decision.sourceKey);
    if (!(rate > 0)) return undefined;
    const eta = now + ((t.prefillAhead ?? 0) + (t.ownPrefill ?? 0)) / rate;
    return eta > t.deadline ? eta - t.deadline : undefined;
  }

  /** A request that must wait: even on an idle worker its own prefill would finish after its deadline. */
  private unmeetable(t: Tracked, now: number): boolean {
    if (t.deadline === undefined) return false;
    if (now >= t.deadline) return true;
    const rate = this.rates.rateOf();
    return rate > 0 && now + (t.promptTokens ?? 0) / rate > t.deadline;
  }

  /** The whole pipeline for one try, at this moment: worker filters, then the router's filters, scorers and picker. */
  private tryRoute(t: Tracked, now: number): TryResult {
    const sub = t.sub;
    const pd = this.legs.hasPrefillPool(sub.model);
    // A pin to a worker that left the fleet is void (its state left with it): the request routes like any other.
    const pinned = sub.pinKey !== undefined ? this.pins.lookup(sub.pinKey, now) : undefined;
    t.pinned = pinned !== undefined;
    const el = eligibility(this.workerStates.values(), { model: sub.model, roles: sub.roles, subset: t.only ?? sub.subset, pinned }, now);
    if (el.kind === 'ineligible') return { kind: 'refused', code: el.reason, message: el.message };
    const preferred = sub.sessionId ? this.sessions.get(sub.sessionId, now) : undefined;
    const result = this.router.route(
      {
        requestId: sub.requestId,
        tokens: t.seqHashes ? undefined : sub.tokens,
        seqHashes: t.seqHashes ?? sub.seqHashes,
        ...(sub.mmItems && !t.seqHashes ? { mmItems: sub.mmItems } : {}),
        promptTokens: t.promptTokens ?? sub.promptTokens,
        loraName: el.loraName,
        cacheSalt: sub.cacheSalt,
        // The decode leg of a P/D fleet balances decode load and KV memory; an aggregated fleet runs its policy.
        policy: pd ? (this.options.pd?.decodePolicy ?? PD_DECODE_POLICY) : sub.policy,
        knobs: sub.knobs,
        allow: el.allow,
        exclude: t.excluded,
        account: !pd,
        ...(preferred ? { prefer: { sourceKey: preferred, loadFactor: this.sessionLoadFactor } } : {}),
      },
      now,
    );
    if (result.kind === 'refused') {
      if (result.seqHashes) keepHashes(t, result.seqHashes, result.promptTokens);
      if (result.reason === 'all_busy') return { kind: 'busy' };
      if (result.reason === 'duplicate_request')
        return { kind: 'refused', code: 'duplicate_request', message: 'request id already routed' };
      // Every eligible source was excluded by earlier failed attempts (or vanished): nothing left to try.
      return { kind: 'refused', code: 'upstream_failed', message: `upstream failure: ${t.lastError ?? 'no source left to try'}` };
    }
    const w = el.workers.get(result.source.workerId)!;
    keepHashes(t, result.seqHashes, result.promptTokens);
    let path: PdPath = 'aggregated';
    if (pd) {
      const p = this.legs.decodePath(t, result, w.engine, now);
      // Every prefill source is busy: the request waits like any busy one (its decode routing was taken back).
      if (p === 'busy') return { kind: 'busy' };
      path = p;
    }
    t.path = path;
    t.decision = result;
    t.worker = w;
    t.sourceKey = result.sourceKey;
    t.dispatchedAt = now;
    t.prefillAhead = result.candidates[0]?.activePrefillTokens ?? 0;
    t.ownPrefill = Math.max(0, result.promptTokens - result.overlapBlocks * this.router.blockSize);
    w.inFlight++;
    const trial = w.breaker.reserve(sub.requestId, now);
    const attempt = t.attempts++;
    const queuedMs = t.queuedMs + (t.enqueuedAt !== undefined ? now - t.enqueuedAt : 0);
    t.queuedMs = queuedMs;
    t.enqueuedAt = undefined;
    t.session = undefined;
    if (sub.sessionId) {
      const entry = this.sessions.set(sub.sessionId, result.sourceKey, now);
      const outcome = preferred === undefined ? 'new' : preferred === result.sourceKey ? 'kept' : 'moved';
      const reason = outcome === 'moved' && result.affinity !== 'kept' ? result.affinity : undefined;
      t.session = { id: sub.sessionId, outcome, ...(reason ? { reason } : {}), entry };
    }
    return { kind: 'dispatch', effect: this.attemptEffect(t, w, result, attempt, trial, path) };
  }

  private attemptEffect(
    t: Tracked,
    w: WorkerState,
    decision: RouteDecision,
    attempt: number,
    trial: boolean,
    path: PdPath,
  ): DispatchAttempt {
    return {
      kind: 'dispatch',
      requestId: t.sub.requestId,
      model: t.sub.model,
      attempt,
      decision,
      workerId: w.id,
      trial,
      queuedMs: t.queuedMs,
      ...(attempt > 0 && t.lastError ? { previousError: t.lastError } : {}),
      path,
      ...(t.prefill && path === 'disaggregated' ? { prefill: t.prefill.leg } : {}),
      engine: w.engine,
      pinned: t.pinned ?? false,
      tenant: t.tenant,
      band: t.band,
      ...(t.session ? { session: t.session } : {}),
    };
  }

  private currentDecision(t: Tracked): RouteDecision | undefined {
    return t.decision;
  }

  private closePrefill(t: Tracked, outcome: 'ok' | 'cancelled', now: number, out: DispatchEffect[]): void {
    const f = this.legs.close(t, outcome, now);
    if (f) out.push({ kind: 'finished', request: f });
  }

  /**
   * Offers freed capacity to waiting requests in flow-control order; a pass stops at the first that is still busy (it
   * keeps its place: nothing behind it overtakes). Requests that can no longer be served, or can no longer meet their
   * deadline, are refused.
   */
  private drain(now: number, out: DispatchEffect[] = []): DispatchEffect[] {
    if (this.queue.length === 0) return out;
    for (const item of this.queue.inOrder()) {
      const t = this.tracked.get(item.requestId);
      if (!t) {
        this.queue.remove(item.requestId);
        continue;
      }
      if (this.unmeetable(t, now)) {
        this.queue.remove(item.requestId);
        this.tracked.delete(item.requestId);
        out.push(this.reject(t, 'deadline_unmeetable', `the TTFT objective of ${t.sub.sloTtftMs} ms can no longer be met`, now));
        continue;
      }
      const r = this.tryRoute(t, now);
      if (r.kind === 'busy') break;
      this.queue.remove(item.requestId);
      if (r.kind === 'dispatch') {
        this.queue.dispatched(item);
        out.push(r.effect);
      } else {
        this.tracked.delete(item.requestId);
        out.push(this.reject(t, r.code, r.message, now, r.retryAfterMs));
      }
    }
    return out;
  }
}
