/**
 * KvRouter: the one object every shell drives (server, simulator, benchmarks). Pure and synchronous: time comes in as
 * `now` (milliseconds), randomness from a seeded generator, so a decision replays exactly for a given seed and clock.
 *
 *   route(request, now)      hash -> overlap per source (event index, overlay, approx) -> active load -> policy
 *                            -> record active load, overlay and ledger -> decision
 *   firstToken(id, now)      prefill done: its tokens stop counting as prefill load
 *   finish(id, info, now)    free the load; delivered cached tokens go to the ledger
 *   applyEvents(source, ev)  engine KV events into the index
 */
import { ActiveLoad, type RecentChain } from './active-load.ts';
import { HashBuffers } from './hash-buffers.ts';
import { TtlIndex } from './approx.ts';
import { fullBlocks as fullBlocksOf, islBlocks as islBlocksOf } from './hashing.ts';
import { CacheGroups, hashStoredEvent } from './index/groups.ts';
import { KvIndex, type IndexApplyResult } from './index/kv-index.ts';
import { type IndexCapture, RouterSnapshot, type RouterSnapshotData, type SourceSnapshot } from './index/snapshot.ts';
import { RESTORE_STEP, snapshotEvents } from './index/snapshot-events.ts';
import { requestSeqHashes } from './multimodal.ts';
import { isLowerTier, TierIndex } from './tiers.ts';
import { predictedCachedTokens, ReuseLedger } from './ledger.ts';
import { createRng, type Rng } from './rng.ts';
import { LoadOrder } from './scheduling/load-order.ts';
import { createPolicy, DEFAULT_POLICY, describePolicy, isPolicyName, unknownPolicyMessage } from './scheduling/registry.ts';
import type { PolicyDescription } from './scheduling/policy.ts';
import type { Candidate, Policy, Ranking } from './scheduling/policy.ts';
import { RequestFacts, type FactStores } from './scheduling/facts.ts';
import {
  ALLOW_FILTER,
  BUSY_FILTER,
  EXCLUDE_FILTER,
  SOURCE_FILTERS,
  type BusyThresholds,
  type SourceFilterQuery,
  type SourceRefusal,
} from './scheduling/filters.ts';
import {
  parseSourceKey,
  sourceKey,
  type ApplyResult,
  type CandidateScore,
  type FinishInfo,
  type KvEvent,
  type KvKnobs,
  type MmItem,
  type RouteDecision,
  type RouteRequest,
  type RouteResult,
  type SourceId,
  type StoredEvent,
} from './types.ts';

export const DEFAULT_KNOBS: KvKnobs = {
  prefillLoadScale: 1,
  overlapCredit: 1,
  temperature: 0,
  hostTierCredit: 0,
  diskTierCredit: 0,
};

/** Tier credits when offload-tier credit is switched on (issue 4): host memory 0.75, disk 0.25 of a GPU block. */
/** Tier credits with --tier-credit (docs/engines.md, "Tiers"): REMOTE copies stay at 0 unless --tier-remote-credit. */
export const TIER_CREDIT_ON = { hostTierCredit: 0.75, diskTierCredit: 0.25 } as const;

export type { BusyThresholds } from './scheduling/filters.ts';

export interface KvRouterOptions {
  readonly blockSize: number;
  /** Default policy name (requests may override). */
  readonly policy?: string;
  /** Extra policy objects, selectable by their `name` like the built-in ones (prototypes, plug-ins). */
  readonly policies?: readonly Policy[];
  readonly knobs?: Partial<KvKnobs>;
  readonly seed?: number;
  /**
   * The predicted overlay for event-fed sources: a request sharing a prefix with a request in flight on a source (or
   * finished there less than `overlayGraceMs` ago) is credited that prefix, so a burst of siblings is routed together
   * before the engine's Stored events arrive. Default on.
   */
  readonly overlay?: boolean;
  /**
   * How long a finished request still counts in the overlay, ms. Default 2 s: Stored events follow each computed
   * step within milliseconds, so this only covers transport delay and short requests that finish before their
   * events are applied; longer would keep crediting blocks the engine may already have evicted.
   */
  readonly overlayGraceMs?: number;
  /**
   * Lower-tier blocks of store-only media (sources that never send removals, e.g. LMCache) stop counting this long
   * after their last Stored, ms. Default 300 s; 0 = never.
   */
  readonly storeOnlyTtlMs?: number;
  /** TTL of approximate-mode entries (sources without events), in ms. Default 120 s. */
  readonly approxTtlMs?: number;
  /** Per-source block capacity of approximate mode (a source's learned KV capacity caps it too). */
  readonly approxCapacityBlocks?: number;
  /** Byte budget of approximate mode's table (--approx-table-mb); the oldest decisions fleet-wide go first beyond. */
  readonly approxTableBytes?: number;
  /** Cap on distinct blocks in the event index. */
  readonly maxIndexedBlocks?: number;
  readonly busy?: BusyThresholds;
  /** Requests older than this are force-freed by sweep(). Default 300 s. */
  readonly staleRequestMs?: number;
  /**
   * How route() finds its candidates: `exhaustive` evaluates every source; `sampled` only those that can hold the
   * request's prefix plus the `coldCandidates` least loaded (load-ordered policies only); `auto` (default) samples above
   * `exhaustiveLimit` sources (256).
   */
  readonly selection?: 'auto' | 'exhaustive' | 'sampled';
  readonly exhaustiveLimit?: number;
  /** Least-loaded sources without a prefix of the request evaluated in sampled selection. Default 16. */
  readonly coldCandidates?: number;
  /**
   * Optional high-resolution clock (ms) used only to time route()'s phases for overhead metrics. Injected so the
   * core stays free of ambient clocks; without it decisions carry no timings.
   */
  readonly clock?: () => number;
}

export interface SourceOptions {
  /** 'events': the engine publishes KV events; 'approx': the router records its own decisions instead. */
  readonly mode: 'events' | 'approx';
  /** KV capacity in blocks (engine num_gpu_blocks), for the busy fraction. */
  readonly capacityBlocks?: number;
}

interface SourceEntry {
  readonly id: SourceId;
  readonly key: string;
  readonly index: number;
  mode: 'events' | 'approx';
  capacityBlocks?: number;
  /** The engine's own gauges as last scraped (setEngineMetrics), for policies that read them. */
  scraped?: EngineMetrics;
  /** Events of this source were lost and could not be replayed: its index is not the engine's cache until healed. */
  degraded?: SourceDegraded;
  /**
   * A stepped restore or reset (restoreSteps, resetSteps) is rewriting this source's index: routing reads its index
   * overlap as 0 (unknown) until it is done, and its events wait in `pending`, applied after it in arrival order.
   */
  restoring?: { pending: KvEvent[] };
}

