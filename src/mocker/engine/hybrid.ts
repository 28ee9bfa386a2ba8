/**
 * The mock engine's hybrid mode (docs/engines.md "Hybrid attention (cache groups)"): cache groups beside the
 * full-attention group the engine's main bookkeeping holds, all in one BlockPool as vLLM's hybrid allocator keeps
 * them. Pure and synchronous, driven by engine.ts.
 *
 * Per request and per group:
 * - full attention: every full block, as the main group;
 * - sliding window (window W tokens): every full block is cached when computed, and a block is released (it stays
 *   cached, evictable) once it lies wholly before the first token the window still needs (vLLM's
 *   get_num_skipped_tokens = computed - W + 1);
 * - mamba: recurrent state is saved only where a step ends on a block boundary past the last saved state: the block
 *   before that boundary is cached (the state at its end) and the previous state block released. A prompt prefilled
 *   in one step has a single state block, at its last full block.
 * A hit is computed as vLLM's HybridKVCacheCoordinator does (the fixed point of core/index/groups.ts, on the pool).
 * When no block is free for a group's block, that group does not cache it (counted): this mock never preempts for a
 * group other than the main one.
 */
import { u32View } from '../../core/index/u64-map.ts';
import type { BlockPool } from './cache.ts';

export type EngineGroupKind = 'full_attention' | 'sliding_window' | 'mamba';

/** One cache group of the mock engine. */
export interface EngineCacheGroup {
  readonly kind: EngineGroupKind;
  /** Sliding window in tokens (sliding-window groups). */
  readonly slidingWindow?: number;
}

/** Named layouts for `kvroute mocker --hybrid`. */
export const HYBRID_PRESETS: Readonly<Record<string, readonly EngineCacheGroup[]>> = {
  // gpt-oss: sliding-window (128 tokens) and full-attention layers alternate; the sliding group comes first.
  'gpt-oss': [{ kind: 'sliding_window', slidingWindow: 128 }, { kind: 'full_attention' }],
  // Qwen3-Next / Jamba-like: linear-attention (Mamba-style) state beside full attention.
  mamba: [{ kind: 'full_attention' }, { kind: 'mamba' }],
  // All three kinds at once.
  mixed: [{ kind: 'full_attention' }, { kind: 'sliding_window', slidingWindow: 64 }, { kind: 'mamba' }],
};

/** A hybrid preset by name, or a layout spelled `full,sliding:128,mamba`. Throws RangeError on anything else. */
export function parseCacheGroups(spec: string): readonly EngineCacheGroup[] {
  const preset = HYBRID_PRESETS[spec];
  if (preset) return preset;
  const groups = spec.split(',').map((part): EngineCacheGroup => {
    const [name, arg] = part.trim().split(':');
    if (name === 'full' && arg === undefined) return { kind: 'full_attention' };
    if (name === 'mamba' && arg === undefined) return { kind: 'mamba' };
    if (name === 'sliding' && arg !== undefined && /^\d+$/.test(arg) && Number(arg) >= 2) {
      return { kind: 'sliding_window', slidingWindow: Number(arg) };
    }
    throw new RangeError(
      `bad cache group "${part}": expected ${Object.keys(HYBRID_PRESETS).join(', ')} or a list of full, sliding:<tokens >= 2>, mamba`,
    );
  });
  if (!groups.some((g) => g.kind === 'full_attention')) throw new RangeError('a hybrid layout needs a full-attention group');
  if (groups.length > 8) throw new RangeError('at most 8 cache groups');
  return groups;
}

/** What the engine's event list receives for another group's newly cached blocks. */
export interface GroupStored {
  readonly group: number;
  readonly kind: EngineGroupKind;
  readonly slidingWindow?: number;
  readonly from: number;
  readonly to: number;
}

/** A request's blocks in the groups besides the main one: block index -> physical block, per group. */
export class GroupHold {
  readonly held: Map<number, number>[];
  readonly done: number[];
  constructor(groups: number) {
    this.held = Array.from({ length: groups }, () => new Map());
    this.done = new Array<number>(groups).fill(0);
  }
}

/** Mixes a group into a block's hash: the pool key of block `seq` in group `g` (the main group keeps the hash). */
function mix(lo: number, hi: number, g: number, out: Int32Array): void {
  out[0] = lo ^ Math.imul(0x9e3779b9, g + 1);
  out[1] = hi ^ Math.imul(0x85ebca6b, g + 1);
}

export class HybridGroups {
  /** Index in `groups` of the main (first full-attention) group. */
  readonly primary: number;
  /** The other groups, in the order the coordinator checks them: full attention first, then by index. */
  private readonly order: number[];
  private readonly key = new Int32Array(2);
  /** Blocks a group could not cache because every block was in use. */
  uncachedBlocks = 0;

  constructor(
    readonly groups: readonly EngineCacheGroup[],
    private readonly blockSize: number,
  ) {
    this.primary = groups.findIndex((g) => g.kind === 'full_attention');
    if (this.primary < 0) throw new RangeError('a hybrid layout needs a full-attention group');
    this.order = groups
      .map((_, i) => i)
      .filter((i) => i !== this.primary)
      .sort((a, b) => Number(groups[a].kind !== 'full_attention') - Number(groups[b].kind !== 'full_attention') || a - b);
  }

