/**
 * Offload tiers: blocks an engine keeps below GPU memory. Engines announce them as Stored events with a medium other
 * than "GPU", engine ids only, no tokens (vLLM's offloading connectors, SGLang's HiCache, LMCache, TensorRT-LLM's host
 * pool). Loading them back is cheaper than recomputing, so the kv policy may credit them at a discount (off by
 * default; `TIER_CREDIT_ON`: host 0.75, disk 0.25, remote 0 unless configured). Every medium and its tier, with the
 * reasons for the credits: docs/engines.md.
 *
 * The router learns a tier block's identity from the GPU tier: the engine id was announced with tokens earlier, so its
 * router hash is known (KvIndex.seqHashOfEngineId). A tier block whose GPU announcement was never seen cannot be
 * matched and is counted as unknown. Per source, tier blocks form a set of router hashes; a request's tier overlap is
 * the run of its blocks right after the GPU overlap that the source holds in a lower tier.
 *
 * Store-only sources (LMCache's CPU events: stores, never removals) would otherwise stay credited forever. A (source,
 * medium) pair that has never sent a removal is aged: its blocks count for `storeOnlyTtlMs` after their last Stored,
 * then they are dropped (lazily in `overlap`, eagerly in `sweep`). The first removal on that medium proves the engine
 * reports evictions, and its blocks stop ageing.
 */
import { GPU_MEDIUM, type KvEvent, type Locality } from './types.ts';

export type Tier = 'host' | 'disk' | 'remote';

/**
 * The tier of a medium, or null for a medium kvroute does not know (counted, not tracked).
 * - host: CPU (vLLM's CPU offloading, LMCache's local CPU backend, TensorRT-LLM's secondary pool), CPU_PINNED (SGLang
 *   HiCache's pinned host memory), HOST;
 * - disk: DISK, LOCAL_DISK, SSD, and FS / OBJ with LOCAL locality (or none);
 * - remote: FS / OBJ with REMOTE locality, REMOTE, and any medium announced with REMOTE locality.
 */
export function tierOf(medium: string, locality?: Locality | null): Tier | null {
  const m = medium.toUpperCase();
  if (locality === 'REMOTE') return 'remote';
  switch (m) {
    case 'CPU':
    case 'CPU_PINNED':
    case 'HOST':
      return 'host';
    case 'DISK':
    case 'LOCAL_DISK':
    case 'SSD':
    case 'FS':
    case 'OBJ':
      return 'disk';
    case 'REMOTE':
      return 'remote';
    default:
      return null;
  }
}

export function isLowerTier(event: KvEvent): boolean {
  return event.kind !== 'cleared' && event.medium !== undefined && event.medium !== GPU_MEDIUM;
}

const RANK: Record<Tier, number> = { host: 0, disk: 1, remote: 2 };

interface TierBlock {
  tier: Tier;
  /** Medium key (medium + locality) the copy came from: its store-only state decides ageing. */
  mediumKey: string;
  /** Time of the last Stored (store-only ageing). */
  storedAt: number;
}

interface SourceTiers {
  /** Engine id -> router hash, so a tier Removed can find its block after the GPU copy is gone. */
  readonly byEngineId: Map<bigint, bigint>;
  /** Router hash -> its best copy. */
  readonly blocks: Map<bigint, TierBlock>;
  /** Medium keys that have sent a removal (not store-only). */
  readonly removing: Set<string>;
}

export interface TierOverlap {
  host: number;
  disk: number;
  remote: number;
}

export interface TierIndexOptions {
  /** Age of a store-only medium's block after which it no longer counts, ms. Default 300 s; 0 = never ages. */
  readonly storeOnlyTtlMs?: number;
}

export interface TierCounters {
  /** Tier blocks whose GPU announcement was never seen (no router hash). */
  unknownBlocks: number;
  /** Blocks of a medium kvroute does not know: not tracked. */
  unknownMediumBlocks: number;
  /** Blocks of store-only media dropped by age. */
  expiredBlocks: number;
}

export const DEFAULT_STORE_ONLY_TTL_MS = 300_000;

const mediumKeyOf = (medium: string, locality: Locality | undefined) => (locality ? `${medium}/${locality}` : medium);

