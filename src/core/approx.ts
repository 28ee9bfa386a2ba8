/**
 * Approximate mode, for engines without a KV event feed: the router records each routing decision (the request's
 * sequence hashes on the chosen source) with a TTL (default 120 s) and an optional per-source capacity.
 *
 * One typed-array table keyed by (seq hash XOR a per-source salt), value = expiry, aux = source. Each source's set
 * stays prefix-closed (a block is present only with all its ancestors: shared ancestors carry the latest expiry, and
 * eviction removes whole expiry groups, oldest first), so "leading blocks of q present on s" is a binary search:
 * O(log n) lookups per source instead of a walk.
 */
import { U64Map, u32View } from './index/u64-map.ts';

export interface TtlIndexOptions {
  readonly ttlMs: number;
  /** Most blocks remembered per source; the least recently recorded go first. Unbounded when absent. */
  readonly capacityPerSource?: number;
}

/** Two 32-bit salts per source, so one table holds every source without collisions in practice. */
function saltLo(source: number): number {
  return Math.imul(source + 1, 0x9e3779b1) >>> 0;
}
function saltHi(source: number): number {
  return Math.imul(source + 1, 0x85ebca77) >>> 0;
}

export class TtlIndex {
  readonly ttlMs: number;
  readonly capacity: number;
  private readonly table = new U64Map(1024, true);
  private readonly counts = new Map<number, number>();
  /** Expiries are stored as int32 ms relative to `base`, rebased when they would overflow. */
  private base = NaN;
  private lastSweep = -Infinity;

  constructor(options: TtlIndexOptions) {
    this.ttlMs = options.ttlMs;
    this.capacity = options.capacityPerSource ?? Infinity;
  }

  private rel(now: number): number {
    if (Number.isNaN(this.base)) this.base = now;
    const r = Math.round(now - this.base);
    if (r + this.ttlMs > 0x7fffffff) {
      // ~24 days without a restart: forget everything rather than risk wrapped expiries (this is only a hint).
      this.table.clear();
      this.counts.clear();
      this.base = now;
      return 0;
    }
    return r;
  }

  /** Records that `source` will hold the blocks `seqHashes` from `now` on. */
  record(source: number, seqHashes: BigUint64Array, now: number): void {
    if (seqHashes.length === 0 || this.ttlMs <= 0) return;
    const expiry = this.rel(now) + this.ttlMs;
    const v = u32View(seqHashes);
    const sl = saltLo(source);
    const sh = saltHi(source);
    // One probe per block: set() inserts or updates, and the table's size says which.
    const before = this.table.size;
    for (let i = 0; i < seqHashes.length; i++) this.table.set((v[2 * i] ^ sl) >>> 0, (v[2 * i + 1] ^ sh) >>> 0, expiry, source);
    const added = this.table.size - before;
    const count = (this.counts.get(source) ?? 0) + added;
    this.counts.set(source, count);
    // Evict with 10% hysteresis so a full source is not rescanned on every request.
    if (count > this.capacity * 1.1) this.evictOldest(source, count - this.capacity, expiry);
  }

  private present(lo: number, hi: number, nowRel: number): boolean {
    const pos = this.table.find(lo, hi);
    return pos >= 0 && this.table.valueAt(pos) > nowRel;
  }

  /** Leading blocks of `seqHashes` that `source` holds unexpired. */
  prefix(source: number, seqHashes: BigUint64Array, now: number, view: Uint32Array = u32View(seqHashes)): number {
    if (!this.counts.get(source) || seqHashes.length === 0) return 0;
    const nowRel = this.rel(now);
    const sl = saltLo(source);
    const sh = saltHi(source);
    let lo = 0;
    let hi = seqHashes.length;
    while (lo < hi) {
      const mid = (lo + hi + 1) >>> 1;
      const k = 2 * (mid - 1);
      if (this.present((view[k] ^ sl) >>> 0, (view[k + 1] ^ sh) >>> 0, nowRel)) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  /** Drops expired entries; a full scan, so it runs at most every quarter TTL (lookups ignore expired ones anyway). */
  sweep(now: number): void {
    if (now - this.lastSweep < this.ttlMs / 4 || this.table.size === 0) return;
    this.lastSweep = now;
    const nowRel = this.rel(now);
    this.removeWhere((_source, expiry) => expiry <= nowRel);
  }

  /** Evicts at least `excess` blocks of older expiry groups; the chain just recorded (expiry `keep`) always stays. */
  private evictOldest(source: number, excess: number, keep: number): void {
    const expiries: number[] = [];
    this.table.forEach((_lo, _hi, expiry, s) => {
      if (s === source) expiries.push(expiry);
    });
    expiries.sort((a, b) => a - b);
    // Whole expiry groups go together, keeping the set prefix-closed.
    const cut = Math.min(expiries[Math.min(excess, expiries.length) - 1], keep - 1);
    this.removeWhere((s, expiry) => s === source && expiry <= cut);
  }

  private removeWhere(pred: (source: number, expiry: number) => boolean): void {
    const doomed: number[] = [];
    this.table.forEach((lo, hi, expiry, source) => {
      if (pred(source, expiry)) doomed.push(lo, hi, source);
    });
    for (let i = 0; i < doomed.length; i += 3) {
      this.table.delete(doomed[i], doomed[i + 1]);
      const s = doomed[i + 2];
      this.counts.set(s, (this.counts.get(s) ?? 1) - 1);
    }
  }

  removeSource(source: number): void {
    if (!this.counts.get(source)) return;
    this.removeWhere((s) => s === source);
    this.counts.delete(source);
  }

  blocks(source: number): number {
    return this.counts.get(source) ?? 0;
  }

  get size(): number {
    return this.table.size;
  }
}
