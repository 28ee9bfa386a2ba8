/**
 * Approximate mode, for engines without a KV event feed: the router records each routing decision (the request's
 * sequence hashes on the chosen source) with a TTL (default 120 s), within a byte budget (--approx-table-mb) and, per
 * source, its engine's KV capacity when known.
 *
 * One typed-array table keyed by (seq hash XOR a per-source salt), value = the record's sequence number, aux = source.
 * Every record() is a group (sequence number, expiry, source, entry count) in a ring in record order; an entry belongs
 * to the group that last recorded it (a chain recorded again moves to the new group, ancestors included). So within a
 * source an ancestor's group is never older than its descendants', and every limit is a cut in that order: the groups
 * up to a sequence number are dropped at once, and "present" means "in a group after the cut, unexpired". Each source's
 * set stays prefix-closed and "leading blocks of q present on s" is a binary search: O(log n) lookups per source.
 *
 * The cuts (TTL, the table's budget: the oldest groups of every source first; a source's capacity: its own oldest
 * groups) are logical and cost O(groups dropped). The entries they leave are deleted by an incremental scan of the
 * table (a cursor going round it), a few cells per recorded block, and before a record that would not fit: the budget
 * cut drops a tenth of the table at a time, so a record finds the room it needs within ~10 cells per block instead of
 * scanning every entry (the old eviction's stall, which grew with the table).
 *
 * Why whole-table rather than per-source budgets: the table is one array, so its bytes are one figure; the oldest
 * decisions fleet-wide are the ones least likely still cached (engines evict least recently used blocks too); and a
 * per-source share would have to be resized as sources join and leave. The engine's capacity still caps each source.
 */
import { capacityAfterGrowth, U64Map, u32View } from './index/u64-map.ts';

export interface TtlIndexOptions {
  readonly ttlMs: number;
  /** Most blocks remembered per source; the least recently recorded go first. Unbounded when absent. */
  readonly capacityPerSource?: number;
  /** A source's KV capacity in blocks when known (the engine's num_gpu_blocks): it never holds more. */
  readonly capacityOf?: (source: number) => number | undefined;
  /** Byte budget of the table and its group ring (what `bytes` counts). Unbounded when absent. */
  readonly maxBytes?: number;
}

/** Two 32-bit salts per source, so one table holds every source without collisions in practice. */
function saltLo(source: number): number {
  return Math.imul(source + 1, 0x9e3779b1) >>> 0;
}
function saltHi(source: number): number {
  return Math.imul(source + 1, 0x85ebca77) >>> 0;
}

/** The table's load limit (passed to U64Map, so the entry limit below matches its growth rule). */
const MAX_LOAD = 0.8;
/** Bytes of one table cell: lo, hi, value, source as int32. */
const CELL_BYTES = 16;
/** Bytes of one group in the ring: expiry, source, count, next group of the source, as int32. */
const GROUP_BYTES = 16;
/** Share of the budget the group ring may use (the table gets the rest). */
const RING_SHARE = 1 / 8;
/** A budget cut drops at least this share of the entry limit, so the deletion scan finds its entries densely. */
const CUT_SHARE = 0.1;
/** Cells scanned per recorded block while dropped entries remain (background deletion). */
const SCAN_PER_BLOCK = 4;
/** Cells scanned per sweep() while dropped entries remain. */
const SWEEP_CELLS = 1 << 16;
/** Sequence numbers are stored as int32 values; renumbered before they would overflow. */
const SEQ_LIMIT = 0x7ffffff0;

