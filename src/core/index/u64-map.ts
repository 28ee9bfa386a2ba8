/**
 * Open-addressing hash map from a u64 key (as lo/hi u32 halves) to a non-negative int32 value plus optional extra int32
 * fields, on one typed array. The one hash table of the core: engine-id maps, the index's sequence-hash table, the
 * approximate index and the mock engine's cache all use it.
 *
 * Why not `Map<bigint, number>`: a JS Map costs ~80-200 bytes per entry, allocates a bigint per lookup and gives the
 * GC millions of objects to trace; this map costs 12 bytes per cell plus 4 per extra field, never allocates on lookup
 * and lives off the GC's scanned heap. Key halves, value and fields are interleaved so a probe touches one cache line.
 * Linear probing with backward-shift deletion: no tombstones, so lookups stay short.
 *
 * Capacity is m * 2^k cells with m in 4..7, not only powers of two: the table grows by ~1.6x at 80% load, so it sits
 * between ~50% and 80% full, where a power-of-two table at 75% sits between 37% and 75% (up to 2.7 cells per entry);
 * the index's memory per block depends on it. The home stays integer arithmetic (the top bits of the mixed key times
 * m, shifted): a floating-point range reduction was about twice as slow per lookup in an A/B run (outside the benches).
 */
const MAX_LOAD = 0.8;
const GROWTH = 1.5;
const MIN_CAPACITY = 16;
/** Largest capacity: 7 * 2^25 cells (home = (q * m) >>> 3 with q < 2^28 stays below 2^31). */
const MAX_CAPACITY = 7 * 2 ** 25;

/** The smallest capacity m * 2^k (m in 4..7) of at least `n` cells, as [capacity, m, b] with q = mix >>> (32 - b). */
function sizeFor(n: number): [number, number, number] {
  let k = 2;
  while (7 * 2 ** k < n) k++;
  for (let m = 4; m <= 7; m++) if (m * 2 ** k >= n) return [m * 2 ** k, m, k + 3];
  return [7 * 2 ** k, 7, k + 3];
}

/**
 * The capacity a map of `cap` cells grows to at its next growth (the same arithmetic as U64Map's growth), for owners
 * that bound a map in bytes by never letting it grow past a limit (the approximate index, core/approx.ts).
 */
export function capacityAfterGrowth(cap: number): number {
  return cap >= MAX_CAPACITY ? cap : sizeFor(Math.min(MAX_CAPACITY, Math.ceil(cap * GROWTH)))[0];
}

/** Both halves mixed (engine ids may be small or sequential, so the low bits alone would cluster); a u32. */
function mixOf(lo: number, hi: number): number {
  return Math.imul(lo ^ Math.imul(hi, 0x85ebca6b), 0x9e3779b1) >>> 0;
}

/**
 * Home cell of a key in a table of `homeShift`/`homeMult` built with `hashedKeys` (exported for owners' inlined
 * probes; see U64Map.cells): the low half is already uniform, so it is used as is.
 */
export function homeOfHashed(lo: number, homeShift: number, homeMult: number): number {
  return Math.imul(lo >>> homeShift, homeMult) >>> 3;
}

export interface U64MapOptions {
  /**
   * Robin Hood placement: runs kept sorted by home (ties by the mixed key), a new key taking the place of the first
   * entry that sorts after it, so no key sits far from its home whatever the insertion order. First-come linear
   * probing (the default, cheaper to insert) leaves the newest keys at the ends of their runs.
   */
  readonly robinHood?: boolean;
  /** Keys are already uniform hashes (xxh3 outputs): the home comes from the low half as is, without mixing. */
  readonly hashedKeys?: boolean;
  /** Load that triggers growth (default 0.8). */
  readonly maxLoad?: number;
}

function gcd(a: number, b: number): number {
  while (b !== 0) [a, b] = [b, a % b];
  return a;
}

