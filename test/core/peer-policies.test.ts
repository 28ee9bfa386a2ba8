/**
 * Peer policies (src/core/scheduling/peers): each rule's distinctive behaviour on crafted states.
 */
import { describe, expect, it } from 'vitest';
import { computeSeqHashes } from '../../src/core/hashing.ts';
import { KvRouter } from '../../src/core/router.ts';
import { createRng } from '../../src/core/rng.ts';
import { KvPolicy } from '../../src/core/scheduling/policies.ts';
import { createPolicy, POLICY_NAMES } from '../../src/core/scheduling/registry.ts';
import type { Candidate, Policy, PolicyContext } from '../../src/core/scheduling/policy.ts';
import { PEER_POLICIES } from '../../src/core/scheduling/peers/index.ts';
import { cand } from '../fixtures/routing.ts';

const PEER_POLICY_NAMES = PEER_POLICIES.map((e) => e.name);

const BS = 16;

function tokens(n: number, base = 0): number[] {
  return Array.from({ length: n }, (_, i) => base + i);
}

function ctx(candidates: Candidate[], promptTokens: number, o: Partial<PolicyContext> = {}): PolicyContext {
  return {
    candidates,
    promptTokens,
    requestBlocks: Math.ceil(promptTokens / BS),
    blockSize: BS,
    seqHashes: computeSeqHashes(tokens(promptTokens), BS, 0n),
    knobs: { prefillLoadScale: 1, overlapCredit: 1, temperature: 0 },
    rng: createRng(1),
    now: 0,
    ...o,
  };
}

/** Routes a request through `policy` as the router would: rank, then tell it the pick. */
function route(policy: Policy, c: PolicyContext): number {
  const r = policy.rank(c);
  policy.routed?.(c, r.order[0]);
  return c.candidates[r.order[0]].source;
}

describe('peer policies are selectable by name', () => {
  it('every peer name is a policy name and builds a policy of that name', () => {
    for (const name of PEER_POLICY_NAMES) {
      expect(POLICY_NAMES).toContain(name);
      expect(createPolicy(name).name).toBe(name);
    }
  });

  it('a KvRouter routes with each of them', () => {
    for (const name of PEER_POLICY_NAMES) {
      const router = new KvRouter({ blockSize: BS, policy: name, seed: 3 });
      router.addSource({ workerId: 'a', dpRank: 0 }, { mode: 'events', capacityBlocks: 1000 });
      router.addSource({ workerId: 'b', dpRank: 0 }, { mode: 'events', capacityBlocks: 1000 });
      const d = router.route({ requestId: 'r1', tokens: tokens(100) }, 0);
      expect(d.kind).toBe('routed');
    }
  });
});

describe('dynamo (strict)', () => {
  it('breaks exact ties uniformly at random across seeds (kv prefers the emptiest cache)', () => {
    const cs = [cand(0, { cachedBlocks: 500 }), cand(1, { cachedBlocks: 10 }), cand(2, { cachedBlocks: 900 })];
    const picks = new Set<number>();
    const kvPicks = new Set<number>();
    for (let seed = 0; seed < 40; seed++) {
      picks.add(route(createPolicy('dynamo'), ctx(cs, 64, { rng: createRng(seed) })));
      kvPicks.add(new KvPolicy().rank(ctx(cs, 64, { rng: createRng(seed) })).order[0]);
    }
    expect(picks).toEqual(new Set([0, 1, 2]));
    expect(kvPicks).toEqual(new Set([1]));
  });

  it('uses isl/bs unrounded and never counts trailing partial blocks', () => {
    // 40 tokens = 2.5 blocks of prefill, 2 complete new blocks; active: 10 blocks of which 3 partial -> 7 complete.
    const c = ctx([cand(0, { activeBlocks: 10, activePartialBlocks: 3, activePrefillTokens: 8 })], 40);
    const r = createPolicy('dynamo').rank(c);
    expect(r.costs[0]).toBeCloseTo((8 + 40) / BS + 7 + 2);
  });

  it('is routed without the predicted overlay: a sibling in flight earns no credit before its KV events', () => {
    const router = new KvRouter({ blockSize: BS, policy: 'dynamo', seed: 1 });
    router.addSource({ workerId: 'a', dpRank: 0 }, { mode: 'events', capacityBlocks: 1000 });
    router.addSource({ workerId: 'b', dpRank: 0 }, { mode: 'events', capacityBlocks: 1000 });
    const first = router.route({ requestId: 'r1', tokens: tokens(320) }, 0);
    const second = router.route({ requestId: 'r2', tokens: tokens(320) }, 1);
    if (first.kind !== 'routed' || second.kind !== 'routed') throw new Error('not routed');
    expect(second.overlapBlocks).toBe(0);
    // The default keeps the overlay: the sibling is credited with the in-flight prefix.
    const kvr = new KvRouter({ blockSize: BS, seed: 1 });
    kvr.addSource({ workerId: 'a', dpRank: 0 }, { mode: 'events', capacityBlocks: 1000 });
    kvr.route({ requestId: 'r1', tokens: tokens(320) }, 0);
    const sib = kvr.route({ requestId: 'r2', tokens: tokens(320) }, 1);
    expect(sib.kind === 'routed' && sib.overlapBlocks).toBe(20);
  });
});

