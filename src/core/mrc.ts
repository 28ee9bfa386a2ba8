/**
 * Miss-ratio curves of prefix-cache traffic: what hit rate an LRU prefix cache of C blocks would give on the block-hash
 * chains the router sees, for every C at once, in bounded memory. Pure and synchronous (the shells feed it).
 *
 * Method: SHARDS (Waldspurger, Park, Garthwaite, Ahmad, "Efficient MRC Construction with SHARDS", FAST 2015), spatially
 * hashed sampling of reuse (stack) distances, fixed-size variant:
 *   - a block is sampled iff (low 24 bits of its 64-bit hash) < T, out of P = 2^24, so the rate is R = T / P; a block
 *     is either always or never sampled, which is what keeps reuse distances among sampled blocks meaningful;
 *   - the stack distance of a sampled reference (distinct blocks touched since its previous touch) is estimated as the
 *     sum of 1/R over the sampled blocks touched since; each sampled reference weighs 1/R in a histogram of distances;
 *   - the first blocks of a chain are sampled at a higher rate, R_i = min(1, R · 256 / (i + 1)²) at depth i < 15, R
 *     deeper (a block's depth is fixed by its hash, which names its whole prefix, so the decision is still a function of
 *     the block). Shared system prompts are few blocks that carry much of the reuse; sampling them at R alone makes the
 *     estimate hinge on whether one or two hot blocks happen to fall under T (on the Mooncake conversation trace at a
 *     final rate of 0.017 the error at 0.5x capacity was -0.035 with a boost of 16/(i + 1) and -0.010 with 256/(i + 1)).
 *     Weights use each block's own rate, so the estimate stays unbiased (importance sampling); the cost is about
 *     R · 256 · π²/6 extra sampled blocks per request (the earlier 256/(i + 1) over 255 blocks cost R · 256 · ln(255),
 *     nearly four times as many, for 0.004 less error on the benchmark traces: bench/RESULTS.md), and the sample bound
 *     still holds (the base rate falls further instead);
 *   - the sample set is bounded (`maxSamples`): past it, the samples with the largest normalised hash value are dropped
 *     (an eighth of the set at a time) and T is lowered to that value (the rate falls as the working set grows; memory
 *     does not);
 *   - distances are summed with a Fenwick tree over touch times (O(log n) per reference), rebuilt when the clock runs
 *     out of slots or T changes.
 *
 * Prefix structure. An engine's prefix cache can use block i of a prompt only if it holds blocks 0..i (its lookup stops
 * at the first miss), and it evicts a freed request's blocks tail first (vLLM's free queue takes them in reverse). The
 * estimator models exactly that cache: a request's blocks are looked up in order (distances read before the request
 * touches anything) and then touched from the last block to the first, so every block is more recent than the blocks
 * that extend it. Because a sequence hash names its whole prefix, whoever touched block i touched blocks 0..i-1 after
 * it, so stack distances never decrease along a chain and the top C entries of the LRU stack are always a set of whole
 * prefixes. The per-block distance recorded is nevertheless the running maximum over the chain's sampled blocks 0..i
 * (block i counts as a hit at C only if no sampled ancestor would miss at C); under the order above the maximum equals
 * the block's own distance, and it keeps the "whole chain cached" rule explicit where the nesting is only approximate.
 * test/core/mrc.test.ts checks the estimate against an exact simulation of an LRU prefix cache (src/sim/lru-prefix.ts).
 *
 * The curve is block-weighted like router_kv_overlap_blocks_total / router_kv_isl_blocks_total: hit blocks over prompt
 * blocks, where the trailing partial block (never matchable) counts in the denominator only.
 */

import { U64Map } from './index/u64-map.ts';
import { mrcScanWasm } from './wasm/blocks.ts';

/** Hash-space modulus: sampling reads the low 24 bits of a block hash's low word. */
export const MRC_MODULUS = 1 << 24;
const MOD_MASK = MRC_MODULUS - 1;

/** The capacity factors (× the fleet's or an engine's KV blocks) that gauges and what-if answers read. */
export const MRC_FACTORS: readonly number[] = [0.125, 0.25, 0.5, 1, 2, 4, 8, 16];

/** Engines added in the scale-out answers (m more engines of today's mean size). */
export const MRC_SCALE_OUT: readonly number[] = [1, 2, 4, 8];

export const MRC_DEFAULTS = { sampleRate: 0.1, maxSamples: 8192, halfLifeRequests: 100_000 } as const;

/** Smallest Fenwick tree (touch slots) of a curve; it is rebuilt at 4 x the samples held when its clock runs out. */
const MIN_SLOTS = 1026;

/** Histogram buckets per doubling of distance (2^(1/32): about 2.2% wide). */
const BUCKETS_PER_OCTAVE = 32;
/** Distances up to 2^44 blocks; beyond is treated as the last bucket. */
const BUCKETS = 1 + 44 * BUCKETS_PER_OCTAVE;

export interface MrcOptions {
  /** Initial sampling rate R in (0, 1]. */
  readonly sampleRate: number;
  /** Bound on sampled blocks tracked; the rate falls past it. */
  readonly maxSamples: number;
  /**
   * 'max' (default): a block's distance is the running maximum over its chain's sampled blocks (the chain rule);
   * 'own': its own distance only (an ablation for the benchmark).
   */
  readonly chainRule?: 'max' | 'own';
  /**
   * MrcBook: older traffic's weight halves every this many routed requests (applied in 16 steps per half-life), so the
   * curves follow traffic that changes; 0 or absent: never (every request counts alike).
   */
  readonly halfLifeRequests?: number;
}

