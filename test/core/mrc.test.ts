import { describe, expect, it } from 'vitest';
import { islBlocks } from '../../src/core/hashing.ts';
import { collectCandidates, depthBoost, MRC_MODULUS, MrcBook, ShardsMrc } from '../../src/core/mrc.ts';
import { LruPrefixCache } from '../../src/sim/lru-prefix.ts';
import { TraceHasher } from '../../src/sim/traces/expand.ts';
import { generateAgentic, generateMultiTurn } from '../../src/sim/traces/generate.ts';
import type { TraceRequest } from '../../src/sim/traces/format.ts';

const BS = 64;

function chainsAt(trace: readonly TraceRequest[], bs: number): { seq: BigUint64Array; isl: number }[] {
  const hasher = new TraceHasher(bs);
  return trace.map((r) => ({ seq: hasher.seqHashes(r), isl: islBlocks(r.inputLength, bs) }));
}

const chains = (trace: readonly TraceRequest[]) => chainsAt(trace, BS);

/** Exact block-weighted hit of an LRU prefix cache of `cap` blocks over the stream. */
function exact(stream: readonly { seq: BigUint64Array; isl: number }[], cap: number): number {
  const c = new LruPrefixCache(cap);
  for (const r of stream) c.access(r.seq, r.isl);
  return c.hitRatio;
}

function estimate(stream: readonly { seq: BigUint64Array; isl: number }[], sampleRate: number, maxSamples: number): ShardsMrc {
  const m = new ShardsMrc({ sampleRate, maxSamples });
  for (const r of stream) m.observeHashes(r.seq, r.isl);
  return m;
}

function unique(hashes: number[]): BigUint64Array {
  // Low 24 bits zero, so a block is sampled at any rate: the test controls which blocks exist, not the sampler.
  return BigUint64Array.from(hashes.map((h) => BigInt(h) << 24n));
}

describe('ShardsMrc against an exact LRU prefix cache', () => {
  const agentic = chains(generateAgentic({ requests: 2500, seed: 7 }));
  let total = 0;
  for (const r of agentic) total += r.seq.length;
  // A "fleet" the size of 1/20 of the blocks referenced, so 0.5x..4x spans most of the curve.
  const fleet = Math.round(total / 20);

  it('at rate 1 (every block) matches the exact simulation at 1/8x..16x', () => {
    const m = estimate(agentic, 1, 1 << 22);
    for (const f of [0.125, 0.5, 1, 2, 4, 16]) {
      const cap = Math.round(f * fleet);
      expect(Math.abs(m.hitRatio(cap) - exact(agentic, cap)), `factor ${f}`).toBeLessThan(0.01);
    }
  });

  it('sampled at 5% stays within 0.03 of the exact simulation at 0.5x, 1x, 2x, 4x', () => {
    const m = estimate(agentic, 0.05, 1 << 20);
    expect(m.sampleRate).toBeCloseTo(0.05, 6);
    for (const f of [0.5, 1, 2, 4]) {
      const cap = Math.round(f * fleet);
      const e = exact(agentic, cap);
      expect(Math.abs(m.hitRatio(cap) - e), `factor ${f}: exact ${e}`).toBeLessThan(0.03);
    }
  });

  it('multi-turn chat (16-token blocks): sampled at 10%, within 0.03 of exact', () => {
    const chat = chainsAt(generateMultiTurn({ requests: 1200, seed: 3 }), 16);
    let n = 0;
    for (const r of chat) n += r.seq.length;
    const m = estimate(chat, 0.1, 1 << 20);
    for (const f of [0.02, 0.05, 0.3]) {
      const cap = Math.round(f * n);
      expect(Math.abs(m.hitRatio(cap) - exact(chat, cap)), `capacity ${cap}`).toBeLessThan(0.03);
    }
  });

  it('fixed-size: the sample set never passes its bound, the rate falls, the curve stays close', () => {
    const m = new ShardsMrc({ sampleRate: 1, maxSamples: 2048 });
    let peak = 0;
    for (const r of agentic) {
      m.observeHashes(r.seq, r.isl);
      peak = Math.max(peak, m.snapshot().samples);
    }
    expect(peak).toBeLessThanOrEqual(2048);
    expect(m.sampleRate).toBeLessThan(0.5);
    expect(m.memoryBytes()).toBeLessThan(2048 * 96 + 3 * 8 * (4 * 2048 + 2) + 8 * 1500);
    for (const f of [1, 2, 4]) {
      const cap = Math.round(f * fleet);
      expect(Math.abs(m.hitRatio(cap) - exact(agentic, cap)), `factor ${f}`).toBeLessThan(0.05);
    }
  });

  it('is monotone in capacity and bounded by the unbounded-cache asymptote', () => {
    const m = estimate(agentic, 0.05, 1 << 20);
    let prev = 0;
    for (const f of [0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 1000]) {
      const h = m.hitRatio(f * fleet);
      expect(h).toBeGreaterThanOrEqual(prev);
      prev = h;
    }
    expect(prev).toBeLessThanOrEqual(m.hitRatioUnbounded() + 1e-12);
    expect(m.hitRatio(0)).toBe(0);
  });
});