describe('llmd (chart profile)', () => {
  it('scores 2 x queue + 2 x (1 - kv usage) + 3 x prefix from scraped gauges', () => {
    const p = createPolicy('llmd');
    const cs = [cand(0, { scraped: { waiting: 0, kvUsage: 0.5 } }), cand(1, { scraped: { waiting: 4, kvUsage: 0 } })];
    const r = p.rank(ctx(cs, 256));
    expect(-r.costs[0]).toBeCloseTo(2 * 1 + 2 * 0.5);
    expect(-r.costs[1]).toBeCloseTo(2 * 0 + 2 * 1);
    expect(r.order[0]).toBe(0);
  });

  it('learns prefixes from its own decisions in 64-token blocks, and the prefix weight outvotes the queue', () => {
    const p = createPolicy('llmd');
    const cs = [cand(0, { scraped: { waiting: 0, kvUsage: 0 } }), cand(1, { scraped: { waiting: 0, kvUsage: 0 } })];
    const first = route(p, ctx(cs, 256));
    // Now the holder has the longer queue; its prefix (4 of 4 blocks: +3) beats the other's queue edge (+2).
    const busy = cs.map((c) => (c.source === first ? { ...c, scraped: { waiting: 5, kvUsage: 0 } } : c));
    const r = p.rank(ctx(busy, 256));
    expect(busy[r.order[0]].source).toBe(first);
    expect(-r.costs[r.order[0]] + r.costs[r.order[1]]).toBeCloseTo(1);
    // A prompt shorter than one 64-token block matches nothing.
    const short = p.rank(ctx(busy, 48));
    expect(busy[short.order[0]].source).not.toBe(first);
  });
});

describe('llmd-baseline (release 0.8)', () => {
  it('keeps the endpoints matching >= 80% of the prompt, even when one elsewhere has less in-flight load', () => {
    const p = createPolicy('llmd-baseline');
    const cs = [cand(0), cand(1)];
    const home = route(p, ctx(cs, 640));
    const loaded = cs.map((c) => (c.source === home ? { ...c, activePrefillTokens: 100_000 } : c));
    expect(loaded[p.rank(ctx(loaded, 640)).order[0]].source).toBe(home);
  });

  it('drops the affinity when the sticky endpoint waits more than 18 s longer at 15,928 tokens/s', () => {
    const p = createPolicy('llmd-baseline');
    const cs = [cand(0), cand(1)];
    const home = route(p, ctx(cs, 640));
    const swamped = cs.map((c) => (c.source === home ? { ...c, activePrefillTokens: 15_928 * 19 } : c));
    expect(swamped[p.rank(ctx(swamped, 640)).order[0]].source).not.toBe(home);
    const within = cs.map((c) => (c.source === home ? { ...c, activePrefillTokens: 15_928 * 17 } : c));
    expect(within[p.rank(ctx(within, 640)).order[0]].source).toBe(home);
  });
});