export function validateMrcOptions(o: MrcOptions): void {
  if (!(o.sampleRate > 0 && o.sampleRate <= 1)) throw new RangeError(`MRC sample rate must be in (0, 1], got ${o.sampleRate}`);
  if (!Number.isInteger(o.maxSamples) || o.maxSamples < 16) {
    throw new RangeError(`MRC max samples must be an integer >= 16, got ${o.maxSamples}`);
  }
  const h = o.halfLifeRequests;
  if (h !== undefined && !(Number.isInteger(h) && h >= 0)) {
    throw new RangeError(`MRC half-life must be a whole number of requests >= 0 (0: no decay), got ${h}`);
  }
}

/** Decay steps per half-life. */
const DECAY_STEPS = 16;

/**
 * Histogram bucket of a scaled distance x >= 0. Bucket 0 is [0, 1); bucket b >= 1 is [2^((b-1)/32), 2^(b/32)). Read off
 * the double's exponent and top 10 mantissa bits (a table holds the bucket at the start of each of the 1024 mantissa
 * cells; a cell is narrower than a bucket, so one compare with the next bucket's lower bound finishes it): no log2 call.
 */
function bucketOf(x: number): number {
  if (x < 1) return 0;
  if (!(x < BUCKET_MAX_X)) return BUCKETS - 1;
  F64[0] = x;
  const hi = U32[HI_WORD];
  const b = 1 + ((hi >>> 20) - 1023) * BUCKETS_PER_OCTAVE + CELL_SUB[(hi >>> 10) & 1023];
  return x >= BUCKET_LOW[b + 1] ? b + 1 : b;
}

const F64 = new Float64Array(1);
const U32 = new Uint32Array(F64.buffer);
/** Index of the word holding the sign, exponent and top mantissa bits (1 on little-endian hosts). */
const HI_WORD = (() => {
  F64[0] = 1;
  return U32[1] === 0x3ff00000 ? 1 : 0;
})();
/** Distances from here on fall in the last bucket. */
const BUCKET_MAX_X = 2 ** ((BUCKETS - 1) / BUCKETS_PER_OCTAVE);
/** Sub-bucket (0..31) of the mantissa cell [1 + c/1024, 1 + (c+1)/1024) at its start. */
const CELL_SUB = new Int32Array(1024);
for (let c = 0; c < 1024; c++) {
  const f = 1 + c / 1024;
  let k = Math.floor(Math.log2(f) * BUCKETS_PER_OCTAVE);
  while (k > 0 && 2 ** (k / BUCKETS_PER_OCTAVE) > f) k--;
  while (2 ** ((k + 1) / BUCKETS_PER_OCTAVE) <= f) k++;
  CELL_SUB[c] = k;
}
/** Lower bound of each bucket (BUCKET_LOW[b] = 2^((b-1)/32)), one past the last for the compare. */
const BUCKET_LOW = new Float64Array(BUCKETS + 2);
for (let b = 1; b < BUCKET_LOW.length; b++) BUCKET_LOW[b] = 2 ** ((b - 1) / BUCKETS_PER_OCTAVE);

function bucketLow(b: number): number {
  return b === 0 ? 0 : 2 ** ((b - 1) / BUCKETS_PER_OCTAVE);
}

function bucketHigh(b: number): number {
  return 2 ** (b / BUCKETS_PER_OCTAVE);
}

export interface MrcSnapshot {
  /** Sampled references seen (each weighs 1/R). */
  readonly sampledRefs: number;
  /** Prompt blocks and full (matchable) prompt blocks observed, exact (not sampled). */
  readonly islBlocks: number;
  readonly fullBlocks: number;
  readonly requests: number;
  /** The current sampling rate (falls when the sample set reaches its bound). */
  readonly sampleRate: number;
  readonly samples: number;
}

/** A request's blocks that pass the sampling test at some threshold: position, hash halves, the 24-bit value. */
export interface Candidates {
  count: number;
  /** Full blocks of the request (the pass's length). */
  blocks: number;
  index: Int32Array;
  lo: Int32Array;
  hi: Int32Array;
  value: Int32Array;
  /** The block's depth boost and its value over it (what a curve compares with its threshold), computed once. */
  boost: Float64Array;
  norm: Float64Array;
}

function newCandidates(size: number): Candidates {
  return {
    count: 0,
    blocks: 0,
    index: new Int32Array(size),
    lo: new Int32Array(size),
    hi: new Int32Array(size),
    value: new Int32Array(size),
    boost: new Float64Array(size),
    norm: new Float64Array(size),
  };
}

/** Shared scratch (the core is synchronous: one request is collected and consumed before the next). */
let SCRATCH_CANDIDATES = newCandidates(256);

/**
 * Integer thresholds of the pass at threshold `t` (shared; recomputed when `t` changes): a block at depth i < BOOST_DEPTH
 * with 24-bit value v passes iff v < HEAD_T[i] (exactly v * BOOST_DIV[i] < t * BOOST, the depth-boosted test), deeper
 * blocks iff v < TAIL_T (exactly v < t).
 */
const HEAD_T = new Int32Array(256);
let HEAD_T_FOR = Number.NaN;
let TAIL_T = 0;
function thresholdsFor(t: number): void {
  if (t === HEAD_T_FOR) return;
  HEAD_T_FOR = t;
  const tB = t * BOOST;
  for (let i = 0; i < BOOST_DEPTH; i++) {
    const d = BOOST_DIV[i];
    // The least integer q with q * d >= tB (products of integers below 2^33 are exact in a double).
    let q = Math.ceil(tB / d);
    while (q > 0 && (q - 1) * d >= tB) q--;
    while (q * d < tB) q++;
    HEAD_T[i] = Math.min(q, MRC_MODULUS);
  }
  TAIL_T = Math.min(Math.ceil(t), MRC_MODULUS);
}