/** Engine gauges a metrics-scraping policy reads (vllm:num_requests_waiting, vllm:kv_cache_usage_perc). */
export interface EngineMetrics {
  readonly waiting: number;
  readonly kvUsage: number;
}

/**
 * Reset reasons that leave a source's index whole: a relay's first start or a restart whose replay reached the
 * engine's first batch, an engine restart (its cache starts empty). Any other reset lost events: the source is
 * degraded until healed.
 */
const WHOLE_RESETS: ReadonlySet<string> = new Set(['relay_start', 'relay_restart', 'restart', 'resync']);

/** Whether a reset with this reason lost events (the index is then missing blocks the engine holds). */
export function resetLosesEvents(reason: string): boolean {
  return !WHOLE_RESETS.has(reason);
}

/** Why and since when a source's index is not to be trusted (events lost, not replayed). */
export interface SourceDegraded {
  /** Routing clock (ms) of the first loss since the source was last known whole. */
  readonly since: number;
  /** The latest loss's reason (a reset reason: relay_backlog_overflow, stream_gap, replay_too_old, ...). */
  readonly reason: string;
  /** Losses since it was last known whole. */
  readonly losses: number;
}

/** What finish() knows about a request: for metrics and the prediction-error histogram. */
export interface FinishedRequest {
  readonly requestId: string;
  readonly sourceKey: string;
  readonly promptTokens: number;
  readonly islBlocks: number;
  readonly overlapBlocks: number;
  readonly predictedCachedTokens: number;
  readonly cachedTokens?: number;
  readonly outcome: 'ok' | 'cancelled' | 'error' | 'retried';
  readonly routedAt: number;
  readonly firstTokenAt?: number;
  readonly finishedAt: number;
  /** In the reuse ledger (false for the decode leg of a disaggregated request: its cache hit is not the one served). */
  readonly accounted: boolean;
}

/**
 * Told about each request's lifecycle as it happens (scale-out replicas announce it to their peers). Called
 * synchronously from route / firstToken / finish; an observer must not call back into the router.
 */
export interface RouterObserver {
  routed?(decision: RouteDecision): void;
  /** Once per request, on its first token. */
  firstToken?(requestId: string, now: number): void;
  finished?(request: FinishedRequest): void;
}

interface RequestRecord {
  /** Routed by another replica: counts in active load and the overlay, not in this replica's ledger. */
  readonly remote?: boolean;
  readonly sourceKey: string;
  readonly promptTokens: number;
  readonly islBlocks: number;
  readonly overlapBlocks: number;
  readonly bestOverlapBlocks: number;
  readonly routedAt: number;
  /** Recorded in the ledger (routed); false until `account` for a leg routed with `account: false`. */
  accounted: boolean;
}

export class KvRouter {
  readonly blockSize: number;
  readonly index: KvIndex;
  readonly ledger = new ReuseLedger();
  readonly active: ActiveLoad;
  /** Recycled memory for the hashes route() computes (hash-buffers.ts); `releaseHashes` gives the caller's hold back. */
  private readonly hashBuffers = new HashBuffers();
  readonly tiers: TierIndex;
  /** Hybrid models' cache groups besides the main index's (index/groups.ts). */
  readonly groups: CacheGroups;
  private readonly overlay: boolean;
  private readonly approx: TtlIndex;
  private readonly factStores: FactStores;
  private readonly sources = new Map<string, SourceEntry>();
  private readonly byIndex: (SourceEntry | undefined)[] = [];
  private readonly freeIndices: number[] = [];
  private readonly policies = new Map<string, Policy>();
  private readonly defaultPolicy: string;
  private readonly knobs: KvKnobs;
  private readonly rng: Rng;
  private readonly records = new Map<string, RequestRecord>();
  private readonly busy: BusyThresholds;
  private readonly staleMs: number;
  private readonly clock?: () => number;
  private readonly observers: RouterObserver[] = [];
  private readonly selection: 'auto' | 'exhaustive' | 'sampled';
  private readonly exhaustiveLimit: number;
  private readonly coldCandidates: number;
  private readonly loadOrder = new LoadOrder();
  private readonly approxSources = new Set<number>();
  /** The latest routing clock seen (route, sweep): the default time of events applied without one. */
  private lastNow = 0;

  constructor(options: KvRouterOptions) {
    this.blockSize = options.blockSize;
    this.index = new KvIndex({ blockSize: options.blockSize, maxBlocks: options.maxIndexedBlocks });
    this.groups = new CacheGroups(options.blockSize);
    this.overlay = options.overlay ?? true;
    this.active = new ActiveLoad({
      graceMs: this.overlay ? (options.overlayGraceMs ?? 2_000) : 0,
      onRelease: (view) => this.hashBuffers.drop(view),
    });
    this.tiers = new TierIndex({ storeOnlyTtlMs: options.storeOnlyTtlMs });
    this.approx = new TtlIndex({
      ttlMs: options.approxTtlMs ?? 120_000,
      capacityPerSource: options.approxCapacityBlocks,
      capacityOf: (s) => this.byIndex[s]?.capacityBlocks,
      maxBytes: options.approxTableBytes,
    });
    this.factStores = {
      index: this.index,
      active: this.active,
      groups: this.groups,
      approx: this.approx,
      tiers: this.tiers,
      overlay: this.overlay,
    };
    for (const p of options.policies ?? []) this.policies.set(p.name, p);
    this.defaultPolicy = options.policy ?? DEFAULT_POLICY;
    this.policy(this.defaultPolicy); // validate early
    this.knobs = { ...DEFAULT_KNOBS, ...options.knobs };
    this.rng = createRng(options.seed ?? 0);
    this.busy = options.busy ?? {};
    this.staleMs = options.staleRequestMs ?? 300_000;
    this.clock = options.clock;
    this.selection = options.selection ?? 'auto';
    this.exhaustiveLimit = options.exhaustiveLimit ?? 256;
    this.coldCandidates = options.coldCandidates ?? 16;
  }

  /** Approximate mode's table memory and budget, bytes (router_table_bytes{table="approximate"}). */
  get approxTable(): { readonly bytes: number; readonly maxBytes: number } {
    return this.approx;
  }

  // ---------------------------------------------------------------- sources

