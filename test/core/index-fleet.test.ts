/**
 * The index at fleet scale, against a brute-force model: 64, 1,024 and 4,096 sources, with popular prefixes held by
 * hundreds of sources (so holder sets go inline -> pool list -> bitset and back), evictions of part of a prefix's
 * holders, clears, sources removed and re-added, and the LRU cap. The model keeps, per source, engine id -> seq hash;
 * a sequence's overlap on a source is its leading blocks whose hashes the source holds.
 */
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { HolderSets, INLINE_MAX } from '../../src/core/index/holders.ts';
import { KvIndex } from '../../src/core/index/kv-index.ts';
import { createRng } from '../../src/core/rng.ts';
import { storedRange } from '../fixtures/routing.ts';

interface Fleet {
  readonly idx: KvIndex;
  readonly model: Map<bigint, bigint>[];
  readonly seqs: bigint[][];
}

/** Engine ids: a scheme unrelated to the router's hash (the hash xor a per-source constant). */
const eid = (s: number, h: bigint) => h ^ 0x9e3779b97f4a7c15n ^ BigInt(s);

function runFleet(sources: number, seed: number, steps: number, maxBlocks?: number): Fleet {
  const rand = createRng(seed);
  const SEQS = 60;
  const LEN = 24;
  const POPULAR = 4;
  // Sequence k copies a random prefix of an earlier one, then goes its own way: a tree of shared prefixes.
  const seqs: bigint[][] = [];
  for (let k = 0; k < SEQS; k++) {
    const share = k === 0 ? 0 : Math.floor(rand() * LEN);
    const from = seqs[Math.floor(rand() * k)];
    const seq: bigint[] = [];
    for (let b = 0; b < LEN; b++) {
      seq.push(b < share ? from[b] : BigInt.asUintN(64, BigInt(Math.floor(rand() * 2 ** 32)) * 4294967311n + BigInt(k * 1000 + b)));
    }
    seqs.push(seq);
  }
  const idx = new KvIndex({ blockSize: 16, maxBlocks });
  const model: Map<bigint, bigint>[] = [];
  for (let s = 0; s < sources; s++) {
    idx.addSource(s);
    model.push(new Map());
  }
  const store = (s: number, k: number, upTo: number) => {
    const held = model[s];
    const seq = seqs[k];
    let start = 0;
    while (start < upTo && held.has(eid(s, seq[start]))) start++;
    if (start >= upTo) return;
    const r = idx.apply(
      s,
      storedRange(seq, start, upTo, (h) => eid(s, h)),
    );
    // Blocks past `start` the source still holds (a removal left a hole) are re-announcements: counted duplicates.
    let already = 0;
    for (let b = start; b < upTo; b++) if (held.has(eid(s, seq[b]))) already++;
    if (maxBlocks === undefined) expect([r.applied, r.rejected]).toEqual([upTo - start - already, already]);
    for (let b = start; b < upTo; b++) held.set(eid(s, seq[b]), seq[b]);
  };
  for (let step = 0; step < steps; step++) {
    const roll = rand();
    const s = Math.floor(rand() * sources);
    if (roll < 0.55) {
      // Half the stores go to a few popular sequences: their prefixes end up on hundreds of sources.
      const k = rand() < 0.5 ? Math.floor(rand() * POPULAR) : Math.floor(rand() * SEQS);
      store(s, k, 1 + Math.floor(rand() * LEN));
    } else if (roll < 0.85) {
      const held = model[s];
      if (held.size === 0) continue;
      const ids = [...held.keys()];
      const id = ids[Math.floor(rand() * ids.length)];
      const r = idx.apply(s, { kind: 'removed', engineIds: [id] });
      // Under a cap the block may have been pruned since (its mapping is stale): counted, not applied.
      if (maxBlocks === undefined) expect(r.applied).toBe(1);
      held.delete(id);
    } else if (roll < 0.9) {
      // An eviction wave: a popular block leaves a random half of the sources holding it (sets shrink in place).
      const h = seqs[Math.floor(rand() * POPULAR)][Math.floor(rand() * LEN)];
      for (let t = 0; t < sources; t++) {
        if (rand() < 0.5 && model[t].has(eid(t, h))) {
          idx.apply(t, { kind: 'removed', engineIds: [eid(t, h)] });
          model[t].delete(eid(t, h));
        }
      }
    } else if (roll < 0.97) {
      idx.apply(s, { kind: 'cleared' });
      model[s].clear();
    } else {
      idx.removeSource(s);
      idx.addSource(s);
      model[s].clear();
    }
  }
  return { idx, model, seqs };
}

