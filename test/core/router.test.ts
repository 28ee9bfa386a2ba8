import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { KvRouter } from '../../src/core/router.ts';
import { computeSeqHashes, hashSeed } from '../../src/core/hashing.ts';
import { ActiveLoad } from '../../src/core/active-load.ts';
import { TtlIndex } from '../../src/core/approx.ts';
import { ReuseLedger, predictedCachedTokens } from '../../src/core/ledger.ts';
import { sampleSoftmax } from '../../src/core/scheduling/pickers.ts';
import { kvCost } from '../../src/core/scheduling/scorers.ts';
import { createRng } from '../../src/core/rng.ts';
import type { KvEvent } from '../../src/core/types.ts';
import { routed, storedEvent, toks } from '../fixtures/routing.ts';

const BS = 4;
const stored = (tokens: number[], blocks: number, base: bigint): KvEvent => storedEvent(tokens, blocks, base, BS);

function fleet(n: number, opts: Partial<ConstructorParameters<typeof KvRouter>[0]> = {}) {
  const r = new KvRouter({ blockSize: BS, overlay: false, ...opts });
  for (let i = 0; i < n; i++) r.addSource({ workerId: `w${i}`, dpRank: 0 });
  return r;
}

describe('kv policy cost (docs/protocols.md §5)', () => {
  it('computes prefill and decode blocks exactly', () => {
    const ctx = {
      candidates: [
        {
          source: 0,
          key: 'a',
          overlapBlocks: 3,
          cachedBlocks: 0,
          activePrefillTokens: 8,
          activeBlocks: 5,
          activePrefixBlocks: 1,
          activeRequests: 1,
        },
      ],
      promptTokens: 22,
      requestBlocks: 6,
      blockSize: 4,
      seqHashes: new BigUint64Array(5),
      knobs: { prefillLoadScale: 2, overlapCredit: 1, temperature: 0 },
      rng: createRng(1),
    };
    // prefill = max(8/4 + 6 - 3, 0) = 5; decode = 5 + (6 - 1) = 10; cost = 2*5 + 10
    expect(kvCost(ctx, 0)).toBe(20);
    // overlap credit larger than the load floors prefill at 0
    expect(kvCost({ ...ctx, knobs: { ...ctx.knobs, overlapCredit: 10 } }, 0)).toBe(10);
  });

  it('routes to the source holding the prefix, and the decision reports chosen, best and isl blocks', () => {
    const r = fleet(3);
    const t = toks(22);
    r.applyEvents('w1', [stored(t, 4, 100n)]);
    const d = routed(r.route({ requestId: 'a', tokens: t }, 0));
    expect(d.sourceKey).toBe('w1');
    expect(d.overlapBlocks).toBe(4);
    expect(d.bestOverlapBlocks).toBe(4);
    expect(d.islBlocks).toBe(6);
    expect(d.promptTokens).toBe(22);
    expect(d.candidates[0].source).toBe('w1');
    expect(d.candidates[0].cost).toBeLessThan(d.candidates[1].cost);
  });

  it('trades overlap for load: a loaded cache-warm worker loses to an idle cold one', () => {
    const r = fleet(2);
    const shared = toks(16);
    r.applyEvents('w0', [stored(shared, 1, 1n)]);
    // Pile active prefill on w0 with requests pinned there.
    for (let i = 0; i < 5; i++) r.route({ requestId: `load${i}`, tokens: toks(64, 1000 * (i + 1)), allow: new Set(['w0']) }, 0);
    const d = routed(r.route({ requestId: 'x', tokens: shared }, 0));
    expect(d.sourceKey).toBe('w1');
    expect(d.bestOverlapBlocks).toBe(1);
    expect(d.overlapBlocks).toBe(0);
  });

  it('ties go to the source with fewer cached blocks', () => {
    const r = fleet(2);
    r.applyEvents('w0', [stored(toks(40, 500), 10, 1n)]);
    for (let i = 0; i < 5; i++) {
      const d = routed(r.route({ requestId: `q${i}`, tokens: toks(8, 9000 + i * 100) }, 0));
      expect(d.sourceKey).toBe('w1');
      r.finish(`q${i}`, {}, 1);
    }
  });

  it('temperature samples the softmax of min-max normalised costs', () => {
    const rng = createRng(7);
    const counts = [0, 0, 0];
    for (let i = 0; i < 20000; i++) counts[sampleSoftmax([0, 5, 10], 1, rng)]++;
    // p ∝ exp(0), exp(-0.5), exp(-1)
    const z = 1 + Math.exp(-0.5) + Math.exp(-1);
    expect(counts[0] / 20000).toBeCloseTo(1 / z, 1);
    expect(counts[2] / 20000).toBeCloseTo(Math.exp(-1) / z, 1);
    const uniform = [0, 0];
    for (let i = 0; i < 10000; i++) uniform[sampleSoftmax([3, 3], 0.5, rng)]++;
    expect(Math.abs(uniform[0] - uniform[1])).toBeLessThan(600);
  });

  it('per-request knob and policy overrides apply to that request only', () => {
    const r = fleet(2);
    const t = toks(16);
    r.applyEvents('w0', [stored(t, 4, 1n)]);
    for (let i = 0; i < 3; i++) r.route({ requestId: `l${i}`, tokens: toks(40, 7000 + 100 * i), allow: new Set(['w0']) }, 0);
    // Default credit prefers the warm but loaded w0? With credit 0 the overlap is worthless: w1 wins.
    expect(routed(r.route({ requestId: 'c0', tokens: t, knobs: { overlapCredit: 0 } }, 0)).sourceKey).toBe('w1');
    expect(routed(r.route({ requestId: 'rr', tokens: t, policy: 'least-loaded' }, 0)).policy).toBe('least-loaded');
  });
});