/**
 * One pass over a request's hashes: the blocks sampled at threshold `t` (depth-boosted, as ShardsMrc samples). Callers
 * with several curves pass the highest of their thresholds; each curve keeps those under its own.
 */
export function collectCandidates(view: Uint32Array, fullBlocks: number, t: number, out: Candidates = SCRATCH_CANDIDATES): Candidates {
  const n = Math.min(fullBlocks, view.length >>> 1);
  let c = out;
  c.count = 0;
  c.blocks = n;
  thresholdsFor(t);
  // Integer compares against precomputed thresholds (HEAD_T per depth in the boosted head, TAIL_T after), four blocks
  // at a time: the signs of (value - threshold) OR-ed together say whether any of the four passes (values and
  // thresholds are below 2^24 + 1, so the differences cannot overflow). A block that passes is copied out (rare: ~R).
  const ht = HEAD_T;
  const head = Math.min(n, BOOST_DEPTH);
  let i = 0;
  for (; i + 3 < head; i += 4) {
    const k = 2 * i;
    if (
      (((view[k] & MOD_MASK) - ht[i]) |
        ((view[k + 2] & MOD_MASK) - ht[i + 1]) |
        ((view[k + 4] & MOD_MASK) - ht[i + 2]) |
        ((view[k + 6] & MOD_MASK) - ht[i + 3])) <
      0
    ) {
      for (let j = i; j < i + 4; j++) if ((view[2 * j] & MOD_MASK) < ht[j]) c = pushCandidate(c, view, j);
    }
  }
  for (; i < head; i++) if ((view[2 * i] & MOD_MASK) < ht[i]) c = pushCandidate(c, view, i);
  const tt = TAIL_T;
  // The tail (all of a long chain but its first BOOST_DEPTH blocks) in the wasm module when it is long enough to repay
  // the call and the copy: the same test, ~2 instructions a block against ~16 here.
  if (n - i >= WASM_TAIL_MIN) {
    if (SCRATCH_TAIL.length < n - i) SCRATCH_TAIL = new Int32Array(Math.max(n - i, 2 * SCRATCH_TAIL.length));
    const tail = SCRATCH_TAIL;
    const count = mrcScanWasm(view, i, n, tt, tail);
    if (count >= 0) {
      for (let k = 0; k < count; k++) c = pushCandidate(c, view, tail[k]);
      return c;
    }
  }
  for (; i + 3 < n; i += 4) {
    const k = 2 * i;
    if (
      (((view[k] & MOD_MASK) - tt) | ((view[k + 2] & MOD_MASK) - tt) | ((view[k + 4] & MOD_MASK) - tt) | ((view[k + 6] & MOD_MASK) - tt)) <
      0
    ) {
      for (let j = i; j < i + 4; j++) if ((view[2 * j] & MOD_MASK) < tt) c = pushCandidate(c, view, j);
    }
  }
  for (; i < n; i++) if ((view[2 * i] & MOD_MASK) < tt) c = pushCandidate(c, view, i);
  return c;
}

/** Tails shorter than this are scanned in JS (the wasm call and the copy cost about as much as ~40 blocks here). */
const WASM_TAIL_MIN = 64;
/** The wasm pass's output (indices of the tail's passing blocks). */
let SCRATCH_TAIL = new Int32Array(256);

function pushCandidate(c: Candidates, view: Uint32Array, i: number): Candidates {
  if (c.count === c.index.length) {
    const bigger = newCandidates(2 * c.count);
    bigger.index.set(c.index);
    bigger.lo.set(c.lo);
    bigger.hi.set(c.hi);
    bigger.value.set(c.value);
    bigger.boost.set(c.boost);
    bigger.norm.set(c.norm);
    bigger.count = c.count;
    bigger.blocks = c.blocks;
    if (c === SCRATCH_CANDIDATES) SCRATCH_CANDIDATES = bigger;
    c = bigger;
  }
  const k = c.count++;
  const lo = view[2 * i];
  c.index[k] = i;
  c.lo[k] = lo | 0;
  c.hi[k] = view[2 * i + 1] | 0;
  const v = lo & MOD_MASK;
  c.value[k] = v;
  const b = i < BOOST_DEPTH ? BOOST / BOOST_DIV[i] : 1;
  c.boost[k] = b;
  c.norm[k] = v / b;
  return c;
}

/** One curve's sampled blocks of the request being observed (shared: observation is synchronous). */
let SCRATCH_LO = new Int32Array(256);
let SCRATCH_HI = new Int32Array(256);
let SCRATCH_NORM = new Float64Array(256);
let SCRATCH_BOOST = new Float64Array(256);
let SCRATCH_POS = new Int32Array(256);
let SCRATCH_W = new Float64Array(256);
function growScratch(n: number): void {
  const size = Math.max(n, 2 * SCRATCH_LO.length);
  SCRATCH_POS = new Int32Array(size);
  SCRATCH_W = new Float64Array(size);
  SCRATCH_LO = new Int32Array(size);
  SCRATCH_HI = new Int32Array(size);
  SCRATCH_NORM = new Float64Array(size);
  SCRATCH_BOOST = new Float64Array(size);
}

/**
 * Depth boost: R_i = min(1, R * BOOST / BOOST_DIV[i]) at depth i < BOOST_DEPTH, where BOOST_DIV[i] = (i + 1)^BOOST_POW
 * (an integer, so the pass's test stays exact integer arithmetic); R from BOOST_DEPTH on (the first depth whose divisor
 * reaches BOOST).
 */
