/**
 * The seeded pseudo-random numbers of the whole project: src/core never calls Math.random, and neither do the
 * simulator and the mock engine, so a seed reproduces a run bit for bit.
 *
 * Two generators, kept apart on purpose: `createRng` (mulberry32, one u32 of state) is the router's tie-break
 * stream and the fault injectors'; `Sfc32` draws the simulator's synthetic traces. Every simulation figure in
 * bench/RESULTS.md depends on both sequences, so replacing either by the other would change figures that are
 * quoted; they live in this one module instead of two.
 */

/** A uniform [0, 1) source. */
export type Rng = () => number;

/** mulberry32. */
export function createRng(seed: number): Rng {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** splitmix32 finaliser: a well-mixed 32-bit value from any 32-bit input (used to derive seeds from ids). */
export function mix32(x: number): number {
  x = (x + 0x9e3779b9) | 0;
  x = Math.imul(x ^ (x >>> 16), 0x85ebca6b);
  x = Math.imul(x ^ (x >>> 13), 0xc2b2ae35);
  return (x ^ (x >>> 16)) >>> 0;
}

/**
 * sfc32 with distributions (the simulator's trace generators): small, fast, passes PractRand to 2^40+; state is four
 * u32; `stream` splits one seed into independent streams.
 */
export class Sfc32 {
  private a: number;
  private b: number;
  private c: number;
  private d: number;

  constructor(seed: number, stream = 0) {
    this.a = mix32(seed >>> 0);
    this.b = mix32(((seed / 0x100000000) >>> 0) ^ 0x6a09e667);
    this.c = mix32(stream ^ 0xbb67ae85);
    this.d = 1;
    for (let i = 0; i < 12; i++) this.nextU32();
  }

  nextU32(): number {
    const t = (((this.a + this.b) | 0) + this.d) | 0;
    this.d = (this.d + 1) | 0;
    this.a = this.b ^ (this.b >>> 9);
    this.b = (this.c + (this.c << 3)) | 0;
    this.c = (this.c << 21) | (this.c >>> 11);
    this.c = (this.c + t) | 0;
    return t >>> 0;
  }

  /** Uniform in [0, 1). */
  next(): number {
    return this.nextU32() / 4294967296;
  }

  /** Uniform integer in [lo, hi] (inclusive). */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo + 1));
  }

  /** Exponential with the given mean. */
  exp(mean: number): number {
    return -Math.log(1 - this.next()) * mean;
  }

  /** Standard normal (Box-Muller; one value per call keeps the stream simple). */
  normal(): number {
    const u = 1 - this.next();
    const v = this.next();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  }

  /** Log-normal parameterised by its median and the sigma of the underlying normal. */
  logNormal(median: number, sigma: number): number {
    return median * Math.exp(sigma * this.normal());
  }

  /** Log-uniform in [lo, hi]. */
  logUniform(lo: number, hi: number): number {
    return Math.exp(Math.log(lo) + this.next() * (Math.log(hi) - Math.log(lo)));
  }

  chance(p: number): boolean {
    return this.next() < p;
  }
}