describe('ShardsMrc prefix rule', () => {
  it('a block whose ancestor was evicted is a miss (running maximum over the chain), as in the exact cache', () => {
    // [a, b] once, then b re-touched under other parents (a stream that does not nest), then [a, b] again.
    const stream = [{ seq: unique([1, 2]), isl: 2 }];
    for (let k = 0; k < 20; k++) stream.push({ seq: unique([100 + k, 2]), isl: 2 });
    stream.push({ seq: unique([1, 2]), isl: 2 });
    const m = estimate(stream, 1, 1024);
    // Capacity 4: `a` is long gone, so the last request hits nothing although `b` is recent (a per-block curve
    // without the chain rule would count b). Capacity 100: both hit, 2 of 44 prompt blocks.
    expect(exact(stream, 4)).toBe(0);
    expect(m.hitRatio(4)).toBe(0);
    expect(exact(stream, 100)).toBeCloseTo(2 / 44, 12);
    expect(m.hitRatio(100)).toBeCloseTo(2 / 44, 12);
  });

  it('counts the trailing partial block in the denominator only', () => {
    const m = new ShardsMrc({ sampleRate: 1, maxSamples: 1024 });
    const seq = unique([5, 6, 7]);
    m.observeHashes(seq, 4);
    m.observeHashes(seq, 4);
    // 3 of 8 prompt blocks hit (the second request's full blocks).
    expect(m.hitRatio(100)).toBeCloseTo(3 / 8, 10);
    expect(m.snapshot()).toMatchObject({ requests: 2, islBlocks: 8, fullBlocks: 6, sampledRefs: 6 });
  });

  it('samples spatially: a block is sampled every time or never (a first block at 256 times the rate)', () => {
    const m = new ShardsMrc({ sampleRate: 1 / 512, maxSamples: 1024 });
    const t = (256 / 512) * MRC_MODULUS;
    const inside = BigUint64Array.from([BigInt(t - 1) | (9n << 32n)]);
    const outside = BigUint64Array.from([BigInt(t) | (9n << 32n)]);
    m.observeHashes(outside, 1);
    m.observeHashes(outside, 1);
    expect(m.snapshot().sampledRefs).toBe(0);
    expect(m.hitRatio(10)).toBeNaN();
    m.observeHashes(inside, 1);
    m.observeHashes(inside, 1);
    expect(m.snapshot().sampledRefs).toBe(2);
  });
});