const BOOST = 256;
const BOOST_POW = 2;
const BOOST_DIV = (() => {
  const d: number[] = [];
  for (let i = 0; (i + 1) ** BOOST_POW < BOOST; i++) d.push((i + 1) ** BOOST_POW);
  return Float64Array.from(d);
})();
const BOOST_DEPTH = BOOST_DIV.length;
/** Rate multiplier at chain depth i: shallow blocks (shared prompts) are sampled more often. */
export function depthBoost(i: number): number {
  return i < BOOST_DEPTH ? BOOST / BOOST_DIV[i] : 1;
}

/**
 * One miss-ratio curve. `observe` takes a request's sequence hashes (as the router's u32 view of its BigUint64Array:
 * low word at 2i, high word at 2i+1) and its prompt length in blocks.
 */
export class ShardsMrc {
  /** Global threshold T (a float: depth boosts scale it). */
  private threshold: number;
  private readonly maxSamples: number;
  private readonly ownOnly: boolean;
  /** Sampled block hash (lo, hi) -> last touch time (a Fenwick slot). A typed-array table: no allocation per look-up. */
  private readonly lastTouch = new U64Map(1024);
  /** Depth boost of the sample at each slot (moves with the slot on rebuilds). */
  private slotBoost: Float64Array;
  /** Sample hash halves at each slot (meaningless where the slot's boost is 0: free). */
  private slotLo: Int32Array;
  private slotHi: Int32Array;
  /** Max-heap of sampled blocks by normalised hash value (hash value / boost), to drop the largest when full. */
  private heapVal: number[] = [];
  private heapLo: number[] = [];
  private heapHi: number[] = [];
  private poppedLo = 0;
  private poppedHi = 0;
  /** Set when shrink() deleted samples (table cells move): the touches of the request being observed re-find keys. */
  private moved = false;
  private fenwick: Float64Array;
  private clock = 0;
  private readonly hist = new Float64Array(BUCKETS);
  /** Weight of first references (infinite distance: a miss at any capacity). */
  private cold = 0;
  private total = 0;
  private refs = 0;
  private isl = 0;
  private full = 0;
  private requests = 0;

  constructor(options: MrcOptions = MRC_DEFAULTS) {
    validateMrcOptions(options);
    this.threshold = Math.max(1, options.sampleRate * MRC_MODULUS);
    this.maxSamples = options.maxSamples;
    this.ownOnly = options.chainRule === 'own';
    // Sized for the samples held, not the bound: rebuilds grow it (engine and model curves hold a share of the fleet's).
    this.fenwick = new Float64Array(Math.min(4 * options.maxSamples + 2, MIN_SLOTS));
    this.slotBoost = new Float64Array(this.fenwick.length);
    this.slotLo = new Int32Array(this.fenwick.length);
    this.slotHi = new Int32Array(this.fenwick.length);
  }

  /** The base sampling rate R (depth 15 and deeper); it falls when the sample set reaches its bound. */
  get sampleRate(): number {
    return this.threshold / MRC_MODULUS;
  }

  /** Observes one request: `view` is the u32 view of its sequence hashes; `promptBlocks` = ceil(prompt tokens / bs). */
  observe(view: Uint32Array, fullBlocks: number, promptBlocks: number): void {
    const c = collectCandidates(view, fullBlocks, this.threshold, SCRATCH_CANDIDATES);
    this.observeCandidates(c, fullBlocks, promptBlocks);
  }

  /** The threshold T (candidates collected at a T at least this high serve this curve). */
  get sampleThreshold(): number {
    return this.threshold;
  }

  /**
   * Observes one request from its candidate blocks, collected (collectCandidates) at a threshold at least this curve's:
   * several curves fed the same request share the one pass over its hashes.
   */
  observeCandidates(c: Candidates, fullBlocks: number, promptBlocks: number): void {
    const n = Math.min(fullBlocks, c.blocks);
    this.requests++;
    this.isl += Math.max(promptBlocks, n);
    this.full += n;
    // The candidates under this curve's threshold: all of them when it is the threshold they were collected at (the
    // fleet curve's, which engine and model curves follow), read in place; else copied out.
    if (SCRATCH_LO.length < c.count) growScratch(c.count);
    const t = this.threshold;
    const cn = c.norm;
    let m = 0;
    while (m < c.count && cn[m] < t) m++;
    let los = c.lo;
    let his = c.hi;
    let norms = cn;
    let boosts = c.boost;
    if (m < c.count) {
      los = SCRATCH_LO;
      his = SCRATCH_HI;
      norms = SCRATCH_NORM;
      boosts = SCRATCH_BOOST;
      m = 0;
      for (let k = 0; k < c.count; k++) {
        const norm = cn[k];
        if (norm < t) {
          los[m] = c.lo[k];
          his[m] = c.hi[k];
          norms[m] = norm;
          boosts[m] = c.boost[k];
          m++;
        }
      }
    }
    if (m === 0) return;
    // Look-ups first, in chain order, with the running maximum over the chain's sampled blocks. Each keeps its table
    // position and weight for its touch (the touches below re-find a key only after the table moved its cells).
    const poss = SCRATCH_POS;
    const ws = SCRATCH_W;
    let runMax = 0;
    let coldFromHere = false;
    const newest = this.prefix(this.clock); // no touch happens during the look-ups
    for (let j = 0; j < m; j++) {
      const weight = this.weightOf(boosts[j]);
      ws[j] = weight;
      this.refs++;
      this.total += weight;
      const pos = coldFromHere ? -1 : this.lastTouch.find(los[j], his[j]);
      poss[j] = pos;
      if (pos < 0) {
        coldFromHere = true; // an uncached ancestor makes every later block of the chain unusable
        this.cold += weight;
        continue;
      }
      const d = newest - this.prefix(this.lastTouch.valueAt(pos));
      if (d > runMax || this.ownOnly) runMax = d;
      this.hist[bucketOf(runMax)] += weight;
    }
    // Touches, last block first: a prefix is always more recent than its extensions.
    const cells = this.lastTouch.cells;
    this.moved = false;
    for (let j = m - 1; j >= 0; j--) {
      if (this.moved || this.lastTouch.cells !== cells) this.touch(los[j], his[j], norms[j], boosts[j], -1, this.weightOf(boosts[j]));
      else this.touch(los[j], his[j], norms[j], boosts[j], poss[j], ws[j]);
    }
  }

