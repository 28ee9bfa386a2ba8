/**
 * The request lifecycle, in the core: pure, synchronous, clock-injected. The HTTP server, the simulator (and later the
 * gateway endpoint picker) are shells around this one object, so a simulated decision is the live one.
 *
 *   submit    eligibility (worker-level filters, evaluated now) -> KvRouter.route (exclude, busy, scorers, picker)
 *             -> dispatch | queue (all busy) | reject (precise reason)
 *   queue     re-evaluated from scratch on every try (a worker that left while a request waited is never picked);
 *             tried when load frees up (first token, finish, failure), when the fleet changes, and on tick()
 *   failed    the attempt failed before the engine answered: the attempt is taken back ('retried'), the worker's
 *             breaker counts a failure, the request moves to the next best source without that worker (bounded)
 *   finish    delivered cached tokens to the ledger, the breaker's verdict, load freed
 *   cancel    the client left: queued -> dropped; in flight -> finished as cancelled (the worker is not blamed)
 *   tick      queue timeouts, stale requests, breakers cooling down; call it at nextWakeAt()
 *
 * Every call returns the effects the shell must carry out (send an attempt, answer a refusal, count a finished request),
 * in order. The core never calls back into a shell.
 */
import type { FinishedRequest, KvRouter } from '../router.ts';
import type { KvKnobs, RouteDecision } from '../types.ts';
import type { BreakerOptions, BreakerState } from './breaker.ts';
import { type EligibilityRefusal, eligibility, type WorkerConfig, type WorkerRole, WorkerState } from './fleet.ts';
import { type PinOptions, PinTable } from './pins.ts';
import { FifoQueue } from './queue.ts';

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
  /** Pins of continued state (stored responses) to the worker holding it. Default 100,000 pins of 1 h. */
  readonly pins?: PinOptions;
}

export interface Submission {
  readonly requestId: string;
  readonly model: string;
  /** Prompt token ids; or `seqHashes` + `promptTokens` already computed. */
  readonly tokens?: ArrayLike<number>;
  readonly seqHashes?: BigUint64Array;
  readonly promptTokens?: number;
  readonly cacheSalt?: string | null;
  /** Per-request policy and knob overrides. */
  readonly policy?: string;
  readonly knobs?: Partial<KvKnobs>;
  /** Roles the leg accepts (default: both, decode). */
  readonly roles?: ReadonlySet<WorkerRole>;
  /** Source keys the request is restricted to (a gateway's endpoint subset). */
  readonly subset?: ReadonlySet<string>;
  /** The request continues state pinned under this key (a previous_response_id): it goes where the pin says. */
  readonly pinKey?: string;
}

export type RefusalCode = EligibilityRefusal | 'queue_full' | 'queue_timeout' | 'upstream_failed' | 'duplicate_request' | 'closed';

export interface DispatchAttempt {
  readonly kind: 'dispatch';
  readonly requestId: string;
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
  /** The request followed a pin to this worker. */
  readonly pinned: boolean;
}

export interface DispatchRefusal {
  readonly kind: 'reject';
  readonly requestId: string;
  readonly code: RefusalCode;
  readonly message: string;
  readonly queuedMs: number;
  readonly attempts: number;
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
}

interface Tracked {
  readonly sub: Submission;
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
}

type TryResult = { kind: 'dispatch'; effect: DispatchAttempt } | { kind: 'busy' } | { kind: 'refused'; code: RefusalCode; message: string };

export class Dispatcher {
  private readonly workerStates = new Map<string, WorkerState>();
  private readonly tracked = new Map<string, Tracked>();
  private readonly queue = new FifoQueue<string>();
  private readonly sweepMs: number;
  private nextSweepAt = 0;
  private closed = false;
  readonly pins: PinTable;