describe('smg (cache_aware, 2026-08-16 rule)', () => {
  it('sends a request matching > 30% to the least-loaded holder', () => {
    const p = createPolicy('smg');
    const cs = [cand(0), cand(1), cand(2)];
    const home = route(p, ctx(cs, 320));
    const loaded = cs.map((c) => (c.source === home ? { ...c, activeRequests: 20 } : { ...c, activeRequests: 0 }));
    expect(loaded[p.rank(ctx(loaded, 320)).order[0]].source).toBe(home);
  });

  it('spills to the least loaded when the holder is above 1.5 x mean and mean + 64', () => {
    const p = createPolicy('smg');
    const cs = [cand(0), cand(1), cand(2)];
    const home = route(p, ctx(cs, 320));
    // 100 with others idle: mean 33.3, 100 > 50 and 100 > 97.3 -> spill. 90: mean 30, 90 > 45 but not > 94 -> stays.
    const over = cs.map((c) => (c.source === home ? { ...c, activeRequests: 100 } : c));
    expect(over[p.rank(ctx(over, 320)).order[0]].source).not.toBe(home);
    const under = cs.map((c) => (c.source === home ? { ...c, activeRequests: 90 } : c));
    expect(under[p.rank(ctx(under, 320)).order[0]].source).toBe(home);
  });

  it('routes a request matching <= 30% by (fewest requests, fewest processed, index)', () => {
    const p = createPolicy('smg');
    const cs = [cand(0), cand(1)];
    expect(route(p, ctx(cs, 320))).toBe(0);
    // A different prompt: w0 has processed one, so w1 (same load) is next.
    expect(route(p, ctx(cs, 320, { seqHashes: computeSeqHashes(tokens(320, 10_000), BS, 0n) }))).toBe(1);
  });
});

describe('smg-legacy (global imbalance switch)', () => {
  it('ignores the cache when (max - min) > 64 and max > 1.5 x min across the fleet', () => {
    const p = createPolicy('smg-legacy');
    const cs = [cand(0), cand(1), cand(2)];
    const home = route(p, ctx(cs, 320));
    // The holder is lightly loaded, but another worker's imbalance flips the whole fleet to min-load.
    const other = (home + 1) % 3;
    const imbalanced = cs.map((c) =>
      c.source === other ? { ...c, activeRequests: 70 } : c.source === home ? { ...c, activeRequests: 2 } : { ...c, activeRequests: 1 },
    );
    expect(imbalanced[p.rank(ctx(imbalanced, 320)).order[0]].source).toBe((home + 2) % 3);
    const balanced = imbalanced.map((c) => (c.source === other ? { ...c, activeRequests: 60 } : c));
    expect(balanced[p.rank(ctx(balanced, 320)).order[0]].source).toBe(home);
  });
});

describe('aibrix (prefix-cache)', () => {
  it('switches to the least busy when running requests differ by more than 8', () => {
    const p = createPolicy('aibrix');
    const cs = [cand(0), cand(1), cand(2)];
    const home = route(p, ctx(cs, 320));
    const at = (n: number) =>
      cs.map((c) => (c.source === home ? { ...c, activeRequests: n } : { ...c, activeRequests: c.source === (home + 1) % 3 ? 0 : 5 }));
    expect(at(9)[p.rank(ctx(at(9), 320)).order[0]].source).toBe((home + 1) % 3);
    // A difference of 8 is not an imbalance, but w_home's 8 is above mean + 1 std: the best match is skipped too.
    const bounded = at(8);
    expect(bounded[p.rank(ctx(bounded, 320)).order[0]].source).toBe((home + 1) % 3);
    // Within mean + 1 std the best match wins.
    // R = 3 on the holder, 2 and 4 elsewhere: mean 3, std 0.82.
    const mild = cs.map((c) => ({ ...c, activeRequests: c.source === home ? 3 : c.source === (home + 1) % 3 ? 2 : 4 }));
    expect(mild[p.rank(ctx(mild, 320)).order[0]].source).toBe(home);
  });

  it('forgets a prefix unused for 20 minutes', () => {
    const p = createPolicy('aibrix');
    const cs = [cand(0), cand(1)];
    const home = route(p, ctx(cs, 320, { now: 0 }));
    const loaded = cs.map((c) => (c.source === home ? { ...c, activeRequests: 1 } : c));
    expect(loaded[p.rank(ctx(loaded, 320, { now: 19 * 60_000 })).order[0]].source).toBe(home);
    expect(loaded[p.rank(ctx(loaded, 320, { now: 21 * 60_000 })).order[0]].source).not.toBe(home);
  });
});