describe('the sampling pass (collectCandidates)', () => {
  // The pass compares integer thresholds (four blocks at a time in JS, eight in the wasm module for long tails); it must
  // pick exactly the blocks of the definition: v * (i + 1)^2 < T * 256 at depth i < 15 (rate R * 256 / (i + 1)^2),
  // v < T deeper, v the low 24 bits of the hash.
  const reference = (seq: BigUint64Array, t: number): number[] => {
    const out: number[] = [];
    for (let i = 0; i < seq.length; i++) {
      const v = Number(seq[i] & 0xffffffn);
      if (v / depthBoost(i) < t) out.push(i);
    }
    return out;
  };
  const picked = (seq: BigUint64Array, t: number): number[] => {
    const c = collectCandidates(new Uint32Array(seq.buffer, seq.byteOffset, seq.length * 2), seq.length, t);
    return Array.from(c.index.subarray(0, c.count));
  };

  it('picks exactly the depth-boosted sample of the definition, at thresholds on and between integers', () => {
    let x = 0x9e3779b97f4a7c15n;
    const seq = new BigUint64Array(1003); // not a multiple of 4: the loops' remainders count
    for (let i = 0; i < seq.length; i++) {
      x = (x * 6364136223846793005n + 1442695040888963407n) & 0xffffffffffffffffn;
      seq[i] = x;
    }
    for (const t of [1, 700.5, 65536, 65536.25, 0.05 * MRC_MODULUS, MRC_MODULUS / 3, MRC_MODULUS]) {
      expect(picked(seq, t), `threshold ${t}`).toEqual(reference(seq, t));
    }
  });

  it('treats a value exactly at a depth threshold as outside (v * (i + 1)^2 = T * 256 is not sampled)', () => {
    const t = 3000; // T * 256 = 768000: at depth i < 15 the first value outside is ceil(768000 / (i + 1)^2), deeper T
    // 300 blocks: the tail goes through the wasm pass; 60: through the JS loop (tails under 64 blocks).
    for (const length of [300, 60]) {
      const seq = new BigUint64Array(length);
      for (let i = 0; i < length; i++) {
        const edge = i < 15 ? Math.ceil((t * 256) / (i + 1) ** 2) : t;
        seq[i] = BigInt(Math.min(edge - (i % 2), MRC_MODULUS - 1)) | (BigInt(i + 1) << 32n); // odd depths: one below
      }
      expect(picked(seq, t), `${length} blocks`).toEqual(reference(seq, t));
      expect(picked(seq, t)).toContain(1);
      expect(picked(seq, t)).not.toContain(2);
      expect(picked(seq, t)).toContain(15); // deeper than the boost: one below T
      expect(picked(seq, t)).not.toContain(16);
    }
  });

  it('boosts the first 15 blocks of a chain by 256 / (i + 1)^2 and no deeper block', () => {
    expect([0, 1, 2, 3, 14, 15, 16, 300].map(depthBoost)).toEqual([256, 64, 256 / 9, 16, 256 / 225, 1, 1, 1]);
  });

  it('picks the blocks of the definition on random chains of every length around the switch from the JS loop to the wasm pass', () => {
    let x = 0x1234567n;
    for (let length = 0; length < 120; length++) {
      const seq = new BigUint64Array(length);
      for (let i = 0; i < length; i++) {
        x = (x * 6364136223846793005n + 1442695040888963407n) & 0xffffffffffffffffn;
        seq[i] = x;
      }
      for (const t of [0.02 * MRC_MODULUS, 0.3 * MRC_MODULUS]) expect(picked(seq, t), `${length} blocks`).toEqual(reference(seq, t));
    }
  });
});

describe('ShardsMrc options', () => {
  it('refuses a rate outside (0, 1] and a tiny or fractional bound with a clear error', () => {
    expect(() => new ShardsMrc({ sampleRate: 0, maxSamples: 1024 })).toThrow(/sample rate must be in \(0, 1\]/);
    expect(() => new ShardsMrc({ sampleRate: 1.5, maxSamples: 1024 })).toThrow(RangeError);
    expect(() => new ShardsMrc({ sampleRate: Number.NaN, maxSamples: 1024 })).toThrow(RangeError);
    expect(() => new ShardsMrc({ sampleRate: 0.1, maxSamples: 8 })).toThrow(/max samples must be an integer >= 16/);
    expect(() => new ShardsMrc({ sampleRate: 0.1, maxSamples: 100.5 })).toThrow(RangeError);
  });

  it('takes empty and short prompts without counting phantom blocks', () => {
    const m = new ShardsMrc({ sampleRate: 1, maxSamples: 1024 });
    m.observeHashes(new BigUint64Array(0), 0);
    m.observeHashes(new BigUint64Array(0), 1);
    expect(m.snapshot()).toMatchObject({ requests: 2, islBlocks: 1, fullBlocks: 0, sampledRefs: 0 });
    expect(m.hitRatio(10)).toBeNaN();
  });
});

