import { describe, expect, it } from 'vitest';
import { computeSeqHashes } from '../../src/core/hashing.ts';
import { runFleet, type FleetResult } from '../../src/sim/run-fleet.ts';
import { expandTokens } from '../../src/sim/traces/expand.ts';
import type { TraceRequest } from '../../src/sim/traces/format.ts';
import { generateMultiTurn, generateSharedPrefix } from '../../src/sim/traces/generate.ts';

/** Everything except wall-clock time. */
function stable(r: FleetResult) {
  const { sim, ...rest } = r;
  return { ...rest, steps: sim.engine_steps, simulated: sim.simulated_s };
}

describe('fleet simulator', () => {
  const trace = generateMultiTurn({ requests: 150, seed: 5, rate: 6 });

  it('is deterministic for a seed', () => {
    const opts = { workers: 3, policy: 'kv', blockSize: 16, gpuBlocks: 1500, seed: 9, keepRequests: true } as const;
    const a = runFleet(trace, opts);
    const b = runFleet(trace, opts);
    expect(stable(a)).toEqual(stable(b));
    // The small cache must actually evict for this to mean something.
    expect(a.blocks_evicted).toBeGreaterThan(0);
    expect(a.requests.finished).toBe(150);
    expect(a.ttft_ms.p50).toBeGreaterThan(0);
    const c = runFleet(trace, { ...opts, policy: 'random', seed: 10 });
    expect(stable(c).perRequest!.map((r) => r.worker)).not.toEqual(a.perRequest!.map((r) => r.worker));
  });

  it('engine-delivered hits equal a brute-force recomputation from the routing decisions', () => {
    // Requests far apart (everything finishes before the next arrives) and caches that never evict: a request's
    // cached tokens are then its longest prefix of full blocks seen in earlier prompts on the same worker, never
    // counting the last prompt token (vLLM).
    const spaced: TraceRequest[] = generateMultiTurn({ requests: 120, seed: 11 }).map((r, i) => ({ ...r, timestamp: i * 100_000 }));
    const bs = 16;
    const res = runFleet(spaced, { workers: 3, policy: 'kv', blockSize: bs, gpuBlocks: 200_000, keepRequests: true, seed: 1 });
    expect(res.requests.finished).toBe(spaced.length);
    const seen = [new Set<bigint>(), new Set<bigint>(), new Set<bigint>()];
    let sumCached = 0;
    let sumPrompt = 0;
    for (const rec of res.perRequest!) {
      const req = spaced[rec.index];
      const seq = computeSeqHashes(expandTokens(req), bs);
      let k = 0;
      while (k < seq.length && seen[rec.worker].has(seq[k])) k++;
      const expected = Math.min(k, Math.floor((req.inputLength - 1) / bs)) * bs;
      expect(rec.cachedTokens).toBe(expected);
      // With every event applied before the next arrival, the router's prediction is exact too.
      expect(rec.overlapBlocks).toBe(k);
      for (const h of seq) seen[rec.worker].add(h);
      sumCached += expected;
      sumPrompt += req.inputLength;
    }
    expect(sumCached).toBeGreaterThan(0);
    expect(res.hit.engine_token_weighted).toBeCloseTo(sumCached / sumPrompt, 12);
  });

  it('round-robin on a trace without shared prefixes gives zero hits', () => {
    let id = 0;
    const cold: TraceRequest[] = Array.from({ length: 80 }, (_, i) => {
      const len = 300 + ((i * 397) % 3000);
      return { timestamp: i * 50, inputLength: len, outputLength: 20, hashIds: Array.from({ length: Math.ceil(len / 512) }, () => id++) };
    });
    const r = runFleet(cold, { workers: 4, policy: 'round-robin', blockSize: 16, gpuBlocks: 4096 });
    expect(r.requests.finished).toBe(80);
    expect(r.hit.predicted_block_weighted).toBe(0);
    expect(r.hit.predicted_request_weighted).toBe(0);
    expect(r.hit.available_block_weighted).toBe(0);
    expect(r.hit.engine_token_weighted).toBe(0);
    // Round-robin spreads requests evenly: 80 requests on 4 workers, 20 each.
    expect(r.per_worker.map((w) => w.requests)).toEqual([20, 20, 20, 20]);
    expect(r.imbalance).toBeLessThan(1.3);
  });

  it('kv routing finds shared prefixes that round-robin scatters, and its prediction matches the engines', () => {
    const gsp = generateSharedPrefix({ groups: 12, promptsPerGroup: 10, systemPromptLen: 2048, questionLen: 128, outputLen: 32, rate: 20 });
    const base = { workers: 4, blockSize: 16, gpuBlocks: 8192, seed: 3 } as const;
    const kv = runFleet(gsp, { ...base, policy: 'kv' });
    const rr = runFleet(gsp, { ...base, policy: 'round-robin' });
    expect(kv.hit.engine_token_weighted).toBeGreaterThan(rr.hit.engine_token_weighted + 0.1);
    expect(kv.hit.predicted_block_weighted).toBeGreaterThan(0.7);
    expect(Math.abs(kv.hit.predicted_block_weighted - kv.hit.engine_token_weighted)).toBeLessThan(0.05);
    expect(kv.events.rejected).toBe(0);
  });

  it('rate scale compresses arrivals', () => {
    const small = trace.slice(0, 60).map((r, i) => ({ ...r, timestamp: i * 2000 }));
    const a = runFleet(small, { workers: 2, policy: 'kv', blockSize: 16, gpuBlocks: 4096, rateScale: 1 });
    const b = runFleet(small, { workers: 2, policy: 'kv', blockSize: 16, gpuBlocks: 4096, rateScale: 4 });
    expect(a.sim.simulated_s).toBeGreaterThan(118);
    expect(b.sim.simulated_s).toBeLessThan(a.sim.simulated_s / 2);
    expect(b.throughput_tokens_per_s).toBeGreaterThan(a.throughput_tokens_per_s * 2);
  });
});