  addSource(id: SourceId, options: SourceOptions = { mode: 'events' }): string {
    const key = sourceKey(id);
    const existing = this.sources.get(key);
    if (existing) {
      existing.mode = options.mode;
      existing.capacityBlocks = options.capacityBlocks;
      if (options.mode === 'approx') this.approxSources.add(existing.index);
      else this.approxSources.delete(existing.index);
      return key;
    }
    const index = this.freeIndices.length > 0 ? this.freeIndices.pop()! : this.byIndex.length;
    const entry: SourceEntry = { id, key, index, mode: options.mode, capacityBlocks: options.capacityBlocks };
    this.sources.set(key, entry);
    this.byIndex[index] = entry;
    this.index.addSource(index);
    this.loadOrder.set(index, 0);
    if (options.mode === 'approx') this.approxSources.add(index);
    return key;
  }

  /** Forgets a source: its blocks, its overlay and its in-flight load (those requests can no longer be tracked). */
  removeSource(key: string): boolean {
    const entry = this.sources.get(key);
    if (!entry) return false;
    for (const id of this.active.requestsOn(entry.index)) this.records.delete(id);
    this.active.removeSource(entry.index);
    this.index.removeSource(entry.index);
    this.groups.removeSource(entry.index);
    this.tiers.clear(entry.index);
    this.approx.removeSource(entry.index);
    this.sources.delete(key);
    this.byIndex[entry.index] = undefined;
    this.loadOrder.delete(entry.index);
    this.approxSources.delete(entry.index);
    this.freeIndices.push(entry.index);
    return true;
  }

  /** Removes every data-parallel rank of a worker. */
  removeWorker(workerId: string): number {
    let n = 0;
    for (const entry of [...this.sources.values()]) if (entry.id.workerId === workerId && this.removeSource(entry.key)) n++;
    return n;
  }

  /** Sets a source's KV capacity in blocks (learned from the engine); false for an unknown source. */
  setCapacity(key: string, capacityBlocks: number): boolean {
    const entry = this.sources.get(key);
    if (!entry || !(capacityBlocks > 0)) return false;
    entry.capacityBlocks = capacityBlocks;
    return true;
  }

  /**
   * Records a source's engine gauges as scraped (the simulator at a policy's `scrapeIntervalMs`): policies that read
   * engine metrics see these values, stale until the next call. False for an unknown source.
   */
  setEngineMetrics(key: string, metrics: EngineMetrics): boolean {
    const entry = this.sources.get(key);
    if (!entry) return false;
    entry.scraped = metrics;
    return true;
  }

  /** A source's KV capacity in blocks, when known (configured or learned from the engine). */
  capacityOf(key: string): number | undefined {
    return this.sources.get(key)?.capacityBlocks;
  }

  hasSource(key: string): boolean {
    return this.sources.has(key);
  }

  sourceKeys(): string[] {
    return [...this.sources.keys()];
  }

  /** The engine restarted or its event stream broke beyond repair: it is cold as far as we know. */
  /**
   * Events of `key` were lost and not replayed: its index is incomplete (after a reset, blocks the engine holds are
   * missing) until `markHealed`. Shown in `state()` (the source's `degraded`); routing goes on with what is known.
   */
  markDegraded(key: string, reason: string, now = this.lastNow): boolean {
    const entry = this.sources.get(key);
    if (!entry) return false;
    const d = entry.degraded;
    entry.degraded = { since: d?.since ?? now, reason, losses: (d?.losses ?? 0) + 1 };
    return true;
  }

  /** The source's index is whole again (rebuilt from a full replay, the engine cleared its cache or restarted). */
  markHealed(key: string): boolean {
    const entry = this.sources.get(key);
    if (!entry?.degraded) return false;
    entry.degraded = undefined;
    return true;
  }

  /** The worker and rank of a source key (undefined when unknown). */
  sourceId(key: string): SourceId | undefined {
    return this.sources.get(key)?.id;
  }

  /** Degraded sources by key. */
  degradedSources(): Map<string, SourceDegraded> {
    const out = new Map<string, SourceDegraded>();
    for (const e of this.sources.values()) if (e.degraded) out.set(e.key, e.degraded);
    return out;
  }

  resetSource(key: string): boolean {
    const entry = this.sources.get(key);
    if (!entry) return false;
    if (entry.restoring) {
      // After the restore, in order with the source's other events.
      entry.restoring.pending.push({ kind: 'cleared' });
      return true;
    }
    this.index.apply(entry.index, { kind: 'cleared' });
    this.clearBeside(entry.index);
    return true;
  }

  // ---------------------------------------------------------------- events

  /** Applies a source's events; `now` (ms, the routing clock) dates lower-tier blocks for store-only ageing. */
  applyEvents(key: string, events: readonly KvEvent[], now = this.lastNow): ApplyResult {
    const entry = this.sources.get(key);
    if (!entry) return { applied: 0, rejected: events.length, reason: 'unknown_source' };
    if (entry.restoring) {
      // Held until the restore is done (they are newer than the snapshot being loaded): nothing applied yet.
      for (const ev of events) entry.restoring.pending.push(ev);
      return { applied: 0, rejected: 0 };
    }
    let applied = 0;
    let rejected = 0;
    let reason: ApplyResult['reason'];
    // The overlay's just-finished chains on this source, with how much of each the index held before the batch's
    // first removal: whatever of that the batch removed is withdrawn from the overlay after it (withdrawRemoved).
    let watched: WatchedChains | undefined;
    for (const ev of events) {
      if (isLowerTier(ev)) {
        const t = this.tiers.apply(entry.index, ev, (id) => this.index.seqHashOfEngineId(entry.index, id), now);
        applied += t.applied;
        rejected += t.unknown;
        rejected += t.unknownMedium;
        if (t.unknown > 0) reason ??= 'unknown_block';
        if (t.unknownMedium > 0) reason ??= 'unknown_medium';
        continue;
      }
      if (ev.kind === 'cleared') {
        this.clearBeside(entry.index);
        watched = undefined;
      } else if (
        (ev.groupIdx !== undefined && ev.groupIdx !== 0) ||
        (ev.kind === 'stored' && ev.groupKind !== undefined) ||
        this.groups.active
      ) {
        // Hybrid models: groups other than the source's first full-attention group are indexed apart.
        if (!this.groups.isPrimary(entry.index, ev, this.index)) {
          const g = this.groups.apply(entry.index, ev, this.index);
          applied += g.applied;
          rejected += g.rejected;
          reason ??= g.reason;
          continue;
        }
      }
      if (ev.kind === 'removed' && watched === undefined) watched = this.watchRecent(entry.index, now);
      const r = this.index.apply(entry.index, ev.kind === 'stored' && ev.mmKeys && !ev.seqHashes ? this.withMmHashes(entry.index, ev) : ev);
      applied += r.applied;
      rejected += r.rejected;
      reason ??= r.reason;
    }
    if (watched && watched.chains.length > 0) this.withdrawRemoved(entry.index, watched);
    return reason ? { applied, rejected, reason } : { applied, rejected };
  }

