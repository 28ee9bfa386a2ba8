/**
 * Offload tiers: blocks an engine moved to host memory or disk (vLLM's KV offloading connectors announce them as
 * Stored events with medium "CPU" etc., engine ids only, no tokens). Loading them back is cheaper than recomputing,
 * so the kv policy may credit them at a discount (off by default; host 0.75, disk 0.25 when on).
 *
 * The router learns a tier block's identity from the GPU tier: the engine id was announced with tokens earlier, so its
 * router hash is known (KvIndex.seqHashOfEngineId). A tier block whose GPU announcement was never seen cannot be
 * matched and is counted as unknown. Per source, tier blocks form a set of router hashes; a request's tier overlap is
 * the run of its blocks right after the GPU overlap that the source holds in a lower tier.
 */
import { GPU_MEDIUM, type KvEvent } from './types.ts';

export type Tier = 'host' | 'disk';

/** vLLM's offloading connectors use "CPU" for host memory; anything else below the GPU counts as disk. */
export function tierOf(medium: string): Tier {
  const m = medium.toUpperCase();
  return m === 'CPU' || m === 'HOST' || m === 'CPU_PINNED' ? 'host' : 'disk';
}

export function isLowerTier(event: KvEvent): boolean {
  return event.kind !== 'cleared' && event.medium !== undefined && event.medium !== GPU_MEDIUM;
}

interface SourceTiers {
  /** Engine id -> router hash, so a tier Removed can find its block after the GPU copy is gone. */
  readonly byEngineId: Map<bigint, bigint>;
  /** Router hash -> tier. */
  readonly blocks: Map<bigint, Tier>;
}

export interface TierOverlap {
  host: number;
  disk: number;
}

export class TierIndex {
  private readonly sources = new Map<number, SourceTiers>();
  private unknownBlocks = 0;

  private of(source: number): SourceTiers {
    let s = this.sources.get(source);
    if (!s) {
      s = { byEngineId: new Map(), blocks: new Map() };
      this.sources.set(source, s);
    }
    return s;
  }

  /** Applies a lower-tier Stored or Removed. `resolve` maps an engine id to the router hash (from the GPU index). */
  apply(source: number, event: KvEvent, resolve: (id: bigint) => bigint | null): { applied: number; unknown: number } {
    if (event.kind === 'cleared') {
      this.clear(source);
      return { applied: 1, unknown: 0 };
    }
    const s = this.of(source);
    let applied = 0;
    let unknown = 0;
    if (event.kind === 'stored') {
      const tier = tierOf(event.medium ?? 'DISK');
      for (const id of event.engineIds) {
        const seq = s.byEngineId.get(id) ?? resolve(id);
        if (seq === null) {
          unknown++;
          continue;
        }
        s.byEngineId.set(id, seq);
        // A block in both tiers counts as the better one.
        if (s.blocks.get(seq) !== 'host') s.blocks.set(seq, tier);
        applied++;
      }
    } else {
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
    this.unknownBlocks += unknown;
    return { applied, unknown };
  }

  /** Blocks of `seqHashes` from `from` on that the source holds in a lower tier, contiguously, by tier. */
  overlap(source: number, seqHashes: BigUint64Array, from: number): TierOverlap {
    const out = { host: 0, disk: 0 };
    const s = this.sources.get(source);
    if (!s || s.blocks.size === 0) return out;
    for (let i = from; i < seqHashes.length; i++) {
      const tier = s.blocks.get(seqHashes[i]);
      if (tier === undefined) break;
      out[tier]++;
    }
    return out;
  }

  clear(source: number): void {
    this.sources.delete(source);
  }

  blocks(source: number): number {
    return this.sources.get(source)?.blocks.size ?? 0;
  }

  get unknown(): number {
    return this.unknownBlocks;
  }
}