export class TtlIndex {
  readonly ttlMs: number;
  readonly capacity: number;
  /** The byte budget (Infinity: unbounded). */
  readonly maxBytes: number;
  /** Most entries the table may hold: as many as its largest capacity within the budget holds without growing. */
  readonly maxEntries: number;
  private readonly capacityOf?: (source: number) => number | undefined;
  private readonly table: U64Map;
  private readonly maxGroups: number;
  /** Group ring, indexed by seq & mask: expiry (relative ms), source, live entries, next group of the same source. */
  private gExpiry = new Int32Array(64);
  private gSource = new Int32Array(64);
  private gCount = new Int32Array(64);
  private gNext = new Int32Array(64);
  private mask = 63;
  /** Groups headSeq..tailSeq-1 are in the ring; everything before headSeq is dropped. */
  private headSeq = 0;
  private tailSeq = 0;
  /** Per source: live entries, the last group dropped by its own capacity or removal, its oldest and newest live group. */
  private readonly held: number[] = [];
  private readonly srcCut: number[] = [];
  private readonly srcHead: number[] = [];
  private readonly srcTail: number[] = [];
  /** Entries still in the table whose group was dropped: what the deletion scan looks for. */
  private doomed = 0;
  private cursor = 0;
  private lastExpiry = 0;
  /** Expiries are stored as int32 ms relative to `base`, rebased when they would overflow. */
  private base = NaN;
  /** Cells the deletion scan read, in all and at most within one record() (bench:memory reports them). */
  readonly scanned = { total: 0, worstRecord: 0 };
  /** Sequence number limit before renumbering (a constructor argument for tests). */
  private readonly seqLimit: number;

  constructor(options: TtlIndexOptions, seqLimit = SEQ_LIMIT) {
    this.ttlMs = options.ttlMs;
    this.capacity = options.capacityPerSource ?? Infinity;
    this.capacityOf = options.capacityOf;
    this.maxBytes = options.maxBytes ?? Infinity;
    this.seqLimit = seqLimit;
    if (Number.isFinite(this.maxBytes)) {
      const tableBytes = this.maxBytes * (1 - RING_SHARE);
      // Start small under a small budget; the table then grows through a fixed sequence of capacities.
      this.table = new U64Map(Math.max(1, Math.min(1024, Math.floor((tableBytes / CELL_BYTES) * MAX_LOAD) >> 1)), true, {
        maxLoad: MAX_LOAD,
        hashedKeys: true,
      });
      let cap = this.table.capacity;
      for (let next = capacityAfterGrowth(cap); next > cap && next * CELL_BYTES <= tableBytes; next = capacityAfterGrowth(cap)) cap = next;
      // set() grows when size + 1 > cap * MAX_LOAD, even to update a present key: one entry of headroom.
      this.maxEntries = Math.max(1, Math.floor(cap * MAX_LOAD) - 1);
      this.maxGroups = Math.max(64, 2 ** Math.floor(Math.log2((this.maxBytes * RING_SHARE) / GROUP_BYTES)));
    } else {
      this.table = new U64Map(1024, true, { maxLoad: MAX_LOAD, hashedKeys: true });
      this.maxEntries = Infinity;
      this.maxGroups = Infinity;
    }
  }

  private rel(now: number): number {
    if (Number.isNaN(this.base)) this.base = now;
    const r = Math.round(now - this.base);
    if (r + this.ttlMs > 0x7fffffff) {
      // ~24 days without a restart: forget everything rather than risk wrapped expiries (this is only a hint).
      this.reset();
      this.base = now;
      return 0;
    }
    return r;
  }

  private reset(): void {
    this.table.clear();
    this.headSeq = this.tailSeq = 0;
    this.doomed = 0;
    this.lastExpiry = 0;
    this.held.length = this.srcCut.length = this.srcHead.length = this.srcTail.length = 0;
  }