describe('policies', () => {
  it('round-robin cycles over sources in order', () => {
    const r = fleet(3, { policy: 'round-robin' });
    const got = Array.from({ length: 6 }, (_, i) => routed(r.route({ requestId: `r${i}`, tokens: toks(8) }, 0)).sourceKey);
    expect(got).toEqual(['w0', 'w1', 'w2', 'w0', 'w1', 'w2']);
  });

  it('least-loaded spreads requests evenly', () => {
    const r = fleet(4, { policy: 'least-loaded' });
    const counts = new Map<string, number>();
    for (let i = 0; i < 40; i++) {
      const k = routed(r.route({ requestId: `r${i}`, tokens: toks(16, i * 100) }, 0)).sourceKey;
      counts.set(k, (counts.get(k) ?? 0) + 1);
    }
    expect([...counts.values()]).toEqual([10, 10, 10, 10]);
  });

  it('prefix-hash keeps a prefix on one home until it is overloaded', () => {
    const r = fleet(4, { policy: 'prefix-hash' });
    const prefix = toks(16, 42);
    const homes = new Set<string>();
    for (let i = 0; i < 3; i++) {
      const d = routed(r.route({ requestId: `p${i}`, tokens: [...prefix, ...toks(8, 900 + i * 10)] }, 0));
      homes.add(d.sourceKey);
      r.finish(`p${i}`, {}, 0);
    }
    expect(homes.size).toBe(1);
    // Overload the home: later requests with the same prefix spill to others.
    const home = [...homes][0];
    for (let i = 0; i < 8; i++) r.route({ requestId: `h${i}`, tokens: toks(200, 5000 * (i + 1)), allow: new Set([home]) }, 0);
    const spill = routed(r.route({ requestId: 'spill', tokens: [...prefix, 1, 2, 3] }, 0));
    expect(spill.sourceKey).not.toBe(home);
  });

  it('random is deterministic for a seed and covers all sources', () => {
    const run = (seed: number) => {
      const r = fleet(4, { policy: 'random', seed });
      return Array.from({ length: 40 }, (_, i) => routed(r.route({ requestId: `r${i}`, tokens: toks(8) }, 0)).sourceKey);
    };
    expect(run(3)).toEqual(run(3));
    expect(new Set(run(3)).size).toBe(4);
    expect(run(3)).not.toEqual(run(4));
  });

  it('the kv policy replays identically for a seed (property)', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.nat(5), fc.integer({ min: 1, max: 60 })), { maxLength: 40 }), fc.nat(), (reqs, seed) => {
        const run = () => {
          const r = fleet(4, { seed, knobs: { temperature: 0.5 }, overlay: true });
          return reqs.map(([p, len], i) => routed(r.route({ requestId: `r${i}`, tokens: toks(len, p * 1000) }, i)).sourceKey);
        };
        expect(run()).toEqual(run());
      }),
      { numRuns: 50 },
    );
  });

  it('unknown policy names fail loudly', () => {
    expect(() => new KvRouter({ blockSize: 4, policy: 'nope' })).toThrow(/unknown policy "nope"/);
    const r = fleet(1);
    expect(() => r.route({ requestId: 'x', tokens: toks(4), policy: 'nope' }, 0)).toThrow(/unknown policy/);
  });
});

