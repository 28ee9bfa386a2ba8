/**
 * Per-candidate facts: what the filters and scorers read of one source for one request, gathered apart from both.
 *
 *   load      activePrefixBlocks (leading request blocks already active there), activeBlocks, activePrefillTokens,
 *             capacityBlocks (the busy filter reads these)
 *   overlap   leading request blocks the source holds: the event index, raised by the predicted overlay (event
 *             sources, siblings in flight) or the approximate index (sources without events); a hybrid model's
 *             source by the hybrid rule at the engine's cap (index/groups.ts); never more than the full blocks
 *   tier      blocks right after the overlap held in host memory / on disk / on shared storage (only when a tier
 *             credit is on), all blocks the source holds (cachedBlocks), its requests in flight
 */
import type { ActiveLoad } from '../active-load.ts';
import type { TtlIndex } from '../approx.ts';
import type { CacheGroups } from '../index/groups.ts';
import type { KvIndex } from '../index/kv-index.ts';
import type { TierIndex } from '../tiers.ts';
import type { KvKnobs } from '../types.ts';
import type { SourceLoad } from './filters.ts';
import type { Candidate } from './policy.ts';

/** The router's stores the facts are read from. */
export interface FactStores {
  readonly index: KvIndex;
  readonly active: ActiveLoad;
  readonly groups: CacheGroups;
  readonly approx: TtlIndex;
  readonly tiers: TierIndex;
  /** The predicted overlay is on. */
  readonly overlay: boolean;
}

/** One routing source as the facts need it. */
export interface FactSource {
  readonly key: string;
  readonly index: number;
  readonly mode: 'events' | 'approx';
  readonly capacityBlocks?: number;
  /** The engine's gauges as last scraped, for policies that read them. */
  readonly scraped?: { readonly waiting: number; readonly kvUsage: number };
  /** Set while a stepped restore rewrites the source's index: its index overlap is unknown (read as 0). */
  readonly restoring?: unknown;
}

export interface LoadFacts extends SourceLoad {
  readonly activePrefixBlocks: number;
  readonly activeRequests: number;
  readonly activePartialBlocks: number;
}

const NO_TIER = { host: 0, disk: 0, remote: 0 } as const;

/** The facts of every source for one request (the request's hashes, looked up once in the event index). */
export class RequestFacts {
  /** Event-index overlap per source. */
  readonly fromIndex: Int32Array;
  /** The request's seq hashes as 32-bit halves (the active-load and approx lookups' key). */
  readonly view: Uint32Array;
  private readonly full: number;
  private readonly hybridCap: number;
  private readonly tierCredit: boolean;
  /**
   * Sources with an in-flight or recent chain starting with the request's first block, looked up once per request:
   * every other source's active prefix and overlay are 0 without a look at its chains.
   */
  private readonly sharers: ReadonlyMap<number, number> | undefined;

  constructor(
    private readonly stores: FactStores,
    readonly seqHashes: BigUint64Array,
    promptTokens: number,
    blockSize: number,
    knobs: KvKnobs,
    private readonly now: number,
    /** false: this request's policy models a router without the predicted overlay (Policy.overlay). */
    private readonly policyOverlay = true,
  ) {
    this.full = Math.min(seqHashes.length, Math.floor(promptTokens / blockSize));
    this.fromIndex = stores.index.findMatches(seqHashes);
    // vLLM never reuses the prompt's last token (max_cache_hit_length = num_tokens - 1).
    this.hybridCap = Math.min(this.full, Math.floor(Math.max(0, promptTokens - 1) / blockSize));
    this.view = new Uint32Array(seqHashes.buffer, seqHashes.byteOffset, seqHashes.length * 2);
    this.sharers = stores.active.firstBlockSharers(this.view, seqHashes.length);
    this.tierCredit = (knobs.hostTierCredit ?? 0) > 0 || (knobs.diskTierCredit ?? 0) > 0 || (knobs.remoteTierCredit ?? 0) > 0;
  }

  load(src: FactSource): LoadFacts {
    const { active } = this.stores;
    const s = src.index;
    const f = active.figures(s);
    return {
      key: src.key,
      capacityBlocks: src.capacityBlocks,
      activePrefixBlocks: this.sharers?.has(s) ? active.activePrefix(s, this.seqHashes, this.view) : 0,
      activeBlocks: f === undefined ? 0 : f.distinctBlocks + f.partialBlocks,
      activePrefillTokens: f === undefined ? 0 : f.prefillTokens,
      activeRequests: f === undefined ? 0 : f.inFlight.length,
      activePartialBlocks: f === undefined ? 0 : f.partialBlocks,
    };
  }

  overlap(src: FactSource, activePrefixBlocks: number): number {
    const { groups, approx, active } = this.stores;
    const s = src.index;
    let ov = src.restoring === undefined && s < this.fromIndex.length ? this.fromIndex[s] : 0;
    if (groups.active && groups.isHybrid(s)) {
      // The hybrid rule (index/groups.ts) at the engine's own cap; the overlay assumes full attention, so not here.
      ov = groups.hit(s, this.seqHashes, ov, this.hybridCap);
    } else if (src.mode === 'approx') ov = Math.max(ov, approx.prefix(s, this.seqHashes, this.now, this.view));
    else if (this.stores.overlay && this.policyOverlay && ov < this.full && this.sharers?.has(s)) {
      ov = Math.max(ov, active.predictedPrefix(s, this.seqHashes, this.now, this.view, activePrefixBlocks));
    }
    return Math.min(ov, this.full);
  }

  /** The candidate as scorers see it: load and overlap plus tier and cache facts. */
  candidate(src: FactSource, load: LoadFacts, overlapBlocks: number): Candidate {
    const s = src.index;
    const tier = this.tierCredit ? this.stores.tiers.overlap(s, this.seqHashes, overlapBlocks, this.now) : NO_TIER;
    // Built whole, `scraped` added after: a spread in the literal costs a runtime call per candidate.
    const c: { -readonly [K in keyof Candidate]: Candidate[K] } = {
      source: s,
      key: src.key,
      overlapBlocks,
      hostTierBlocks: tier.host,
      diskTierBlocks: tier.disk,
      remoteTierBlocks: tier.remote,
      cachedBlocks: this.stores.index.cachedBlocks(s),
      capacityBlocks: src.capacityBlocks,
      activePrefillTokens: load.activePrefillTokens,
      activeBlocks: load.activeBlocks,
      activePrefixBlocks: load.activePrefixBlocks,
      activeRequests: load.activeRequests,
      activePartialBlocks: load.activePartialBlocks,
    };
    if (src.scraped) c.scraped = src.scraped;
    return c;
  }
}
