/** `kvroute hitrate` on a P/D fleet: the engine truth is the prefill pool's, not the decode engines' received KV. */
import { describe, expect, it } from 'vitest';
import { buildReport } from '../../src/metrics/hitrate-report.ts';

const scrape = (n: number) =>
  [
    `router_worker_role{worker="p0",role="prefill"} 1`,
    `router_worker_role{worker="d0",role="decode"} 1`,
    `router_kv_hit_rate_count{worker="p0"} ${10 * n}`,
    `router_kv_hit_rate_sum{worker="p0"} ${5 * n}`,
    `router_kv_isl_blocks_total{worker="p0"} ${1000 * n}`,
    `router_kv_overlap_blocks_total{worker="p0"} ${500 * n}`,
    `router_kv_isl_blocks_total{worker="d0"} 0`,
    `router_kv_overlap_blocks_total{worker="d0"} 0`,
    // The prefill engine: half its prompt tokens from cache. The decode engine: every prompt it received is a query.
    `router_engine_prefix_cache_queries_total{worker="p0"} ${16000 * n}`,
    `router_engine_prefix_cache_hits_total{worker="p0"} ${8000 * n}`,
    `router_engine_prefix_cache_queries_total{worker="d0"} ${16000 * n}`,
    `router_engine_prefix_cache_hits_total{worker="d0"} 0`,
    '',
  ].join('\n');

describe('hitrate report on a P/D fleet', () => {
  it('leaves decode engines out of the overall engine figure and says so', () => {
    const r = buildReport({ from: scrape(1), to: scrape(2), windowS: 60 });
    expect(r.overall.engine.ratio).toBeCloseTo(0.5, 6); // with the decode engine it would read 0.25
    expect(r.overall.predicted.blockWeighted).toBeCloseTo(0.5, 6);
    expect(r.verdict).toMatch(/^router view accurate/);
    expect(r.notes.some((n) => n.startsWith('P/D fleet: the engine counters of 1 decode worker'))).toBe(true);
  });

  it('an aggregated fleet (no role series) sums every engine as before', () => {
    const strip = (t: string) =>
      t
        .split('\n')
        .filter((l) => !l.startsWith('router_worker_role'))
        .join('\n');
    const r = buildReport({ from: strip(scrape(1)), to: strip(scrape(2)), windowS: 60 });
    expect(r.overall.engine.ratio).toBeCloseTo(0.25, 6);
  });
});
