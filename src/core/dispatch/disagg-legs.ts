/**
 * The P/D leg machine: for a model with a prefill pool, the decode leg is routed first (pd-decode, by the Dispatcher);
 * then this decides the path: decode alone when the request cannot be handed over (`noHandoff`, n > 1) or its uncached
 * prompt on the decode worker is at most `pd.minUncachedTokens` (decode_rule); otherwise a prefill leg on the prefill
 * pool of the decode worker's engine flavour (pd-prefill), or decode alone when no prefill worker can take it
 * (decode_fallback). It routes, closes and drops prefill legs and counts paths and handoff failures (`stats`).
 */
import type { FinishedRequest, KvRouter } from '../router.ts';
import { eligibility, type WorkerRole } from '../scheduling/filters.ts';
import { PD_PREFILL_POLICY } from '../scheduling/policies.ts';
import type { KvKnobs, RouteDecision } from '../types.ts';
import type { EngineFlavor, WorkerState } from './worker-state.ts';

export interface PdOptions {
  /**
   * Conditional disaggregation: a request whose uncached prompt tokens on its decode worker are at most this many is
   * served there alone (its own prefill). Default 0: every request with an uncached token is disaggregated.
   */
  readonly minUncachedTokens?: number;
  /** Policies of the two legs (default pd-prefill and pd-decode); a peer's P/D routing runs its rule on both. */
  readonly prefillPolicy?: string;
  readonly decodePolicy?: string;
}

/**
 * How a request was served: aggregated (no prefill pool for its model), disaggregated (a prefill and a decode leg),
 * decode_rule (decode alone by the conditional rule), decode_fallback (decode alone: no usable prefill worker).
 */
export type PdPath = 'aggregated' | 'disaggregated' | 'decode_rule' | 'decode_fallback';
export const PD_PATHS: readonly PdPath[] = ['aggregated', 'disaggregated', 'decode_rule', 'decode_fallback'];

/** Why a handoff did not go as planned. */
export type HandoffFailure = 'prefill_failed' | 'no_kv_transfer_params' | 'decode_failed' | 'cancelled';
export const HANDOFF_FAILURES: readonly HandoffFailure[] = ['prefill_failed', 'no_kv_transfer_params', 'decode_failed', 'cancelled'];

export interface PdStats {
  /** Requests finished (served, failed or cancelled), by their final path. */
  readonly paths: Record<PdPath, number>;
  /** Why a request was served on decode alone: short (the rule), sequences (n > 1), or the prefill pool's refusal. */
  readonly decodeOnly: Record<string, number>;
  readonly handoffFailures: Record<HandoffFailure, number>;
  /** Prompt tokens whose KV was handed from a prefill to a decode worker (the decode leg's first token came). */
  transferredTokens: number;
  /** Prefill legs sent again on another prefill worker. */
  prefillRetries: number;
}

/** The prefill leg of a disaggregated attempt. */
export interface PrefillLeg {
  /** The router's id of this leg (the decode leg keeps the request's id). */
  readonly legId: string;
  readonly decision: RouteDecision;
  readonly workerId: string;
  readonly trial: boolean;
  /** 0 for the first prefill leg of the request, then 1, 2, ... */
  readonly attempt: number;
}

export interface PrefillReport {
  /** The prefill answer's usage.prompt_tokens_details.cached_tokens (the prefix hit that matters); undefined: unknown. */
  readonly cachedTokens?: number;
  /** vLLM: the answer carried kv_transfer_params (without them the decode side recomputes; counted). */
  readonly transferParams?: boolean;
}

export interface PrefillState {
  readonly leg: PrefillLeg;
  readonly worker: WorkerState;
  done: boolean;
  cachedTokens?: number;
}

/** What the leg machine reads of a request (the Dispatcher's submission). */
export interface LegSubmission {
  readonly requestId: string;
  readonly model: string;
  readonly subset?: ReadonlySet<string>;
  readonly cacheSalt?: string | null;
  readonly knobs?: Partial<KvKnobs>;
  readonly sequences?: number;
  readonly noHandoff?: string;
}

/** The request's P/D state the leg machine keeps (part of the Dispatcher's tracked request). */
export interface LegTracked {
  readonly sub: LegSubmission;
  seqHashes?: BigUint64Array;
  promptTokens?: number;
  prefill?: PrefillState;
  prefillAttempts: number;
  /** Prefill sources excluded by failed prefill legs. */
  readonly prefillExcluded: Set<string>;
}

const PREFILL_ROLES: ReadonlySet<WorkerRole> = new Set<WorkerRole>(['prefill']);

export type PrefillRoute = { kind: 'routed'; state: PrefillState } | { kind: 'busy' } | { kind: 'none'; cause: string };

export class DisaggLegs {
  readonly stats: PdStats = {
    paths: { aggregated: 0, disaggregated: 0, decode_rule: 0, decode_fallback: 0 },
    decodeOnly: {},
    handoffFailures: { prefill_failed: 0, no_kv_transfer_params: 0, decode_failed: 0, cancelled: 0 },
    transferredTokens: 0,
    prefillRetries: 0,
  };

