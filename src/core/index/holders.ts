/**
 * One set of source numbers in two int32 words, whose cost follows its size, not the fleet's: the member storage of
 * the interned holder sets (./set-table.ts keeps each distinct set once, under an id, as two words in its `cells`).
 *
 * Most sets are small (bench:index workload: 1 to 4 holders for 99% of the blocks at 64 sources and 97% at 1,024):
 * up to four source numbers as 16-bit halves of the two words (number + 1; 0 = empty, filled from the front). A
 * larger set moves to a pool entry, and the words keep its kind and offset: a list of source numbers while it is no
 * larger than a bitset of the fleet would be (up to W = ceil(sources / 32) entries), a bitset beyond.
 *
 * Pool entries are [count, capacity, ...capacity ids or words], reused through free lists by size. A bitset records
 * its own width, so a fleet that grows widens only the bitsets that need a new source's bit.
 */

/** Source numbers 0..32766: number + 1 fits in 15 bits, so inline words stay non-negative and kinds are negative. */
export const MAX_SOURCES = 32767;
/** Inline holders per cell. */
export const INLINE_MAX = 4;
/** Cell word 0 of a block whose holders are a pool list (word 1: the entry's offset). */
export const LIST = -1;
/** Cell word 0 of a block whose holders are a pool bitset (word 1: the entry's offset). */
export const BITS = -2;

const FIRST_LIST = 8;

export class HolderSets {
  /** The pool. Read directly by the index's lookup walk; reallocated by growth (re-read after any add). */
  data = new Int32Array(1024);
  private top = 0;
  /** Free entries by entry size (offset + 1; 0: none); a free entry's word 0 links to the next. */
  private freeHeads = new Int32Array(16);
  /** Bitset width for the fleet: ceil((largest source number + 1) / 32). */
  private words = 1;
  private liveEntries = 0;
  private scratch = new Int32Array(INLINE_MAX + 1);

  /** Tells the sets the largest source number in use (bitsets and the list limit follow it). */
  fleet(largestSource: number): void {
    const words = (largestSource >>> 5) + 1;
    if (words > this.words) this.words = words;
  }

  /** Bitset width (and the largest list) for the fleet. */
  get width(): number {
    return this.words;
  }

  /** Sets whose members live in the pool. */
  get overflowBlocks(): number {
    return this.liveEntries;
  }

  get byteLength(): number {
    return this.data.byteLength + this.freeHeads.byteLength;
  }

  /** Adds source s to the set at cells[at], cells[at + 1]; false when it was already there. */
  add(cells: Int32Array, at: number, s: number): boolean {
    const m0 = cells[at];
    if (m0 >= 0) {
      const v = s + 1;
      const m1 = cells[at + 1];
      const a = m0 & 0xffff;
      const b = m0 >>> 16;
      const c = m1 & 0xffff;
      const d = m1 >>> 16;
      if (a === 0) {
        cells[at] = v;
        return true;
      }
      if (a === v || b === v || c === v || d === v) return false;
      if (b === 0) cells[at] = m0 | (v << 16);
      else if (c === 0) cells[at + 1] = v;
      else if (d === 0) cells[at + 1] = m1 | (v << 16);
      else {
        const ids = this.scratch;
        ids[0] = a - 1;
        ids[1] = b - 1;
        ids[2] = c - 1;
        ids[3] = d - 1;
        ids[4] = s;
        this.spill(cells, at, ids, INLINE_MAX + 1);
      }
      return true;
    }
    let data = this.data;
    const off = cells[at + 1];
    const n = data[off];
    if (m0 === LIST) {
      for (let k = 0; k < n; k++) if (data[off + 2 + k] === s) return false;
      const cap = data[off + 1];
      if (n < cap) {
        data[off + 2 + n] = s;
        data[off] = n + 1;
        return true;
      }
      if (n + 1 <= this.words) {
        const next = this.alloc(Math.min(2 * cap, this.words));
        data = this.data;
        data.copyWithin(next + 2, off + 2, off + 2 + n);
        data[next + 2 + n] = s;
        data[next] = n + 1;
        this.release(off);
        cells[at + 1] = next;
      } else {
        const next = this.allocBits();
        data = this.data;
        for (let k = 0; k < n; k++) {
          const id = data[off + 2 + k];
          data[next + 2 + (id >>> 5)] |= 1 << (id & 31);
        }
        data[next + 2 + (s >>> 5)] |= 1 << (s & 31);
        data[next] = n + 1;
        this.release(off);
        cells[at] = BITS;
        cells[at + 1] = next;
      }
      return true;
    }
    const width = data[off + 1];
    const w = s >>> 5;
    const bit = 1 << (s & 31);
    if (w < width) {
      if ((data[off + 2 + w] & bit) !== 0) return false;
      data[off + 2 + w] |= bit;
      data[off] = n + 1;
      return true;
    }
    // The fleet grew since this bitset was made: widen it.
    const next = this.allocBits();
    data = this.data;
    data.copyWithin(next + 2, off + 2, off + 2 + width);
    data[next + 2 + w] |= bit;
    data[next] = n + 1;
    this.release(off);
    cells[at + 1] = next;
    return true;
  }

