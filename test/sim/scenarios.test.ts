/** The built-in scenarios the league runs: each builds, scales with the fleet, and runs under any policy. */
import { describe, expect, it } from 'vitest';
import { runFleet } from '../../src/sim/run-fleet.ts';
import { AGENTIC_SCENARIO, NOISY_SCENARIO, SCENARIOS, scenario } from '../../src/sim/scenarios.ts';
import { traceStats } from '../../src/sim/traces/stats.ts';

describe('scenarios', () => {
  it('every listed scenario builds; an unknown one and a bad fleet size are refused by name', () => {
    for (const name of SCENARIOS) {
      const sc = scenario(name, 1, 50);
      expect(sc.requests.length).toBeGreaterThan(0);
      expect(sc.policies.length).toBeGreaterThan(0);
    }
    expect(() => scenario('bursty')).toThrow(/unknown scenario "bursty"; known: seed, noisy-neighbour, agentic, pd/);
    expect(() => scenario('pd', 1, 50, { workers: 1 })).toThrow(/scenario pd: workers must be an integer >= 2, got 1/);
    expect(() => scenario('agentic', 1, 50, { workers: 2.5 })).toThrow(/workers must be an integer >= 1/);
  });

  it('scales the arrival rate with the fleet, so each engine sees the load the scenario was built for', () => {
    // noisy-neighbour also scales its default request count, so the flood lasts as long on a bigger fleet.
    for (const [name, base, n] of [
      ['agentic', AGENTIC_SCENARIO.workers, 4000],
      ['noisy-neighbour', NOISY_SCENARIO.workers, undefined],
    ] as const) {
      const small = traceStats(scenario(name, 1, n).requests);
      const big = traceStats(scenario(name, 1, n, { workers: base * 4 }).requests);
      expect(big.rate_rps / small.rate_rps).toBeGreaterThan(3.3);
      expect(big.rate_rps / small.rate_rps).toBeLessThan(4.8);
      expect(scenario(name, 1, 10, { workers: base * 4 }).fleet.workers).toBe(base * 4);
    }
  });

  it('pd splits the engines 1:3 into prefill and decode workers and disaggregates under every policy', () => {
    const sc = scenario('pd', 1, 150, { workers: 8 });
    expect([sc.fleet.prefillWorkers, sc.fleet.decodeWorkers]).toEqual([2, 6]);
    for (const policy of ['kv', 'round-robin']) {
      const r = runFleet(sc.requests, { ...sc.fleet, policy, dispatch: { pd: { minUncachedTokens: 1024 } } });
      expect(r.requests.served).toBe(150);
      expect(r.pd?.prefill_workers).toBe(2);
      expect(r.pd?.paths.disaggregated).toBeGreaterThan(0);
      expect(r.pd?.transferred_tokens).toBeGreaterThan(0);
    }
  }, 120_000);

  it('noisy-neighbour on a league-sized fleet still makes the flood queue', () => {
    const sc = scenario('noisy-neighbour', 1, 3000, { workers: 8 });
    const s = sc.settings ?? {};
    // The scenario's own admission settings, as `kvroute sim --scenario` applies them (src/cli/sim.ts simSettings).
    const r = runFleet(sc.requests, {
      ...sc.fleet,
      policy: 'kv',
      router: { busy: { activePrefillTokens: s.busyPrefillTokens } },
      dispatch: { queueLimit: s.queueLimit, queueTimeoutMs: s.queueTimeoutMs },
    });
    expect(r.requests.served + r.requests.refused).toBe(sc.requests.length);
    expect(r.requests.queued).toBeGreaterThan(0);
    expect(r.by_tenant.map((t) => t.name)).toEqual(['noisy', 'tenant-0', 'tenant-1', 'tenant-2']);
  }, 120_000);

  it('agentic sessions and tenants reach the simulator', () => {
    const sc = scenario('agentic', 1, 300);
    const r = runFleet(sc.requests, { ...sc.fleet, policy: 'kv-pressure' });
    expect(r.requests.served).toBe(300);
    expect(r.by_tenant.map((t) => t.name)).toEqual(['tenant-0', 'tenant-1', 'tenant-2', 'tenant-3']);
    expect(r.hit.engine_token_weighted).toBeGreaterThan(0.2);
  }, 120_000);
});