  /** Records that `source` will hold the blocks `seqHashes` from `now` on. */
  record(source: number, seqHashes: BigUint64Array, now: number): void {
    if (seqHashes.length === 0 || this.ttlMs <= 0) return;
    const nowRel = this.rel(now);
    this.dropExpired(nowRel);
    if (this.tailSeq >= this.seqLimit) this.renumber();
    // A clock that steps back does not reorder the groups: expiries never decrease along the ring.
    const expiry = Math.max(nowRel + this.ttlMs, this.lastExpiry);
    this.lastExpiry = expiry;
    // A chain longer than the table keeps its leading blocks (still prefix-closed).
    const scannedBefore = this.scanned.total;
    let n = Math.min(seqHashes.length, this.maxEntries);
    n = this.makeRoom(n);
    if (n === 0) return;
    const seq = this.openGroup(source, expiry);
    const v = u32View(seqHashes);
    const sl = saltLo(source);
    const sh = saltHi(source);
    const table = this.table;
    const floor = this.floorOf(source);
    const gCount = this.gCount;
    const mask = this.mask;
    // Entries now in this group, and how many of them the source did not hold (new, or revived from a dropped group).
    let joined = 0;
    let gained = 0;
    for (let i = 0; i < n; i++) {
      const lo = (v[2 * i] ^ sl) | 0;
      const hi = (v[2 * i + 1] ^ sh) | 0;
      const pos = table.find(lo, hi);
      if (pos < 0) {
        table.set(lo, hi, seq, source);
        joined++;
        gained++;
        continue;
      }
      const old = table.valueAt(pos);
      if (old === seq) continue; // a hash repeated within the chain
      if (old <= floor) {
        this.doomed--;
        gained++;
      } else gCount[old & mask]--;
      table.setAt(pos, seq, source);
      joined++;
    }
    gCount[seq & mask] += joined;
    this.held[source] = (this.held[source] ?? 0) + gained;
    this.limitSource(source, seq);
    if (this.doomed > 0) this.scan(SCAN_PER_BLOCK * n + 16, 0);
    this.scanned.worstRecord = Math.max(this.scanned.worstRecord, this.scanned.total - scannedBefore);
  }

  /** The last dropped group's sequence number for a source: entries at or before it are gone. */
  private floorOf(source: number): number {
    const c = this.srcCut[source];
    return c !== undefined && c > this.headSeq - 1 ? c : this.headSeq - 1;
  }

  private present(lo: number, hi: number, floor: number, nowRel: number): boolean {
    const pos = this.table.find(lo, hi);
    if (pos < 0) return false;
    const seq = this.table.valueAt(pos);
    return seq > floor && this.gExpiry[seq & this.mask] > nowRel;
  }