  /**
   * Before a batch's first removal: the overlay's recently finished chains on `source` and the prefix of each the index
   * holds. A chain the index holds whole leaves the overlay here (it credits nothing the index does not, and from now
   * on the index alone follows what the engine removes), so a chain is probed in one removal batch after its Stored
   * events arrived, not in every one. None when the overlay is off or no chain is in its grace period (no probe).
   */
  private watchRecent(source: number, now: number): WatchedChains {
    if (!this.overlay) return NO_WATCH;
    const recent = this.active.recentOn(source, now);
    if (recent.length === 0) return NO_WATCH;
    const chains: RecentChain[] = [];
    const held: number[] = [];
    for (const c of recent) {
      const h = this.index.heldPrefix(source, c.view, c.credit);
      if (h >= c.credit) this.active.withdrawRecent(c, 0);
      else if (h > 0) {
        chains.push(c);
        held.push(h);
      }
    }
    return { chains, held };
  }

  /**
   * After a batch with removals: a recent chain the index held further before the batch than after it lost blocks to
   * the engine's own Removed events, so the overlay credits it only up to what is left (a prefix is usable only whole).
   * What the index never held (the Stored events still on their way, the overlay's purpose) stays credited; a block
   * removed and stored again within the batch is held after it and withdraws nothing.
   */
  private withdrawRemoved(source: number, watched: WatchedChains): void {
    const { chains, held } = watched;
    for (let i = 0; i < chains.length; i++) {
      const after = this.index.heldPrefix(source, chains[i].view, held[i]);
      if (after < held[i]) this.active.withdrawRecent(chains[i], after);
    }
  }

  /** A Stored event with multimodal keys, with its router hashes computed (the index hashes plain tokens only). */
  private withMmHashes(source: number, ev: StoredEvent): StoredEvent {
    let parentSeq: bigint | null = null;
    if (ev.parent !== null) {
      parentSeq = this.index.seqHashOfEngineId(source, ev.parent);
      if (parentSeq === null) return ev; // the index rejects it as unknown_parent
    }
    const seqHashes = hashStoredEvent(ev, this.blockSize, parentSeq);
    // Keys the router cannot map onto its blocks: the block-size reject, counted by the index.
    return seqHashes ? { ...ev, seqHashes } : { ...ev, blockSize: 0 };
  }

  // ---------------------------------------------------------------- routing

  private policy(name: string): Policy {
    let p = this.policies.get(name);
    if (!p) {
      p = createPolicy(name);
      this.policies.set(name, p);
    }
    return p;
  }

  /** Adds a lifecycle observer; returns the function that removes it. */
  observe(observer: RouterObserver): () => void {
    this.observers.push(observer);
    return () => {
      const at = this.observers.indexOf(observer);
      if (at >= 0) this.observers.splice(at, 1);
    };
  }

  /** Sequence hashes of a request, with its adapter and salt in the seed (`out`: where to put them, as requestSeqHashes). */
  hashRequest(
    tokens: ArrayLike<number>,
    loraName?: string | null,
    cacheSalt?: string | null,
    mmItems?: readonly MmItem[],
    out?: BigUint64Array,
  ): BigUint64Array {
    return requestSeqHashes(tokens, this.blockSize, loraName, cacheSalt, mmItems, out);
  }

  /**
   * The caller is done with the `seqHashes` route() computed for it (a decision's or a refusal's): the router may
   * reuse their memory for a later request once the active load and the overlay no longer hold them either. Call it
   * only when nothing of the caller's will read them again (the dispatcher does when the request's task ends); never
   * calling it is safe (the array is then ordinary garbage). No-op for arrays route() did not compute, and after the
   * first call.
   */
  releaseHashes(seqHashes: BigUint64Array): void {
    this.hashBuffers.releaseCaller(seqHashes);
  }

  route(req: RouteRequest, now: number): RouteResult {
    this.lastNow = now;
    if (this.records.has(req.requestId)) {
      return { kind: 'refused', requestId: req.requestId, reason: 'duplicate_request', busySources: [] };
    }
    const policyName = req.policy ?? this.defaultPolicy;
    if (!this.policies.has(policyName) && !isPolicyName(policyName)) throw new RangeError(unknownPolicyMessage(policyName));
    const t0 = this.clock?.() ?? 0;
    const tokens = req.tokens ?? [];
    const seqHashes =
      req.seqHashes ??
      this.hashRequest(
        tokens,
        req.loraName,
        req.cacheSalt,
        req.mmItems,
        this.hashBuffers.take(fullBlocksOf(tokens.length, this.blockSize)),
      );
    const t1 = this.clock?.() ?? 0;
    const promptTokens = req.promptTokens ?? req.tokens?.length ?? seqHashes.length * this.blockSize;
    const requestBlocks = islBlocksOf(promptTokens, this.blockSize);

    const knobs: KvKnobs = { ...this.knobs, ...req.knobs };
    const policy = this.policy(policyName);
    // A policy may model a router without the predicted overlay (its overlap is the event index's alone).
    const facts = new RequestFacts(this.factStores, seqHashes, promptTokens, this.blockSize, knobs, now, policy.overlay !== false);
    const { candidates, busySources, bestOverlap, refusal } = this.gather(policy, facts, {
      allow: req.allow,
      exclude: req.exclude,
      busy: this.busy,
    });
    // "find" covers the event index plus overlay, approx and active-prefix lookups per candidate.
    const t2 = this.clock?.() ?? 0;
    if (refusal !== undefined) {
      return {
        kind: 'refused',
        requestId: req.requestId,
        reason: refusal,
        busySources,
        seqHashes,
        promptTokens,
      };
    }

    const ctx = { candidates, promptTokens, requestBlocks, blockSize: this.blockSize, seqHashes, knobs, rng: this.rng, now };
    const ranking = policy.rank(ctx);
    const affinity = req.prefer ? this.applyAffinity(req.prefer, candidates, ranking.order, requestBlocks) : undefined;
    const chosen = candidates[ranking.order[0]];
    // Policies that learn from their own decisions (approximate prefix trees) record the pick.
    policy.routed?.(ctx, ranking.order[0]);
    const entry = this.byIndex[chosen.source]!;
    const t3 = this.clock?.() ?? 0;

    this.commit(req, chosen, entry, seqHashes, promptTokens, requestBlocks, bestOverlap, now);

    const scored = scoredCandidates(candidates, ranking);
    const decision: RouteDecision = {
      kind: 'routed',
      requestId: req.requestId,
      source: entry.id,
      sourceKey: entry.key,
      policy: policyName,
      promptTokens,
      islBlocks: requestBlocks,
      overlapBlocks: chosen.overlapBlocks,
      bestOverlapBlocks: bestOverlap,
      candidates: scored,
      seqHashes,
      ...(affinity ? { affinity } : {}),
      timingsMs: this.clock ? { hash: t1 - t0, find: t2 - t1, select: t3 - t2 } : undefined,
    };
    for (const o of this.observers) o.routed?.(decision);
    return decision;
  }