describe('MrcBook (the curves the live router keeps)', () => {
  const stream = chains(generateAgentic({ requests: 600, seed: 11 }));
  const options = { sampleRate: 1, maxSamples: 1 << 20 };

  it('fleet, per-engine and scale-up answers equal separately fed curves; one shared pass changes nothing', () => {
    const book = new MrcBook(options);
    const fleet = new ShardsMrc(options);
    const perEngine = [new ShardsMrc(options), new ShardsMrc(options)];
    const isl = [0, 0];
    stream.forEach((r, i) => {
      book.observe('m', `w${i % 2}`, r.seq, r.isl);
      fleet.observeHashes(r.seq, r.isl);
      perEngine[i % 2].observeHashes(r.seq, r.isl);
      isl[i % 2] += r.isl;
    });
    const capacity = (key: string) => (key === 'w0' ? 2000 : key === 'w1' ? 1000 : undefined);
    const r = book.report(capacity, 500);
    expect(r.fleetBlocks).toBe(3000);
    for (const p of r.fleet) expect(p.hit).toBeCloseTo(fleet.hitRatio(p.factor * 3000), 12);
    // One model: its curve is the fleet's.
    expect(r.models).toEqual({ m: r.fleet });
    const engineMean = (blocks0: number, blocks1: number) =>
      (perEngine[0].hitRatio(blocks0) * isl[0] + perEngine[1].hitRatio(blocks1) * isl[1]) / (isl[0] + isl[1]);
    const locality = engineMean(2000, 1000) / fleet.hitRatio(3000);
    expect(r.locality).toBeCloseTo(locality, 12);
    for (const p of r.scaleUp) {
      // Up to 1x: the engines' own curves; above: the fleet curve times today's locality (equal at 1x).
      const want = p.factor <= 1 ? engineMean(p.factor * 2000, p.factor * 1000) : fleet.hitRatio(p.factor * 3000) * locality;
      expect(p.hit).toBeCloseTo(want, 12);
    }
    for (const p of r.scaleUpFixedRouting) expect(p.hit).toBeCloseTo(engineMean(p.factor * 2000, p.factor * 1000), 12);
    // Scale out: m more engines of the mean size (1,500 blocks).
    expect(r.scaleOut.map((p) => p.engines)).toEqual([3, 4, 6, 10]);
    for (const p of r.scaleOut) expect(p.hit).toBeCloseTo(fleet.hitRatio(3000 + p.enginesAdded * 1500) * locality, 12);
    // Host tier of 500 blocks per engine: credited, the scale-up answer at (3000 + 2 x 500) / 3000; not credited (routing
    // as today), each engine's own curve at its blocks + 500.
    expect(r.hostTier).toEqual({
      hostBlocksPerEngine: 500,
      factor: 4000 / 3000,
      hit: expect.closeTo(fleet.hitRatio(4000) * locality, 12),
      hitFixedRouting: expect.closeTo(engineMean(2500, 1500), 12),
    });
    expect(r.hostTier!.hitFixedRouting).not.toBeCloseTo(engineMean(2000 * (4000 / 3000), 1000 * (4000 / 3000)), 6);
    expect(r.engines.w0.blocks).toBe(2000);
    expect(book.report(capacity).hostTier).toBeNull();
  });

  it('a second model gets its own curve; models beyond the bound are counted, not tracked; unknown capacity gives no answers', () => {
    const book = new MrcBook(options, 2);
    for (const r of stream.slice(0, 100)) book.observe('a', 'w0', r.seq, r.isl);
    for (const r of stream.slice(100, 200)) book.observe('b', 'w0', r.seq, r.isl);
    for (const r of stream.slice(200, 230)) book.observe('c', 'w0', r.seq, r.isl);
    const none = book.report(() => undefined);
    expect(none.fleetBlocks).toBeNull();
    expect(none.fleet.every((p) => p.hit === null && p.blocks === null)).toBe(true);
    const r = book.report(() => 4000);
    expect(Object.keys(r.models)).toEqual(['a', 'b']);
    expect(r.untrackedModelRequests).toBe(30);
    expect(r.requests).toBe(230);
    book.forgetEngine('w0');
    expect(book.report(() => 4000).fleetBlocks).toBeNull();
  });
});

