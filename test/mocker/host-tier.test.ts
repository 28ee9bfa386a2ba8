import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { HOST_MEDIUM, MockEngine, type EngineEvent, type RequestOutput } from '../../src/mocker/engine/index.ts';
import { HostTier } from '../../src/mocker/engine/host-tier.ts';
import { KvRouter } from '../../src/core/router.ts';

const BS = 4;

/** Runs one request to completion on an otherwise idle engine; returns its first output and the events. */
function serve(e: MockEngine, id: string, prompt: number[], now: number): { out: RequestOutput; events: EngineEvent[] } {
  e.addRequest({ requestId: id, promptTokens: prompt, maxTokens: 1 }, now);
  const events: EngineEvent[] = [];
  let first: RequestOutput | undefined;
  let t = now;
  while (e.hasWork()) {
    const r = e.step(t);
    events.push(...r.events);
    for (const o of r.outputs) if (o.firstToken) first = o;
    t += Math.max(1, r.durationMs);
  }
  return { out: first!, events };
}

/** A prompt of `blocks` full blocks from the conversation `conv` plus 2 tokens (a partial block). */
const prompt = (conv: number, blocks: number) => Array.from({ length: blocks * BS + 2 }, (_, i) => conv * 100_000 + i);

describe('HostTier (LRU level of N blocks)', () => {
  it('keeps the N most recently stored blocks, drops the least recent and reports it, and a take frees a slot', () => {
    const h = new HostTier(2);
    expect(h.store(1, 0, 11n)).toBeNull();
    expect(h.store(2, 0, 22n)).toBeNull();
    expect(h.store(1, 0, 11n)).toBeNull(); // refresh: 1 is now the most recent
    expect(h.store(3, 0, 33n)).toBe(22n); // 2 was least recent
    expect(h.order()).toEqual([
      [1, 0],
      [3, 0],
    ]);
    expect(h.take(1, 0)).toBe(11n);
    expect(h.take(1, 0)).toBeNull();
    expect(h.has(3, 0)).toBe(true);
    expect(h.size).toBe(1);
    expect(h.store(4, 0, 44n)).toBeNull();
    expect(() => new HostTier(0)).toThrow(/positive integer/);
  });
});

describe('MockEngine host tier (CPU offload)', () => {
  it('an evicted GPU block goes to the host tier and a later request loads it back as cached tokens', () => {
    // 4 GPU blocks: conversation A (3 full blocks + partial) is evicted by conversation B, then asked again.
    const e = new MockEngine({ blockSize: BS, numGpuBlocks: 4, hostBlocks: 8 });
    serve(e, 'a', prompt(1, 3), 0);
    const b = serve(e, 'b', prompt(2, 3), 100);
    expect(e.counters.hostStored).toBe(3);
    // Announced on the CPU medium, stored before the GPU copy is removed (so its engine id is still known).
    const cpuStored = b.events.filter((ev) => ev.kind === 'stored' && ev.medium === HOST_MEDIUM);
    expect(cpuStored.length).toBe(3);
    const again = serve(e, 'a2', prompt(1, 3), 200);
    expect(again.out.cachedTokens).toBe(3 * BS);
    expect(e.counters.hostHitTokens).toBe(3 * BS);
    expect(e.counters.prefixCacheHits).toBe(0); // vLLM counts connector loads apart from prefix-cache hits
    expect(e.counters.hostLoaded).toBe(3);
    expect(again.events.some((ev) => ev.kind === 'removed' && ev.medium === HOST_MEDIUM && ev.engineIds.length === 3)).toBe(true);
    // Without the tier the same sequence hits nothing.
    const plain = new MockEngine({ blockSize: BS, numGpuBlocks: 4 });
    serve(plain, 'a', prompt(1, 3), 0);
    serve(plain, 'b', prompt(2, 3), 100);
    expect(serve(plain, 'a2', prompt(1, 3), 200).out.cachedTokens).toBe(0);
    e.checkInvariants();
  });

  it('the look-up continues in the host tier only where the GPU look-up stops, and the loaded blocks leave the tier', () => {
    const e = new MockEngine({ blockSize: BS, numGpuBlocks: 6, hostBlocks: 16 });
    serve(e, 'a', prompt(1, 5), 0); // 5 full + partial = 6 blocks: all of the GPU
    serve(e, 'b', prompt(2, 2), 10); // evicts A's tail (2 blocks + A's partial was never cached)
    const held = e.hostCachedBlocks;
    expect(held).toBeGreaterThan(0);
    const again = serve(e, 'a2', prompt(1, 5), 20);
    expect(again.out.cachedTokens).toBe(5 * BS); // GPU prefix + host tail
    expect(e.counters.prefixCacheHits + e.counters.hostHitTokens).toBe(5 * BS);
    expect(e.counters.hostHitTokens).toBeGreaterThan(0);
    expect(e.hostCachedBlocks).toBeLessThanOrEqual(held - e.counters.hostLoaded + (e.counters.hostStored - held));
    e.checkInvariants();
  });

  it('its events keep a router that reads them consistent: every GPU and CPU event applies', () => {
    const e = new MockEngine({ blockSize: BS, numGpuBlocks: 4, hostBlocks: 8 });
    const router = new KvRouter({ blockSize: BS, seed: 0 });
    const key = router.addSource({ workerId: 'w', dpRank: 0 });
    const all = [...serve(e, 'a', prompt(1, 3), 0).events, ...serve(e, 'b', prompt(2, 3), 10).events];
    expect(all.some((ev) => ev.medium === HOST_MEDIUM)).toBe(true);
    const r = router.applyEvents(key, all as never);
    expect(r.rejected).toBe(0);
    expect(r.applied).toBe(all.reduce((n, ev) => n + ev.engineIds.length, 0));
  });

  it('refuses a host tier on a hybrid model and a bad size', () => {
    expect(() => new MockEngine({ blockSize: BS, numGpuBlocks: 8, hostBlocks: -1 })).toThrow(/hostBlocks/);
    expect(
      () =>
        new MockEngine({
          blockSize: BS,
          numGpuBlocks: 8,
          hostBlocks: 4,
          cacheGroups: [{ kind: 'full_attention' }, { kind: 'sliding_window', slidingWindow: 8 }] as never,
        }),
    ).toThrow(/hybrid/);
  });

  it('serially, GPU G + host H delivers what one GPU of G + H blocks does, request by request (one LRU order)', () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.integer({ min: 0, max: 5 }), fc.integer({ min: 1, max: 6 })), { minLength: 5, maxLength: 60 }),
        fc.integer({ min: 8, max: 14 }),
        fc.integer({ min: 1, max: 20 }),
        (reqs, g, h) => {
          const tiered = new MockEngine({ blockSize: BS, numGpuBlocks: g, hostBlocks: h });
          const big = new MockEngine({ blockSize: BS, numGpuBlocks: g + h });
          let t = 0;
          for (const [k, [conv, blocks]] of reqs.entries()) {
            const p = prompt(conv, blocks);
            const a = serve(tiered, `t${k}`, p, t).out.cachedTokens;
            const b = serve(big, `b${k}`, p, t).out.cachedTokens;
            expect(a).toBe(b);
            t += 1000;
          }
          tiered.checkInvariants();
        },
      ),
      { numRuns: 60 },
    );
  });
});