  /**
   * The candidates of one request: each source through the source-level filters (filters.ts), allow and exclude on
   * its key, busy on its load facts (facts.ts); the overlap of busy sources still counts towards the best overlap any
   * source holds. Sampled selection (load-ordered policies over large fleets) evaluates only part of the fleet.
   */
  private gather(policy: Policy, facts: RequestFacts, q: SourceFilterQuery): Gathering {
    const g = new Gathering(facts, q);
    if (!this.selectSampled(policy, q, facts.seqHashes, facts.view, facts.fromIndex, g)) {
      for (const entry of this.sources.values()) g.evaluate(entry);
    }
    g.refusal = g.candidates.length === 0 ? SOURCE_FILTERS[g.passed.indexOf(0)].refusal : undefined;
    return g;
  }

  /** Records a pick: active load, the load order, the approximate index, the ledger and the request's record. */
  private commit(
    req: RouteRequest,
    chosen: Candidate,
    entry: SourceEntry,
    seqHashes: BigUint64Array,
    promptTokens: number,
    requestBlocks: number,
    bestOverlap: number,
    now: number,
  ): void {
    this.hashBuffers.retain(seqHashes);
    this.active.add({
      requestId: req.requestId,
      source: chosen.source,
      seqHashes,
      requestBlocks,
      prefillTokens: Math.max(0, promptTokens - chosen.overlapBlocks * this.blockSize),
      startedAt: now,
    });
    this.reorder(chosen.source);
    if (entry.mode === 'approx') this.approx.record(chosen.source, seqHashes, now);
    const accounted = req.account ?? true;
    if (accounted) this.ledger.routed(entry.key, requestBlocks, chosen.overlapBlocks, bestOverlap);
    this.records.set(req.requestId, {
      sourceKey: entry.key,
      promptTokens,
      islBlocks: requestBlocks,
      overlapBlocks: chosen.overlapBlocks,
      bestOverlapBlocks: bestOverlap,
      routedAt: now,
      accounted,
    });
  }

  /**
   * Load that another router replica routed (scale-out): it counts in this replica's active load and overlay so
   * replicas decide as one router would, but not in this replica's ledger. Lifecycle via firstToken/finish as usual.
   */
  trackRemote(
    remote: { requestId: string; sourceKey: string; seqHashes: BigUint64Array; promptTokens: number; overlapBlocks: number },
    now: number,
  ): boolean {
    const entry = this.sources.get(remote.sourceKey);
    if (!entry || this.records.has(remote.requestId)) return false;
    this.hashBuffers.retain(remote.seqHashes);
    this.active.add({
      requestId: remote.requestId,
      source: entry.index,
      seqHashes: remote.seqHashes,
      requestBlocks: islBlocksOf(remote.promptTokens, this.blockSize),
      prefillTokens: Math.max(0, remote.promptTokens - remote.overlapBlocks * this.blockSize),
      startedAt: now,
    });
    this.reorder(entry.index);
    this.records.set(remote.requestId, {
      remote: true,
      sourceKey: entry.key,
      promptTokens: remote.promptTokens,
      islBlocks: islBlocksOf(remote.promptTokens, this.blockSize),
      overlapBlocks: remote.overlapBlocks,
      bestOverlapBlocks: remote.overlapBlocks,
      routedAt: now,
      accounted: false,
    });
    return true;
  }

  /**
   * The affinity stage (sessions, pinned conversations): the preferred source goes first when it is a candidate (it
   * passed every filter) and not overloaded: load(p) <= (1 + loadFactor) * mean load + requestBlocks, with
   * load = activePrefillTokens / bs + activeBlocks over the candidates (bounded-load consistent hashing's rule).
   */
  private applyAffinity(
    prefer: NonNullable<RouteRequest['prefer']>,
    candidates: readonly Candidate[],
    order: number[],
    requestBlocks: number,
  ): 'kept' | 'overloaded' | 'unavailable' {
    const at = order.findIndex((i) => candidates[i].key === prefer.sourceKey);
    if (at < 0) return 'unavailable';
    const load = (c: Candidate) => c.activePrefillTokens / this.blockSize + c.activeBlocks;
    let sum = 0;
    for (const c of candidates) sum += load(c);
    const bound = (1 + prefer.loadFactor) * (sum / candidates.length) + requestBlocks;
    if (load(candidates[order[at]]) > bound) return 'overloaded';
    if (at > 0) order.unshift(...order.splice(at, 1));
    return 'kept';
  }

  /**
   * Records a routing made with `account: false` in the ledger (the decode leg becomes the served one when its
   * request falls back to decode alone). False when unknown or already accounted.
   */
  account(requestId: string): boolean {
    const r = this.records.get(requestId);
    if (!r || r.accounted || r.remote) return false;
    r.accounted = true;
    this.ledger.routed(r.sourceKey, r.islBlocks, r.overlapBlocks, r.bestOverlapBlocks);
    return true;
  }

  /**
   * Takes a routing back as if it never happened (a leg chosen and then not sent): load freed, ledger entry removed,
   * no overlay grace entry. Returns false for an unknown id.
   */
  withdraw(requestId: string): boolean {
    return this.finish(requestId, { outcome: 'retried' }, -Infinity) !== undefined;
  }