describe('fleet simulator: admission through the core dispatcher', () => {
  const burst = generateMultiTurn({ requests: 200, seed: 3, rate: 60 });

  it('queues under busy thresholds, refuses past the queue limit or timeout, and accounts for every request', () => {
    const r = runFleet(burst, {
      workers: 2,
      policy: 'kv-pressure',
      blockSize: 16,
      gpuBlocks: 4000,
      seed: 2,
      rateScale: 8,
      router: { busy: { activePrefillTokens: 2000 } },
      dispatch: { queueLimit: 10, queueTimeoutMs: 300 },
    });
    const q = r.requests;
    expect(q.queued).toBeGreaterThan(0);
    expect(q.refused).toBeGreaterThan(0);
    expect((r.refusals.queue_full ?? 0) + (r.refusals.queue_timeout ?? 0)).toBe(q.refused);
    expect(q.served + q.refused).toBe(200); // nothing lost
    expect(r.queue_wait_ms.p99).toBeLessThanOrEqual(300);
    expect(r.queue_wait_ms.p50).toBeGreaterThan(0);
  });

  it('retries injected engine failures elsewhere; a single worker with retries 0 refuses them as upstream_failed', () => {
    const base = { policy: 'kv', blockSize: 16, gpuBlocks: 4000, seed: 4, engineFailures: 0.2 } as const;
    const many = runFleet(burst, { ...base, workers: 4, dispatch: { retries: 3, breaker: { threshold: 1000, cooldownMs: 1 } } });
    expect(many.requests.retried).toBeGreaterThan(20);
    expect(many.requests.served + many.requests.refused).toBe(200);
    const one = runFleet(burst, { ...base, workers: 1, dispatch: { retries: 0, breaker: { threshold: 1000, cooldownMs: 1 } } });
    expect(one.refusals.upstream_failed).toBeGreaterThan(20);
    expect(one.requests.served + one.requests.refused).toBe(200);
    expect(one.requests.retried).toBe(0);
  });

  it('breakers open on a failing fleet: requests are refused no_healthy_workers while they cool down', () => {
    const r = runFleet(burst, {
      workers: 2,
      policy: 'kv',
      blockSize: 16,
      gpuBlocks: 4000,
      seed: 5,
      engineFailures: 0.9,
      dispatch: { retries: 1, breaker: { threshold: 2, cooldownMs: 500 } },
    });
    expect(r.refusals.no_healthy_workers).toBeGreaterThan(0);
    expect(r.requests.served + r.requests.refused).toBe(200);
  });
});

describe('fleet simulator: tenants and fairness', () => {
  it("max-min fair shares by water-filling, and Jain's index", async () => {
    const { maxMinShares, jainIndex } = await import('../../src/sim/run-fleet.ts');
    const shares = maxMinShares(
      new Map([
        ['a', 10],
        ['b', 100],
        ['c', 100],
      ]),
      () => 1,
      90,
    );
    expect(Object.fromEntries(shares)).toEqual({ a: 10, b: 40, c: 40 });
    const weighted = maxMinShares(
      new Map([
        ['a', 100],
        ['b', 100],
      ]),
      (t) => (t === 'a' ? 3 : 1),
      80,
    );
    expect(Object.fromEntries(weighted)).toEqual({ a: 60, b: 20 });
    expect(jainIndex([1, 1, 1])).toBe(1);
    expect(jainIndex([1, 0, 0])).toBeCloseTo(1 / 3, 10);
    expect(jainIndex([1])).toBeNaN();
  });

  it('noisy neighbour: fair queuing keeps the steady tenants responsive where FIFO makes everyone wait', async () => {
    const { generateNoisyNeighbour } = await import('../../src/sim/traces/generate.ts');
    const trace = generateNoisyNeighbour({ requests: 1200, seed: 2, rate: 2.4 });
    expect(new Set(trace.map((r) => r.tenant))).toEqual(new Set(['tenant-0', 'tenant-1', 'tenant-2', 'noisy']));
    expect(trace.every((r) => r.sessionId?.startsWith(`${r.tenant}/`))).toBe(true);
    const run = (order: 'fair' | 'fifo') =>
      runFleet(trace, {
        workers: 1,
        policy: 'kv-pressure',
        blockSize: 16,
        gpuBlocks: 65_536,
        seed: 1,
        router: { busy: { activePrefillTokens: 2048 } },
        dispatch: { queueLimit: 100_000, queueTimeoutMs: 600_000, flow: { order } },
      });
    const fair = run('fair');
    const fifo = run('fifo');
    const steadyP90 = (r: FleetResult) => Math.max(...r.by_tenant.filter((t) => t.name !== 'noisy').map((t) => t.p90));
    expect(fifo.requests.queued).toBeGreaterThan(50);
    expect(steadyP90(fair) * 3).toBeLessThan(steadyP90(fifo));
    expect(fair.fairness.jain).toBeGreaterThan(fifo.fairness.jain);
    expect(fair.requests.served).toBe(trace.length);
  });
});