  /** Leading blocks of `seqHashes` that `source` holds unexpired. */
  prefix(source: number, seqHashes: BigUint64Array, now: number, view: Uint32Array = u32View(seqHashes)): number {
    if (!this.held[source] || seqHashes.length === 0) return 0;
    const nowRel = this.rel(now);
    const floor = this.floorOf(source);
    const sl = saltLo(source);
    const sh = saltHi(source);
    let lo = 0;
    let hi = seqHashes.length;
    while (lo < hi) {
      const mid = (lo + hi + 1) >>> 1;
      const k = 2 * (mid - 1);
      if (this.present((view[k] ^ sl) | 0, (view[k + 1] ^ sh) | 0, floor, nowRel)) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  /** Drops expired groups (cheap) and deletes up to SWEEP_CELLS cells' worth of dropped entries. */
  sweep(now: number): void {
    if (this.tailSeq === this.headSeq && this.doomed === 0) return;
    this.dropExpired(this.rel(now));
    if (this.doomed > 0) this.scan(SWEEP_CELLS, 0);
  }

  /** A new group at the ring's tail (dropping the oldest when the ring is at its budget). */
  private openGroup(source: number, expiry: number): number {
    if (this.tailSeq - this.headSeq > this.mask) {
      if (this.mask + 1 < this.maxGroups) this.growRing();
      else this.dropHead();
    }
    const seq = this.tailSeq++;
    const g = seq & this.mask;
    this.gExpiry[g] = expiry;
    this.gSource[g] = source;
    this.gCount[g] = 0;
    this.gNext[g] = -1;
    const tail = this.srcTail[source];
    if (tail !== undefined && tail >= 0 && tail >= this.headSeq && tail > (this.srcCut[source] ?? -1)) this.gNext[tail & this.mask] = seq;
    else this.srcHead[source] = seq;
    this.srcTail[source] = seq;
    return seq;
  }

  private growRing(): void {
    const size = (this.mask + 1) * 2;
    const grow = (old: Int32Array) => {
      const a = new Int32Array(size);
      for (let s = this.headSeq; s < this.tailSeq; s++) a[s & (size - 1)] = old[s & this.mask];
      return a;
    };
    this.gExpiry = grow(this.gExpiry);
    this.gSource = grow(this.gSource);
    this.gCount = grow(this.gCount);
    this.gNext = grow(this.gNext);
    this.mask = size - 1;
  }

  /** Drops the ring's oldest group: its live entries become dropped ones. */
  private dropHead(): void {
    const seq = this.headSeq++;
    const g = seq & this.mask;
    const s = this.gSource[g];
    if (seq > (this.srcCut[s] ?? -1)) {
      this.doomed += this.gCount[g];
      this.held[s] -= this.gCount[g];
      this.srcHead[s] = this.gNext[g];
      if (this.gNext[g] < 0) this.srcTail[s] = -1;
    }
  }

  private dropExpired(nowRel: number): void {
    while (this.headSeq < this.tailSeq && this.gExpiry[this.headSeq & this.mask] <= nowRel) this.dropHead();
  }

  /**
   * Makes room for `n` more entries within the budget: drops the oldest groups (a tenth of the table at a time, so the
   * scan finds their entries densely) and deletes dropped entries. Returns how many entries fit (n, or fewer when the
   * table holds nothing else to drop).
   */
  private makeRoom(n: number): number {
    if (this.table.size + n <= this.maxEntries) return n;
    const low = Math.ceil(this.maxEntries * CUT_SHARE * 0.5);
    let cycles = 0;
    while (this.table.size + n > this.maxEntries) {
      const need = this.table.size + n - this.maxEntries;
      if (this.doomed < Math.max(need, low)) {
        const target = need + Math.ceil(this.maxEntries * CUT_SHARE);
        while (this.doomed < target && this.headSeq < this.tailSeq) this.dropHead();
      }
      if (this.doomed === 0) break;
      const before = this.table.size;
      this.scan(this.table.capacity, this.maxEntries - n);
      if (this.table.size === before && ++cycles > 1) {
        // A whole turn found nothing: the count of dropped entries is off. Never spin; trust the table.
        this.doomed = 0;
        break;
      }
    }
    return Math.max(0, Math.min(n, this.maxEntries - this.table.size));
  }

  /**
   * Deletes dropped entries from the cursor on, at most `cells` cells, stopping once the table holds `stopAt`
   * entries or none are left to delete. Backward-shift deletion moves later cells back into the hole, so the cursor
   * re-reads the cell it deleted.
   */
  private scan(cells: number, stopAt: number): void {
    const table = this.table;
    const cap = table.capacity;
    const stride = table.stride;
    if (this.cursor >= cap) this.cursor = 0;
    let i = this.cursor;
    const head = this.headSeq - 1;
    const cut = this.srcCut;
    let k = 0;
    for (; k < cells && this.doomed > 0 && table.size > stopAt; k++) {
      const data = table.cells;
      const at = i * stride;
      const v = data[at + 2];
      if (v !== 0) {
        const seq = v - 1;
        const c = cut[data[at + 3]];
        if (seq <= head || (c !== undefined && seq <= c)) {
          table.deleteAt(i);
          this.doomed--;
          continue;
        }
      }
      if (++i === cap) i = 0;
    }
    this.cursor = i;
    this.scanned.total += k;
  }

  /** Holds a source within its capacity (configured, or its engine's): its oldest groups go, never `keep`. */
  private limitSource(source: number, keep: number): void {
    const learned = this.capacityOf?.(source);
    const cap = learned !== undefined && learned > 0 ? Math.min(learned, this.capacity) : this.capacity;
    if (!((this.held[source] ?? 0) > cap)) return;
    let g = this.srcHead[source];
    while (this.held[source] > cap && g >= 0 && g !== keep) {
      const at = g & this.mask;
      this.doomed += this.gCount[at];
      this.held[source] -= this.gCount[at];
      this.gCount[at] = 0;
      this.srcCut[source] = g;
      g = this.gNext[at];
    }
    this.srcHead[source] = g;
  }

  /** Forgets a source: its groups are dropped now, its entries deleted by the scan. */
  removeSource(source: number): void {
    if (this.srcHead[source] === undefined) return;
    let g = this.srcHead[source];
    const floor = this.floorOf(source);
    while (g !== undefined && g >= 0 && g > floor) {
      const at = g & this.mask;
      this.doomed += this.gCount[at];
      this.gCount[at] = 0;
      g = this.gNext[at];
    }
    this.held[source] = 0;
    this.srcCut[source] = this.tailSeq - 1;
    this.srcHead[source] = -1;
    this.srcTail[source] = -1;
  }

  /**
   * Before sequence numbers would overflow int32: deletes every dropped entry (one full pass, every ~2^31 records)
   * and shifts the numbers down by a multiple of the ring's size (each group keeps its slot).
   */
  private renumber(): void {
    this.scanAll();
    const shift = this.headSeq - (this.headSeq & this.mask);
    const cells = this.table.cells;
    const stride = this.table.stride;
    for (let at = 0; at < cells.length; at += stride) if (cells[at + 2] !== 0) cells[at + 2] -= shift;
    for (let s = this.headSeq; s < this.tailSeq; s++) if (this.gNext[s & this.mask] >= 0) this.gNext[s & this.mask] -= shift;
    const down = (a: number[]) => {
      for (let i = 0; i < a.length; i++) if (a[i] !== undefined && a[i] >= 0) a[i] = Math.max(-1, a[i] - shift);
    };
    down(this.srcHead);
    down(this.srcTail);
    down(this.srcCut);
    this.headSeq -= shift;
    this.tailSeq -= shift;
  }

  /** Deletes every dropped entry in one pass (a deletion pulls later cells back, so the cell is read again). */
  private scanAll(): void {
    const table = this.table;
    const cap = table.capacity;
    const stride = table.stride;
    for (let i = 0; i < cap; i++) {
      for (;;) {
        const at = i * stride;
        const v = table.cells[at + 2];
        if (v === 0 || v - 1 > this.floorOf(table.cells[at + 3])) break;
        table.deleteAt(i);
      }
    }
    this.doomed = 0;
  }

  /**
   * Checks the counts against the table (tests): dropped entries, each live group's and each source's entries.
   * A full scan; returns the first mismatch, or undefined.
   */
  audit(): string | undefined {
    const perGroup = new Map<number, number>();
    const perSource = new Map<number, number>();
    let doomed = 0;
    this.table.forEach((_lo, _hi, seq, source) => {
      if (seq <= this.floorOf(source)) doomed++;
      else {
        perGroup.set(seq, (perGroup.get(seq) ?? 0) + 1);
        perSource.set(source, (perSource.get(source) ?? 0) + 1);
      }
    });
    if (doomed !== this.doomed) return `dropped entries: counted ${this.doomed}, found ${doomed}`;
    for (let seq = this.headSeq; seq < this.tailSeq; seq++) {
      const s = this.gSource[seq & this.mask];
      if (seq <= this.floorOf(s)) continue;
      if ((perGroup.get(seq) ?? 0) !== this.gCount[seq & this.mask])
        return `group ${seq}: counted ${this.gCount[seq & this.mask]}, found ${perGroup.get(seq) ?? 0}`;
    }
    for (let s = 0; s < this.held.length; s++)
      if ((this.held[s] ?? 0) !== (perSource.get(s) ?? 0)) return `source ${s}: counted ${this.held[s]}, found ${perSource.get(s) ?? 0}`;
    return undefined;
  }

  /** Live blocks of a source (expired ones count until their group is dropped at the next record or sweep). */
  blocks(source: number): number {
    return this.held[source] ?? 0;
  }

  /** Entries in the table, dropped ones not yet deleted included. */
  get size(): number {
    return this.table.size;
  }

  /** Memory of the table's array and the group ring, bytes (what `maxBytes` bounds). */
  get bytes(): number {
    return this.table.byteLength + (this.mask + 1) * GROUP_BYTES;
  }
}
