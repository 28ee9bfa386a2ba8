/**
 * Holder sets, interned: every distinct set of sources that holds some block is stored once, under a small integer
 * id, and a block carries only that id (one int32 in the index's sequence table cell, beside the block's slot).
 *
 * Prefix chains share holder sets: the blocks of one cached conversation are held by the same few sources down to
 * where one of them stops, so thousands of blocks name a handful of sets. The index walk then compares ids: a block
 * whose id equals the previous block's costs one table probe and nothing else, and the candidate set is intersected
 * with a set's members only where the id changes (src/core/index/kv-index.ts, walk).
 *
 * A set's members are stored in HolderSets' form (./holders.ts: up to four inline, a pool list or bitset past that),
 * two words per id in `cells`. Sets are immutable: adding or removing a holder of a block moves the block to another
 * id (found through a table keyed by the set's content hash, created when absent). Each id counts the blocks that
 * carry it and is freed when none does. The content hash is the sum of per-member hashes (64 bits in two halves), so
 * the hash of "set plus s" or "set minus s" is O(1); a hash hit is checked against the members before it is reused,
 * so a collision costs a second copy of a set, never a wrong answer. Id 0 is the empty set.
 */
import { HolderSets, INLINE_MAX } from './holders.ts';
import { U64Map } from './u64-map.ts';

function fmix(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return h ^ (h >>> 16);
}
const memberLo = (s: number): number => fmix(s + 1);
const memberHi = (s: number): number => fmix(Math.imul(s + 1, 0x9e3779b1) ^ 0x7f4a7c15);

/** The empty set's id. */
export const EMPTY_SET = 0;

export class SetTable {
  /** Member storage (pool lists and bitsets); read directly by the index walk (re-read after any change). */
  readonly holders = new HolderSets();
  /** Two HolderSets words per id. Re-read after any change (growth reallocates it). */
  cells: Int32Array = new Int32Array(2 * 64);
  private refs: Int32Array = new Int32Array(64);
  private sizes: Int32Array = new Int32Array(64);
  private hashes: Int32Array = new Int32Array(2 * 64);
  private interned = new Uint8Array(64);
  private readonly byHash = new U64Map(64);
  /** Per id: bumped when the id is freed, so a remembered transition to or from an older use of it is ignored. */
  private gens: Int32Array = new Int32Array(64);
  /**
   * Remembered transitions, (set, source, plus or minus) -> set, with both sets' generations: a popular block's next
   * holder usually makes the change another block of its prefix just made. Cleared when it outgrows the live sets.
   */
  private readonly transitions = new U64Map(1024, 2);
  private freeIds: Int32Array = new Int32Array(64);
  private freeTop = 0;
  /** Next never-used id (id 0 is the empty set). */
  private top = 1;
  private liveSets = 0;
  private mark = new Int32Array(64);
  private stamp = 0;
  private scratch = new Int32Array(64);
  /** Blocks whose set has more than four holders (kept in step by retain / release). */
  overflowBlocks = 0;

  /** Tells the table the largest source number in use. */
  fleet(largestSource: number): void {
    this.holders.fleet(largestSource);
    if (this.mark.length <= largestSource) {
      const n = Math.max(largestSource + 1, 2 * this.mark.length);
      this.mark = new Int32Array(n);
      this.scratch = new Int32Array(n);
      this.stamp = 0;
    }
  }

  /** Distinct non-empty sets alive. */
  get size(): number {
    return this.liveSets;
  }

  get byteLength(): number {
    return (
      this.holders.byteLength +
      this.cells.byteLength +
      this.refs.byteLength +
      this.sizes.byteLength +
      this.hashes.byteLength +
      this.interned.byteLength +
      this.byHash.byteLength +
      this.gens.byteLength +
      this.transitions.byteLength +
      this.freeIds.byteLength
    );
  }

  has(id: number, s: number): boolean {
    return id !== EMPTY_SET && this.holders.has(this.cells, 2 * id, s);
  }

  count(id: number): number {
    return this.sizes[id];
  }

  /** The members into `out` (sized >= count), in no particular order; returns the count. */
  collect(id: number, out: Int32Array): number {
    return id === EMPTY_SET ? 0 : this.holders.collect(this.cells, 2 * id, out);
  }

  /** One more block carries `id`. */
  retain(id: number): void {
    if (id === EMPTY_SET) return;
    this.refs[id]++;
    if (this.sizes[id] > INLINE_MAX) this.overflowBlocks++;
  }

