/**
 * Selection over a large fleet: sampled selection (the warm sources plus the least loaded) against the exhaustive scan,
 * on the same cache and load. The pick's cost and the reuse available must be the same: the sampled path may pick a
 * different source only among equals.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { KvRouter } from '../../src/core/router.ts';
import { createRng } from '../../src/core/rng.ts';
import { storedEvent, toks } from '../fixtures/routing.ts';

const BS = 4;

function fleet(selection: 'sampled' | 'exhaustive', sources: number, policy: string) {
  const r = new KvRouter({ blockSize: BS, seed: 7, policy, selection, overlay: false });
  for (let s = 0; s < sources; s++) r.addSource({ workerId: `w${s}`, dpRank: 0 }, { mode: 'events', capacityBlocks: 10_000 });
  return r;
}

describe('sampled selection', () => {
  for (const policy of ['kv', 'kv-pressure', 'least-loaded']) {
    it(`${policy}: at 1,024 sources the pick costs what the exhaustive pick costs, with the same available reuse`, () => {
      fc.assert(
        fc.property(fc.integer({ min: 0, max: 2 ** 31 }), (seed) => {
          const rng = createRng(seed);
          const a = fleet('sampled', 1024, policy);
          const b = fleet('exhaustive', 1024, policy);
          const families = Array.from({ length: 12 }, (_, f) => toks(64, 10_000 * (f + 1)));
          // Cache: each family's prefix on a few sources; load: long-running requests on random sources.
          let id = 1n;
          for (let f = 0; f < families.length; f++) {
            for (let k = 0; k < 3; k++) {
              const src = `w${Math.floor(rng() * 1024)}`;
              const blocks = 1 + Math.floor(rng() * 15);
              for (const r of [a, b]) r.applyEvents(src, [storedEvent(families[f], blocks, id, BS)]);
              id += 100n;
            }
          }
          for (let i = 0; i < 300; i++) {
            const src = `w${Math.floor(rng() * 1024)}`;
            const tokens = toks(8 + Math.floor(rng() * 200), 900_000 + 1000 * i);
            for (const r of [a, b]) {
              r.trackRemote(
                { requestId: `load${i}`, sourceKey: src, seqHashes: r.hashRequest(tokens), promptTokens: tokens.length, overlapBlocks: 0 },
                0,
              );
            }
          }
          for (let q = 0; q < 20; q++) {
            const fam = families[Math.floor(rng() * families.length)];
            const tokens = [...fam.slice(0, 4 * (1 + Math.floor(rng() * 16))), ...toks(12, 5_000_000 + q * 100)];
            const da = a.route({ requestId: `q${q}`, tokens }, 1);
            const db = b.route({ requestId: `q${q}`, tokens }, 1);
            if (da.kind !== 'routed' || db.kind !== 'routed') throw new Error('refused');
            expect(da.bestOverlapBlocks).toBe(db.bestOverlapBlocks);
            expect(da.candidates[0].cost).toBe(db.candidates[0].cost);
            expect(da.candidates.length).toBeLessThan(200); // it did not scan the fleet
            expect(db.candidates.length).toBe(1024);
            a.finish(`q${q}`, {}, 2);
            b.finish(`q${q}`, {}, 2);
          }
        }),
        { numRuns: 15 },
      );
    });
  }

  it('falls back to the whole fleet when no least-loaded source passes the filters, and keeps the small-fleet scan', () => {
    const r = fleet('sampled', 600, 'kv');
    // Only a subset far down the load order is allowed: the sampled pass finds no cold candidate and rescans.
    for (let s = 0; s < 599; s++)
      r.trackRemote(
        { requestId: `l${s}`, sourceKey: `w${s}`, seqHashes: r.hashRequest(toks(8, s * 10)), promptTokens: 8, overlapBlocks: 0 },
        0,
      );
    const allow = new Set(['w599', 'w598']);
    const d = r.route({ requestId: 'x', tokens: toks(16), allow }, 1);
    expect(d.kind === 'routed' && d.sourceKey).toBe('w599');
    const small = new KvRouter({ blockSize: BS, seed: 1, policy: 'kv' }); // auto: 20 sources are scanned whole
    for (let s = 0; s < 20; s++) small.addSource({ workerId: `s${s}`, dpRank: 0 });
    const ds = small.route({ requestId: 'y', tokens: toks(16) }, 0);
    expect(ds.kind === 'routed' && ds.candidates.length).toBe(20);
  });

  it('round-robin, random and prefix-hash always see every source', () => {
    for (const policy of ['round-robin', 'random', 'prefix-hash']) {
      const r = fleet('sampled', 400, policy);
      const d = r.route({ requestId: 'z', tokens: toks(16) }, 0);
      expect(d.kind === 'routed' && d.candidates.length).toBe(400);
    }
  });
});