export class U64Map {
  /**
   * Cells of `stride` int32: [lo, hi, value + 1, field 0, field 1, ...]; value + 1 === 0 marks an empty cell. Exposed
   * for owners' hot loops (read only between modifications: an insert may reallocate it, a delete moves cells).
   */
  cells: Int32Array;
  readonly stride: number;
  private cap: number;
  /** home = ((mix >>> homeShift) * homeMult) >>> 3, in [0, cap): see homeOf. Read only. */
  homeShift: number;
  homeMult: number;
  private count = 0;
  private readonly robinHood: boolean;
  private readonly hashed: boolean;
  private readonly maxLoad: number;

  /**
   * @param initialCapacity entries expected before the first growth
   * @param fields extra int32 fields per entry (`true`: one, the "aux" field)
   * @param options placement, key distribution and load (see U64MapOptions)
   */
  constructor(
    initialCapacity = 16,
    fields: boolean | number = false,
    private readonly options: U64MapOptions = {},
  ) {
    const extra = fields === true ? 1 : fields === false ? 0 : fields;
    if (!Number.isInteger(extra) || extra < 0) throw new RangeError(`extra fields must be a non-negative integer, got ${fields}`);
    this.stride = 3 + extra;
    this.robinHood = options.robinHood ?? false;
    this.hashed = options.hashedKeys ?? false;
    this.maxLoad = options.maxLoad ?? MAX_LOAD;
    if (!(this.maxLoad > 0 && this.maxLoad < 1)) throw new RangeError(`maxLoad must be in (0, 1), got ${options.maxLoad}`);
    const [cap, mult, b] = sizeFor(Math.max(MIN_CAPACITY, Math.ceil(initialCapacity / this.maxLoad)));
    this.cap = cap;
    this.homeMult = mult;
    this.homeShift = 32 - b;
    this.cells = new Int32Array(this.cap * this.stride);
  }

  get size(): number {
    return this.count;
  }

  /** Cells in the table (occupied or not). */
  get capacity(): number {
    return this.cap;
  }

  /** Bytes held by the table's array. */
  get byteLength(): number {
    return this.cells.byteLength;
  }

  /** The key as a uniform u32 (the home is its top bits, scaled). */
  private mix(lo: number, hi: number): number {
    return this.hashed ? lo >>> 0 : mixOf(lo, hi);
  }

  /** Home cell of a key. */
  home(lo: number, hi: number): number {
    return Math.imul(this.mix(lo, hi) >>> this.homeShift, this.homeMult) >>> 3;
  }