describe('active load', () => {
  it('counts shared prefixes once, drops prefill on first token, frees on finish', () => {
    const a = new ActiveLoad();
    const h = computeSeqHashes(toks(12), BS); // 3 full blocks
    const h2 = computeSeqHashes([...toks(8), 77, 78, 79, 80], BS); // shares 2 blocks
    a.add({ requestId: 'a', source: 0, seqHashes: h, requestBlocks: 4, prefillTokens: 14, startedAt: 0 });
    a.add({ requestId: 'b', source: 0, seqHashes: h2, requestBlocks: 3, prefillTokens: 4, startedAt: 0 });
    expect(a.activeBlocks(0)).toBe(3 + 1 + 1 + 0); // 4 distinct hashes + a's partial block
    expect(a.prefillTokens(0)).toBe(18);
    expect(a.activePrefix(0, h2)).toBe(3);
    a.firstToken('a', 5);
    a.firstToken('a', 6); // idempotent
    expect(a.prefillTokens(0)).toBe(4);
    a.free('a');
    expect(a.activeBlocks(0)).toBe(3);
    expect(a.free('a')).toBeUndefined();
    a.free('b');
    expect(a.activeBlocks(0)).toBe(0);
    expect(a.prefillTokens(0)).toBe(0);
  });

  it('a withdrawn or cleared recent chain credits what is left and leaves the first-block index when nothing is', () => {
    const a = new ActiveLoad({ graceMs: 100, recentPerSource: 2 });
    const h = computeSeqHashes(toks(40), BS); // 10 blocks
    const view = new Uint32Array(h.buffer, h.byteOffset, h.length * 2);
    const finished = (id: string, source: number, now: number) => {
      a.add({ requestId: id, source, seqHashes: h, requestBlocks: 10, prefillTokens: 0, startedAt: now });
      a.free(id, now);
    };
    finished('x', 0, 0);
    const [chain] = a.recentOn(0, 1);
    a.withdrawRecent(chain, 12); // more than it credits: no change
    expect(a.predictedPrefix(0, h, 1)).toBe(10);
    a.withdrawRecent(chain, 4);
    expect(a.predictedPrefix(0, h, 1)).toBe(4);
    a.withdrawRecent(chain, 6); // never raised again
    expect(a.predictedPrefix(0, h, 1)).toBe(4);
    a.withdrawRecent(chain, 0);
    expect(a.predictedPrefix(0, h, 1)).toBe(0);
    expect(a.recentOn(0, 1)).toEqual([]);
    // Still listed by its first block (a false positive the index allows) until replaced or expired.
    expect([...a.sourcesSharingFirstBlock(view, 10)]).toEqual([0]);
    // The ring replaces the withdrawn entry; counts stay balanced (the sweep below empties the index).
    finished('y', 0, 2);
    finished('z', 0, 3);
    expect(a.predictedPrefix(0, h, 4)).toBe(10);
    finished('w', 1, 3);
    a.clearRecent(0);
    expect(a.predictedPrefix(0, h, 4)).toBe(0);
    expect(a.recentOn(0, 4)).toEqual([]);
    expect(a.predictedPrefix(1, h, 4)).toBe(10);
    expect([...a.sourcesSharingFirstBlock(view, 10)]).toEqual([1]);
    a.sweep(1_000, 300_000);
    expect([...a.sourcesSharingFirstBlock(view, 10)]).toEqual([]);
  });

  it('the router returns load to zero through finish, cancel and the stale sweep', () => {
    const r = fleet(2);
    routed(r.route({ requestId: 'a', tokens: toks(30) }, 0));
    routed(r.route({ requestId: 'b', tokens: toks(30, 99) }, 0));
    routed(r.route({ requestId: 'c', tokens: toks(30, 199) }, 0));
    r.firstToken('a', 10);
    expect(r.finish('a', { cachedTokens: 0 }, 20)?.outcome).toBe('ok');
    expect(r.finish('b', { outcome: 'cancelled' }, 20)?.outcome).toBe('cancelled');
    expect(r.finish('b', {}, 21)).toBeUndefined();
    expect(r.sweep(200_000)).toEqual([]);
    expect(r.sweep(300_001)).toEqual(['c']);
    for (const s of r.state().sources) {
      expect(s.activeBlocks).toBe(0);
      expect(s.activePrefillTokens).toBe(0);
      expect(s.activeRequests).toBe(0);
    }
    expect(r.state().inFlight).toBe(0);
  });

  it('busy thresholds exclude sources and refuse when all are busy', () => {
    const r = new KvRouter({ blockSize: BS, busy: { activePrefillTokens: 50 } });
    r.addSource({ workerId: 'w0', dpRank: 0 });
    r.addSource({ workerId: 'w1', dpRank: 0 });
    routed(r.route({ requestId: 'a', tokens: toks(60) }, 0));
    routed(r.route({ requestId: 'b', tokens: toks(60, 500) }, 0));
    const refusal = r.route({ requestId: 'c', tokens: toks(8, 900) }, 0);
    expect(refusal).toMatchObject({ kind: 'refused', reason: 'all_busy', busySources: ['w0', 'w1'] });
    r.firstToken('a', 1);
    expect(routed(r.route({ requestId: 'c', tokens: toks(8, 900) }, 1)).sourceKey).toBeDefined();
    expect(r.route({ requestId: 'c', tokens: toks(8) }, 1)).toMatchObject({ kind: 'refused', reason: 'duplicate_request' });
    expect(new KvRouter({ blockSize: BS }).route({ requestId: 'z', tokens: toks(8) }, 0)).toMatchObject({ reason: 'no_sources' });
  });
});

