/**
 * Index snapshots as typed arrays: what a replica writes to its store and a starting replica loads.
 *
 * Taking one is two steps so that the caller never waits long: `KvIndex.capture()` copies the index's typed arrays
 * (slot records and the engine-id tables: a memory copy, the only part that must be synchronous to be consistent),
 * then each source's arrays are built from that private copy, in steps of bounded work, while the live index goes on
 * changing. Nothing here allocates a bigint per block.
 */
import type { U64Map } from './u64-map.ts';

/** One source's blocks in a snapshot. */
export interface SourceBlocks {
  /** Engine block size in tokens (a multiple of the router's). */
  readonly blockSize: number;
  /** The engine's block ids. */
  readonly engineIds: BigUint64Array;
  /** Router sequence hashes, blockSize / router block size per engine id, that engine block's first block first. */
  readonly seqHashes: BigUint64Array;
  /**
   * Per engine id, the position in `engineIds` of the engine block before it (its parent), or -1 (a first block, or a
   * parent this source does not hold). Optional: without it blocks are restored unlinked, which only the LRU cap
   * notices (it prunes leaves, and an unlinked parent looks like one).
   */
  readonly parents?: Int32Array;
}

/** Why and since when a source's index was not to be trusted when the snapshot was taken (KvRouter's SourceDegraded). */
export interface SnapshotDegraded {
  readonly since: number;
  readonly reason: string;
  readonly losses: number;
}

/** A snapshot source with its key (the router's name for it: `worker` or `worker#dpRank`). */
export interface SourceSnapshot extends SourceBlocks {
  readonly key: string;
  /**
   * Set when the source was degraded (events lost, not replayed): a router restoring it is degraded the same way.
   * A degraded source is listed even when it holds no blocks.
   */
  readonly degraded?: SnapshotDegraded;
}

/** A snapshot as data: what `KvRouter.restore` takes and a transport encodes. */
export interface RouterSnapshotData {
  /** The router block size the hashes were computed with. */
  readonly blockSize: number;
  readonly sources: readonly SourceSnapshot[];
}

const NONE = -1;
/** Default work per export step: ~1-2 ms. */
const EXPORT_STEP = 65_536;

/** The copy `KvIndex.capture()` takes; sources are named by index number. */
export class IndexCapture {
  constructor(
    /** Router block size. */
    readonly blockSize: number,
    /** Slot records [hash lo, hash hi, parent slot + 1, ...], `REC` int32 each. */
    private readonly rec: Int32Array,
    private readonly recStride: number,
    /** Slot generations (capped index only): an engine-id mapping with another generation is stale. */
    private readonly gen: Int32Array | null,
    private readonly maps: Map<number, { split: number; engineIds: U64Map }>,
  ) {}

  /** Source numbers that held blocks. */
  sources(): number[] {
    return [...this.maps.keys()];
  }

  /** Engine ids mapped for a source (an upper bound on its exported blocks): the cost of exporting it. */
  entries(source: number): number {
    return this.maps.get(source)?.engineIds.size ?? 0;
  }

  /** One source's arrays, O(its blocks), in one synchronous piece (exportSteps spreads the same work). */
  exportSource(source: number): SourceBlocks | null {
    const steps = this.exportSteps(source, Number.POSITIVE_INFINITY);
    let r = steps.next();
    while (!r.done) r = steps.next();
    return r.value;
  }

  /**
   * One source's arrays, built in steps of at most `budget` units of work (a table cell scanned or an engine id
   * handled: ~10-30 ns each); the generator's return value is the result. Engine ids come out in table order (a
   * sequential scan): restoreSource sizes its table for all of them first, so any order loads in linear time.
   */
  *exportSteps(source: number, budget = EXPORT_STEP): Generator<void, SourceBlocks | null, void> {
    const m = this.maps.get(source);
    if (!m) return null;
    const { split, engineIds: map } = m;
    const rec = this.rec;
    const REC = this.recStride;
    const gen = this.gen;
    const total = map.size;
    const cells = map.cells;
    const stride = map.stride;
    const cap = map.capacity;
    const ids = new BigUint64Array(total);
    const ids32 = new Int32Array(ids.buffer);
    const hashes = new BigUint64Array(total * split);
    const h32 = new Int32Array(hashes.buffer);
    const lastSlot = new Int32Array(total);
    const parentSlot = new Int32Array(total);
    let work = 0;
    let n = 0;
    for (let p = 0; p < cap; p++) {
      if (++work >= budget) {
        work = 0;
        yield;
      }
      const at = p * stride;
      if (cells[at + 2] === 0) continue;
      const slot = cells[at + 2] - 1;
      if (gen && gen[slot] !== cells[at + 3]) continue; // pruned by the cap since
      // The engine block's router blocks, from its last up through parent links, written first block first.
      let s = slot;
      let k = split - 1;
      for (; k >= 0 && s !== NONE; k--) {
        const h = 2 * (n * split + k);
        h32[h] = rec[s * REC];
        h32[h + 1] = rec[s * REC + 1];
        if (k > 0) s = rec[s * REC + 2] - 1;
      }
      if (k >= 0) continue; // a chain cut short (its ancestors were pruned): not restorable as one engine block
      ids32[2 * n] = cells[at];
      ids32[2 * n + 1] = cells[at + 1];
      lastSlot[n] = slot;
      parentSlot[n] = rec[s * REC + 2] - 1;
      n++;
    }
    const parents = new Int32Array(n);
    // Parent positions: the slot of each engine block's last router block -> its position + 1, in an array over all
    // slots that exports share (cleared after use; an export running while another holds it gets its own).
    const shared = this.bySlot !== null && !this.bySlotBusy;
    const bySlot = shared ? this.bySlot! : new Int32Array(rec.length / REC);
    if (this.bySlot === null) this.bySlot = bySlot;
    const owned = bySlot === this.bySlot;
    if (owned) this.bySlotBusy = true;
    try {
      yield* this.parentPositions(bySlot, lastSlot, parentSlot, parents, n, budget, work);
    } finally {
      for (let j = 0; j < n; j++) bySlot[lastSlot[j]] = 0;
      if (owned) this.bySlotBusy = false;
    }
    return {
      blockSize: split * this.blockSize,
      engineIds: n === total ? ids : ids.slice(0, n),
      seqHashes: n === total ? hashes : hashes.slice(0, n * split),
      parents,
    };
  }