  /** Removes source s; false when it was not there. An emptied set is inline and all zero. */
  remove(cells: Int32Array, at: number, s: number): boolean {
    const m0 = cells[at];
    if (m0 >= 0) {
      const v = s + 1;
      const m1 = cells[at + 1];
      let a = m0 & 0xffff;
      let b = m0 >>> 16;
      let c = m1 & 0xffff;
      let d = m1 >>> 16;
      // Replace the removed one with the last one, so the set stays filled from the front.
      const last = d !== 0 ? d : c !== 0 ? c : b !== 0 ? b : a;
      if (a === v) a = last;
      else if (b === v) b = last;
      else if (c === v) c = last;
      else if (d === v) d = last;
      else return false;
      if (d !== 0) d = 0;
      else if (c !== 0) c = 0;
      else if (b !== 0) b = 0;
      else a = 0;
      cells[at] = a | (b << 16);
      cells[at + 1] = c | (d << 16);
      return true;
    }
    const data = this.data;
    const off = cells[at + 1];
    const n = data[off];
    if (m0 === LIST) {
      let k = 0;
      while (k < n && data[off + 2 + k] !== s) k++;
      if (k === n) return false;
      data[off + 2 + k] = data[off + 2 + n - 1];
      data[off] = n - 1;
      if (n - 1 <= INLINE_MAX) {
        const ids = this.scratch;
        for (let j = 0; j < n - 1; j++) ids[j] = data[off + 2 + j];
        this.inline(cells, at, ids, n - 1);
        this.release(off);
      }
      return true;
    }
    const width = data[off + 1];
    const w = s >>> 5;
    const bit = 1 << (s & 31);
    if (w >= width || (data[off + 2 + w] & bit) === 0) return false;
    data[off + 2 + w] &= ~bit;
    data[off] = n - 1;
    // Back to a smaller form only well below the limit, so a set hovering around it does not convert every event.
    if (n - 1 <= INLINE_MAX || n - 1 <= this.words >>> 1) {
      const ids = new Int32Array(n - 1);
      this.bitsInto(data, off, ids, 0);
      this.release(off);
      if (n - 1 <= INLINE_MAX) this.inline(cells, at, ids, n - 1);
      else {
        const next = this.alloc(Math.min(this.words, Math.max(FIRST_LIST, n - 1)));
        this.data.set(ids, next + 2);
        this.data[next] = n - 1;
        cells[at] = LIST;
        cells[at + 1] = next;
      }
    }
    return true;
  }

  has(cells: Int32Array, at: number, s: number): boolean {
    const m0 = cells[at];
    if (m0 >= 0) {
      const v = s + 1;
      const m1 = cells[at + 1];
      return (m0 & 0xffff) === v || m0 >>> 16 === v || (m1 & 0xffff) === v || m1 >>> 16 === v;
    }
    const data = this.data;
    const off = cells[at + 1];
    if (m0 === LIST) {
      for (let k = 0; k < data[off]; k++) if (data[off + 2 + k] === s) return true;
      return false;
    }
    const w = s >>> 5;
    return w < data[off + 1] && (data[off + 2 + w] & (1 << (s & 31))) !== 0;
  }

  count(cells: Int32Array, at: number): number {
    const m0 = cells[at];
    if (m0 < 0) return this.data[cells[at + 1]];
    const m1 = cells[at + 1];
    return (m0 & 0xffff ? 1 : 0) + (m0 >>> 16 ? 1 : 0) + (m1 & 0xffff ? 1 : 0) + (m1 >>> 16 ? 1 : 0);
  }