describe('overlay and approximate mode', () => {
  it('the overlay credits a sibling burst before any Stored event arrives, then expires', () => {
    const r = new KvRouter({ blockSize: BS, overlayGraceMs: 1000 });
    for (let i = 0; i < 4; i++) r.addSource({ workerId: `w${i}`, dpRank: 0 });
    // Other workers busy with unrelated work, so the prefix credit decides.
    for (let i = 1; i < 4; i++) r.route({ requestId: `bg${i}`, tokens: toks(200, 10_000 * i), allow: new Set([`w${i}`]) }, 0);
    const prefix = toks(64, 3);
    const first = routed(r.route({ requestId: 's0', tokens: [...prefix, 1] }, 0));
    expect(first.sourceKey).toBe('w0');
    const second = routed(r.route({ requestId: 's1', tokens: [...prefix, 2] }, 10));
    expect(second.sourceKey).toBe('w0');
    expect(second.overlapBlocks).toBe(16);
    r.finish('s0', {}, 20);
    r.finish('s1', {}, 20);
    r.sweep(2000);
    const later = routed(r.route({ requestId: 's2', tokens: [...prefix, 3] }, 2000));
    expect(later.bestOverlapBlocks).toBe(0);
  });

  describe("withdraws what the engine's own events removed", () => {
    // One router, two idle sources, a finished request's chain in the overlay's grace period (default 2 s).
    const prefix = toks(64, 5); // 16 full blocks
    const ids = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => 500n + BigInt(from + i));
    const removedTail = (from: number): KvEvent => ({ kind: 'removed', engineIds: ids(from, 16).reverse() });
    function afterTurn(opts: { stored: boolean }) {
      const r = new KvRouter({ blockSize: BS });
      r.addSource({ workerId: 'a', dpRank: 0 });
      r.addSource({ workerId: 'b', dpRank: 0 });
      const first = routed(r.route({ requestId: 't1', tokens: [...prefix, 1], allow: new Set(['a']) }, 0));
      expect(first.sourceKey).toBe('a');
      if (opts.stored) r.applyEvents('a', [stored(prefix, 16, 500n)], 5);
      r.finish('t1', {}, 10);
      return r;
    }
    // The next turn prefers 'a' (session affinity) and reports what is credited there.
    const next = (r: KvRouter, now: number) =>
      routed(r.route({ requestId: `t${now}`, tokens: [...prefix, 2], prefer: { sourceKey: 'a', loadFactor: 1 } }, now));

    it('A stores then removes the prefix: the next request on A is credited nothing', () => {
      const r = afterTurn({ stored: true });
      expect(next(r, 20).overlapBlocks).toBe(16);
      r.finish('t20', {}, 25);
      // The engine evicts the chain, tail first (vLLM frees a request's blocks in reverse order).
      r.applyEvents('a', [removedTail(0)], 30);
      const d = next(r, 40);
      expect(d.sourceKey).toBe('a');
      expect(d.overlapBlocks).toBe(0);
      expect(d.bestOverlapBlocks).toBe(0);
      // The ledger predicts what the engine can deliver: t1 cold, t20 16 of 17 blocks, t40 none.
      expect(r.ledger.view().predicted.blockWeighted).toBeCloseTo((0 + 16 + 0) / (17 * 3), 9);
    });

    it('a removed tail withdraws that block and every block after it, and the held head stays credited', () => {
      const r = afterTurn({ stored: true });
      r.applyEvents('a', [removedTail(10)], 30);
      expect(next(r, 40).overlapBlocks).toBe(10);
    });

    it('a chain whose last Stored events are still on their way loses the removed part of what the index held', () => {
      const r = afterTurn({ stored: false });
      r.applyEvents('a', [stored(prefix, 12, 500n)], 15); // blocks 12-15 not announced yet
      expect(next(r, 20).overlapBlocks).toBe(16);
      r.finish('t20', {}, 25);
      r.applyEvents('a', [{ kind: 'removed', engineIds: ids(8, 12).reverse() }], 30);
      expect(next(r, 40).overlapBlocks).toBe(8);
    });

    it('keeps crediting what the engine has not announced yet (the overlay itself), and a block removed then stored again', () => {
      const r = afterTurn({ stored: false });
      // An unrelated eviction on A: the chain's Stored events are still on their way, its credit stays.
      r.applyEvents('a', [stored(toks(8, 9000), 2, 900n), { kind: 'removed', engineIds: [901n, 900n] }], 15);
      expect(next(r, 20).overlapBlocks).toBe(16);
      r.finish('t20', {}, 25);
      // Stored, then in one batch its last block evicted and stored again (another request recomputed it).
      r.applyEvents('a', [stored(prefix, 16, 500n)], 30);
      r.applyEvents('a', [{ kind: 'removed', engineIds: [515n] }, { ...stored(prefix, 16, 500n) }], 31);
      expect(next(r, 40).overlapBlocks).toBe(16);
    });

    it('a cleared cache or a reset source withdraws all of its recent chains', () => {
      const cleared = afterTurn({ stored: false });
      cleared.applyEvents('a', [{ kind: 'cleared' }], 15);
      expect(next(cleared, 20).overlapBlocks).toBe(0);
      const reset = afterTurn({ stored: false });
      reset.resetSource('a');
      expect(next(reset, 20).overlapBlocks).toBe(0);
      // The grace itself is untouched: without any event the finished chain is still credited.
      expect(next(afterTurn({ stored: false }), 20).overlapBlocks).toBe(16);
    });
  });

  it('approximate sources remember routing decisions for their TTL and capacity', () => {
    const idx = new TtlIndex({ ttlMs: 100, capacityPerSource: 4 });
    const h = computeSeqHashes(toks(20), BS); // 5 blocks
    const other = computeSeqHashes(toks(20, 7000), BS);
    idx.record(0, h.subarray(0, 3), 0);
    idx.record(1, h, 0);
    expect(idx.prefix(0, h, 50)).toBe(3);
    expect(idx.prefix(1, h, 50)).toBe(5);
    expect(idx.prefix(1, other, 50)).toBe(0);
    // Capacity: recording a newer chain on source 0 evicts the older one whole, never leaving a hole at block 0.
    idx.record(0, other, 10);
    expect(idx.prefix(0, h, 50)).toBe(0);
    expect(idx.prefix(0, other, 50)).toBe(5);
    expect(idx.blocks(0)).toBe(5);
    // TTL
    expect(idx.prefix(1, h, 100)).toBe(0);
    idx.sweep(200);
    expect(idx.size).toBe(0);
    idx.record(2, h, 300);
    idx.removeSource(2);
    expect(idx.prefix(2, h, 301)).toBe(0);
  });

  it('a router with approx sources learns affinity from its own decisions', () => {
    const r = new KvRouter({ blockSize: BS, overlay: false });
    for (let i = 0; i < 3; i++) r.addSource({ workerId: `w${i}`, dpRank: 0 }, { mode: 'approx' });
    const t = toks(40, 11);
    const a = routed(r.route({ requestId: 'a', tokens: t }, 0));
    r.finish('a', {}, 10);
    const b = routed(r.route({ requestId: 'b', tokens: t }, 20));
    expect(b.sourceKey).toBe(a.sourceKey);
    expect(b.overlapBlocks).toBe(10);
  });

  it('LoRA and cache_salt isolate requests', () => {
    const r = fleet(2);
    const t = toks(16);
    r.applyEvents('w0', [{ ...stored(t, 4, 1n), loraName: 'sql' } as KvEvent]);
    expect(routed(r.route({ requestId: 'a', tokens: t }, 0)).bestOverlapBlocks).toBe(0);
    expect(routed(r.route({ requestId: 'b', tokens: t, loraName: 'sql' }, 0)).overlapBlocks).toBe(4);
    expect(routed(r.route({ requestId: 'c', tokens: t, loraName: 'sql', cacheSalt: 't1' }, 0)).bestOverlapBlocks).toBe(0);
    expect(r.hashRequest(t, 'sql')[0]).toBe(computeSeqHashes(t, BS, hashSeed('sql'))[0]);
  });
});

