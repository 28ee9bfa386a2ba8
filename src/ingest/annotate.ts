/**
 * Per-source state that turns decoded events into events the core index can apply correctly. Pure (no I/O).
 *
 * - Block size: learned from Stored events (a change clears the source: the index keeps one split factor per source).
 *   A size other than the router's is reported once (via `onMismatch`) and counted; a multiple passes (KvIndex splits
 *   it), a divisor is joined into router blocks (./aggregate.ts; SGLang's default page size is 1), anything else is
 *   quarantined: dropped and counted, together with every block chained under it (their router hashes cannot be
 *   computed either).
 * - cache_salt: vLLM puts it in the extra keys of a sequence's first block only, but it seeds every block of the
 *   sequence (docs/protocols.md §1), so continuation events inherit it from their parent.
 * - Blocks the decoder skipped (identity it cannot reproduce: prompt embeds, offset-less multimodal hashes) poison their
 *   descendants the same way: skipped and counted. Multimodal (identifier, offset) keys are hashable and pass.
 * - KV-cache groups (hybrid models: sliding-window and Mamba-state groups beside full attention, the same engine ids
 *   in every group): every group of a known kind passes to the router, which indexes each group apart
 *   (src/core/index/groups.ts). A group of unknown kind, with a block size unlike group 0's, or on a source whose
 *   blocks are joined (aggregate.ts) cannot be indexed: its events are counted and dropped.
 * - Offload tiers (medium other than GPU): tracked here by engine id per medium, and passed through unchanged (the
 *   core index currently counts them as `unsupported_medium`).
 */
import { GPU_MEDIUM, type EngineBlockId, type KvEvent, type StoredEvent } from '../core/types.ts';
import type { DecodedBatch } from '../engines/common.ts';
import { aggregatable, BlockAggregator } from './aggregate.ts';

export interface AnnotatorCounters {
  blockSizeMismatchEvents: number;
  /** Times the engine's block size changed without a restart; each clears the source. */
  blockSizeChanges: number;
  quarantinedBlocks: number;
  multimodalBlocks: number;
  otherGroupEvents: number;
  hybridGroupEvents: number;
  offloadEvents: number;
}

type SkipCause = 'multimodal' | 'quarantine';

const CLEARED: KvEvent = { kind: 'cleared' };

export class SourceAnnotator {
  /** Engine block size last seen in a Stored event (null until one arrives). */
  engineBlockSize: number | null = null;
  readonly counters: AnnotatorCounters = {
    blockSizeMismatchEvents: 0,
    blockSizeChanges: 0,
    quarantinedBlocks: 0,
    multimodalBlocks: 0,
    otherGroupEvents: 0,
    hybridGroupEvents: 0,
    offloadEvents: 0,
  };
  /** Groups (other than 0) whose events cannot be indexed: their removals are dropped too. */
  private readonly unindexedGroups = new Set<number>();
  private readonly skipped = new Map<EngineBlockId, SkipCause>();
  private readonly salts = new Map<EngineBlockId, string>();
  private readonly tiers = new Map<string, Set<EngineBlockId>>();
  private mismatchReported = false;
  private aggregator: BlockAggregator | null = null;

  constructor(
    private readonly routerBlockSize: number,
    private readonly onMismatch: (
      engineBlockSize: number,
      routerBlockSize: number,
      action: 'split' | 'aggregate' | 'quarantine',
    ) => void = () => {},
  ) {}

  /** Forgets everything known about the source's cache (reset or AllBlocksCleared). */
  reset(): void {
    this.unindexedGroups.clear();
    this.skipped.clear();
    this.salts.clear();
    this.tiers.clear();
    this.aggregator?.reset();
  }

  /** Engine blocks joined into router blocks (engine block size a divisor of the router's), when active. */
  aggregatorCounters(): { orphanBlocks: number; routerBlocks: number; engineBlocksHeld: number } | null {
    const a = this.aggregator;
    return a ? { ...a.counters, engineBlocksHeld: a.size } : null;
  }