export class TierIndex {
  private readonly sources = new Map<number, SourceTiers>();
  readonly counters: TierCounters = { unknownBlocks: 0, unknownMediumBlocks: 0, expiredBlocks: 0 };
  private readonly ttl: number;

  constructor(opts: TierIndexOptions = {}) {
    this.ttl = opts.storeOnlyTtlMs ?? DEFAULT_STORE_ONLY_TTL_MS;
  }

  private of(source: number): SourceTiers {
    let s = this.sources.get(source);
    if (!s) {
      s = { byEngineId: new Map(), blocks: new Map(), removing: new Set() };
      this.sources.set(source, s);
    }
    return s;
  }

  /**
   * Applies a lower-tier Stored or Removed at time `now` (ms). `resolve` maps an engine id to the router hash (from the
   * GPU index).
   */
  apply(
    source: number,
    event: KvEvent,
    resolve: (id: bigint) => bigint | null,
    now = 0,
  ): { applied: number; unknown: number; unknownMedium: number } {
    if (event.kind === 'cleared') {
      this.clear(source);
      return { applied: 1, unknown: 0, unknownMedium: 0 };
    }
    const medium = event.medium ?? 'DISK';
    const tier = tierOf(medium, event.locality);
    if (tier === null) {
      this.counters.unknownMediumBlocks += event.engineIds.length;
      return { applied: 0, unknown: 0, unknownMedium: event.engineIds.length };
    }
    const mediumKey = mediumKeyOf(medium, event.locality);
    const s = this.of(source);
    let applied = 0;
    let unknown = 0;
    if (event.kind === 'stored') {
      for (const id of event.engineIds) {
        const seq = s.byEngineId.get(id) ?? resolve(id);
        if (seq === null) {
          unknown++;
          continue;
        }
        s.byEngineId.set(id, seq);
        const had = s.blocks.get(seq);
        // A block in several tiers counts as the best one; a new Stored on the same medium refreshes its age.
        if (!had || RANK[tier] < RANK[had.tier] || had.mediumKey === mediumKey) s.blocks.set(seq, { tier, mediumKey, storedAt: now });
        applied++;
      }
    } else {
      s.removing.add(mediumKey);
      for (const id of event.engineIds) {
        const seq = s.byEngineId.get(id);
        if (seq === undefined) {
          unknown++;
          continue;
        }
        s.byEngineId.delete(id);
        s.blocks.delete(seq);
        applied++;
      }
    }
    this.counters.unknownBlocks += unknown;
    return { applied, unknown, unknownMedium: 0 };
  }

  private expired(s: SourceTiers, b: TierBlock, now: number): boolean {
    return this.ttl > 0 && !s.removing.has(b.mediumKey) && now - b.storedAt > this.ttl;
  }

  /** Blocks of `seqHashes` from `from` on that the source holds in a lower tier, contiguously, by tier, at `now`. */
  overlap(source: number, seqHashes: BigUint64Array, from: number, now = 0): TierOverlap {
    const out = { host: 0, disk: 0, remote: 0 };
    const s = this.sources.get(source);
    if (!s || s.blocks.size === 0) return out;
    for (let i = from; i < seqHashes.length; i++) {
      const b = s.blocks.get(seqHashes[i]);
      if (b === undefined || this.expired(s, b, now)) break;
      out[b.tier]++;
    }
    return out;
  }

  /** Drops the expired blocks of store-only media. Returns how many went. */
  sweep(now: number): number {
    let n = 0;
    for (const s of this.sources.values()) {
      if (s.blocks.size === 0) continue;
      const gone = new Set<bigint>();
      for (const [seq, b] of s.blocks) if (this.expired(s, b, now)) gone.add(seq);
      if (gone.size === 0) continue;
      for (const seq of gone) s.blocks.delete(seq);
      for (const [id, seq] of s.byEngineId) if (gone.has(seq)) s.byEngineId.delete(id);
      n += gone.size;
    }
    this.counters.expiredBlocks += n;
    return n;
  }

  clear(source: number): void {
    this.sources.delete(source);
  }

  blocks(source: number): number {
    return this.sources.get(source)?.blocks.size ?? 0;
  }

  get unknown(): number {
    return this.counters.unknownBlocks;
  }
}