describe('sources', () => {
  it('remove-source and remove-worker drop blocks and in-flight load; data-parallel ranks are separate sources', () => {
    const r = new KvRouter({ blockSize: BS });
    r.addSource({ workerId: 'w', dpRank: 0 });
    r.addSource({ workerId: 'w', dpRank: 1 });
    r.addSource({ workerId: 'v', dpRank: 0 });
    const t = toks(16);
    r.applyEvents('w#1', [stored(t, 4, 1n)]);
    expect(routed(r.route({ requestId: 'a', tokens: t }, 0)).sourceKey).toBe('w#1');
    expect(r.removeWorker('w')).toBe(2);
    expect(r.sourceKeys()).toEqual(['v']);
    expect(r.finish('a', {}, 1)).toBeUndefined();
    expect(r.applyEvents('w#1', [stored(t, 4, 1n)])).toMatchObject({ reason: 'unknown_source' });
    // A re-added source is cold.
    r.addSource({ workerId: 'w', dpRank: 1 });
    expect(r.state().sources.find((s) => s.source === 'w#1')?.cachedBlocks).toBe(0);
  });

  it('resetSource clears what an engine holds (restart)', () => {
    const r = fleet(1);
    r.applyEvents('w0', [stored(toks(16), 4, 1n)]);
    expect(r.resetSource('w0')).toBe(true);
    expect(r.state().sources[0].cachedBlocks).toBe(0);
    expect(r.resetSource('nope')).toBe(false);
  });
});