/** Leading blocks of `seq` whose hashes the source holds. */
function modelDepth(values: Set<bigint>, seq: readonly bigint[]): number {
  let d = 0;
  while (d < seq.length && values.has(seq[d])) d++;
  return d;
}

function expectMatchesModel({ idx, model, seqs }: Fleet): void {
  const values = model.map((m) => new Set(m.values()));
  let pairs = 0;
  values.forEach((v, s) => {
    pairs += v.size;
    expect(idx.cachedBlocks(s), `cachedBlocks(${s})`).toBe(v.size);
  });
  expect(idx.stats().pairs).toBe(pairs);
  for (const seq of seqs) {
    const m = idx.findMatches(BigUint64Array.from(seq));
    for (let s = 0; s < model.length; s++) {
      const want = modelDepth(values[s], seq);
      if (m[s] !== want) expect(m[s], `source ${s}`).toBe(want);
    }
  }
}

describe('KvIndex against the model at fleet scale', () => {
  for (const [sources, steps] of [
    [64, 4000],
    [1024, 6000],
    [4096, 8000],
  ] as const) {
    it(`${sources} sources: findMatches, cachedBlocks and pairs equal the model; holder sets overflowed and came back`, () => {
      fc.assert(
        fc.property(fc.integer({ min: 1, max: 2 ** 30 }), (seed) => {
          const fleet = runFleet(sources, seed, steps);
          expectMatchesModel(fleet);
          // The popular prefixes really did exercise the pool: more than four holders (a list) and more than the
          // bitset width in holders (a bitset) on some blocks; the first block's bitset starts the dense walk.
          const maxHolders = Math.max(...fleet.seqs[0].map((h) => fleet.model.filter((m, s) => m.has(eid(s, h))).length));
          expect(maxHolders).toBeGreaterThan(Math.max(INLINE_MAX, sources / 32));
          expect(fleet.idx.stats().overflowBlocks).toBeGreaterThan(0);
        }),
        { numRuns: sources === 4096 ? 2 : 4 },
      );
    });
  }

  it('dual key at 1,024 sources: every engine id still names its router hash', () => {
    const fleet = runFleet(1024, 11, 4000);
    for (let s = 0; s < 1024; s += 7) {
      for (const [id, h] of fleet.model[s]) expect(fleet.idx.seqHashOfEngineId(s, id)).toBe(h);
    }
  });

  it('with a cap at 1,024 sources: only real matches, within the cap, per-source counts consistent', () => {
    const fleet = runFleet(1024, 5, 4000, 400);
    const { idx, model, seqs } = fleet;
    expect(idx.stats().blocks).toBeLessThanOrEqual(400);
    expect(idx.stats().pruned).toBeGreaterThan(0);
    const values = model.map((m) => new Set(m.values()));
    for (const seq of seqs) {
      const m = idx.findMatches(BigUint64Array.from(seq));
      for (let s = 0; s < 1024; s++) for (let b = 0; b < m[s]; b++) expect(values[s].has(seq[b])).toBe(true);
    }
    for (let s = 0; s < 1024; s += 3) expect(idx.cachedBlocks(s)).toBe(idx.blocksOf(s).size);
  });

  it('a fleet that grows past a bitset width widens the bitsets that need the new bit', () => {
    const idx = new KvIndex({ blockSize: 4 });
    const tokens = [1, 2, 3, 4, 5, 6, 7, 8];
    const stored = (s: number) =>
      idx.apply(s, { kind: 'stored', parent: null, engineIds: [BigInt(s + 1)], tokens: tokens.slice(0, 4), blockSize: 4 });
    // 200 holders among 256 sources: a bitset of 8 words; then a source numbered 1,000 joins it.
    for (let s = 0; s < 256; s++) idx.addSource(s);
    for (let s = 0; s < 200; s++) expect(stored(s).applied).toBe(1);
    idx.addSource(1000);
    expect(stored(1000).applied).toBe(1);
    const m = idx.findMatches(new BigUint64Array([...idx.blocksOf(1000)]));
    expect(m[1000]).toBe(1);
    expect(m[199]).toBe(1);
    expect(m[200]).toBe(0);
    expect(idx.stats().overflowBlocks).toBe(1);
  });
});