describe('MrcBook: one sampling threshold, decay', () => {
  it('engine and model curves never sample above the fleet curve: their samples together stay near the bound', () => {
    const stream = chains(generateAgentic({ requests: 1500, seed: 5 }));
    const book = new MrcBook({ sampleRate: 1, maxSamples: 512 });
    stream.forEach((r, i) => {
      book.observe(i % 3 === 0 ? 'a' : 'b', `w${i % 4}`, r.seq, r.isl);
    });
    const fleetRate = book.fleet.sampleRate;
    expect(fleetRate).toBeLessThan(0.2);
    book.observe('a', 'w0', stream[0].seq, stream[0].isl); // each engine curve follows the fleet's at its next request
    const r = book.report(() => 1000);
    expect(r.sampleRate).toBe(book.fleet.sampleRate);
    let samples = 0;
    for (const key of book.engineKeys()) {
      const e = r.engines[key];
      expect(e.curve.some((p) => p.hit !== null)).toBe(true);
      // At most the fleet's rate (w0 was just fed; the others may lag one request behind a fall).
      expect(e.sampleRate).toBeLessThanOrEqual(key === 'w0:0' || key === 'w0' ? r.sampleRate : fleetRate);
      samples += e.samples;
    }
    // The engines split the fleet's sampled blocks (a shared block counts on each engine that saw it).
    expect(samples).toBeLessThan(4 * 512);
  });

  it('lowerThreshold drops the samples above the new threshold and keeps the curve consistent', () => {
    const stream = chains(generateAgentic({ requests: 400, seed: 9 }));
    const m = new ShardsMrc({ sampleRate: 1, maxSamples: 1 << 20 });
    for (const r of stream) m.observeHashes(r.seq, r.isl);
    const before = m.snapshot().samples;
    m.lowerThreshold(0.25 * MRC_MODULUS);
    expect(m.sampleRate).toBe(0.25);
    const after = m.snapshot().samples;
    expect(after).toBeLessThan(before);
    expect(after).toBeGreaterThan(0);
    m.lowerThreshold(0.5 * MRC_MODULUS); // not lower: nothing changes
    expect(m.sampleRate).toBe(0.25);
    expect(m.snapshot().samples).toBe(after);
    for (const r of stream) m.observeHashes(r.seq, r.isl);
    const h = m.hitRatio(1e9);
    expect(h).toBeGreaterThan(0.3);
    expect(h).toBeLessThanOrEqual(m.hitRatioUnbounded() + 1e-12);
  });

  // Hot traffic: 10 prompts of 8 blocks over and over (nearly every block a hit); then cold traffic: every prompt new.
  const hot = Array.from({ length: 2000 }, (_, r) => unique(Array.from({ length: 8 }, (_, i) => 1 + (r % 10) * 100 + i)));
  const cold = Array.from({ length: 2000 }, (_, r) => unique(Array.from({ length: 8 }, (_, i) => 1e6 + r * 10 + i)));

  it('with a half-life the curves follow traffic that changes; without, they keep the whole history', () => {
    const decayed = new MrcBook({ sampleRate: 1, maxSamples: 1 << 16, halfLifeRequests: 100 });
    const kept = new MrcBook({ sampleRate: 1, maxSamples: 1 << 16 });
    for (const seq of hot) {
      decayed.observe('m', 'w0', seq, 8);
      kept.observe('m', 'w0', seq, 8);
    }
    expect(decayed.fleet.hitRatio(1000)).toBeGreaterThan(0.95);
    for (const seq of cold) {
      decayed.observe('m', 'w0', seq, 8);
      kept.observe('m', 'w0', seq, 8);
    }
    // 2,000 cold requests are 20 half-lives: the hot traffic weighs 2^-20.
    expect(decayed.fleet.hitRatio(1000)).toBeLessThan(0.001);
    const scaleUp = decayed.report(() => 500).scaleUp.find((p) => p.factor === 2)?.hit;
    expect(scaleUp).toBeLessThan(0.001);
    // Without decay: half the requests were hot.
    expect(kept.fleet.hitRatio(1000)).toBeGreaterThan(0.45);
    expect(kept.fleet.hitRatio(1000)).toBeLessThan(0.51);
    // Steady traffic: decay changes nothing but the weights' scale.
    const steady = new MrcBook({ sampleRate: 1, maxSamples: 1 << 16, halfLifeRequests: 50 });
    for (const seq of hot) steady.observe('m', 'w0', seq, 8);
    expect(steady.fleet.hitRatio(1000)).toBeGreaterThan(0.99);
  });

  it('refuses a negative or fractional half-life; decay factors outside (0, 1] are errors', () => {
    expect(() => new MrcBook({ sampleRate: 0.1, maxSamples: 64, halfLifeRequests: -1 })).toThrow(/half-life/);
    expect(() => new MrcBook({ sampleRate: 0.1, maxSamples: 64, halfLifeRequests: 1.5 })).toThrow(/half-life/);
    expect(() => new ShardsMrc().decay(0)).toThrow(/decay factor/);
    expect(() => new ShardsMrc().decay(1.5)).toThrow(/decay factor/);
  });
});