describe('reuse ledger', () => {
  it('keeps request- and block-weighted views apart (1 block at 0, 100 blocks at 99)', () => {
    const l = new ReuseLedger();
    l.routed('a', 1, 0, 0);
    l.routed('b', 100, 99, 100);
    const v = l.view();
    expect(v.predicted.requestWeighted).toBeCloseTo(0.495, 10);
    expect(v.predicted.blockWeighted).toBeCloseTo(99 / 101, 10);
    expect(v.available.blockWeighted).toBeCloseTo(100 / 101, 10);
    expect(l.view('a').predicted.blockWeighted).toBe(0);
    expect(Number.isNaN(v.delivered.tokenWeighted)).toBe(true);
    // An empty prompt has no ratio and changes neither view.
    l.routed('a', 0, 0, 0);
    expect(l.view().requests).toBe(2);
    expect(l.view().predicted.requestWeighted).toBeCloseTo(0.495, 10);
  });

  it('delivered reuse covers only requests with an engine report, beside the prediction for the same requests', () => {
    const r = fleet(1);
    const t = toks(33);
    r.applyEvents('w0', [stored(t, 8, 1n)]);
    routed(r.route({ requestId: 'a', tokens: t }, 0));
    routed(r.route({ requestId: 'b', tokens: t.slice(0, 9) }, 0));
    const fa = r.finish('a', { cachedTokens: 28 }, 1)!;
    expect(fa.predictedCachedTokens).toBe(32);
    r.finish('b', {}, 1);
    const v = r.ledger.view();
    expect(v.delivered.requests).toBe(1);
    expect(v.delivered.tokenWeighted).toBeCloseTo(28 / 33, 10);
    expect(v.delivered.predictedTokenWeighted).toBeCloseTo(32 / 33, 10);
    expect(v.requests).toBe(2);
  });

  it("a 'retried' attempt is taken back out of the ledger, so a request counts once, where it was served", () => {
    const r = fleet(2);
    const t = toks(40);
    const first = routed(r.route({ requestId: 'a', tokens: t }, 0));
    r.finish('a', { outcome: 'retried' }, 1);
    expect(r.ledger.view().requests).toBe(0);
    expect(r.ledger.total.islBlocks).toBe(0);
    routed(r.route({ requestId: 'a', tokens: t, exclude: new Set([first.sourceKey]) }, 2));
    r.finish('a', { cachedTokens: 0 }, 3);
    expect(r.ledger.view().requests).toBe(1);
    expect(r.ledger.total.islBlocks).toBe(10);
    expect(r.ledger.view().delivered.requests).toBe(1);
  });

  it('predicted cached tokens never include the last prompt token', () => {
    expect(predictedCachedTokens(4, 16, 4)).toBe(12);
    expect(predictedCachedTokens(4, 17, 4)).toBe(16);
    expect(predictedCachedTokens(0, 17, 4)).toBe(0);
    expect(predictedCachedTokens(3, 0, 4)).toBe(0);
  });

  it('ratio of sums = mean of ratios + Cov(n, h) / mean(n) (property)', () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.integer({ min: 1, max: 500 }), fc.double({ min: 0, max: 1, noNaN: true })), { minLength: 1, maxLength: 50 }),
        (rows) => {
          const l = new ReuseLedger();
          const ns = rows.map(([n]) => n);
          const hs = rows.map(([n, f]) => Math.floor(f * n) / n);
          rows.forEach(([n], i) => {
            l.routed('w', n, Math.round(hs[i] * n), 0);
          });
          const v = l.view();
          const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
          const mn = mean(ns);
          const mh = mean(hs);
          const cov = mean(ns.map((n, i) => (n - mn) * (hs[i] - mh)));
          expect(v.predicted.blockWeighted).toBeCloseTo(v.predicted.requestWeighted + cov / mn, 9);
        },
      ),
    );
  });
});