  /**
   * Lowers the threshold to `t` (no-op when it is not lower), dropping the samples above it: MrcBook keeps its engine and
   * model curves at or below the fleet curve's threshold, so one pass at that threshold serves them all and their
   * samples together stay within about the fleet's.
   */
  lowerThreshold(t: number): void {
    if (!(t < this.threshold)) return;
    this.threshold = t;
    while (this.heapVal.length > 0 && this.heapVal[0] >= t) {
      this.heapPop();
      const at = this.lastTouch.delete(this.poppedLo, this.poppedHi);
      if (at >= 0) this.slotBoost[at] = 0;
    }
    this.reweight();
  }

  /**
   * Multiplies every recorded weight (histogram, cold references, block counts) by `f` in (0, 1]: older traffic counts
   * less, so the curve follows traffic that changes (MrcBook applies it on a half-life in requests). The sample set and
   * its recency order are kept: reuse distances still span the old traffic, as an LRU cache's contents would.
   */
  decay(f: number): void {
    if (!(f > 0 && f <= 1)) throw new RangeError(`decay factor must be in (0, 1], got ${f}`);
    if (f === 1) return;
    const h = this.hist;
    for (let b = 0; b < h.length; b++) h[b] *= f;
    this.cold *= f;
    this.total *= f;
    this.isl *= f;
    this.full *= f;
  }

  /** Prompt blocks observed, decayed like the curve (the weight of this curve's stream). */
  get weight(): number {
    return this.isl;
  }

  /** Convenience for BigUint64Array sequence hashes. */
  observeHashes(seqHashes: BigUint64Array, promptBlocks: number): void {
    this.observe(new Uint32Array(seqHashes.buffer, seqHashes.byteOffset, seqHashes.length * 2), seqHashes.length, promptBlocks);
  }

  /**
   * Block-weighted hit ratio of an LRU prefix cache of `capacityBlocks` blocks on the traffic observed: the weighted
   * fraction of sampled full-block references within that distance, times full blocks / prompt blocks. NaN before any
   * sample.
   */
  hitRatio(capacityBlocks: number): number {
    if (this.total === 0 || this.isl === 0) return NaN;
    if (!(capacityBlocks > 0)) return 0;
    let w = 0;
    const cb = bucketOf(capacityBlocks);
    for (let b = 0; b < cb; b++) w += this.hist[b];
    // Linear share of the bucket that holds the capacity.
    const lo = bucketLow(cb);
    const hi = bucketHigh(cb);
    w += this.hist[cb] * Math.min(1, Math.max(0, (capacityBlocks - lo) / (hi - lo)));
    return (w / this.total) * (this.full / this.isl);
  }

  /** Hit ratio with no capacity limit (every re-reference hits): the curve's asymptote. */
  hitRatioUnbounded(): number {
    if (this.total === 0 || this.isl === 0) return NaN;
    return ((this.total - this.cold) / this.total) * (this.full / this.isl);
  }

  snapshot(): MrcSnapshot {
    return {
      sampledRefs: this.refs,
      islBlocks: this.isl,
      fullBlocks: this.full,
      requests: this.requests,
      sampleRate: this.sampleRate,
      samples: this.lastTouch.size,
    };
  }

  /**
   * Bytes held: the sample table (U64Map, 12 B a cell at 50-80% load), the eviction heap (3 × 8 B an entry), the
   * Fenwick tree and slot arrays (16 + 8 + 4 + 4 B × 4 × maxSamples), the histogram (11 KiB). Bounded through maxSamples.
   */
  memoryBytes(): number {
    return (
      this.lastTouch.byteLength +
      this.heapVal.length * 24 +
      this.fenwick.byteLength +
      this.slotBoost.byteLength +
      this.slotLo.byteLength +
      this.slotHi.byteLength +
      this.hist.byteLength
    );
  }

  /** 1 / R_i for a block of the given depth boost at the current threshold. */
  private weightOf(boost: number): number {
    return MRC_MODULUS / Math.min(MRC_MODULUS, this.threshold * boost);
  }

  private prefix(i: number): number {
    let s = 0;
    const f = this.fenwick;
    for (let j = i | 0; j > 0; j = (j & (j - 1)) | 0) s += f[j];
    return s;
  }

  private add(i: number, d: number): void {
    const f = this.fenwick;
    const n = f.length | 0;
    for (let j = i | 0; j < n; j = (j + (j & -j)) | 0) f[j] += d;
  }

  /**
   * Moves a sample to the newest touch slot. `pos`: its table position from this request's look-up (-1: find it), `w`:
   * its weight at the current threshold (a block's boost is fixed by its depth, so its old slot holds the same weight).
   */
  private touch(lo: number, hi: number, norm: number, boost: number, pos: number, w: number): void {
    if (this.clock + 1 >= this.fenwick.length) this.rebuild();
    if (pos < 0) pos = this.lastTouch.find(lo, hi);
    const at = pos >= 0 ? this.lastTouch.valueAt(pos) : -1;
    if (at < 0 && norm >= this.threshold) return; // dropped by a lowered threshold while this request was read
    const now = ++this.clock;
    if (at >= 0) {
      this.slotBoost[at] = 0;
      this.move(at, now, w);
    } else this.add(now, w);
    this.slotBoost[now] = boost;
    this.slotLo[now] = lo;
    this.slotHi[now] = hi;
    if (pos >= 0) this.lastTouch.setAt(pos, now);
    else {
      this.lastTouch.set(lo, hi, now);
      this.heapPush(norm, lo, hi);
      if (this.lastTouch.size > this.maxSamples) this.shrink();
    }
  }

