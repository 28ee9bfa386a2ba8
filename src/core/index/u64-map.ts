/**
 * Open-addressing hash map from a u64 key (as lo/hi u32 halves) to a non-negative int32 value, on one typed array.
 *
 * Why not `Map<bigint, number>`: a JS Map costs ~80-200 bytes per entry, allocates a bigint per lookup and gives the
 * GC millions of objects to trace; this map costs 12 bytes per cell (16 with `aux`), never allocates on lookup and
 * lives off the GC's scanned heap. Key halves, value and aux are interleaved in one array so a probe touches one cache
 * line, not three. Linear probing with backward-shift deletion: no tombstones, so lookups stay short.
 */
const MAX_LOAD = 0.75;

/** Fibonacci hashing of both halves: engine ids may be small or sequential, so the low bits alone would cluster. */
function home(lo: number, hi: number, shift: number): number {
  return Math.imul(lo ^ Math.imul(hi, 0x85ebca6b), 0x9e3779b1) >>> shift;
}

export class U64Map {
  /** Cells of `stride` u32: [lo, hi, value + 1, aux?]; value + 1 === 0 marks an empty cell. */
  private cells: Uint32Array;
  private readonly stride: number;
  private cap: number;
  private shift: number;
  private count = 0;

  constructor(
    initialCapacity = 16,
    private readonly withAux = false,
  ) {
    let bits = 4;
    while (1 << bits < initialCapacity / MAX_LOAD) bits++;
    this.stride = withAux ? 4 : 3;
    this.cap = 1 << bits;
    this.shift = 32 - bits;
    this.cells = new Uint32Array(this.cap * this.stride);
  }

  get size(): number {
    return this.count;
  }

  /** Bytes held by the table's array. */
  get byteLength(): number {
    return this.cells.byteLength;
  }

  /** Cell position of a key, or -1. The position is valid until the next insert or delete. */
  find(lo: number, hi: number): number {
    const cells = this.cells;
    const stride = this.stride;
    const mask = this.cap - 1;
    lo >>>= 0;
    hi >>>= 0;
    let i = home(lo, hi, this.shift);
    for (;;) {
      const at = i * stride;
      if (cells[at + 2] === 0) return -1;
      if (cells[at] === lo && cells[at + 1] === hi) return i;
      i = (i + 1) & mask;
    }
  }

  get(lo: number, hi: number): number {
    const i = this.find(lo, hi);
    return i < 0 ? -1 : this.cells[i * this.stride + 2] - 1;
  }

  /** Value at a position found by `find`. */
  valueAt(pos: number): number {
    return this.cells[pos * this.stride + 2] - 1;
  }

  auxAt(pos: number): number {
    return this.withAux ? this.cells[pos * this.stride + 3] : 0;
  }

  /** Overwrites the value (and aux) at a position found by `find`. */
  setAt(pos: number, value: number, aux = 0): void {
    this.cells[pos * this.stride + 2] = value + 1;
    if (this.withAux) this.cells[pos * this.stride + 3] = aux;
  }

  /** Inserts or overwrites. `value` must be >= 0. */
  set(lo: number, hi: number, value: number, aux = 0): void {
    if (this.count + 1 > this.cap * MAX_LOAD) this.grow();
    const cells = this.cells;
    const stride = this.stride;
    const mask = this.cap - 1;
    lo >>>= 0;
    hi >>>= 0;
    let i = home(lo, hi, this.shift);
    for (;;) {
      const at = i * stride;
      if (cells[at + 2] === 0) {
        cells[at] = lo;
        cells[at + 1] = hi;
        this.count++;
        break;
      }
      if (cells[at] === lo && cells[at + 1] === hi) break;
      i = (i + 1) & mask;
    }
    const at = i * stride;
    cells[at + 2] = value + 1;
    if (this.withAux) cells[at + 3] = aux;
  }

  /** Removes a key; returns its value or -1. */
  delete(lo: number, hi: number): number {
    const pos = this.find(lo, hi);
    if (pos < 0) return -1;
    const value = this.valueAt(pos);
    this.deleteAt(pos);
    return value;
  }

  /** Removes the entry at a position found by `find`. Backward shift keeps every probe chain intact. */
  deleteAt(pos: number): void {
    const cells = this.cells;
    const stride = this.stride;
    const mask = this.cap - 1;
    const shift = this.shift;
    let hole = pos;
    let i = (pos + 1) & mask;
    for (;;) {
      const at = i * stride;
      if (cells[at + 2] === 0) break;
      const h = home(cells[at], cells[at + 1], shift);
      // Move entry i into the hole if its home does not lie cyclically in (hole, i].
      const inRange = hole <= i ? h > hole && h <= i : h > hole || h <= i;
      if (!inRange) {
        cells.copyWithin(hole * stride, at, at + stride);
        hole = i;
      }
      i = (i + 1) & mask;
    }
    cells[hole * stride + 2] = 0;
    this.count--;
  }

  clear(): void {
    this.cells.fill(0);
    this.count = 0;
  }

  /** Calls fn for every entry. The map must not be modified during the walk. */
  forEach(fn: (lo: number, hi: number, value: number, aux: number) => void): void {
    const { cells, stride, withAux } = this;
    const mask = this.cap - 1;
    // Cells are visited in a scrambled order (an odd multiplier permutes 0..cap-1), not in home order: with homes
    // taken from the top hash bits, home order stays sorted in every smaller table, so re-inserting a walk into a
    // growing map (a snapshot load) would pile every key into one probe run and cost O(n^2).
    for (let k = 0; k < this.cap; k++) {
      const at = (Math.imul(k, 0x9e3779b1) & mask) * stride;
      if (cells[at + 2] !== 0) fn(cells[at], cells[at + 1], cells[at + 2] - 1, withAux ? cells[at + 3] : 0);
    }
  }

  /** Longest distance of any key from its home cell (diagnostics and tests: short runs keep lookups fast). */
  maxDisplacement(): number {
    const { cells, stride } = this;
    const mask = this.cap - 1;
    let worst = 0;
    for (let i = 0; i < this.cap; i++) {
      const at = i * stride;
      if (cells[at + 2] === 0) continue;
      const d = (i - home(cells[at], cells[at + 1], this.shift)) & mask;
      if (d > worst) worst = d;
    }
    return worst;
  }

  private grow(): void {
    const old = this.cells;
    const stride = this.stride;
    this.cap *= 2;
    this.shift--;
    this.cells = new Uint32Array(this.cap * stride);
    const cells = this.cells;
    const mask = this.cap - 1;
    for (let at = 0; at < old.length; at += stride) {
      if (old[at + 2] === 0) continue;
      let i = home(old[at], old[at + 1], this.shift);
      while (cells[i * stride + 2] !== 0) i = (i + 1) & mask;
      cells.set(old.subarray(at, at + stride), i * stride);
    }
  }
}

/** Splits a u64 into lo/hi u32 halves without bigint arithmetic in callers' hot loops. */
const splitBuf = new BigUint64Array(1);
const splitU32 = new Uint32Array(splitBuf.buffer);
export function splitU64(value: bigint): [number, number] {
  splitBuf[0] = value;
  return [splitU32[0], splitU32[1]];
}

export function joinU64(lo: number, hi: number): bigint {
  splitU32[0] = lo;
  splitU32[1] = hi;
  return splitBuf[0];
}

/** A (lo, hi) view of a BigUint64Array, for hot loops. Little-endian hosts only (checked at hashing). */
export function u32View(hashes: BigUint64Array): Uint32Array {
  return new Uint32Array(hashes.buffer, hashes.byteOffset, hashes.length * 2);
}
