/**
 * The index's typed-array internals at a scale the small model test never reaches: table growth, backward-shift
 * deletion under collisions, Robin Hood placement, slot reuse through the free list. Fleets of hundreds and
 * thousands of sources: test/core/index-fleet.test.ts.
 */
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { KvIndex } from '../../src/core/index/kv-index.ts';
import { U64Map } from '../../src/core/index/u64-map.ts';

/** Small deterministic PRNG (mulberry32) so failures replay. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe('U64Map', () => {
  it('behaves like a Map under inserts, overwrites and deletes through several growths (first-come and Robin Hood)', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 2 ** 31 }), fc.boolean(), fc.boolean(), (seed, sequential, robinHood) => {
        const rand = rng(seed);
        const map = new U64Map(4, true, { robinHood });
        const model = new Map<string, [number, number]>();
        const keys: Array<[number, number]> = [];
        for (let step = 0; step < 4000; step++) {
          const roll = rand();
          if (roll < 0.1 && keys.length > 0) {
            // insert() leaves a present key alone and reports its value.
            const [lo, hi] = keys[(rand() * keys.length) | 0];
            const expected = model.get(`${lo}:${hi}`);
            expect(map.insert(lo, hi, 7, 7)).toBe(expected ? expected[0] : -1);
            if (!expected) model.set(`${lo}:${hi}`, [7, 7]);
          } else if (roll < 0.6 || keys.length === 0) {
            // Sequential small ids (like engine block counters) cluster without mixing: cover both kinds.
            const key: [number, number] = sequential ? [step, 0] : [(rand() * 2 ** 32) >>> 0, (rand() * 64) >>> 0];
            const value = (rand() * 1e6) | 0;
            map.set(key[0], key[1], value, step);
            model.set(`${key[0]}:${key[1]}`, [value, step]);
            keys.push(key);
          } else {
            const [lo, hi] = keys[(rand() * keys.length) | 0];
            const expected = model.get(`${lo}:${hi}`);
            expect(map.delete(lo, hi)).toBe(expected ? expected[0] : -1);
            model.delete(`${lo}:${hi}`);
          }
        }
        expect(map.size).toBe(model.size);
        for (const [lo, hi] of keys) {
          const expected = model.get(`${lo}:${hi}`);
          const pos = map.find(lo, hi);
          if (!expected) expect(pos).toBe(-1);
          else expect([map.valueAt(pos), map.auxAt(pos)]).toEqual(expected);
        }
        let seen = 0;
        map.forEach((lo, hi, value) => {
          seen++;
          expect(model.get(`${lo}:${hi}`)?.[0]).toBe(value);
        });
        expect(seen).toBe(model.size);
        // A clone is a copy: changing one leaves the other alone.
        const copy = map.clone();
        for (const [lo, hi] of keys) map.delete(lo, hi);
        expect(map.size).toBe(0);
        expect(copy.size).toBe(model.size);
        for (const [k, [value]] of model) expect(copy.get(...(k.split(':').map(Number) as [number, number]))).toBe(value);
      }),
      { numRuns: 20 },
    );
  });

  it('keeps Robin Hood runs ordered by home through growth and deletions (what its early-stopping search relies on)', () => {
    const rand = rng(9);
    const map = new U64Map(16, 2, { robinHood: true });
    const live: Array<[number, number]> = [];
    for (let step = 0; step < 50_000; step++) {
      if (live.length < 2000 || rand() < 0.5) {
        const key: [number, number] = [(rand() * 4096) | 0, 0]; // few distinct keys: many re-inserts and collisions
        map.set(key[0], key[1], step);
        live.push(key);
      } else {
        const j = (rand() * live.length) | 0;
        map.delete(live[j][0], live[j][1]);
        live[j] = live[live.length - 1];
        live.pop();
      }
    }
    const cap = map.capacity;
    const dist = (p: number) => {
      const h = map.home(map.cells[p * 5], map.cells[p * 5 + 1]);
      return p >= h ? p - h : p + cap - h;
    };
    // Along a run, each next entry is at most one further from its home than the one before (sorted by home).
    for (let p = 0; p < cap; p++) {
      const q = (p + 1) % cap;
      if (map.cells[p * 5 + 2] !== 0 && map.cells[q * 5 + 2] !== 0) expect(dist(q)).toBeLessThanOrEqual(dist(p) + 1);
    }
  });
});

/**
 * Random workload on sequences sharing prefixes; the model keeps, per source, engine id -> seq hash, and the overlap
 * of a sequence on a source is its leading blocks whose hashes the source holds.
 */