  constructor(
    readonly router: KvRouter,
    readonly options: DispatchOptions,
  ) {
    this.sweepMs = options.sweepIntervalMs ?? 10_000;
    this.pins = new PinTable(options.pins ?? { limit: 100_000, ttlMs: 3_600_000 });
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
   * the order workers joined. Nothing is tracked: these requests are not part of the routing accounting.
   */
  passthroughTarget(model: string | null, now: number): { workerId: string } | { code: RefusalCode; message: string } {
    if (this.closed) return { code: 'closed', message: 'the router is shutting down' };
    const el = eligibility(this.workerStates.values(), model === null ? { model: '', anyModel: true } : { model }, now);
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
    if (this.closed) return [reject(id, 'closed', 'the router is shutting down', 0, 0)];
    if (this.tracked.has(id)) return [reject(id, 'duplicate_request', `request id "${id}" is already in flight`, 0, 0)];
    const t: Tracked = { sub, attempts: 0, excluded: new Set(), queuedMs: 0 };
    this.tracked.set(id, t);
    const r = this.tryRoute(t, now);
    if (r.kind === 'dispatch') return [r.effect];
    if (r.kind === 'refused') {
      this.tracked.delete(id);
      return [reject(id, r.code, r.message, 0, 0)];
    }
    if (this.queue.length >= this.options.queueLimit) {
      this.tracked.delete(id);
      return [reject(id, 'queue_full', 'all workers are busy and the queue is full', 0, 0)];
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
    w.inFlight = Math.max(0, w.inFlight - 1);
    w.breaker.failure(requestId, now);
    this.router.finish(requestId, { outcome: 'retried' }, now);
    for (const k of w.sourceKeys) t.excluded.add(k);
    t.lastError = error;
    const out: DispatchEffect[] = [];
    if (t.attempts > this.options.retries) {
      this.tracked.delete(requestId);
      out.push(reject(requestId, 'upstream_failed', `upstream failure: ${error}`, t.queuedMs, t.attempts));
    } else {
      const r = this.tryRoute(t, now);
      if (r.kind === 'dispatch') out.push(r.effect);
      else if (r.kind === 'busy') this.enqueue(t, now, true);
      else {
        this.tracked.delete(requestId);
        out.push(reject(requestId, r.code, r.message, t.queuedMs, t.attempts));
      }
    }
    return this.drain(now, out);
  }

  /** The first output token arrived: its prefill stops counting as load. */
  firstToken(requestId: string, now: number): DispatchEffect[] {
    if (!this.router.firstToken(requestId, now)) return [];
    return this.drain(now);
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
    const f = this.router.finish(requestId, { outcome: report.outcome, cachedTokens: report.cachedTokens }, now);
    const out: DispatchEffect[] = f ? [{ kind: 'finished', request: f }] : [];
    return this.drain(now, out);
  }

  /** The client left. A queued request is dropped; one in flight is finished as cancelled. */
  cancel(requestId: string, now: number): DispatchEffect[] {
    const t = this.tracked.get(requestId);
    if (!t) return [];
    if (t.worker) return this.finish(requestId, { outcome: 'cancelled' }, now);
    this.queue.remove(requestId);
    this.tracked.delete(requestId);
    return [];
  }

  /** Queue timeouts, the stale-request sweep and breakers that cooled down. */
  tick(now: number): DispatchEffect[] {
    const out: DispatchEffect[] = [];
    for (const q of this.queue.expire(now)) {
      const t = this.tracked.get(q.requestId);
      this.tracked.delete(q.requestId);
      const waited = now - q.enqueuedAt + (t?.queuedMs ?? 0);
      out.push(
        reject(q.requestId, 'queue_timeout', `all workers stayed busy for ${this.options.queueTimeoutMs} ms`, waited, t?.attempts ?? 0),
      );
    }
    if (now >= this.nextSweepAt) {
      this.nextSweepAt = now + this.sweepMs;
      for (const id of this.router.sweep(now)) {
        const t = this.tracked.get(id);
        if (!t?.worker) continue;
        this.tracked.delete(id);
        t.worker.inFlight = Math.max(0, t.worker.inFlight - 1);
        t.worker.breaker.release(id);
      }
    }
    return this.drain(now, out);
  }

  /** When tick() next has work: a queue deadline, a breaker reopening for waiting requests, the sweep. */
  nextWakeAt(now: number): number | undefined {
    let at = this.queue.earliestDeadline();
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
    for (const q of [...this.queue.inOrder()]) {
      this.queue.remove(q.requestId);
      const t = this.tracked.get(q.requestId);
      this.tracked.delete(q.requestId);
      out.push(reject(q.requestId, 'closed', 'the router is shutting down', now - q.enqueuedAt, t?.attempts ?? 0));
    }
    return out;
  }

  get queueLength(): number {
    return this.queue.length;
  }

  /** Requests admitted and not finished (queued or in flight). */
  get pending(): number {
    return this.tracked.size;
  }

  state(now: number): {
    queue: { length: number; limit: number; timeoutMs: number };
    workers: Array<{
      id: string;
      role: WorkerRole;
      healthy: boolean;
      breaker: ReturnType<WorkerState['breaker']['toJSON']>;
      inFlight: number;
    }>;
  } {
    return {
      queue: { length: this.queue.length, limit: this.options.queueLimit, timeoutMs: this.options.queueTimeoutMs },
      workers: this.workers().map((w) => {
        w.breaker.state(now);
        return { id: w.id, role: w.role, healthy: w.healthy, breaker: w.breaker.toJSON(), inFlight: w.inFlight };
      }),
    };
  }

  // ------------------------------------------------------------------------------------------ internals

  private enqueue(t: Tracked, now: number, front: boolean): void {
    t.enqueuedAt = now;
    this.queue.push(
      { requestId: t.sub.requestId, value: t.sub.requestId, enqueuedAt: now, deadline: now + this.options.queueTimeoutMs },
      front,
    );
  }

  /** The whole pipeline for one try, at this moment: worker filters, then the router's filters, scorers and picker. */
  private tryRoute(t: Tracked, now: number): TryResult {
    const sub = t.sub;
    // A pin to a worker that left the fleet is void (its state left with it): the request routes like any other.
    const pinned = sub.pinKey !== undefined ? this.pins.lookup(sub.pinKey, now) : undefined;
    const el = eligibility(this.workerStates.values(), { model: sub.model, roles: sub.roles, subset: sub.subset, pinned }, now);
    if (el.kind === 'ineligible') return { kind: 'refused', code: el.reason, message: el.message };
    const result = this.router.route(
      {
        requestId: sub.requestId,
        tokens: t.seqHashes ? undefined : sub.tokens,
        seqHashes: t.seqHashes ?? sub.seqHashes,
        promptTokens: t.promptTokens ?? sub.promptTokens,
        loraName: el.loraName,
        cacheSalt: sub.cacheSalt,
        policy: sub.policy,
        knobs: sub.knobs,
        allow: el.allow,
        exclude: t.excluded,
      },
      now,
    );
    if (result.kind === 'refused') {
      if (result.seqHashes) {
        t.seqHashes = result.seqHashes;
        t.promptTokens = result.promptTokens;
      }
      if (result.reason === 'all_busy') return { kind: 'busy' };
      if (result.reason === 'duplicate_request')
        return { kind: 'refused', code: 'duplicate_request', message: 'request id already routed' };
      // Every eligible source was excluded by earlier failed attempts (or vanished): nothing left to try.
      return { kind: 'refused', code: 'upstream_failed', message: `upstream failure: ${t.lastError ?? 'no source left to try'}` };
    }
    const w = el.workers.get(result.source.workerId)!;
    t.seqHashes = result.seqHashes;
    t.promptTokens = result.promptTokens;
    t.worker = w;
    w.inFlight++;
    const trial = w.breaker.reserve(sub.requestId, now);
    const attempt = t.attempts++;
    const queuedMs = t.queuedMs + (t.enqueuedAt !== undefined ? now - t.enqueuedAt : 0);
    t.queuedMs = queuedMs;
    t.enqueuedAt = undefined;
    return {
      kind: 'dispatch',
      effect: {
        kind: 'dispatch',
        requestId: sub.requestId,
        attempt,
        decision: result,
        workerId: w.id,
        trial,
        queuedMs,
        pinned: pinned !== undefined,
        ...(attempt > 0 && t.lastError ? { previousError: t.lastError } : {}),
      },
    };
  }

  /** Tries the queue in order while the head routes; requests that can no longer be served are refused. */
  private drain(now: number, out: DispatchEffect[] = []): DispatchEffect[] {
    const items = this.queue.inOrder();
    const i = 0;
    while (i < items.length) {
      const item = items[i];
      const t = this.tracked.get(item.requestId);
      if (!t) {
        this.queue.remove(item.requestId);
        continue;
      }
      const r = this.tryRoute(t, now);
      if (r.kind === 'busy') break; // strict FIFO: the head waits, and so does everyone behind it
      this.queue.remove(item.requestId);
      if (r.kind === 'dispatch') out.push(r.effect);
      else {
        this.tracked.delete(item.requestId);
        out.push(reject(item.requestId, r.code, r.message, t.queuedMs + (now - item.enqueuedAt), t.attempts));
      }
    }
    return out;
  }
}

function reject(requestId: string, code: RefusalCode, message: string, queuedMs: number, attempts: number): DispatchRefusal {
  return { kind: 'reject', requestId, code, message, queuedMs, attempts };
}