  /** Writes the holders into `out` (sized >= count) in no particular order; returns the count. */
  collect(cells: Int32Array, at: number, out: Int32Array): number {
    const m0 = cells[at];
    if (m0 >= 0) {
      const m1 = cells[at + 1];
      let n = 0;
      if (m0 & 0xffff) out[n++] = (m0 & 0xffff) - 1;
      if (m0 >>> 16) out[n++] = (m0 >>> 16) - 1;
      if (m1 & 0xffff) out[n++] = (m1 & 0xffff) - 1;
      if (m1 >>> 16) out[n++] = (m1 >>> 16) - 1;
      return n;
    }
    const data = this.data;
    const off = cells[at + 1];
    if (m0 === LIST) {
      const n = data[off];
      for (let k = 0; k < n; k++) out[k] = data[off + 2 + k];
      return n;
    }
    return this.bitsInto(data, off, out, 0);
  }

  /** Copies the set at cells[from] to cells[to] (a pool entry gets its own copy). */
  copy(cells: Int32Array, from: number, to: number): void {
    const m0 = cells[from];
    if (m0 >= 0) {
      cells[to] = m0;
      cells[to + 1] = cells[from + 1];
      return;
    }
    const off = cells[from + 1];
    const capacity = this.data[off + 1];
    const next = this.alloc(capacity);
    this.data.copyWithin(next, off, off + 2 + capacity);
    cells[to] = m0;
    cells[to + 1] = next;
  }

  /** Empties the set (frees its pool entry). */
  clear(cells: Int32Array, at: number): void {
    if (cells[at] < 0) this.release(cells[at + 1]);
    cells[at] = 0;
    cells[at + 1] = 0;
  }

  /** Moves five or more holders from a full inline set to a pool entry. */
  private spill(cells: Int32Array, at: number, ids: Int32Array, n: number): void {
    if (n <= this.words) {
      const off = this.alloc(Math.min(this.words, FIRST_LIST));
      for (let k = 0; k < n; k++) this.data[off + 2 + k] = ids[k];
      this.data[off] = n;
      cells[at] = LIST;
      cells[at + 1] = off;
      return;
    }
    const off = this.allocBits();
    const data = this.data;
    for (let k = 0; k < n; k++) data[off + 2 + (ids[k] >>> 5)] |= 1 << (ids[k] & 31);
    data[off] = n;
    cells[at] = BITS;
    cells[at + 1] = off;
  }

  private inline(cells: Int32Array, at: number, ids: ArrayLike<number>, n: number): void {
    const h = (k: number) => (k < n ? ids[k] + 1 : 0);
    cells[at] = h(0) | (h(1) << 16);
    cells[at + 1] = h(2) | (h(3) << 16);
  }

  private bitsInto(data: Int32Array, off: number, out: Int32Array, from: number): number {
    let n = from;
    const width = data[off + 1];
    for (let w = 0; w < width; w++) {
      for (let bits = data[off + 2 + w]; bits !== 0; bits &= bits - 1) out[n++] = (w << 5) + (31 - Math.clz32(bits & -bits));
    }
    return n;
  }

  private allocBits(): number {
    const off = this.alloc(this.words);
    this.data.fill(0, off + 2, off + 2 + this.words);
    return off;
  }

  /** An entry of `capacity` payload words; its count starts at 0. */
  private alloc(capacity: number): number {
    const size = 2 + capacity;
    this.liveEntries++;
    let off: number;
    if (size < this.freeHeads.length && this.freeHeads[size] !== 0) {
      off = this.freeHeads[size] - 1;
      this.freeHeads[size] = this.data[off];
    } else {
      if (this.top + size > this.data.length) {
        const grown = new Int32Array(Math.max(this.top + size, Math.ceil(this.data.length * 1.5)));
        grown.set(this.data.subarray(0, this.top));
        this.data = grown;
      }
      off = this.top;
      this.top += size;
    }
    this.data[off] = 0;
    this.data[off + 1] = capacity;
    return off;
  }

  private release(off: number): void {
    const size = 2 + this.data[off + 1];
    if (size >= this.freeHeads.length) {
      const grown = new Int32Array(Math.max(size + 1, 2 * this.freeHeads.length));
      grown.set(this.freeHeads);
      this.freeHeads = grown;
    }
    this.data[off] = this.freeHeads[size];
    this.freeHeads[size] = off + 1;
    this.liveEntries--;
  }
}