  newHold(): GroupHold {
    return new GroupHold(this.groups.length);
  }

  private lookup(pool: BlockPool, seq32: Uint32Array, j: number, g: number): number {
    mix(seq32[2 * j], seq32[2 * j + 1], g, this.key);
    return pool.lookup32(this.key[0], this.key[1]);
  }

  /** The prefix the hybrid allocator reuses, given the main group's `mainBlocks` (already capped). */
  hitBlocks(pool: BlockPool, seqs: BigUint64Array, mainBlocks: number): number {
    const seq32 = u32View(seqs);
    let length = mainBlocks;
    for (;;) {
      let cur = length;
      for (const g of this.order) {
        cur = this.find(pool, seq32, g, cur);
        if (cur === 0) return 0;
      }
      if (cur >= length) return length;
      length = cur;
    }
  }

  private find(pool: BlockPool, seq32: Uint32Array, g: number, max: number): number {
    const spec = this.groups[g];
    if (spec.kind === 'mamba') {
      for (let i = max - 1; i >= 0; i--) if (this.lookup(pool, seq32, i, g) >= 0) return i + 1;
      return 0;
    }
    if (spec.kind === 'sliding_window') {
      const need = Math.ceil(((spec.slidingWindow ?? 0) - 1) / this.blockSize);
      let run = 0;
      for (let i = max - 1; i >= 0; i--) {
        if (this.lookup(pool, seq32, i, g) < 0) {
          run = 0;
          continue;
        }
        run++;
        if (run >= need) return i + run;
      }
      return run;
    }
    let i = 0;
    while (i < max && this.lookup(pool, seq32, i, g) >= 0) i++;
    return i;
  }

  /** Takes the hit's blocks in every other group (a new admission reusing `hitBlocks` blocks). */
  admit(pool: BlockPool, hold: GroupHold, seqs: BigUint64Array, hitBlocks: number): void {
    const seq32 = u32View(seqs);
    for (const g of this.order) {
      const spec = this.groups[g];
      let from = 0;
      if (spec.kind === 'sliding_window') from = Math.max(0, hitBlocks - Math.ceil(((spec.slidingWindow ?? 0) - 1) / this.blockSize));
      else if (spec.kind === 'mamba') from = Math.max(0, hitBlocks - 1);
      for (let j = from; j < hitBlocks; j++) {
        const b = this.lookup(pool, seq32, j, g);
        if (b < 0) continue; // the hit computation saw it a moment ago; nothing evicts in between
        pool.touch(b);
        hold.held[g].set(j, b);
      }
      hold.done[g] = hitBlocks;
    }
  }

  /**
   * After a step computed tokens up to `computed`: caches the groups' newly full blocks (`engineIdOf(j)` is block j's
   * id, the main group's) and releases what each group no longer needs. Returns the runs announced, per group.
   */
  afterCompute(
    pool: BlockPool,
    hold: GroupHold,
    seqs: BigUint64Array,
    computed: number,
    engineIdOf: (j: number) => bigint,
    identity: number,
  ): GroupStored[] {
    const bs = this.blockSize;
    const full = Math.floor(computed / bs);
    const seq32 = u32View(seqs);
    const out: GroupStored[] = [];
    for (const g of this.order) {
      const spec = this.groups[g];
      const held = hold.held[g];
      if (full <= hold.done[g]) continue;
      const first = spec.kind === 'mamba' ? full - 1 : hold.done[g];
      let runFrom = -1;
      const close = (end: number) => {
        if (runFrom >= 0) out.push({ group: g, kind: spec.kind, slidingWindow: spec.slidingWindow, from: runFrom, to: end });
        runFrom = -1;
      };
      for (let j = first; j < full; j++) {
        const existing = this.lookup(pool, seq32, j, g);
        if (existing >= 0) {
          // Another request cached it meanwhile: share it (not announced again).
          pool.touch(existing);
          held.set(j, existing);
          close(j);
          continue;
        }
        const b = pool.allocate();
        if (b < 0) {
          this.uncachedBlocks++;
          close(j);
          continue;
        }
        const [lo, hi] = this.key;
        pool.register(b, lo, hi, engineIdOf(j), j > 0 ? engineIdOf(j - 1) : null, identity, g);
        held.set(j, b);
        if (runFrom < 0) runFrom = j;
      }
      close(full);
      hold.done[g] = full;
      // What this group no longer needs stays cached but evictable (released last block first, as a request ends).
      let keepFrom = 0;
      if (spec.kind === 'mamba') keepFrom = full - 1;
      else if (spec.kind === 'sliding_window') keepFrom = Math.floor(Math.max(0, computed - (spec.slidingWindow ?? 0) + 1) / bs);
      if (keepFrom > 0) {
        const drop: number[] = [];
        for (const [j, b] of held) {
          if (j < keepFrom) {
            drop.push(b);
            held.delete(j);
          }
        }
        if (drop.length > 0) pool.release(drop);
      }
    }
    return out;
  }

  /** Releases everything a request holds in the other groups (finish, abort, preemption). */
  release(pool: BlockPool, hold: GroupHold): void {
    for (const held of hold.held) {
      const blocks = [...held.entries()].sort((a, b) => a[0] - b[0]).map((e) => e[1]);
      if (blocks.length > 0) pool.release(blocks);
      held.clear();
    }
    hold.done.fill(0);
  }
}