function runWorkload(sources: number, seed: number, maxBlocks?: number): void {
  const rand = rng(seed);
  const SEQS = 120;
  const LEN = 40;
  // Sequence k copies a random prefix of an earlier one, then goes its own way: a tree of shared prefixes.
  const hashes: bigint[][] = [];
  for (let k = 0; k < SEQS; k++) {
    const share = k === 0 ? 0 : (rand() * LEN) | 0;
    const from = hashes[(rand() * k) | 0];
    const seq: bigint[] = [];
    for (let b = 0; b < LEN; b++) {
      seq.push(b < share ? from[b] : BigInt.asUintN(64, BigInt((rand() * 2 ** 32) >>> 0) * 4294967311n + BigInt(k * 1000 + b)));
    }
    hashes.push(seq);
  }
  // Engine ids: a different scheme (the hash xor a per-source constant).
  const eid = (s: number, h: bigint) => h ^ BigInt(0x9e3779b97f4a7c15n) ^ BigInt(s);
  const idx = new KvIndex({ blockSize: 16, maxBlocks });
  const model: Map<bigint, bigint>[] = [];
  for (let s = 0; s < sources; s++) {
    idx.addSource(s);
    model.push(new Map());
  }
  for (let step = 0; step < 3000; step++) {
    const s = (rand() * sources) | 0;
    const held = model[s];
    const roll = rand();
    if (roll < 0.55) {
      const k = (rand() * SEQS) | 0;
      const seq = hashes[k];
      let start = 0;
      while (start < LEN && held.has(eid(s, seq[start]))) start++;
      if (start === LEN) continue;
      const end = Math.min(LEN, start + 1 + ((rand() * 12) | 0));
      const r = idx.apply(s, {
        kind: 'stored',
        parent: start === 0 ? null : eid(s, seq[start - 1]),
        engineIds: seq.slice(start, end).map((h) => eid(s, h)),
        tokens: null,
        blockSize: 16,
        seqHashes: BigUint64Array.from(seq.slice(start, end)),
      });
      if (maxBlocks === undefined) expect(r.applied + r.rejected).toBe(end - start);
      for (let b = start; b < end; b++) held.set(eid(s, seq[b]), seq[b]);
    } else if (roll < 0.97) {
      if (held.size === 0) continue;
      const ids = [...held.keys()];
      const id = ids[(rand() * ids.length) | 0];
      idx.apply(s, { kind: 'removed', engineIds: [id] });
      held.delete(id);
    } else {
      idx.apply(s, { kind: 'cleared' });
      held.clear();
    }
  }
  if (maxBlocks !== undefined) {
    // With a cap the model is an upper bound: every match the index reports is real and within the cap.
    expect(idx.stats().blocks).toBeLessThanOrEqual(maxBlocks);
    for (const seq of hashes) {
      const m = idx.findMatches(BigUint64Array.from(seq));
      for (let s = 0; s < sources; s++) {
        const values = new Set(model[s].values());
        for (let b = 0; b < m[s]; b++) expect(values.has(seq[b])).toBe(true);
      }
    }
    for (let s = 0; s < sources; s++) expect(idx.cachedBlocks(s)).toBe(idx.blocksOf(s).size);
    return;
  }
  let pairs = 0;
  for (let s = 0; s < sources; s++) {
    const values = new Set(model[s].values());
    pairs += values.size;
    expect(idx.cachedBlocks(s)).toBe(values.size);
  }
  expect(idx.stats().pairs).toBe(pairs);
  for (const seq of hashes) {
    const m = idx.findMatches(BigUint64Array.from(seq));
    for (let s = 0; s < sources; s++) {
      const values = new Set(model[s].values());
      let depth = 0;
      while (depth < LEN && values.has(seq[depth])) depth++;
      expect(m[s], `source ${s}`).toBe(depth);
    }
  }
}

describe('KvIndex at scale', () => {
  it('matches the model at 10 sources (holders inline)', () => runWorkload(10, 1));
  it('matches the model at 64 sources', () => runWorkload(64, 2));
  it('matches the model at 70 sources (a third bitset word)', () => runWorkload(70, 3));
  it('only reports real matches under a cap, and keeps per-source counts consistent', () => runWorkload(16, 4, 300));
});
