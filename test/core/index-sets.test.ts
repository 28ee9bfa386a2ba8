/**
 * Interned holder sets (src/core/index/set-table.ts) against a simple reference: random streams of stored, removed and
 * cleared events and removed / re-added sources, over chains that share prefixes, at 5 to 300 sources. After every
 * step the index's findMatches equals the reference's (leading blocks each source holds), overflowBlocks equals the
 * reference's count of blocks with more than four holders, and the index keeps exactly one set per distinct holder
 * set (interning is exact); emptied, the index keeps no set at all. Also the active-prefix / overlay LCP (searched
 * only where a chain can beat the best so far) against a brute-force LCP.
 */
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { ActiveLoad } from '../../src/core/active-load.ts';
import { KvIndex } from '../../src/core/index/kv-index.ts';
import { createRng } from '../../src/core/rng.ts';
import { storedRange } from '../fixtures/routing.ts';

const eid = (s: number, h: bigint) => h ^ 0x51ed_270b_2710_1f4dn ^ (BigInt(s) << 20n);

/** Chains that copy a random prefix of an earlier chain, then go their own way. */
function chains(rand: () => number, count: number, len: number): bigint[][] {
  const out: bigint[][] = [];
  for (let k = 0; k < count; k++) {
    const share = k === 0 ? 0 : Math.floor(rand() * len);
    const from = out[Math.floor(rand() * k)];
    out.push(
      Array.from({ length: len }, (_, b) =>
        b < share ? from[b] : BigInt.asUintN(64, BigInt(Math.floor(rand() * 2 ** 32)) * 0x1_0000_0001n + BigInt(k * 997 + b + 1)),
      ),
    );
  }
  return out;
}

function check(idx: KvIndex, model: Map<bigint, bigint>[], seqs: bigint[][], live: boolean[]): void {
  const holders = new Map<bigint, number[]>();
  model.forEach((held, s) => {
    if (!live[s]) return;
    for (const h of held.values()) {
      const list = holders.get(h);
      if (list) list.push(s);
      else holders.set(h, [s]);
    }
  });
  const distinct = new Set([...holders.values()].map((l) => l.sort((a, b) => a - b).join(',')));
  const st = idx.stats();
  expect(st.blocks).toBe(holders.size);
  expect(st.overflowBlocks).toBe([...holders.values()].filter((l) => l.length > 4).length);
  expect(st.holderSets).toBe(distinct.size);
  const valueSets = model.map((held) => new Set(held.values()));
  for (const seq of seqs) {
    const m = idx.findMatches(BigUint64Array.from(seq));
    valueSets.forEach((values, s) => {
      let k = 0;
      while (live[s] && k < seq.length && values.has(seq[k])) k++;
      expect(s < m.length ? m[s] : 0).toBe(k);
    });
  }
}

function run(sources: number, seed: number, steps: number): void {
  const rand = createRng(seed);
  const seqs = chains(rand, 12, 10);
  const idx = new KvIndex({ blockSize: 16 });
  const model: Map<bigint, bigint>[] = [];
  const live: boolean[] = [];
  for (let s = 0; s < sources; s++) {
    idx.addSource(s);
    model.push(new Map());
    live.push(true);
  }
  for (let step = 0; step < steps; step++) {
    const roll = rand();
    // A few sources take most events, so some blocks gather many holders (sets past four: pool lists, bitsets).
    const s = rand() < 0.3 ? Math.floor(rand() * Math.min(sources, 3)) : Math.floor(rand() * sources);
    const held = model[s];
    if (!live[s]) {
      idx.addSource(s);
      live[s] = true;
    } else if (roll < 0.6) {
      const seq = seqs[rand() < 0.5 ? 0 : Math.floor(rand() * seqs.length)];
      const upTo = 1 + Math.floor(rand() * seq.length);
      let start = 0;
      while (start < upTo && held.has(eid(s, seq[start]))) start++;
      if (start < upTo) {
        idx.apply(
          s,
          storedRange(seq, start, upTo, (h) => eid(s, h)),
        );
        for (let b = start; b < upTo; b++) held.set(eid(s, seq[b]), seq[b]);
      }
    } else if (roll < 0.9) {
      if (held.size === 0) continue;
      const ids = [...held.keys()];
      const id = ids[Math.floor(rand() * ids.length)];
      expect(idx.apply(s, { kind: 'removed', engineIds: [id] }).applied).toBe(1);
      held.delete(id);
    } else if (roll < 0.96) {
      idx.apply(s, { kind: 'cleared' });
      held.clear();
    } else {
      idx.removeSource(s);
      held.clear();
      live[s] = false;
    }
    if (step % 25 === 0) check(idx, model, seqs, live);
  }
  check(idx, model, seqs, live);
  for (let s = 0; s < sources; s++) if (live[s]) idx.apply(s, { kind: 'cleared' });
  const st = idx.stats();
  expect([st.blocks, st.pairs, st.holderSets, st.overflowBlocks]).toEqual([0, 0, 0, 0]);
}

