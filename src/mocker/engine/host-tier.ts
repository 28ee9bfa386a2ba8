/**
 * The host tier of the mock engine: CPU offload, a second LRU level of `capacity` blocks behind the GPU cache.
 *
 * Model (an exclusive victim cache, write-back on eviction, like vLLM's CPU offloading with store-on-evict and SGLang
 * HiCache's write-back policy):
 *   - a cached GPU block evicted to make room is copied to the host tier as its most recent block (the least recent
 *     host block is dropped when the tier is full);
 *   - a request's prefix look-up continues in the host tier where the GPU look-up stops: the run of its next blocks
 *     that the tier holds is loaded back into fresh GPU blocks (it counts as computed, like KV received from elsewhere,
 *     and in the request's cached tokens) and leaves the host tier (one copy of a block at a time).
 * For reuse, GPU + host is then one LRU order of GPU + host blocks: the GPU's free queue is the recent end, the host
 * tier the older end, and a block moves up on a hit whichever level holds it. That is what the miss-ratio curve's
 * host-tier answer assumes (src/core/mrc.ts, docs/cache-sizing.md); bench:mrc --parts host checks it on traces.
 *
 * Not modelled: the time a load or an offload takes (loads cost no step time), and write-through tiers (every block
 * copied when computed, which keeps a block in both levels and makes the pair closer to one LRU of max(GPU, host)).
 *
 * Blocks are keyed by the router's sequence hash (as the GPU pool); each keeps the engine id announced for it, so the
 * engine can announce the tier's Stored and Removed events (medium "CPU", engine ids only).
 */
import { U64Map } from '../../core/index/u64-map.ts';

export class HostTier {
  readonly capacity: number;
  /** Hash -> slot. */
  private readonly bySeq: U64Map;
  private readonly lo: Int32Array;
  private readonly hi: Int32Array;
  private readonly engineId: BigUint64Array;
  /** LRU list over slots; index `capacity` is the sentinel (next of it: least recent). */
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private readonly freeSlots: Int32Array;
  private freeCount: number;

  constructor(capacity: number) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`host tier blocks must be a positive integer, got ${capacity}`);
    this.capacity = capacity;
    this.bySeq = new U64Map(Math.min(capacity, 1 << 16));
    this.lo = new Int32Array(capacity);
    this.hi = new Int32Array(capacity);
    this.engineId = new BigUint64Array(capacity);
    this.prev = new Int32Array(capacity + 1);
    this.next = new Int32Array(capacity + 1);
    this.prev[capacity] = capacity;
    this.next[capacity] = capacity;
    this.freeSlots = new Int32Array(capacity);
    for (let i = 0; i < capacity; i++) this.freeSlots[i] = capacity - 1 - i;
    this.freeCount = capacity;
  }

  /** Blocks held. */
  get size(): number {
    return this.capacity - this.freeCount;
  }

  has(lo: number, hi: number): boolean {
    return this.bySeq.get(lo, hi) >= 0;
  }

  /**
   * Stores a block as the most recent (refreshing it when held). Returns the engine id of the block dropped to make room,
   * or null when none was.
   */
  store(lo: number, hi: number, engineId: bigint): bigint | null {
    const had = this.bySeq.get(lo, hi);
    if (had >= 0) {
      this.unlink(had);
      this.pushRecent(had);
      return null;
    }
    let dropped: bigint | null = null;
    if (this.freeCount === 0) {
      const oldest = this.next[this.capacity];
      dropped = this.engineId[oldest];
      this.bySeq.delete(this.lo[oldest], this.hi[oldest]);
      this.unlink(oldest);
      this.freeSlots[this.freeCount++] = oldest;
    }
    const s = this.freeSlots[--this.freeCount];
    this.lo[s] = lo;
    this.hi[s] = hi;
    this.engineId[s] = engineId;
    this.bySeq.set(lo, hi, s);
    this.pushRecent(s);
    return dropped;
  }

  /** Removes a block (loaded back to the GPU); returns its engine id, or null when the tier does not hold it. */
  take(lo: number, hi: number): bigint | null {
    const s = this.bySeq.delete(lo, hi);
    if (s < 0) return null;
    this.unlink(s);
    this.freeSlots[this.freeCount++] = s;
    return this.engineId[s];
  }

  /** Router hashes (lo, hi) from least to most recent: for tests. */
  order(): [number, number][] {
    const out: [number, number][] = [];
    for (let s = this.next[this.capacity]; s !== this.capacity; s = this.next[s]) out.push([this.lo[s], this.hi[s]]);
    return out;
  }

  private pushRecent(s: number): void {
    const c = this.capacity;
    const last = this.prev[c];
    this.next[last] = s;
    this.prev[s] = last;
    this.next[s] = c;
    this.prev[c] = s;
  }

  private unlink(s: number): void {
    const p = this.prev[s];
    const n = this.next[s];
    this.next[p] = n;
    this.prev[n] = p;
  }
}