  /**
   * Moves weight `w` from slot `from` to slot `to` > from: the two update walks up the tree, stopped where they meet
   * (above it the two updates cancel), so a recently touched sample costs a few steps instead of two full walks.
   */
  private move(from: number, to: number, w: number): void {
    const f = this.fenwick;
    const n = f.length | 0;
    let a = from | 0;
    let b = to | 0;
    while (a !== b) {
      if (a < b) {
        if (a >= n) return;
        f[a] -= w;
        a = (a + (a & -a)) | 0;
      } else {
        if (b >= n) return;
        f[b] += w;
        b = (b + (b & -b)) | 0;
      }
    }
  }

  /**
   * Drops the samples with the largest normalised hash value, a quarter of the bound at a time (so the O(n) pass that
   * re-weights the survivors is amortised), lowering the threshold to the last value dropped.
   */
  private shrink(): void {
    this.moved = true;
    const target = this.maxSamples - Math.max(1, this.maxSamples >>> 2);
    while (this.lastTouch.size > target && this.heapVal.length > 0) {
      const top = this.heapVal[0];
      this.threshold = top;
      while (this.heapVal.length > 0 && this.heapVal[0] >= top) {
        this.heapPop();
        const at = this.lastTouch.delete(this.poppedLo, this.poppedHi);
        if (at >= 0) this.slotBoost[at] = 0;
      }
    }
    if (!(this.threshold > 0)) this.threshold = Number.MIN_VALUE;
    this.reweight();
  }

  /** Renumbers live touch times 1..n in order (slot order is time order: no sort) and rebuilds the tree. */
  private rebuild(): void {
    const size = Math.max(MIN_SLOTS, 4 * this.lastTouch.size + 2);
    const clock = this.clock;
    const oldBoost = this.slotBoost;
    const oldLo = this.slotLo;
    const oldHi = this.slotHi;
    const boost = new Float64Array(size);
    const lo = new Int32Array(size);
    const hi = new Int32Array(size);
    const renumbered = new Int32Array(clock + 1);
    let t = 0;
    for (let at = 1; at <= clock; at++) {
      const b = oldBoost[at];
      if (b === 0) continue;
      t++;
      renumbered[at] = t;
      boost[t] = b;
      lo[t] = oldLo[at];
      hi[t] = oldHi[at];
    }
    this.slotBoost = boost;
    this.slotLo = lo;
    this.slotHi = hi;
    // Every key in the table has a live slot: renumber the values where they lie (no look-up per sample).
    const table = this.lastTouch;
    for (let pos = 0, cap = table.capacity; pos < cap; pos++) {
      const at = table.valueAt(pos);
      if (at >= 0) table.setAt(pos, renumbered[at]);
    }
    this.clock = t;
    this.fenwick = new Float64Array(size);
    this.reweight();
  }

  /** Rebuilds the tree in place from the slots' boosts at the current threshold (O(n) construction). */
  private reweight(): void {
    const f = this.fenwick;
    const n = f.length;
    const boost = this.slotBoost;
    const clock = this.clock;
    f.fill(0);
    for (let i = 1; i <= clock; i++) {
      const b = boost[i];
      if (b !== 0) f[i] = this.weightOf(b);
    }
    for (let i = 1; i < n; i++) {
      const j = i + (i & -i);
      if (j < n) f[j] += f[i];
    }
  }

  private heapPush(val: number, lo: number, hi: number): void {
    const hv = this.heapVal;
    const hl = this.heapLo;
    const hh = this.heapHi;
    let i = hv.length;
    hv.push(val);
    hl.push(lo);
    hh.push(hi);
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (hv[p] >= val) break;
      hv[i] = hv[p];
      hl[i] = hl[p];
      hh[i] = hh[p];
      i = p;
    }
    hv[i] = val;
    hl[i] = lo;
    hh[i] = hi;
  }

  /** Removes the top of the heap into poppedLo / poppedHi. */
  private heapPop(): void {
    const hv = this.heapVal;
    const hl = this.heapLo;
    const hh = this.heapHi;
    this.poppedLo = hl[0];
    this.poppedHi = hh[0];
    const lastVal = hv.pop() as number;
    const lastLo = hl.pop() as number;
    const lastHi = hh.pop() as number;
    const n = hv.length;
    if (n === 0) return;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= n) break;
      const r = l + 1;
      const c = r < n && hv[r] > hv[l] ? r : l;
      if (hv[c] <= lastVal) break;
      hv[i] = hv[c];
      hl[i] = hl[c];
      hh[i] = hh[c];
      i = c;
    }
    hv[i] = lastVal;
    hl[i] = lastLo;
    hh[i] = lastHi;
  }
}
/** One point of a what-if answer. */
export interface MrcPoint {
  readonly factor: number;
  /** The capacity in blocks (null when the capacity it multiplies is unknown). */
  readonly blocks: number | null;
  /** Block-weighted hit ratio predicted at that capacity (null: no sampled traffic yet). */
  readonly hit: number | null;
}