  private bySlot: Int32Array | null = null;
  private bySlotBusy = false;

  private *parentPositions(
    bySlot: Int32Array,
    lastSlot: Int32Array,
    parentSlot: Int32Array,
    parents: Int32Array,
    n: number,
    budget: number,
    work: number,
  ): Generator<void, void, void> {
    for (let j = 0; j < n; j++) {
      bySlot[lastSlot[j]] = j + 1;
      if (++work >= budget) {
        work = 0;
        yield;
      }
    }
    for (let j = 0; j < n; j++) {
      const p = parentSlot[j];
      // A parent slot inside the block's own chain (a cycle left by inconsistent events: engine ids reused across
      // prefixes) is written as no parent: a restore refuses a block that is its own parent.
      const at = p === NONE || p >= bySlot.length ? NONE : bySlot[p] - 1;
      parents[j] = at === j ? NONE : at;
      if (++work >= budget) {
        work = 0;
        yield;
      }
    }
  }
}

/**
 * A router's snapshot, keyed by source key: the capture plus the names of its sources. `source(key)` builds one
 * source's arrays (O(its blocks)); a shell that must not stall runs `sourceSteps(key)` between event-loop turns.
 */
export class RouterSnapshot {
  readonly keys: readonly string[];

  constructor(
    private readonly capture: IndexCapture,
    private readonly names: ReadonlyMap<string, number>,
    /** Degraded sources at capture time (listed in `names` even without blocks). */
    private readonly degraded: ReadonlyMap<string, SnapshotDegraded> = new Map(),
  ) {
    this.keys = [...names.keys()];
  }

  /** A source's arrays with its key and degraded state; an empty source for a degraded one that held no blocks. */
  private named(key: string, blocks: SourceBlocks | null): SourceSnapshot | null {
    const degraded = this.degraded.get(key);
    if (!blocks && !degraded) return null;
    const b = blocks ?? {
      blockSize: this.capture.blockSize,
      engineIds: new BigUint64Array(0),
      seqHashes: new BigUint64Array(0),
      parents: new Int32Array(0),
    };
    return degraded ? { key, ...b, degraded } : { key, ...b };
  }

  /** The router block size the hashes were computed with. */
  get blockSize(): number {
    return this.capture.blockSize;
  }

  /** Engine ids of a source (an upper bound on its blocks): the cost of `source(key)`. */
  entries(key: string): number {
    const n = this.names.get(key);
    return n === undefined ? 0 : this.capture.entries(n);
  }

  /** One source's arrays, or null for a key not in the snapshot (one synchronous piece of O(its blocks)). */
  source(key: string): SourceSnapshot | null {
    const n = this.names.get(key);
    if (n === undefined) return null;
    return this.named(key, this.capture.exportSource(n));
  }

  /**
   * The same in steps of bounded work (see IndexCapture.exportSteps): `next()` until `done`, yielding to the event
   * loop in between; the final value is the source's arrays (null for a key not in the snapshot).
   */
  *sourceSteps(key: string, budget?: number): Generator<void, SourceSnapshot | null, void> {
    const n = this.names.get(key);
    if (n === undefined) return null;
    const blocks = yield* this.capture.exportSteps(n, budget);
    return this.named(key, blocks);
  }

  /** Every source at once: one synchronous piece of O(all blocks). */
  data(): RouterSnapshotData {
    const sources: SourceSnapshot[] = [];
    for (const key of this.keys) {
      const s = this.source(key);
      if (s && (s.engineIds.length > 0 || s.degraded)) sources.push(s);
    }
    return { blockSize: this.blockSize, sources };
  }
}