  constructor(
    private readonly router: KvRouter,
    private readonly workers: ReadonlyMap<string, WorkerState>,
    private readonly minUncached: number,
    private readonly prefillPolicy = PD_PREFILL_POLICY,
  ) {}

  /** Whether any worker (in any state) serves the model as a prefill worker: the fleet is disaggregated for it. */
  hasPrefillPool(model: string): boolean {
    for (const w of this.workers.values()) if (w.role === 'prefill' && w.serves(model)) return true;
    return false;
  }

  /**
   * The path of a request whose decode leg was just routed on `engine`'s worker: the prefill leg is routed here when
   * it is disaggregated. 'busy': every prefill source is busy (the caller takes the decode routing back and waits).
   */
  decodePath(t: LegTracked, result: RouteDecision, engine: EngineFlavor, now: number): PdPath | 'busy' {
    const sub = t.sub;
    const uncached = result.promptTokens - result.overlapBlocks * this.router.blockSize;
    let onlyCause: string | undefined;
    let path: PdPath;
    if (sub.noHandoff) onlyCause = sub.noHandoff;
    else if ((sub.sequences ?? 1) > 1) onlyCause = 'sequences';
    // An unknown prompt (no tokenizer, tokenization failed: 0 tokens) cannot be judged short: it is disaggregated.
    else if (result.promptTokens > 0 && uncached <= this.minUncached) onlyCause = 'short';
    if (onlyCause === undefined) {
      const r = this.routePrefill(t, engine, now);
      if (r.kind === 'busy') {
        this.router.withdraw(sub.requestId);
        return 'busy';
      }
      if (r.kind === 'routed') {
        t.prefill = r.state;
        path = 'disaggregated';
      } else {
        onlyCause = r.cause;
        path = 'decode_fallback';
      }
    } else path = 'decode_rule';
    if (path !== 'disaggregated') {
      this.router.account(sub.requestId);
      this.countDecodeOnly(onlyCause!);
    }
    return path;
  }

  countDecodeOnly(cause: string): void {
    this.stats.decodeOnly[cause] = (this.stats.decodeOnly[cause] ?? 0) + 1;
  }

  /** The prefill leg: the prefill pool of the decode worker's engine flavour, chasing the cache (pd-prefill). */
  routePrefill(t: LegTracked, engine: EngineFlavor, now: number): PrefillRoute {
    const sub = t.sub;
    const el = eligibility(this.workers.values(), { model: sub.model, roles: PREFILL_ROLES, subset: sub.subset, engine }, now);
    if (el.kind === 'ineligible') return { kind: 'none', cause: el.reason };
    const legId = `${sub.requestId}/prefill${t.prefillAttempts}`;
    const r = this.router.route(
      {
        requestId: legId,
        seqHashes: t.seqHashes,
        promptTokens: t.promptTokens,
        loraName: el.loraName,
        cacheSalt: sub.cacheSalt,
        policy: this.prefillPolicy,
        knobs: sub.knobs,
        allow: el.allow,
        exclude: t.prefillExcluded,
      },
      now,
    );
    if (r.kind === 'refused') {
      if (r.reason === 'all_busy') return { kind: 'busy' };
      return { kind: 'none', cause: r.reason === 'all_excluded' ? 'prefill_retries_exhausted' : r.reason };
    }
    const pw = el.workers.get(r.source.workerId)!;
    pw.inFlight++;
    const trial = pw.breaker.reserve(legId, now);
    const leg: PrefillLeg = { legId, decision: r, workerId: pw.id, trial, attempt: t.prefillAttempts++ };
    return { kind: 'routed', state: { leg, worker: pw, done: false } };
  }

  /** Closes the prefill leg's record: its delivered cached tokens reach the ledger (a served prefill). */
  close(t: LegTracked, outcome: 'ok' | 'cancelled', now: number): FinishedRequest | null {
    const p = t.prefill;
    if (!p) return null;
    t.prefill = undefined;
    p.worker.inFlight = Math.max(0, p.worker.inFlight - 1);
    if (outcome === 'cancelled') p.worker.breaker.release(p.leg.legId);
    return this.router.finish(p.leg.legId, { outcome, cachedTokens: p.cachedTokens }, now) ?? null;
  }

  /** Takes the prefill leg back (retried elsewhere) or ends it without a verdict on its worker. */
  drop(t: LegTracked, outcome: 'retried' | 'cancelled'): void {
    const p = t.prefill;
    if (!p) return;
    t.prefill = undefined;
    p.worker.inFlight = Math.max(0, p.worker.inFlight - 1);
    p.worker.breaker.release(p.leg.legId);
    if (outcome === 'retried') this.router.withdraw(p.leg.legId);
    else this.router.finish(p.leg.legId, { outcome: 'cancelled' }, -Infinity);
  }
}