describe('scale-out hook', () => {
  it('remote requests count in active load and the overlay but not in the ledger', () => {
    const r = fleet(2, { overlay: true });
    const t = toks(40, 5);
    const seq = r.hashRequest(t);
    expect(r.trackRemote({ requestId: 'peer/1', sourceKey: 'w1', seqHashes: seq, promptTokens: 40, overlapBlocks: 0 }, 0)).toBe(true);
    expect(r.trackRemote({ requestId: 'peer/1', sourceKey: 'w1', seqHashes: seq, promptTokens: 40, overlapBlocks: 0 }, 0)).toBe(false);
    expect(r.trackRemote({ requestId: 'peer/2', sourceKey: 'nope', seqHashes: seq, promptTokens: 40, overlapBlocks: 0 }, 0)).toBe(false);
    expect(r.state().sources[1]).toMatchObject({ activeRequests: 1, activeBlocks: 10, activePrefillTokens: 40 });
    // A sibling is credited the remote request's prefix.
    const d = routed(r.route({ requestId: 'local', tokens: [...t, 1, 2, 3] }, 1));
    expect(d.candidates.find((c) => c.source === 'w1')?.overlapBlocks).toBe(10);
    r.finish('peer/1', { cachedTokens: 0 }, 2);
    expect(r.ledger.view().requests).toBe(1);
    expect(r.ledger.view().delivered.requests).toBe(0);
  });
});

