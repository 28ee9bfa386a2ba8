import { describe, expect, it } from 'vitest';
import { createRng } from '../../src/core/rng.ts';
import { KvPolicy, KvPressurePolicy } from '../../src/core/scheduling/policies.ts';
import type { Candidate, PolicyContext } from '../../src/core/scheduling/policy.ts';
import { KvRouter } from '../../src/core/router.ts';
import { runFleet } from '../../src/sim/run-fleet.ts';
import { generateSharedPrefix } from '../../src/sim/traces/generate.ts';
import { cand } from '../fixtures/routing.ts';

function ctx(candidates: Candidate[], requestBlocks: number): PolicyContext {
  return {
    candidates,
    promptTokens: requestBlocks * 16,
    requestBlocks,
    blockSize: 16,
    seqHashes: new BigUint64Array(0),
    knobs: { prefillLoadScale: 1, overlapCredit: 1, temperature: 0 },
    rng: createRng(1),
  };
}

describe('kv-pressure (the default policy)', () => {
  // Next turn of a conversation: 100 blocks, 90 cached on w0, which is still decoding a 300-block context; w1 idle.
  const warmBusy = cand(0, { overlapBlocks: 90, cachedBlocks: 5000, activeBlocks: 300, activeRequests: 3 });
  const coldIdle = cand(1, { cachedBlocks: 100 });

  it('keeps a warm worker whose only load is decode when memory is plentiful (plain kv sends the turn cold)', () => {
    expect(new KvPolicy().rank(ctx([warmBusy, coldIdle], 100)).order[0]).toBe(1);
    expect(new KvPressurePolicy().rank(ctx([warmBusy, coldIdle], 100)).order[0]).toBe(0);
  });

  it('falls back to the plain cost when the decode load fills memory, or when capacity is unknown', () => {
    // 400 of 420 blocks would be in use on w0: pressure ~1, the cost is Dynamo's.
    const tight = ctx(
      [
        { ...warmBusy, capacityBlocks: 420 },
        { ...coldIdle, capacityBlocks: 420 },
      ],
      100,
    );
    const r = new KvPressurePolicy().rank(tight);
    expect(r.costs[0]).toBeCloseTo(10 + (400 / 420) * 400);
    expect(r.order[0]).toBe(1);
    const unknown = ctx(
      [
        { ...warmBusy, capacityBlocks: undefined },
        { ...coldIdle, capacityBlocks: undefined },
      ],
      100,
    );
    expect(new KvPressurePolicy().rank(unknown).order[0]).toBe(new KvPolicy().rank(unknown).order[0]);
  });

  it('still balances prefill: queued prefill outweighs the overlap it would save', () => {
    const queued = cand(0, { overlapBlocks: 90, activePrefillTokens: 200 * 16 });
    expect(new KvPressurePolicy().rank(ctx([queued, coldIdle], 100)).order[0]).toBe(1);
  });

  it('treats a one-block overlap as a tie and lets an idle, empty worker warm up', () => {
    // w0 holds only the shared system-prompt block and is idle; w1 has never been used.
    const systemOnly = cand(0, { overlapBlocks: 1, cachedBlocks: 900 });
    const empty = cand(1, { cachedBlocks: 0 });
    expect(new KvPressurePolicy().rank(ctx([systemOnly, empty], 40)).order[0]).toBe(1);
    // Without the margin the one-block overlap wins.
    expect(new KvPressurePolicy(1 / 64, 0).rank(ctx([systemOnly, empty], 40)).order[0]).toBe(0);
    // Two blocks of overlap are real reuse.
    expect(new KvPressurePolicy().rank(ctx([cand(0, { overlapBlocks: 2, cachedBlocks: 900 }), empty], 40)).order[0]).toBe(0);
  });

  it('sends a sibling of an in-flight request to join it, not to an idle worker (tie broken by overlap)', () => {
    // The first request of a burst is in prefill on w0 (64 shared blocks + 1); its sibling's cost ties with idle w1.
    const r = new KvRouter({ blockSize: 16 });
    r.addSource({ workerId: 'w0', dpRank: 0 }, { mode: 'events', capacityBlocks: 10_000 });
    r.addSource({ workerId: 'w1', dpRank: 0 }, { mode: 'events', capacityBlocks: 10_000 });
    const prefix = Array.from({ length: 1024 }, (_, i) => i + 7);
    const first = r.route({ requestId: 'a', tokens: [...prefix, 1], allow: new Set(['w0']) }, 0);
    expect(first.kind).toBe('routed');
    for (let i = 0; i < 20; i++) {
      const d = r.route({ requestId: `s${i}`, tokens: [...prefix, 100 + i] }, 1);
      if (d.kind !== 'routed') throw new Error('refused');
      expect(d.sourceKey).toBe('w0');
      expect(d.overlapBlocks).toBe(64);
      r.finish(`s${i}`, {}, 1);
    }
  });

  it('runs in the simulator under its own name', () => {
    const gsp = generateSharedPrefix({ groups: 8, promptsPerGroup: 8, outputLen: 16, rate: 20 });
    const r = runFleet(gsp, { workers: 3, policy: 'kv-pressure', blockSize: 16, gpuBlocks: 8192 });
    expect(r.name).toBe('kv-pressure');
    expect(r.hit.predicted_block_weighted).toBeGreaterThan(0.6);
  });
});