describe('KvIndex walk across holder forms', () => {
  // Blocks 0 and 1 of one prefix held by chosen sources (a hole: block 1 held by sources that lost block 0).
  const fleetWith = (holders0: number[], holders1: number[]) => {
    const idx = new KvIndex({ blockSize: 4 });
    for (let s = 0; s < 1024; s++) idx.addSource(s);
    const seq = new BigUint64Array([0x1234_5678_9abc_def0n, 0x0fed_cba9_8765_4321n]);
    for (const s of holders0)
      idx.apply(s, {
        kind: 'stored',
        parent: null,
        engineIds: [BigInt(s) * 2n],
        tokens: null,
        blockSize: 4,
        seqHashes: seq.subarray(0, 1),
      });
    for (const s of holders1) {
      const ev = holders0.includes(s)
        ? { parent: BigInt(s) * 2n, seqHashes: seq.subarray(1, 2) }
        : { parent: null, seqHashes: seq.subarray(1, 2) };
      idx.apply(s, { kind: 'stored', engineIds: [BigInt(s) * 2n + 1n], tokens: null, blockSize: 4, ...ev });
    }
    return { idx, seq };
  };
  const range = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => a + i);

  it('a list block then a bitset block (the alive list tested against bits)', () => {
    const { idx, seq } = fleetWith(range(1, 7), range(2, 42));
    const m = idx.findMatches(seq);
    expect(m[1]).toBe(1);
    for (const s of range(2, 7)) expect(m[s]).toBe(2);
    expect(m[7]).toBe(0);
    expect(idx.stats().overflowBlocks).toBe(2);
  });

  it('a bitset block then an inline block (the dense walk hands over to the alive list)', () => {
    const { idx, seq } = fleetWith(range(0, 100), [5, 50, 99, 500]);
    const m = idx.findMatches(seq);
    expect([m[5], m[50], m[99], m[500], m[0], m[98]]).toEqual([2, 2, 2, 0, 1, 1]);
  });

  it('bitset blocks all the way (the dense walk to the end)', () => {
    const { idx, seq } = fleetWith(range(0, 100), range(40, 140));
    const m = idx.findMatches(seq);
    expect([m[39], m[40], m[99], m[100], m[139]]).toEqual([1, 2, 2, 0, 0]);
  });
});

describe('HolderSets', () => {
  it('behaves like a Set through inline, list and bitset forms (and a growing fleet)', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 2 ** 30 }), fc.constantFrom(64, 1024, 4096), (seed, fleet) => {
        const rand = createRng(seed);
        const sets = new HolderSets();
        sets.fleet(fleet - 1);
        // Eight blocks' holder words in one array, as in the index's records.
        const cells = new Int32Array(16);
        const model = Array.from({ length: 8 }, () => new Set<number>());
        let largest = fleet - 1;
        const out = new Int32Array(32767);
        for (let step = 0; step < 3000; step++) {
          const b = Math.floor(rand() * 8);
          // Skewed towards a few hundred sources so sets get large; now and then a source beyond the fleet.
          let s = Math.floor(rand() * Math.min(largest + 1, 600));
          if (rand() < 0.01) {
            largest = Math.min(32766, largest + 1 + Math.floor(rand() * 500));
            sets.fleet(largest);
            s = largest;
          }
          const adding = rand() < (model[b].size > 300 ? 0.3 : 0.6);
          if (adding) expect(sets.add(cells, 2 * b, s)).toBe(!model[b].has(s));
          else expect(sets.remove(cells, 2 * b, s)).toBe(model[b].has(s));
          if (adding) model[b].add(s);
          else model[b].delete(s);
          expect(sets.count(cells, 2 * b)).toBe(model[b].size);
          expect(sets.has(cells, 2 * b, s)).toBe(model[b].has(s));
        }
        for (let b = 0; b < 8; b++) {
          const n = sets.collect(cells, 2 * b, out);
          expect([...out.subarray(0, n)].sort((x, y) => x - y)).toEqual([...model[b]].sort((x, y) => x - y));
          if (model[b].size === 0) expect([cells[2 * b], cells[2 * b + 1]]).toEqual([0, 0]);
          sets.clear(cells, 2 * b);
        }
        expect(sets.overflowBlocks).toBe(0);
      }),
      { numRuns: 12 },
    );
  });
});
