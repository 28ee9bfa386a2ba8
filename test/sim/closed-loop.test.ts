/** The simulator's closed loop (Dynamo replay's --replay-concurrency): timestamps ignored, C requests in flight. */
import { describe, expect, it } from 'vitest';
import { runFleet } from '../../src/sim/run-fleet.ts';
import { generateMultiTurn } from '../../src/sim/traces/generate.ts';

// Sparse arrivals (one request every ~10 s): an open-loop replay rarely has more than one in flight.
const trace = generateMultiTurn({ requests: 90, seed: 5, rate: 0.1 });
const base = { workers: 2, policy: 'kv', blockSize: 16, gpuBlocks: 20_000, seed: 1, keepRequests: true } as const;

/** Most requests in flight at once, from the per-request records (arrival to finish). */
function peakInFlight(recs: readonly { arrivalMs: number; finishMs: number }[]): number {
  const edges = recs.flatMap((r) => [
    [r.arrivalMs, 1],
    [r.finishMs, -1],
  ]);
  // A finish and a release at the same instant: count the finish first.
  edges.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let cur = 0;
  let peak = 0;
  for (const [, d] of edges) {
    cur += d;
    peak = Math.max(peak, cur);
  }
  return peak;
}

describe('closed-loop replay', () => {
  it('keeps exactly C requests in flight, in trace order, and serves them all', () => {
    const open = runFleet(trace, base);
    const closed = runFleet(trace, { ...base, concurrency: 4 });
    expect(closed.requests.served).toBe(90);
    expect(peakInFlight(open.perRequest!)).toBeLessThan(4);
    expect(peakInFlight(closed.perRequest!)).toBe(4);
    // Released in trace order: arrivals never go backwards.
    const arrivals = [...closed.perRequest!].sort((a, b) => a.index - b.index).map((r) => r.arrivalMs);
    for (let i = 1; i < arrivals.length; i++) expect(arrivals[i]).toBeGreaterThanOrEqual(arrivals[i - 1]);
    expect(arrivals.slice(0, 4)).toEqual([0, 0, 0, 0]);
    // Without the trace's gaps the run is far shorter.
    expect(closed.sim.simulated_s).toBeLessThan(open.sim.simulated_s / 5);
    expect(runFleet(trace, { ...base, concurrency: 4 }).ttft_ms).toEqual(closed.ttft_ms);
  }, 120_000);

  it('at C = 1 each request starts when the previous one finishes', () => {
    const r = runFleet(trace, { ...base, concurrency: 1 });
    const recs = [...r.perRequest!].sort((a, b) => a.index - b.index);
    for (let i = 1; i < recs.length; i++) expect(recs[i].arrivalMs).toBe(recs[i - 1].finishMs);
  });

  it('a refused request frees its slot too, and a bad concurrency is refused', () => {
    // A queue of 0 and a busy threshold of 1 token: whatever cannot start at once is refused, and the loop goes on.
    const r = runFleet(trace, {
      ...base,
      concurrency: 6,
      router: { busy: { activePrefillTokens: 1 } },
      dispatch: { queueLimit: 0 },
    });
    expect(r.requests.refused).toBeGreaterThan(0);
    expect(r.requests.served + r.requests.refused).toBe(90);
    expect(() => runFleet(trace, { ...base, concurrency: 0 })).toThrow(/concurrency must be a positive integer, got 0/);
  });
});