  /** Blocks held per lower tier (by medium), as announced by the engine. */
  tierBlocks(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [medium, ids] of this.tiers) if (ids.size > 0) out[medium] = ids.size;
    return out;
  }

  /** Events of one decoded batch, ready for the index, in order. */
  process(batch: DecodedBatch): KvEvent[] {
    this.counters.multimodalBlocks += batch.counts.multimodalBlocks;
    // Skipped ids of the batch: mark them before the events so later events in the batch see them.
    for (const id of batch.skippedIds) this.skipped.set(id, 'multimodal');
    const out: KvEvent[] = [];
    for (const ev of batch.events) {
      const r = this.one(ev);
      if (Array.isArray(r)) out.push(...r);
      else if (r) out.push(r);
    }
    return out;
  }

  private one(ev: KvEvent): KvEvent | KvEvent[] | null {
    switch (ev.kind) {
      case 'cleared':
        this.reset();
        return ev;
      case 'removed': {
        if (ev.medium !== undefined && ev.medium !== GPU_MEDIUM) {
          this.counters.offloadEvents++;
          const tier = this.tiers.get(ev.medium);
          if (tier) for (const id of ev.engineIds) tier.delete(id);
          return ev;
        }
        if ((ev.groupIdx ?? 0) !== 0) return this.otherGroupRemoved(ev);
        if (this.aggregator) {
          for (const id of ev.engineIds) this.skipped.delete(id);
          const gone = this.aggregator.removed(ev.engineIds);
          return gone.length > 0 ? { ...ev, engineIds: gone } : null;
        }
        // Common case first: nothing skipped or salted on this source, nothing to look up (bigint Map ops cost).
        if (this.skipped.size === 0 && this.salts.size === 0) return ev;
        let keep: EngineBlockId[] | null = null;
        for (let i = 0; i < ev.engineIds.length; i++) {
          const id = ev.engineIds[i];
          this.salts.delete(id);
          if (this.skipped.delete(id)) {
            // The index never saw it: removing it there would only count an unknown block.
            if (!keep) keep = ev.engineIds.slice(0, i);
          } else if (keep) {
            keep.push(id);
          }
        }
        if (!keep) return ev;
        return keep.length > 0 ? { ...ev, engineIds: keep } : null;
      }
      case 'stored':
        return this.stored(ev);
      default:
        return null;
    }
  }

  private stored(ev: StoredEvent): KvEvent | KvEvent[] | null {
    if (ev.medium !== undefined && ev.medium !== GPU_MEDIUM) {
      this.counters.offloadEvents++;
      let tier = this.tiers.get(ev.medium);
      if (!tier) {
        tier = new Set();
        this.tiers.set(ev.medium, tier);
      }
      for (const id of ev.engineIds) tier.add(id);
      return ev;
    }
    if ((ev.groupIdx ?? 0) !== 0) return this.otherGroupStored(ev);
    const bs = ev.blockSize;
    let changed = false;
    if (this.engineBlockSize !== bs) {
      // An engine's block size is fixed for its life; a change means another configuration. The index keeps one
      // split factor per source, so blocks of the old size must go before blocks of the new size arrive.
      changed = this.engineBlockSize !== null;
      if (changed) {
        this.counters.blockSizeChanges++;
        this.reset();
      }
      this.engineBlockSize = bs;
    }
    if (bs !== this.routerBlockSize) {
      this.counters.blockSizeMismatchEvents++;
      const splittable = Number.isInteger(bs) && bs > 0 && bs % this.routerBlockSize === 0;
      const joinable = !splittable && aggregatable(bs, this.routerBlockSize);
      if (!this.mismatchReported) {
        this.mismatchReported = true;
        this.onMismatch(bs, this.routerBlockSize, splittable ? 'split' : joinable ? 'aggregate' : 'quarantine');
      }
      if (joinable) {
        if (this.aggregator?.engineBlockSize !== bs) this.aggregator = new BlockAggregator(bs, this.routerBlockSize);
        if (ev.parent !== null && this.skipped.size > 0) {
          const cause = this.skipped.get(ev.parent);
          if (cause !== undefined) return this.skip(ev, cause);
        }
        const joined = this.aggregator.stored(ev);
        return changed ? [CLEARED, ...joined] : joined;
      }
      if (!splittable) {
        this.skip(ev, 'quarantine');
        return changed ? CLEARED : null;
      }
    }
    if (ev.parent !== null && this.skipped.size > 0) {
      const cause = this.skipped.get(ev.parent);
      if (cause !== undefined) return this.skip(ev, cause);
    }
    let salt = ev.cacheSalt ?? null;
    if (salt === null && ev.parent !== null && this.salts.size > 0) salt = this.salts.get(ev.parent) ?? null;
    let out: StoredEvent = ev;
    if (salt !== null) {
      for (const id of ev.engineIds) this.salts.set(id, salt);
      if (salt !== ev.cacheSalt) out = { ...ev, cacheSalt: salt };
    }
    return changed ? [CLEARED, out] : out;
  }

  /**
   * A Stored event of a hybrid model's other cache group. The engine ids are those of group 0 (one hash per block,
   * whatever the group), so skip causes and salts learned there apply here as they are; they are not forgotten on
   * this group's removals (group 0 may still hold the block).
   */
  private otherGroupStored(ev: StoredEvent): StoredEvent | null {
    const g = ev.groupIdx ?? 0;
    const bs = ev.blockSize;
    const sameSize = this.engineBlockSize === null || this.engineBlockSize === bs;
    const indexable = Number.isInteger(bs) && bs > 0 && bs % this.routerBlockSize === 0;
    if (ev.groupKind === undefined || ev.groupKind === 'unknown' || this.aggregator || !sameSize || !indexable) {
      this.unindexedGroups.add(g);
      this.counters.otherGroupEvents++;
      return null;
    }
    if (ev.parent !== null && this.skipped.size > 0) {
      const cause = this.skipped.get(ev.parent);
      if (cause !== undefined) {
        if (cause === 'quarantine') this.counters.quarantinedBlocks += ev.engineIds.length;
        else this.counters.multimodalBlocks += ev.engineIds.length;
        return null;
      }
    }
    this.counters.hybridGroupEvents++;
    let salt = ev.cacheSalt ?? null;
    if (salt === null && ev.parent !== null && this.salts.size > 0) salt = this.salts.get(ev.parent) ?? null;
    if (salt === null || salt === ev.cacheSalt) return ev;
    return { ...ev, cacheSalt: salt };
  }

  private otherGroupRemoved(ev: KvEvent & { kind: 'removed' }): KvEvent | null {
    if (this.unindexedGroups.has(ev.groupIdx ?? 0) || this.aggregator) {
      this.counters.otherGroupEvents++;
      return null;
    }
    this.counters.hybridGroupEvents++;
    if (this.skipped.size === 0) return ev;
    const keep = ev.engineIds.filter((id) => !this.skipped.has(id));
    if (keep.length === ev.engineIds.length) return ev;
    return keep.length > 0 ? { ...ev, engineIds: keep } : null;
  }

  private skip(ev: StoredEvent, cause: SkipCause): null {
    for (const id of ev.engineIds) this.skipped.set(id, cause);
    if (cause === 'quarantine') this.counters.quarantinedBlocks += ev.engineIds.length;
    else this.counters.multimodalBlocks += ev.engineIds.length;
    return null;
  }
}