describe('KvIndex interned holder sets', () => {
  it('equal the reference on random event streams (5 to 300 sources)', () => {
    fc.assert(
      fc.property(fc.integer({ min: 5, max: 300 }), fc.integer({ min: 1, max: 2 ** 30 }), (sources, seed) => run(sources, seed, 400)),
      { numRuns: 20 },
    );
  }, 120_000);

  it('blocks of one cached prefix share one set; a holder leaving part of it splits it in two', () => {
    const idx = new KvIndex({ blockSize: 16 });
    const seq = BigUint64Array.from(chains(createRng(3), 1, 50)[0]);
    for (let s = 0; s < 10; s++) {
      idx.addSource(s);
      idx.apply(s, {
        kind: 'stored',
        parent: null,
        engineIds: [...seq].map((h) => eid(s, h)),
        tokens: null,
        blockSize: 16,
        seqHashes: seq,
      });
    }
    expect(idx.stats()).toMatchObject({ blocks: 50, pairs: 500, holderSets: 1, overflowBlocks: 50 });
    idx.apply(7, { kind: 'removed', engineIds: [...seq.subarray(30)].map((h) => eid(7, h)) });
    expect(idx.stats()).toMatchObject({ blocks: 50, pairs: 480, holderSets: 2 });
    const m = idx.findMatches(seq);
    expect([m[0], m[7], m[9]]).toEqual([50, 30, 50]);
  });
});

describe('ActiveLoad prefixes', () => {
  it('activePrefix and predictedPrefix equal a brute-force LCP over in-flight and recent chains', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 2 ** 30 }), (seed) => {
        const rand = createRng(seed);
        const seqs = chains(rand, 30, 40).map((c) => BigUint64Array.from(c.slice(0, 1 + Math.floor(rand() * c.length))));
        const active = new ActiveLoad({ graceMs: 100, recentPerSource: 4 });
        const onSource: BigUint64Array[][] = [[], [], []];
        let now = 0;
        for (let r = 0; r < 40; r++) {
          const source = Math.floor(rand() * 3);
          const seqHashes = seqs[Math.floor(rand() * seqs.length)];
          active.add({ requestId: `r${r}`, source, seqHashes, requestBlocks: seqHashes.length, prefillTokens: 0, startedAt: now });
          if (rand() < 0.5) active.free(`r${Math.floor(rand() * r)}`, now);
          now += 10;
        }
        for (let r = 0; r < 40; r++) {
          const req = active.get(`r${r}`);
          if (req) onSource[req.source].push(req.seqHashes);
        }
        const lcp = (a: BigUint64Array, b: BigUint64Array) => {
          let k = 0;
          while (k < a.length && k < b.length && a[k] === b[k]) k++;
          return k;
        };
        for (const q of seqs) {
          for (let s = 0; s < 3; s++) {
            const inFlight = Math.max(0, ...onSource[s].map((c) => lcp(q, c)));
            expect(active.activePrefix(s, q)).toBe(inFlight);
            expect(active.predictedPrefix(s, q, now)).toBeGreaterThanOrEqual(inFlight);
            expect(active.predictedPrefix(s, q, now + 1_000)).toBe(inFlight);
          }
        }
      }),
      { numRuns: 50 },
    );
  });

  it('predictedPrefix equals a brute-force LCP over in-flight and unexpired recent chains, query after query', () => {
    // Chains remember the hash they were last compared at (their probe): queries that share a prefix, in any order and
    // repeated, must read the same answers as a fresh comparison.
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 2 ** 30 }), (seed) => {
        const rand = createRng(seed);
        const seqs = chains(rand, 30, 40).map((c) => BigUint64Array.from(c.slice(0, 1 + Math.floor(rand() * c.length))));
        const active = new ActiveLoad({ graceMs: 100, recentPerSource: 4 });
        const recent: { seq: BigUint64Array; expiresAt: number }[][] = [[], [], []];
        let now = 0;
        for (let r = 0; r < 40; r++) {
          const source = Math.floor(rand() * 3);
          const seqHashes = seqs[Math.floor(rand() * seqs.length)];
          active.add({ requestId: `r${r}`, source, seqHashes, requestBlocks: seqHashes.length, prefillTokens: 0, startedAt: now });
          if (rand() < 0.5) {
            const freed = active.free(`r${Math.floor(rand() * r)}`, now);
            if (freed) recent[freed.source] = [...recent[freed.source], { seq: freed.seqHashes, expiresAt: now + 100 }].slice(-4);
          }
          now += 10;
        }
        const lcp = (a: BigUint64Array, b: BigUint64Array) => {
          let k = 0;
          while (k < a.length && k < b.length && a[k] === b[k]) k++;
          return k;
        };
        const inFlight: BigUint64Array[][] = [[], [], []];
        for (let r = 0; r < 40; r++) {
          const req = active.get(`r${r}`);
          if (req) inFlight[req.source].push(req.seqHashes);
        }
        for (let round = 0; round < 3; round++) {
          for (let k = 0; k < seqs.length; k++) {
            const q = seqs[Math.floor(rand() * seqs.length)];
            const s = Math.floor(rand() * 3);
            const live = recent[s].filter((c) => c.expiresAt > now).map((c) => c.seq);
            const expected = Math.max(0, ...[...inFlight[s], ...live].map((c) => lcp(q, c)));
            expect(active.predictedPrefix(s, q, now)).toBe(expected);
            expect(active.activePrefix(s, q)).toBe(Math.max(0, ...inFlight[s].map((c) => lcp(q, c))));
          }
        }
      }),
      { numRuns: 50 },
    );
  });
});