  /**
   * Selection over a large fleet without scanning it (docs/routing.md, "Large fleets"): evaluate only the sources that
   * can hold a prefix of the request (the event index's matches, in-flight and just-finished chains starting with the
   * same block, approximate-mode sources) plus the least loaded others, up to `coldCandidates` of them that pass the
   * filters. Exact for the warm sources (so overlap and available reuse are exact); the cold ones differ only in load,
   * and a load-ordered policy's best cold source is among the least loaded. Returns false (scan everything) for small
   * fleets, policies that need every source (round-robin, random, prefix-hash), or when too few sources passed.
   */
  private selectSampled(
    policy: Policy,
    filters: SourceFilterQuery,
    seqHashes: BigUint64Array,
    view: Uint32Array,
    fromIndex: ArrayLike<number>,
    g: Gathering,
  ): boolean {
    if (this.selection === 'exhaustive') return false;
    if (this.selection === 'auto' && this.sources.size <= this.exhaustiveLimit) return false;
    if (!policy.loadOrdered) return false;
    const seen = new Set<number>();
    const visit = (s: number) => {
      if (seen.has(s)) return;
      const entry = this.byIndex[s];
      if (!entry) return;
      seen.add(s);
      g.evaluate(entry);
    };
    for (let s = 0; s < fromIndex.length; s++) if (fromIndex[s] > 0) visit(s);
    for (const s of this.active.sourcesSharingFirstBlock(view, seqHashes.length)) visit(s);
    for (const s of this.approxSources) visit(s);
    let cold = 0;
    for (const s of this.loadOrder.inOrder()) {
      if (cold >= this.coldCandidates) break;
      if (seen.has(s)) continue;
      const entry = this.byIndex[s];
      if (!entry || !ALLOW_FILTER.admits(entry.key, filters) || !EXCLUDE_FILTER.admits(entry.key, filters)) continue;
      visit(s);
      cold++;
    }
    if (cold > 0 || seen.size >= this.sources.size) return true;
    // Nothing cold passed the filters (a subset, or everything excluded or busy): judge the whole fleet.
    return this.rescan(g, seen);
  }

  /** Evaluates the sources not yet seen (the sampled path's fallback keeps what it already evaluated). */
  private rescan(g: Gathering, seen: ReadonlySet<number>): boolean {
    for (const entry of this.sources.values()) if (!seen.has(entry.index)) g.evaluate(entry);
    return true;
  }

  /** A source's load changed: its place in the load order follows. */
  private reorder(source: number): void {
    if (!this.byIndex[source]) return;
    this.loadOrder.set(source, this.active.prefillTokens(source) / this.blockSize + this.active.activeBlocks(source));
  }

  // ---------------------------------------------------------------- lifecycle

  /** The request is in flight and has not produced its first token yet. */
  firstTokenPending(requestId: string): boolean {
    const req = this.active.get(requestId);
    return req !== undefined && req.firstTokenAt === undefined;
  }

  firstToken(requestId: string, now: number): boolean {
    const req = this.active.get(requestId);
    if (!req) return false;
    const first = req.firstTokenAt === undefined;
    this.active.firstToken(requestId, now);
    this.reorder(req.source);
    if (first) for (const o of this.observers) o.firstToken?.(requestId, now);
    return true;
  }

  /** Frees the request's load and records delivered reuse. Unknown ids (already finished) return undefined. */
  finish(requestId: string, info: FinishInfo, now: number): FinishedRequest | undefined {
    const record = this.records.get(requestId);
    if (!record) return undefined;
    this.records.delete(requestId);
    const active = this.active.free(requestId, now);
    if (active) this.reorder(active.source);
    const predicted = predictedCachedTokens(record.overlapBlocks, record.promptTokens, this.blockSize);
    const cached = info.cachedTokens;
    if (info.outcome === 'retried' && record.accounted) {
      this.ledger.unrouted(record.sourceKey, record.islBlocks, record.overlapBlocks, record.bestOverlapBlocks);
    } else if (record.accounted && cached !== undefined && Number.isFinite(cached) && cached >= 0) {
      this.ledger.delivered(record.sourceKey, record.promptTokens, cached, predicted);
    }
    const finished: FinishedRequest = {
      requestId,
      sourceKey: record.sourceKey,
      promptTokens: record.promptTokens,
      islBlocks: record.islBlocks,
      overlapBlocks: record.overlapBlocks,
      predictedCachedTokens: predicted,
      cachedTokens: cached,
      outcome: info.outcome ?? 'ok',
      routedAt: record.routedAt,
      firstTokenAt: active?.firstTokenAt,
      finishedAt: now,
      accounted: record.accounted,
    };
    for (const o of this.observers) o.finished?.(finished);
    return finished;
  }

  /** Expires overlay entries and force-frees requests older than the stale limit. Returns the freed ids. */
  sweep(now: number): string[] {
    this.lastNow = now;
    this.approx.sweep(now);
    this.tiers.sweep(now);
    const stale = this.active.sweep(now, this.staleMs);
    for (const id of stale) this.records.delete(id);
    if (stale.length > 0) for (const e of this.sources.values()) this.reorder(e.index);
    return stale;
  }

  // ---------------------------------------------------------------- introspection

  /** Plain JSON for /debug/state and tests. */
  state(): {
    blockSize: number;
    policy: string;
    /** The pipeline of every policy this router has run (the default's first): scorers, weights, formulas, picker. */
    policies: PolicyDescription[];
    knobs: KvKnobs;
    inFlight: number;
    index: ReturnType<KvIndex['stats']>;
    /** Hybrid models' other cache groups: (block, source) pairs per group index, rejects by reason; once any exist. */
    cacheGroups?: ReturnType<CacheGroups['stats']>;
    sources: Array<{
      source: string;
      workerId: string;
      dpRank: number;
      mode: 'events' | 'approx';
      cachedBlocks: number;
      approxBlocks: number;
      activeRequests: number;
      activeBlocks: number;
      activePrefillTokens: number;
      capacityBlocks?: number;
      /** Null while the source's index is trusted; else since when (routing clock, ms) and why it is not. */
      degraded: SourceDegraded | null;
      /** A stepped restore or reset is rewriting its index (routing reads its index overlap as 0 meanwhile). */
      restoring: boolean;
    }>;
  } {
    return {
      blockSize: this.blockSize,
      policy: this.defaultPolicy,
      policies: [this.policy(this.defaultPolicy), ...[...this.policies.values()].filter((p) => p.name !== this.defaultPolicy)].map(
        describePolicy,
      ),
      knobs: this.knobs,
      inFlight: this.records.size,
      index: this.index.stats(),
      ...(this.groups.active ? { cacheGroups: this.groups.stats() } : {}),
      sources: [...this.sources.values()].map((e) => ({
        source: e.key,
        workerId: e.id.workerId,
        dpRank: e.id.dpRank,
        mode: e.mode,
        cachedBlocks: this.index.cachedBlocks(e.index),
        approxBlocks: this.approx.blocks(e.index),
        activeRequests: this.active.activeRequests(e.index),
        activeBlocks: this.active.activeBlocks(e.index),
        activePrefillTokens: this.active.prefillTokens(e.index),
        capacityBlocks: e.capacityBlocks,
        degraded: e.degraded ?? null,
        restoring: e.restoring !== undefined,
      })),
    };
  }