describe('production-stack', () => {
  it('ps-prefixaware follows its own longest match whatever the load, random when nothing matches', () => {
    const p = createPolicy('ps-prefixaware');
    const cs = [cand(0), cand(1), cand(2)];
    const home = route(p, ctx(cs, 320));
    const swamped = cs.map((c) => (c.source === home ? { ...c, activeRequests: 500, activePrefillTokens: 1e6 } : c));
    expect(swamped[p.rank(ctx(swamped, 320)).order[0]].source).toBe(home);
    const firsts = new Set<number>();
    for (let s = 0; s < 30; s++) firsts.add(createPolicy('ps-prefixaware').rank(ctx(cs, 320, { rng: createRng(s) })).order[0]);
    expect(firsts.size).toBe(3);
  });

  it('ps-kvaware takes the instance holding all but 2,000 tokens, else the fewest requests in 60 s', () => {
    const p = createPolicy('ps-kvaware');
    // 4,000-token prompt: 2,048 cached on w1 leaves 1,952 < 2,000 uncached -> w1, whatever its load.
    const hit = [cand(0), cand(1, { overlapBlocks: 128, activeRequests: 50 })];
    expect(route(p, ctx(hit, 4000, { now: 0 }))).toBe(1);
    // 1,024 cached leaves 2,976 uncached -> fallback: w1 had a request in the last 60 s, w0 none.
    const partial = [cand(0), cand(1, { overlapBlocks: 64 })];
    expect(p.rank(ctx(partial, 4000, { now: 1000 })).order[0]).toBe(0);
    // After 60 s the window forgets w1's request: a tie, broken at random across seeds.
    const picks = new Set<number>();
    for (let s = 0; s < 20; s++) picks.add(p.rank(ctx(partial, 4000, { now: 70_000, rng: createRng(s) })).order[0]);
    expect(picks).toEqual(new Set([0, 1]));
  });
});

describe('scraped engine gauges', () => {
  it('the router hands a policy the gauges last set, and refuses an unknown source', () => {
    const seen: Array<Candidate['scraped']> = [];
    const spy: Policy = {
      name: 'spy',
      rank: (c) => {
        seen.push(c.candidates[0].scraped);
        return { order: [0], costs: [0] };
      },
    };
    const router = new KvRouter({ blockSize: BS, policy: 'spy', policies: [spy] });
    const key = router.addSource({ workerId: 'a', dpRank: 0 });
    router.route({ requestId: 'r1', tokens: tokens(32) }, 0);
    expect(router.setEngineMetrics(key, { waiting: 3, kvUsage: 0.25 })).toBe(true);
    expect(router.setEngineMetrics('nope', { waiting: 1, kvUsage: 0 })).toBe(false);
    router.route({ requestId: 'r2', tokens: tokens(32) }, 1);
    expect(seen).toEqual([undefined, { waiting: 3, kvUsage: 0.25 }]);
  });

  it('the simulator scrapes at the policy interval: between scrapes a policy sees the same stale gauges', async () => {
    const { runFleet } = await import('../../src/sim/run-fleet.ts');
    const { generateSharedPrefix } = await import('../../src/sim/traces/generate.ts');
    const seen: Array<{ now: number; scraped: Candidate['scraped'] }> = [];
    const spy: Policy = {
      name: 'spy',
      scrapeIntervalMs: 1000,
      rank: (c) => {
        seen.push({ now: c.now ?? 0, scraped: c.candidates[0].scraped });
        return { order: c.candidates.map((_, i) => i), costs: c.candidates.map(() => 0) };
      },
    };
    const requests = generateSharedPrefix({ requests: 200, seed: 1 });
    runFleet(requests, { workers: 2, policy: 'spy', customPolicy: spy, blockSize: 16, gpuBlocks: 4096, seed: 1 });
    expect(seen.every((s) => s.scraped !== undefined)).toBe(true);
    // Within one scrape interval the gauges never change.
    const byWindow = new Map<number, string>();
    for (const s of seen) {
      const w = Math.floor(s.now / 1000);
      const v = JSON.stringify(s.scraped);
      if (byWindow.has(w)) expect(byWindow.get(w)).toBe(v);
      else byWindow.set(w, v);
    }
    expect(new Set(byWindow.values()).size).toBeGreaterThan(1);
  });
});

describe('selectable by name in serve settings (eppSchema extends serveSchema)', () => {
  it('--policy / KVROUTE_POLICY accept every peer policy; an unknown name is refused in one line', async () => {
    const { resolveServeConfig } = await import('../../src/config/serve.ts');
    for (const name of PEER_POLICY_NAMES) {
      const { config } = await resolveServeConfig({ flags: { policy: name }, env: {} });
      expect(config.policy).toBe(name);
    }
    const { config } = await resolveServeConfig({ flags: {}, env: { KVROUTE_POLICY: 'smg' } });
    expect(config.policy).toBe('smg');
    const err = await resolveServeConfig({ flags: { policy: 'sglang' }, env: {} }).catch((e: unknown) => e);
    expect(String((err as Error).message)).toMatch(/policy/);
    expect(String((err as Error).message)).not.toContain('\n');
  });
});
