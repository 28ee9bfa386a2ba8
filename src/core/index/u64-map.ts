/**
 * Open-addressing hash map from a u64 key (as lo/hi u32 halves) to an int32 value, on typed arrays.
 *
 * Why not `Map<bigint, number>`: a JS Map costs ~80-200 bytes per entry, allocates a bigint per lookup and gives the
 * GC millions of objects to trace; this map costs 12 bytes per slot (16 with `aux`), never allocates on lookup and
 * lives off the GC's scanned heap. Linear probing with backward-shift deletion: no tombstones, so lookups stay short.
 */
const EMPTY = -1;
const MAX_LOAD = 0.75;

function mix(lo: number, hi: number): number {
  // Keys are usually hashes already, but engine ids may be small or sequential: mix both halves.
  let h = Math.imul(lo ^ Math.imul(hi, 0x85ebca6b), 0x9e3779b1);
  h ^= h >>> 15;
  h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 13)) >>> 0;
}

export class U64Map {
  private keyLo: Uint32Array;
  private keyHi: Uint32Array;
  private vals: Int32Array;
  private auxs: Uint32Array | null;
  private mask: number;
  private count = 0;

  constructor(
    initialCapacity = 16,
    private readonly withAux = false,
  ) {
    let cap = 16;
    while (cap < initialCapacity / MAX_LOAD) cap *= 2;
    this.keyLo = new Uint32Array(cap);
    this.keyHi = new Uint32Array(cap);
    this.vals = new Int32Array(cap).fill(EMPTY);
    this.auxs = withAux ? new Uint32Array(cap) : null;
    this.mask = cap - 1;
  }

  get size(): number {
    return this.count;
  }

  /** Bytes held by the table's arrays. */
  get byteLength(): number {
    return this.keyLo.byteLength + this.keyHi.byteLength + this.vals.byteLength + (this.auxs?.byteLength ?? 0);
  }

  /** Slot position of a key, or -1. The position is valid until the next insert or delete. */
  find(lo: number, hi: number): number {
    const mask = this.mask;
    const keyLo = this.keyLo;
    const keyHi = this.keyHi;
    const vals = this.vals;
    let i = mix(lo, hi) & mask;
    for (;;) {
      if (vals[i] === EMPTY) return -1;
      if (keyLo[i] === lo && keyHi[i] === hi) return i;
      i = (i + 1) & mask;
    }
  }

  get(lo: number, hi: number): number {
    const i = this.find(lo, hi);
    return i < 0 ? EMPTY : this.vals[i];
  }

  /** Value at a position found by `find`. */
  valueAt(pos: number): number {
    return this.vals[pos];
  }

  auxAt(pos: number): number {
    return this.auxs ? this.auxs[pos] : 0;
  }

  /** Inserts or overwrites. `value` must be >= 0. */
  set(lo: number, hi: number, value: number, aux = 0): void {
    if ((this.count + 1) > (this.mask + 1) * MAX_LOAD) this.grow();
    const mask = this.mask;
    let i = mix(lo, hi) & mask;
    for (;;) {
      if (this.vals[i] === EMPTY) {
        this.keyLo[i] = lo;
        this.keyHi[i] = hi;
        this.count++;
        break;
      }
      if (this.keyLo[i] === lo && this.keyHi[i] === hi) break;
      i = (i + 1) & mask;
    }
    this.vals[i] = value;
    if (this.auxs) this.auxs[i] = aux;
  }

  /** Removes a key; returns its value or -1. */
  delete(lo: number, hi: number): number {
    const pos = this.find(lo, hi);
    if (pos < 0) return EMPTY;
    const value = this.vals[pos];
    this.deleteAt(pos);
    return value;
  }

  /** Backward-shift deletion keeps every probe chain intact without tombstones. */
  private deleteAt(pos: number): void {
    const mask = this.mask;
    const { keyLo, keyHi, vals, auxs } = this;
    let hole = pos;
    let i = (pos + 1) & mask;
    for (;;) {
      if (vals[i] === EMPTY) break;
      const home = mix(keyLo[i], keyHi[i]) & mask;
      // Move entry i into the hole if its home does not lie cyclically in (hole, i].
      const inRange = hole <= i ? home > hole && home <= i : home > hole || home <= i;
      if (!inRange) {
        keyLo[hole] = keyLo[i];
        keyHi[hole] = keyHi[i];
        vals[hole] = vals[i];
        if (auxs) auxs[hole] = auxs[i];
        hole = i;
      }
      i = (i + 1) & mask;
    }
    vals[hole] = EMPTY;
    this.count--;
  }

  clear(): void {
    this.vals.fill(EMPTY);
    this.count = 0;
  }

  /** Calls fn for every entry. The map must not be modified during the walk. */
  forEach(fn: (lo: number, hi: number, value: number, aux: number) => void): void {
    const { keyLo, keyHi, vals, auxs } = this;
    for (let i = 0; i < vals.length; i++) {
      if (vals[i] !== EMPTY) fn(keyLo[i], keyHi[i], vals[i], auxs ? auxs[i] : 0);
    }
  }

  private grow(): void {
    const { keyLo, keyHi, vals, auxs } = this;
    const cap = (this.mask + 1) * 2;
    this.keyLo = new Uint32Array(cap);
    this.keyHi = new Uint32Array(cap);
    this.vals = new Int32Array(cap).fill(EMPTY);
    this.auxs = this.withAux ? new Uint32Array(cap) : null;
    this.mask = cap - 1;
    this.count = 0;
    for (let i = 0; i < vals.length; i++) {
      if (vals[i] !== EMPTY) this.set(keyLo[i], keyHi[i], vals[i], auxs ? auxs[i] : 0);
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