  // ================================================================ snapshots (issue 13; KvRouter's public snapshot API)

  /**
   * A snapshot of the event index keyed by source key. Synchronous cost: a typed-array copy of the index's arrays
   * (bench/RESULTS.md, "Snapshots"); each source's arrays are then built from that copy by `source(key)`, one source
   * per call, so a shell spreads the export over event-loop turns while routing and event application go on, and the
   * result is still the index as it was at this call. Sources holding no blocks are not listed.
   */
  snapshot(): RouterSnapshot {
    return this.named(this.index.capture());
  }

  /**
   * The same snapshot taken in steps of bounded work (`next()` until done, yielding to the event loop in between),
   * for a shell that must not stall on the copy either. Apply no events until it returns (routing goes on: it only
   * reads the index); if the index changed anyway the result is null and the snapshot must be taken again. Null too
   * while a stepped restore or reset runs (restoreSteps, resetSteps): a source half rewritten is no state to keep.
   */
  *snapshotSteps(budget?: number): Generator<void, RouterSnapshot | null, void> {
    if (this.restoring()) return null;
    const capture = yield* this.index.captureSteps(budget);
    return capture && !this.restoring() ? this.named(capture) : null;
  }

  /** Whether a stepped restore or reset is rewriting any source. */
  private restoring(): boolean {
    for (const e of this.sources.values()) if (e.restoring) return true;
    return false;
  }

  private named(capture: IndexCapture): RouterSnapshot {
    const names = new Map<string, number>();
    const degraded = new Map<string, SourceDegraded>();
    const captured = new Set(capture.sources());
    for (const [key, e] of this.sources) {
      if (e.degraded) degraded.set(key, e.degraded);
      if (captured.has(e.index) || e.degraded) names.set(key, e.index);
    }
    return new RouterSnapshot(capture, names, degraded);
  }

  /**
   * Loads a snapshot: each listed source's blocks replace what the router holds for it (its offload tiers are
   * cleared too); a source it does not know is added as an event source. Sources not listed are left alone. Bad
   * entries are counted in the result, never thrown on. One synchronous piece of O(the sources' blocks): a shell that
   * must not stall runs `restoreSteps` instead.
   */
  restore(snapshot: RouterSnapshotData): RestoreResult {
    const result: RestoreResult = { sources: 0, blocks: 0, rejected: [] };
    if (snapshot.blockSize !== this.blockSize) {
      for (const s of snapshot.sources) {
        result.rejected.push({
          key: s.key,
          blocks: s.engineIds.length,
          reason: `snapshot block size ${snapshot.blockSize}, router ${this.blockSize}`,
        });
      }
      return result;
    }
    for (const s of snapshot.sources) {
      const r = this.restoreSource(s);
      if (r.applied > 0 || r.rejected === 0) result.sources++;
      result.blocks += r.applied;
      if (r.reason) result.rejected.push({ key: s.key, blocks: r.rejected, reason: r.reason });
    }
    return result;
  }

  /**
   * The same load as `restore(...)` of these sources, in steps of at most `budget` blocks (a few ms each): `next()`
   * until done, yielding to the event loop in between, so a large source never stalls routing for its whole length.
   * Each source's old blocks are removed in steps too. While a source is being rewritten routing reads its index
   * overlap as 0 (unknown, as right after a reset) and its events are held, then applied after the snapshot's blocks
   * (`applyEvents` and `resetSource` meanwhile return at once). Blocks go in through the index's one insert path
   * (Stored events, parents first). Sources not listed are left alone. The sources must be taken with this router's
   * block size (a transport checks the snapshot's before).
   */
  *restoreSteps(sources: readonly SourceSnapshot[], budget = RESTORE_STEP): Generator<void, RestoreResult, void> {
    const result: RestoreResult = { sources: 0, blocks: 0, rejected: [] };
    const todo: Array<{ entry: SourceEntry; s: SourceSnapshot }> = [];
    for (const s of sources) {
      const n = s.engineIds?.length ?? 0;
      if (typeof s.key !== 'string' || s.key === '') {
        result.rejected.push({ key: String(s.key), blocks: n, reason: 'unknown_source' });
        continue;
      }
      const why = this.unloadable(s);
      if (why) {
        result.rejected.push({ key: s.key, blocks: n, reason: why });
        continue;
      }
      if (!this.sources.has(s.key)) this.addSource(parseSourceKey(s.key), { mode: 'events' });
      const entry = this.sources.get(s.key)!;
      if (entry.restoring || todo.some((t) => t.entry === entry)) {
        result.rejected.push({ key: s.key, blocks: n, reason: 'restore_in_progress' });
        continue;
      }
      entry.restoring = { pending: [] };
      todo.push({ entry, s });
    }
    try {
      yield* this.clearSteps(
        todo.map((t) => t.entry),
        budget,
      );
      for (const { entry, s } of todo) {
        if (!this.current(entry)) continue;
        this.tiers.clear(entry.index);
        let applied = 0;
        let rejected = 0;
        let invalid = 0;
        let reason: string | undefined;
        for (const batch of snapshotEvents(s, budget)) {
          if (!this.current(entry)) break; // removed meanwhile
          for (const ev of batch.events) {
            const r = this.index.apply(entry.index, ev);
            applied += r.applied;
            rejected += r.rejected;
            if (r.reason) reason ??= r.reason;
          }
          invalid += batch.invalid;
          yield;
        }
        if (invalid > 0) reason ??= 'invalid_snapshot';
        entry.degraded = degradedOf(s);
        if (applied > 0 || rejected === 0) result.sources++;
        result.blocks += applied;
        if (reason) result.rejected.push({ key: s.key, blocks: rejected, reason });
        this.endRestoring(entry);
      }
    } finally {
      for (const { entry } of todo) this.endRestoring(entry);
    }
    return result;
  }

  /**
   * Clears these sources' blocks (as `resetSource` does) in steps of at most `budget` blocks, with the same hold on
   * routing and events as restoreSteps. Returns the keys it cleared (unknown keys, or sources being restored, are
   * skipped).
   */
  *resetSteps(keys: readonly string[], budget = RESTORE_STEP): Generator<void, string[], void> {
    const entries: SourceEntry[] = [];
    for (const key of keys) {
      const entry = this.sources.get(key);
      if (!entry || entry.restoring || entries.includes(entry)) continue;
      entry.restoring = { pending: [] };
      entries.push(entry);
    }
    try {
      yield* this.clearSteps(entries, budget);
    } finally {
      for (const entry of entries) this.endRestoring(entry);
    }
    return entries.map((e) => e.key);
  }

