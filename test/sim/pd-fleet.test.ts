/** The simulator in P/D mode: the same dispatcher's paths, the transfer cost, ITL and goodput, deterministic. */
import { describe, expect, it } from 'vitest';
import { type FleetOptions, runFleet } from '../../src/sim/run-fleet.ts';
import { generateMultiTurn } from '../../src/sim/traces/generate.ts';

const trace = generateMultiTurn({ requests: 120, seed: 3, rate: 4 });
const base: FleetOptions = { workers: 2, policy: 'kv-pressure', blockSize: 16, gpuBlocks: 20_000, seed: 1 };

describe('sim with prefill and decode workers', () => {
  it('disaggregates every request at N = 0, moves the KV, and replays exactly', () => {
    const opts: FleetOptions = { ...base, prefillWorkers: 1, decodeWorkers: 1, dispatch: { pd: { minUncachedTokens: 0 } } };
    const a = runFleet(trace, opts);
    expect(a.requests.served).toBe(120);
    expect(a.pd?.paths.disaggregated).toBe(120);
    expect(a.pd?.transferred_tokens).toBe(trace.reduce((s, r) => s + r.inputLength, 0));
    expect(a.pd?.transfer_ms.p50).toBeGreaterThan(0);
    expect(a.itl_ms.requests).toBeGreaterThan(0);
    expect(a.goodput.fraction).toBeGreaterThan(0);
    const b = runFleet(trace, opts);
    expect([b.ttft_ms, b.itl_ms, b.pd]).toEqual([a.ttft_ms, a.itl_ms, a.pd]);
  });

  it('a huge threshold serves everything on decode alone; the transfer cost shows in TTFT', () => {
    const alone = runFleet(trace, { ...base, prefillWorkers: 1, decodeWorkers: 1, dispatch: { pd: { minUncachedTokens: 1e9 } } });
    expect(alone.pd?.paths.decode_rule).toBe(120);
    expect(alone.pd?.transferred_tokens).toBe(0);
    const slow = runFleet(trace, {
      ...base,
      prefillWorkers: 1,
      decodeWorkers: 1,
      dispatch: { pd: { minUncachedTokens: 0 } },
      transfer: { bytesPerToken: 147_456, bytesPerS: 1e8 },
    });
    const fast = runFleet(trace, { ...base, prefillWorkers: 1, decodeWorkers: 1, dispatch: { pd: { minUncachedTokens: 0 } } });
    expect(slow.ttft_ms.p50).toBeGreaterThan(fast.ttft_ms.p50);
  });
});