export interface MrcReport {
  readonly method: string;
  readonly sampleRate: number;
  readonly maxSamples: number;
  readonly requests: number;
  readonly sampledRefs: number;
  readonly memoryBytes: number;
  /** The fleet's KV blocks today (sum over sources of known capacity); null when no capacity is known. */
  readonly fleetBlocks: number | null;
  /** Shared LRU prefix cache of factor x the fleet's blocks, fleet-wide traffic. */
  readonly fleet: readonly MrcPoint[];
  /** Per model, the same factors of the fleet's blocks (each model's traffic alone in a cache of that size). */
  readonly models: Readonly<Record<string, readonly MrcPoint[]>>;
  /** Models beyond the tracked number: their traffic counts fleet-wide only. */
  readonly untrackedModelRequests: number;
  /**
   * Scale up: every engine k x its own capacity, the fleet's hit. k <= 1: each engine's own stream on its own curve at k x
   * its capacity (prompt-block-weighted mean; smaller engines keep today's routing). k > 1: the fleet curve at k x the
   * fleet's blocks times `locality` (a cache-aware router with bigger engines keeps more of each prefix where it is
   * cached, so the engines' streams change and today's streams under-predict; the shared cache of the same total size,
   * discounted by the share of its hits the split fleet delivers today, tracks it: bench:mrc, docs/cache-sizing.md).
   */
  readonly scaleUp: readonly MrcPoint[];
  /** Every engine k x its own capacity with each engine's stream as today (routing held fixed): the old answer. */
  readonly scaleUpFixedRouting: readonly MrcPoint[];
  /**
   * Scale out: m more engines of today's mean size (capacity_factor = (N + m) / N): the fleet curve at that many blocks
   * times `locality`.
   */
  readonly scaleOut: readonly (MrcPoint & { readonly enginesAdded: number; readonly engines: number })[];
  /**
   * Today's locality: the engines' own curves at 1x (what the split fleet delivers) over the fleet curve at 1x (one
   * shared cache of the same total size); null without both.
   */
  readonly locality: number | null;
  /** Per engine (source key): its capacity and the same factors of it. */
  readonly engines: Readonly<
    Record<
      string,
      { readonly blocks: number | null; readonly sampleRate: number; readonly samples: number; readonly curve: readonly MrcPoint[] }
    >
  >;
  /**
   * With a host tier: each engine's own blocks plus `hostBlocksPerEngine` (null without a host size); for reuse an
   * offload tier the engine loads back from is a bigger cache of the same LRU order (src/mocker/engine/host-tier.ts).
   * `hit`: the scale-up answer at (fleet blocks + N x host blocks) / fleet blocks, for a router that credits the tier's
   * blocks (`--tier-credit`) and so keeps each prefix's traffic where the tier holds it. `hitFixedRouting`: each
   * engine's own stream, as routed today, on its own curve at its blocks + the host blocks, for a router that does not
   * see the tier (its blocks leave the index on GPU eviction, so the routing stays as today's): bench:mrc --parts host.
   */
  readonly hostTier: {
    readonly hostBlocksPerEngine: number;
    readonly factor: number | null;
    readonly hit: number | null;
    readonly hitFixedRouting: number | null;
  } | null;
}

export const MRC_METHOD =
  'SHARDS (Waldspurger et al., FAST 2015): spatially hashed sampling of block hashes, fixed-size sample set; LRU prefix ' +
  'cache, a block counts only when its whole chain is cached; block-weighted (hit blocks / prompt blocks)';

const nullIfNaN = (x: number): number | null => (Number.isFinite(x) ? x : null);

/**
 * The curves the live router keeps: fleet-wide, per model (bounded count) and per engine (source). Fed each routed
 * request once (its first attempt); read on demand. Pure.
 */
export class MrcBook {
  readonly fleet: ShardsMrc;
  private readonly models = new Map<string, ShardsMrc>();
  private readonly engines = new Map<string, ShardsMrc>();
  /** Requests between decay steps (0: no decay), the factor of a step, and requests since the last one. */
  private readonly decayEvery: number;
  private readonly decayFactor: number;
  private sinceDecay = 0;
  private untracked = 0;
  /** The first model seen; its own curve exists only once another model has been seen. */
  private soleModel: string | undefined;

  constructor(
    readonly options: MrcOptions = MRC_DEFAULTS,
    /** Models with their own curve; further models count fleet-wide only. */
    readonly maxModels = 32,
  ) {
    this.fleet = new ShardsMrc(options);
    const h = options.halfLifeRequests ?? 0;
    this.decayEvery = h > 0 ? Math.max(1, Math.round(h / DECAY_STEPS)) : 0;
    this.decayFactor = h > 0 ? 2 ** (-this.decayEvery / h) : 1;
  }

  observe(model: string, sourceKey: string, seqHashes: BigUint64Array, promptBlocks: number): void {
    const view = new Uint32Array(seqHashes.buffer, seqHashes.byteOffset, seqHashes.length * 2);
    const full = seqHashes.length;
    // While one model has all the traffic, its curve is the fleet's (no second copy on the hot path); a second model
    // starts its own curve from then on, and the first model's from its next request, both counting from that point.
    if (this.soleModel === undefined) this.soleModel = model;
    let m: ShardsMrc | undefined;
    if (model !== this.soleModel || this.models.size > 0) {
      // The first model keeps its place among the tracked ones (its curve counts from its next request).
      if (this.models.size === 0) this.models.set(this.soleModel, new ShardsMrc(this.options));
      m = this.models.get(model);
      if (!m && this.models.size < this.maxModels) {
        m = new ShardsMrc(this.options);
        this.models.set(model, m);
      }
      if (!m) this.untracked++;
    }
    let e = this.engines.get(sourceKey);
    if (!e) {
      e = new ShardsMrc(this.options);
      this.engines.set(sourceKey, e);
    }
    // Engine and model curves sample at most at the fleet curve's rate (one threshold: one pass over the hashes serves
    // every curve, and their samples together stay within about the fleet curve's, whatever the number of engines).
    const t = this.fleet.sampleThreshold;
    e.lowerThreshold(t);
    m?.lowerThreshold(t);
    const c = collectCandidates(view, full, t);
    this.fleet.observeCandidates(c, full, promptBlocks);
    m?.observeCandidates(c, full, promptBlocks);
    e.observeCandidates(c, full, promptBlocks);
    if (this.decayEvery > 0 && ++this.sinceDecay >= this.decayEvery) this.decayAll();
  }