  /** Why a snapshot source cannot be loaded at all (checked before anything of the source is touched). */
  private unloadable(s: SourceSnapshot): string | undefined {
    const n = s.engineIds?.length ?? 0;
    if (!(s.engineIds instanceof BigUint64Array) || !(s.seqHashes instanceof BigUint64Array)) return 'invalid_snapshot';
    if (!Number.isInteger(s.blockSize) || s.blockSize <= 0 || s.blockSize % this.blockSize !== 0) return 'block_size_mismatch';
    if (s.seqHashes.length !== n * (s.blockSize / this.blockSize)) return 'token_count_mismatch';
    if (s.parents && s.parents.length !== n) return 'invalid_snapshot';
    return undefined;
  }

  /** The entry still names a source of this router (not removed, its number not reused). */
  private current(entry: SourceEntry): boolean {
    return this.byIndex[entry.index] === entry;
  }

  /** The restore of a source is over: routing reads its index again, and its held events are applied. */
  private endRestoring(entry: SourceEntry): void {
    const held = entry.restoring;
    if (!held) return;
    entry.restoring = undefined;
    if (held.pending.length > 0 && this.current(entry)) this.applyEvents(entry.key, held.pending);
  }

  /**
   * Removes every block of these sources in steps: their engine ids from one index copy (captureSteps, exportSteps),
   * then Removed events of at most `budget` ids each, then a Cleared (which finds nothing left, or the few blocks
   * the copy could not name). Their offload tiers and cache groups are cleared too.
   */
  private *clearSteps(entries: readonly SourceEntry[], budget: number): Generator<void, void, void> {
    const held = entries.filter((e) => this.index.cachedBlocks(e.index) > 0);
    let capture: IndexCapture | null = null;
    // The copy is void if the index changes meanwhile (another source's events): taken again, then given up.
    for (let attempt = 0; attempt < 3 && held.length > 0 && capture === null; attempt++) {
      capture = yield* this.index.captureSteps();
      if (capture === null) yield;
    }
    const step = Math.max(1, Math.floor(budget));
    for (const entry of held) {
      if (!capture || !this.current(entry)) break;
      const blocks = yield* capture.exportSteps(entry.index);
      const ids = blocks?.engineIds ?? new BigUint64Array(0);
      for (let at = 0; at < ids.length; at += step) {
        yield;
        if (!this.current(entry)) break;
        this.index.apply(entry.index, { kind: 'removed', engineIds: Array.from(ids.subarray(at, at + step)) });
      }
      yield;
    }
    for (const entry of entries) {
      if (!this.current(entry)) continue;
      this.index.apply(entry.index, { kind: 'cleared' });
      this.clearBeside(entry.index);
    }
  }

  /** A source's cache was cleared: what the router keeps beside the index for it goes too (groups, tiers, overlay). */
  private clearBeside(source: number): void {
    this.groups.clearSource(source);
    this.tiers.clear(source);
    this.active.clearRecent(source);
  }

  /** Loads one source of a snapshot taken with this router's block size (see restore). */
  restoreSource(s: SourceSnapshot): IndexApplyResult {
    if (typeof s.key !== 'string' || s.key === '') return { applied: 0, rejected: s.engineIds?.length ?? 0, reason: 'unknown_source' };
    if (!this.sources.has(s.key)) this.addSource(parseSourceKey(s.key), { mode: 'events' });
    const entry = this.sources.get(s.key)!;
    this.tiers.clear(entry.index);
    // As restoreSteps: the overlay's just-finished chains on the source credit nothing the snapshot does not hold.
    this.active.clearRecent(entry.index);
    const r = this.index.restoreSource(entry.index, s);
    if (r.applied > 0 || r.rejected === 0) entry.degraded = degradedOf(s);
    return r;
  }
}

/** A restored source is degraded as the snapshot says (a well-formed entry), or trusted. */
function degradedOf(s: SourceSnapshot): SourceDegraded | undefined {
  const d = s.degraded;
  if (!d || typeof d.reason !== 'string' || !Number.isFinite(d.since) || !Number.isInteger(d.losses)) return undefined;
  return { since: d.since, reason: d.reason, losses: d.losses };
}

/** Recent overlay chains of one source and the prefix of each the index held before a batch's first removal. */
interface WatchedChains {
  readonly chains: readonly RecentChain[];
  readonly held: readonly number[];
}
const NO_WATCH: WatchedChains = { chains: [], held: [] };

/** What `KvRouter.restore` did: sources and blocks loaded, and each source entry it could not load in full. */
export interface RestoreResult {
  sources: number;
  blocks: number;
  rejected: Array<{ key: string; blocks: number; reason: string }>;
}

/**
 * One request's candidates as gather() collects them: each source through the source-level filters (filters.ts),
 * allow and exclude on its key, busy on its load facts (facts.ts); the overlap of busy sources still counts towards the
 * best overlap any source holds. A class, not a closure per request: route() is the hot path.
 */
class Gathering {
  readonly candidates: Candidate[] = [];
  readonly busySources: string[] = [];
  /** Sources that passed each filter of SOURCE_FILTERS (allow, exclude, busy). */
  readonly passed = [0, 0, 0];
  bestOverlap = 0;
  refusal: SourceRefusal | undefined = undefined;

  constructor(
    private readonly facts: RequestFacts,
    private readonly q: SourceFilterQuery,
  ) {}

  evaluate(entry: SourceEntry): void {
    const { facts, q } = this;
    if (!ALLOW_FILTER.admits(entry.key, q)) return;
    this.passed[0]++;
    if (!EXCLUDE_FILTER.admits(entry.key, q)) return;
    this.passed[1]++;
    const load = facts.load(entry);
    const ov = facts.overlap(entry, load.activePrefixBlocks);
    if (ov > this.bestOverlap) this.bestOverlap = ov;
    if (!BUSY_FILTER.admits(load, q)) {
      this.busySources.push(entry.key);
      return;
    }
    this.passed[2]++;
    this.candidates.push(facts.candidate(entry, load, ov));
  }
}

/** The candidates in pick order, as a decision reports them. */
function scoredCandidates(candidates: readonly Candidate[], ranking: Ranking): CandidateScore[] {
  return ranking.order.map((i) => {
    const c = candidates[i];
    return {
      source: c.key,
      overlapBlocks: c.overlapBlocks,
      cachedBlocks: c.cachedBlocks,
      activePrefillTokens: c.activePrefillTokens,
      activeBlocks: c.activeBlocks,
      cost: ranking.costs[i],
    };
  });
}