  /** Cell position of a key, or -1. The position is valid until the next insert or delete. */
  find(lo: number, hi: number): number {
    const cells = this.cells;
    const stride = this.stride;
    const cap = this.cap;
    lo |= 0;
    hi |= 0;
    let i = Math.imul(this.mix(lo, hi) >>> this.homeShift, this.homeMult) >>> 3;
    for (;;) {
      const at = i * stride;
      if (cells[at + 2] === 0) return -1;
      if (cells[at] === lo && cells[at + 1] === hi) return i;
      if (++i === cap) i = 0;
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

  /** Field 0 (0 when the map has no fields). */
  auxAt(pos: number): number {
    return this.stride > 3 ? this.cells[pos * this.stride + 3] : 0;
  }

  fieldAt(pos: number, field: number): number {
    return this.cells[pos * this.stride + 3 + field];
  }

  setFieldAt(pos: number, field: number, v: number): void {
    this.cells[pos * this.stride + 3 + field] = v;
  }

  /** Overwrites the value (and field 0) at a position found by `find`. */
  setAt(pos: number, value: number, aux = 0): void {
    this.cells[pos * this.stride + 2] = value + 1;
    if (this.stride > 3) this.cells[pos * this.stride + 3] = aux;
  }

  /**
   * Inserts or overwrites the value and field 0; a new entry's other fields start at 0. `value` must be >= 0.
   * Returns the entry's position (valid until the next insert or delete).
   */
  set(lo: number, hi: number, value: number, aux = 0): number {
    if (this.count + 1 > this.cap * this.maxLoad) this.grow();
    lo |= 0;
    hi |= 0;
    const pos = this.locate(lo, hi);
    if (pos >= 0) {
      this.setAt(pos, value, aux);
      return pos;
    }
    return this.insertAt(~pos, lo, hi, value, aux);
  }

  /** Inserts a key that is absent and returns -1, or leaves a present one alone and returns its value. */
  insert(lo: number, hi: number, value: number, aux = 0): number {
    if (this.count + 1 > this.cap * this.maxLoad) this.grow();
    lo |= 0;
    hi |= 0;
    const pos = this.locate(lo, hi);
    if (pos >= 0) return this.cells[pos * this.stride + 2] - 1;
    this.insertAt(~pos, lo, hi, value, aux);
    return -1;
  }

  /**
   * The key's position, or ~(where it goes). Robin Hood tables keep every run sorted by (home, mixed key), so the
   * search stops at the first entry that sorts after the key: the key is absent and belongs there.
   */
  private locate(lo: number, hi: number): number {
    const cells = this.cells;
    const stride = this.stride;
    const cap = this.cap;
    const shift = this.homeShift;
    const mult = this.homeMult;
    const mix = this.mix(lo, hi);
    let i = Math.imul(mix >>> shift, mult) >>> 3;
    let d = 0;
    for (;;) {
      const at = i * stride;
      if (cells[at + 2] === 0) break;
      if (cells[at] === lo && cells[at + 1] === hi) return i;
      if (this.robinHood) {
        const m = this.mix(cells[at], cells[at + 1]);
        const h = Math.imul(m >>> shift, mult) >>> 3;
        const dOcc = i >= h ? i - h : i + cap - h;
        if (dOcc < d || (dOcc === d && m > mix)) break;
      }
      if (++i === cap) i = 0;
      d++;
    }
    return ~i;
  }

  private insertAt(i: number, lo: number, hi: number, value: number, aux: number): number {
    this.count++;
    const cells = this.cells;
    const stride = this.stride;
    if (this.robinHood && cells[i * stride + 2] !== 0) {
      // Shift the rest of the run on by one cell (it stays sorted; each moved entry is one further from home).
      const cap = this.cap;
      let e = i;
      while (cells[e * stride + 2] !== 0) if (++e === cap) e = 0;
      while (e !== i) {
        const from = e === 0 ? cap - 1 : e - 1;
        for (let f = 0; f < stride; f++) cells[e * stride + f] = cells[from * stride + f];
        e = from;
      }
    }
    const at = i * stride;
    cells[at] = lo;
    cells[at + 1] = hi;
    cells[at + 2] = value + 1;
    for (let f = 3; f < stride; f++) cells[at + f] = 0;
    if (stride > 3) cells[at + 3] = aux;
    return i;
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
    const cap = this.cap;
    const qShift = this.homeShift;
    const mult = this.homeMult;
    let hole = pos;
    let i = pos + 1 === cap ? 0 : pos + 1;
    for (;;) {
      const at = i * stride;
      if (cells[at + 2] === 0) break;
      const h = Math.imul(this.mix(cells[at], cells[at + 1]) >>> qShift, mult) >>> 3;
      // Move entry i into the hole if its home does not lie cyclically in (hole, i].
      const inRange = hole <= i ? h > hole && h <= i : h > hole || h <= i;
      if (!inRange) {
        for (let f = 0; f < stride; f++) cells[hole * stride + f] = cells[at + f];
        hole = i;
      } else if (this.robinHood) break; // a sorted run: nothing after an entry that stays can move either
      if (++i === cap) i = 0;
    }
    cells[hole * stride + 2] = 0;
    this.count--;
  }

  clear(): void {
    this.cells.fill(0);
    this.count = 0;
  }

  /** An independent copy (a typed-array copy: snapshots take one without walking the entries). */
  clone(): U64Map {
    const steps = this.cloneSteps(Number.POSITIVE_INFINITY);
    let r = steps.next();
    while (!r.done) r = steps.next();
    return r.value;
  }

  /**
   * The same copy in steps of at most `budget` cells' words, yielding in between. The map must not be modified until
   * the generator returns (its owner checks; see KvIndex.captureSteps).
   */
  *cloneSteps(budget: number): Generator<void, U64Map, void> {
    const copy = new U64Map(0, this.stride - 3, this.options);
    copy.cells = yield* copySteps(this.cells, this.cells.length, budget);
    copy.cap = this.cap;
    copy.homeShift = this.homeShift;
    copy.homeMult = this.homeMult;
    copy.count = this.count;
    return copy;
  }

  /**
   * Calls fn for every entry, key halves as u32 (as splitU64 gives them). The map must not be modified during the walk. Cells are visited in a scrambled order
   * (steps of ~0.618 of the capacity, coprime with it), not in position order: position order is home order, and
   * re-inserting keys in home order into a growing map (a snapshot load) piles them into one probe run: O(n^2).
   */
  forEach(fn: (lo: number, hi: number, value: number, aux: number) => void): void {
    const { cells, stride, cap } = this;
    const withAux = stride > 3;
    const step = this.walkStep();
    let p = 0;
    for (let k = 0; k < cap; k++) {
      const at = p * stride;
      if (cells[at + 2] !== 0) fn(cells[at] >>> 0, cells[at + 1] >>> 0, cells[at + 2] - 1, withAux ? cells[at + 3] : 0);
      p += step;
      if (p >= cap) p -= cap;
    }
  }

  /**
   * Positions of every entry into `out` (sized >= size); returns the count. Scrambled (forEach's order) by default;
   * `scrambled = false` gives position order, a sequential scan, for callers that do not re-insert in that order.
   */
  positions(out: Int32Array, scrambled = true): number {
    const { cells, stride, cap } = this;
    const step = scrambled ? this.walkStep() : 1;
    let p = 0;
    let n = 0;
    for (let k = 0; k < cap; k++) {
      if (cells[p * stride + 2] !== 0) out[n++] = p;
      p += step;
      if (p >= cap) p -= cap;
    }
    return n;
  }

  private walkStep(): number {
    let step = Math.max(1, Math.round(this.cap * 0.6180339887498949));
    while (gcd(step, this.cap) !== 1) step--;
    return step;
  }

  /** Longest distance of any key from its home cell (diagnostics and tests: short runs keep lookups fast). */
  maxDisplacement(): number {
    const { cells, stride, cap } = this;
    let worst = 0;
    for (let i = 0; i < cap; i++) {
      const at = i * stride;
      if (cells[at + 2] === 0) continue;
      const h = this.home(cells[at], cells[at + 1]);
      const d = i >= h ? i - h : i + cap - h;
      if (d > worst) worst = d;
    }
    return worst;
  }

  private grow(): void {
    if (this.cap >= MAX_CAPACITY) throw new RangeError(`U64Map cannot grow past ${MAX_CAPACITY} cells`);
    const old = this.cells;
    const stride = this.stride;
    const [cap, mult, b] = sizeFor(Math.min(MAX_CAPACITY, Math.ceil(this.cap * GROWTH)));
    this.cap = cap;
    this.homeMult = mult;
    this.homeShift = 32 - b;
    this.cells = new Int32Array(cap * stride);
    const cells = this.cells;
    // Old position order from a run start is (home, mixed key) order, cyclically, and a new home is monotone in the
    // mixed key too: plain linear probing in that order keeps Robin Hood runs sorted, and nothing clusters (the table
    // is already at its final size).
    const oldCap = old.length / stride;
    let p0 = 0;
    while (old[p0 * stride + 2] !== 0) p0++;
    for (let k = 0; k < oldCap; k++) {
      const p = p0 + k < oldCap ? p0 + k : p0 + k - oldCap;
      const at = p * stride;
      if (old[at + 2] === 0) continue;
      let i = this.home(old[at], old[at + 1]);
      while (cells[i * stride + 2] !== 0) if (++i === cap) i = 0;
      for (let f = 0; f < stride; f++) cells[i * stride + f] = old[at + f];
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

/** The first `n` words of `src` into a new array, at most `budget` words per step (yielding after each step but the last). */
export function* copySteps(src: Int32Array, n: number, budget: number): Generator<void, Int32Array, void> {
  const out = new Int32Array(n);
  for (let at = 0; at < n; at += budget) {
    const end = Math.min(n, at + budget);
    out.set(src.subarray(at, end), at);
    if (end < n) yield;
  }
  return out;
}