  /** One decay step on every curve (a half-life is DECAY_STEPS steps). */
  private decayAll(): void {
    this.sinceDecay = 0;
    const f = this.decayFactor;
    this.fleet.decay(f);
    for (const m of this.models.values()) m.decay(f);
    for (const e of this.engines.values()) e.decay(f);
  }

  engineKeys(): string[] {
    return [...this.engines.keys()];
  }

  /** Forgets an engine's curve (the source left the fleet). */
  forgetEngine(sourceKey: string): void {
    this.engines.delete(sourceKey);
  }

  memoryBytes(): number {
    let n = this.fleet.memoryBytes();
    for (const m of this.models.values()) n += m.memoryBytes();
    for (const e of this.engines.values()) n += e.memoryBytes();
    return n;
  }

  /**
   * What more cache would buy. `capacity(sourceKey)`: an engine's KV blocks today (undefined when unknown); the fleet's
   * blocks are their sum over the engines seen. `hostBlocksPerEngine`: a host tier's size per engine, for that answer.
   */
  report(
    capacity: (sourceKey: string) => number | undefined,
    hostBlocksPerEngine?: number,
    factors: readonly number[] = MRC_FACTORS,
  ): MrcReport {
    let fleetBlocks = 0;
    const engines: Record<string, { blocks: number | null; sampleRate: number; samples: number; curve: MrcPoint[] }> = {};
    for (const [key, e] of this.engines) {
      const blocks = capacity(key);
      const known = blocks !== undefined && blocks > 0;
      if (known) fleetBlocks += blocks;
      engines[key] = {
        blocks: known ? blocks : null,
        sampleRate: e.sampleRate,
        samples: e.snapshot().samples,
        curve: factors.map((f) => ({
          factor: f,
          blocks: known ? f * blocks : null,
          hit: known ? nullIfNaN(e.hitRatio(f * blocks)) : null,
        })),
      };
    }
    const fb = fleetBlocks > 0 ? fleetBlocks : null;
    const curveOf = (m: ShardsMrc): MrcPoint[] =>
      factors.map((f) => ({ factor: f, blocks: fb === null ? null : f * fb, hit: fb === null ? null : nullIfNaN(m.hitRatio(f * fb)) }));
    const engineMean = (blocksOf: (own: number) => number): number | null => {
      let num = 0;
      let den = 0;
      for (const [key, e] of this.engines) {
        const own = capacity(key);
        if (own === undefined || !(own > 0)) continue;
        const h = e.hitRatio(blocksOf(own));
        if (!Number.isFinite(h)) continue;
        num += h * e.weight;
        den += e.weight;
      }
      return den > 0 ? num / den : null;
    };
    const models: Record<string, MrcPoint[]> = {};
    if (this.models.size === 0 && this.soleModel !== undefined) models[this.soleModel] = curveOf(this.fleet);
    for (const [name, m] of [...this.models].sort(([a], [b]) => (a < b ? -1 : 1))) models[name] = curveOf(m);
    const snap = this.fleet.snapshot();
    // Engines of known capacity (the scale-out answers add engines of their mean size).
    let known = 0;
    for (const key of this.engines.keys()) {
      const own = capacity(key);
      if (own !== undefined && own > 0) known++;
    }
    const fleet1 = fb === null ? NaN : this.fleet.hitRatio(fb);
    const engines1 = engineMean((own) => own);
    const locality = engines1 !== null && fleet1 > 0 ? engines1 / fleet1 : null;
    /** The fleet's hit with `blocks` in all, the split fleet's locality kept. */
    const grown = (blocks: number): number | null =>
      fb === null || locality === null ? null : nullIfNaN(this.fleet.hitRatio(blocks) * locality);
    const scaleUpAt = (k: number): number | null => (k <= 1 ? engineMean((own) => k * own) : grown(k * (fb ?? 0)));
    const hostFactor = fb !== null && hostBlocksPerEngine !== undefined ? (fb + known * hostBlocksPerEngine) / fb : null;
    return {
      method: MRC_METHOD,
      sampleRate: this.fleet.sampleRate,
      maxSamples: this.options.maxSamples,
      requests: snap.requests,
      sampledRefs: snap.sampledRefs,
      memoryBytes: this.memoryBytes(),
      fleetBlocks: fb,
      fleet: curveOf(this.fleet),
      models,
      untrackedModelRequests: this.untracked,
      scaleUp: factors.map((k) => ({ factor: k, blocks: fb === null ? null : k * fb, hit: scaleUpAt(k) })),
      scaleUpFixedRouting: factors.map((k) => ({ factor: k, blocks: fb === null ? null : k * fb, hit: engineMean((own) => k * own) })),
      scaleOut:
        known === 0
          ? []
          : MRC_SCALE_OUT.map((m) => {
              const factor = (known + m) / known;
              return {
                enginesAdded: m,
                engines: known + m,
                factor,
                blocks: fb === null ? null : factor * fb,
                hit: fb === null ? null : grown(factor * fb),
              };
            }),
      locality,
      engines,
      hostTier:
        hostBlocksPerEngine !== undefined && hostBlocksPerEngine >= 0
          ? {
              hostBlocksPerEngine,
              factor: hostFactor,
              hit: hostFactor === null ? null : scaleUpAt(hostFactor),
              hitFixedRouting: engineMean((own) => own + hostBlocksPerEngine),
            }
          : null,
    };
  }
}