  /** One block fewer carries `id`; the set is freed when none does. */
  release(id: number): void {
    if (id === EMPTY_SET) return;
    if (this.sizes[id] > INLINE_MAX) this.overflowBlocks--;
    if (--this.refs[id] > 0) return;
    if (this.interned[id] === 1) this.byHash.delete(this.hashes[2 * id], this.hashes[2 * id + 1]);
    this.holders.clear(this.cells, 2 * id);
    this.sizes[id] = 0;
    this.gens[id]++;
    this.liveSets--;
    if (this.freeTop === this.freeIds.length) this.freeIds = grown(this.freeIds, 2 * this.freeIds.length);
    this.freeIds[this.freeTop++] = id;
  }

  /**
   * The id of `id` plus source `s` (`sign` 1; s must not be a member) or minus it (`sign` -1; s must be a member).
   * A set created here carries no block yet: the caller retains it at once.
   */
  changed(id: number, s: number, sign: 1 | -1): number {
    const n = this.sizes[id] + sign;
    if (n === 0) return EMPTY_SET;
    const key = (s << 1) | (sign > 0 ? 1 : 0);
    const t = this.transitions.find(id, key);
    if (t >= 0) {
      const to = this.transitions.valueAt(t);
      if (this.transitions.fieldAt(t, 0) === this.gens[id] && this.transitions.fieldAt(t, 1) === this.gens[to]) return to;
    }
    const to = this.lookUp(id, s, sign, n);
    if (this.transitions.size > 4 * this.liveSets + 4096) this.transitions.clear();
    const at = this.transitions.set(id, key, to, this.gens[id]);
    this.transitions.setFieldAt(at, 1, this.gens[to]);
    return to;
  }

  /** `changed` without the remembered transitions: by content hash, else a new set. */
  private lookUp(id: number, s: number, sign: 1 | -1, n: number): number {
    const lo = (this.hashes[2 * id] + sign * memberLo(s)) | 0;
    const hi = (this.hashes[2 * id + 1] + sign * memberHi(s)) | 0;
    const pos = this.byHash.find(lo, hi);
    if (pos >= 0) {
      const c = this.byHash.valueAt(pos);
      if (this.sizes[c] === n && (sign > 0 ? this.isPlus(c, id, s) : this.isPlus(id, c, s))) return c;
    }
    const b = this.allocId();
    const cells = this.cells;
    if (id === EMPTY_SET) {
      cells[2 * b] = 0;
      cells[2 * b + 1] = 0;
    } else this.holders.copy(cells, 2 * id, 2 * b);
    if (sign > 0) this.holders.add(cells, 2 * b, s);
    else this.holders.remove(cells, 2 * b, s);
    this.sizes[b] = n;
    this.refs[b] = 0;
    this.hashes[2 * b] = lo;
    this.hashes[2 * b + 1] = hi;
    // A hash taken by another set (a collision): this copy lives on uninterned; answers never depend on sharing.
    this.interned[b] = pos < 0 ? 1 : 0;
    if (pos < 0) this.byHash.set(lo, hi, b);
    return b;
  }

  /** True when set `big` is set `small` plus `s` (sizes already checked to differ by one). */
  private isPlus(big: number, small: number, s: number): boolean {
    if (!this.has(big, s) || this.has(small, s)) return false;
    const stamp = this.nextStamp();
    const mark = this.mark;
    const ids = this.scratch;
    const k = this.collect(big, ids);
    for (let j = 0; j < k; j++) mark[ids[j]] = stamp;
    const m = this.collect(small, ids);
    for (let j = 0; j < m; j++) if (mark[ids[j]] !== stamp) return false;
    return true;
  }

  private nextStamp(): number {
    if (this.stamp === 0x7fffffff) {
      this.mark.fill(0);
      this.stamp = 0;
    }
    return ++this.stamp;
  }

  private allocId(): number {
    this.liveSets++;
    if (this.freeTop > 0) return this.freeIds[--this.freeTop];
    const id = this.top++;
    if (id >= this.refs.length) {
      const n = 2 * this.refs.length;
      this.cells = grown(this.cells, 2 * n);
      this.refs = grown(this.refs, n);
      this.sizes = grown(this.sizes, n);
      this.hashes = grown(this.hashes, 2 * n);
      this.gens = grown(this.gens, n);
      const interned = new Uint8Array(n);
      interned.set(this.interned);
      this.interned = interned;
    }
    return id;
  }
}

function grown(a: Int32Array, n: number): Int32Array {
  const b = new Int32Array(n);
  b.set(a);
  return b;
}