describe('offload tiers', () => {
  it('learns tier blocks from GPU announcements and credits them only when tier credit is on', () => {
    const r = fleet(2);
    const t = toks(32, 9); // 8 blocks
    // w0: blocks 0-1 on GPU, blocks 2-5 offloaded to host after the GPU copy is evicted; w1: blocks 0-2 on GPU.
    r.applyEvents('w0', [stored(t, 6, 100n)]);
    expect(
      r.applyEvents('w0', [
        { kind: 'stored', parent: null, engineIds: [102n, 103n, 104n, 105n], tokens: null, blockSize: BS, medium: 'CPU' },
      ]),
    ).toEqual({ applied: 4, rejected: 0 });
    r.applyEvents('w0', [{ kind: 'removed', engineIds: [102n, 103n, 104n, 105n] }]);
    r.applyEvents('w1', [stored(t, 3, 200n)]);
    expect(r.tiers.blocks(0)).toBe(4);
    // An unknown tier block (never announced on GPU) is counted, not invented.
    expect(
      r.applyEvents('w0', [{ kind: 'stored', parent: null, engineIds: [999n], tokens: null, blockSize: BS, medium: 'DISK' }]),
    ).toMatchObject({ rejected: 1, reason: 'unknown_block' });

    const off = routed(r.route({ requestId: 'off', tokens: t }, 0));
    expect(off.sourceKey).toBe('w1'); // 3 GPU blocks beat 2
    r.finish('off', {}, 0);
    const on = routed(r.route({ requestId: 'on', tokens: t, knobs: { hostTierCredit: 0.75, diskTierCredit: 0.25 } }, 0));
    expect(on.sourceKey).toBe('w0'); // 2 + 0.75 * 4 = 5 credited blocks beat 3
    expect(on.overlapBlocks).toBe(2); // the GPU overlap is still what is reported as predicted reuse
    r.finish('on', {}, 0);

    r.applyEvents('w0', [{ kind: 'removed', engineIds: [104n, 105n], medium: 'CPU' }]);
    expect(r.tiers.blocks(0)).toBe(2);
    r.resetSource('w0');
    expect(r.tiers.blocks(0)).toBe(0);
  });
});

describe('lifecycle observers', () => {
  it('hear routed, the first token once, and finished, in order; removal stops them', () => {
    const r = fleet(2);
    const heard: string[] = [];
    const stop = r.observe({
      routed: (d) => heard.push(`routed ${d.requestId} ${d.sourceKey}`),
      firstToken: (id) => heard.push(`first ${id}`),
      finished: (f) => heard.push(`finished ${f.requestId} ${f.outcome}`),
    });
    const d = routed(r.route({ requestId: 'a', tokens: toks(20) }, 0));
    r.firstToken('a', 1);
    r.firstToken('a', 2);
    r.finish('a', { cachedTokens: 0 }, 3);
    r.finish('a', {}, 4); // unknown by now: nothing to hear
    expect(r.route({ requestId: 'b', tokens: toks(4), allow: new Set(['none']) }, 5).kind).toBe('refused');
    expect(heard).toEqual([`routed a ${d.sourceKey}`, 'first a', 'finished a ok']);
    stop();
    routed(r.route({ requestId: 'c', tokens: toks(20) }, 6));
    expect(heard.length).toBe(3);
  });
});
