import { describe, expect, it } from 'vitest';
import { KvRouter } from '../../src/core/router.ts';
import type { KvEvent } from '../../src/core/types.ts';
import { routed, storedEvent, toks } from '../fixtures/routing.ts';
import { HIT_RATE_BUCKETS } from '../../src/metrics/buckets.ts';
import { RouterMetrics } from '../../src/metrics/registry.ts';
import { parsePrometheusText, sumOf } from '../../src/metrics/scrape.ts';
import { buildReport } from '../../src/metrics/hitrate-report.ts';

const BS = 16;
const stored = (tokens: number[], blocks: number, base: bigint): KvEvent => storedEvent(tokens, blocks, base, BS);

/** Two workers; w1 holds the first 99 blocks of a 100-block prompt. */
function setup(prefix?: string) {
  let t = 0;
  const router = new KvRouter({ blockSize: BS, clock: () => (t += 0.01) });
  router.addSource({ workerId: 'w0', dpRank: 0 });
  router.addSource({ workerId: 'w1', dpRank: 0 });
  const metrics = new RouterMetrics({ router, prefix });
  const long = toks(100 * BS, 1_000);
  const res = router.applyEvents('w1', [stored(long, 99, 1n)]);
  metrics.eventsApplied('w1', res, 'stored');
  return { router, metrics, long };
}

/** The scripted pair: 1 block with 0 hits and 100 blocks with 99 hits. */
function twoRequests(router: KvRouter, metrics: RouterMetrics, long: number[]) {
  const short = routed(router.route({ requestId: 's', tokens: toks(BS, 900_000) }, 0));
  metrics.routed(short, { tokenize: 0.0005 });
  const big = routed(router.route({ requestId: 'l', tokens: long }, 1));
  metrics.routed(big, { tokenize: 0.002 });
  return { short, big };
}

async function samples(metrics: RouterMetrics) {
  const parsed = parsePrometheusText(await metrics.render());
  expect(parsed.badLines).toBe(0);
  return parsed.samples;
}

describe('RouterMetrics: exact values after scripted requests through a real KvRouter', () => {
  it('histogram mean 0.495 (mean of ratios) and block-weighted 0.980 (ratio of sums)', async () => {
    const { router, metrics, long } = setup();
    const { short, big } = twoRequests(router, metrics, long);
    expect(short.overlapBlocks).toBe(0);
    expect(short.islBlocks).toBe(1);
    expect(big.sourceKey).toBe('w1');
    expect(big.overlapBlocks).toBe(99);
    expect(big.islBlocks).toBe(100);

    const s = await samples(metrics);
    const sum = sumOf(s, 'router_kv_hit_rate_sum')!;
    const count = sumOf(s, 'router_kv_hit_rate_count')!;
    expect(count).toBe(2);
    expect(sum / count).toBeCloseTo(0.495, 12);
    const overlap = sumOf(s, 'router_kv_overlap_blocks_total')!;
    const isl = sumOf(s, 'router_kv_isl_blocks_total')!;
    expect(overlap).toBe(99);
    expect(isl).toBe(101);
    expect((overlap / isl).toFixed(3)).toBe('0.980');
    // per worker: w1 has the long request; the short one went to whichever was cheaper
    expect(sumOf(s, 'router_kv_overlap_blocks_total', { worker: 'w1' })).toBe(99);
    expect(sumOf(s, 'router_kv_best_overlap_blocks_total')).toBe(99);
    // buckets: the 0.99 observation lands in le=1, the 0 in le=0
    expect(sumOf(s, 'router_kv_hit_rate_bucket', { le: '0' })).toBe(1);
    expect(sumOf(s, 'router_kv_hit_rate_bucket', { le: '0.95' })).toBe(1);
    expect(sumOf(s, 'router_kv_hit_rate_bucket', { le: '1' })).toBe(2);
    expect(HIT_RATE_BUCKETS).toHaveLength(21);
    expect(HIT_RATE_BUCKETS[1]).toBe(0.05);

    // the ledger agrees with the metrics
    const v = router.ledger.view();
    expect(v.predicted.requestWeighted).toBeCloseTo(0.495, 12);
    expect(v.predicted.blockWeighted).toBeCloseTo(99 / 101, 12);

    // the report on two scrapes (empty router -> after) reads the same numbers
    const { metrics: empty } = setup();
    const report = buildReport({ from: await empty.render(), to: await metrics.render(), windowS: 1 });
    expect(report.overall.predicted.requestWeighted).toBeCloseTo(0.495, 12);
    expect(report.overall.predicted.blockWeighted.toFixed(3)).toBe('0.980');
    expect(report.verdict).toContain('no engine truth');
    expect(report.verdict).toContain("histogram's 0.495 is a mean of ratios pulled down by many short requests");
  });

  it('overhead histograms in seconds, per phase, with total = sum of phases', async () => {
    const { router, metrics, long } = setup();
    twoRequests(router, metrics, long);
    const s = await samples(metrics);
    for (const phase of ['tokenize', 'hash', 'find_matches', 'select', 'total']) {
      expect(sumOf(s, 'router_routing_overhead_seconds_count', { phase })).toBe(2);
    }
    // the fake clock advances 0.01 ms per reading: each phase is 0.01 ms = 1e-5 s
    expect(sumOf(s, 'router_routing_overhead_seconds_sum', { phase: 'hash' })).toBeCloseTo(2e-5, 12);
    expect(sumOf(s, 'router_routing_overhead_seconds_sum', { phase: 'tokenize' })).toBeCloseTo(0.0025, 12);
    expect(sumOf(s, 'router_routing_overhead_seconds_sum', { phase: 'total' })).toBeCloseTo(0.0025 + 6e-5, 12);
  });

  it('delivered reuse, predicted for the same requests, and prediction error from usage', async () => {
    const { router, metrics, long } = setup();
    twoRequests(router, metrics, long);
    // the long request: router predicted 99 blocks = 1584 tokens; engine reported 1568 (one block evicted)
    const f = router.finish('l', { cachedTokens: 1568, outcome: 'ok' }, 10)!;
    expect(f.predictedCachedTokens).toBe(99 * BS);
    metrics.finished(f, { outputTokens: 40 });
    metrics.outcome('ok');
    // the short request: engine did not report cached tokens (unknown, not zero): not in the delivered view
    const g = router.finish('s', { outcome: 'ok' }, 10)!;
    metrics.finished(g);
    metrics.outcome('ok');

    const s = await samples(metrics);
    expect(sumOf(s, 'router_kv_engine_cached_tokens_total')).toBe(1568);
    expect(sumOf(s, 'router_kv_engine_prompt_tokens_total')).toBe(1600);
    expect(sumOf(s, 'router_kv_predicted_cached_tokens_total')).toBe(1584);
    expect(sumOf(s, 'router_kv_engine_cached_tokens_total', { worker: 'w1' })).toBe(1568);
    expect(sumOf(s, 'router_kv_prediction_error_tokens_sum')).toBe(16);
    expect(sumOf(s, 'router_kv_prediction_error_tokens_count')).toBe(1);
    expect(sumOf(s, 'router_kv_prediction_error_tokens_bucket', { le: '0' })).toBe(0);
    expect(sumOf(s, 'router_kv_prediction_error_tokens_bucket', { le: '16' })).toBe(1);
    expect(sumOf(s, 'router_output_tokens_count')).toBe(1);
    expect(sumOf(s, 'router_requests_total', { outcome: 'ok' })).toBe(2);

    const { metrics: empty } = setup();
    const report = buildReport({ from: await empty.render(), to: await metrics.render(), windowS: 1 });
    expect(report.overall.delivered.requests).toBe(1);
    expect(report.overall.delivered.tokenWeighted).toBeCloseTo(1568 / 1600, 12);
    expect(report.overall.delivered.predictedTokenWeighted).toBeCloseTo(1584 / 1600, 12);
    expect(report.verdict).toMatch(/^router view accurate: predicted 0\.990 vs delivered 0\.980 on the 1 requests/);
  });

  it('per-worker gauges read from the router at scrape time; refusals, TTFT/ITL, event counters', async () => {
    const { router, metrics, long } = setup('dynamo_component_');
    twoRequests(router, metrics, long);
    metrics.refused('all_busy');
    metrics.firstToken('w1', 0.25);
    metrics.token('w1', 0.02);
    metrics.token('w1', -1); // nonsense timing: ignored, not thrown
    metrics.ingestCounters('w0', { gaps: 2, replays: 1, decodeErrors: 3, blind: true });
    metrics.setHealthy('w0', false);
    const s = await samples(metrics);
    const p = 'dynamo_component_';
    expect(s.every((x) => x.name.startsWith(p))).toBe(true);
    const st = router.state().sources.find((x) => x.source === 'w1')!;
    expect(sumOf(s, `${p}router_worker_indexed_blocks`, { worker: 'w1' })).toBe(99);
    expect(sumOf(s, `${p}router_worker_active_blocks`, { worker: 'w1' })).toBe(st.activeBlocks);
    expect(st.activeBlocks).toBeGreaterThan(0);
    expect(sumOf(s, `${p}router_worker_active_prefill_tokens`, { worker: 'w1' })).toBe(st.activePrefillTokens);
    expect(sumOf(s, `${p}router_worker_healthy`, { worker: 'w0' })).toBe(0);
    expect(sumOf(s, `${p}router_worker_healthy`, { worker: 'w1' })).toBe(1);
    expect(sumOf(s, `${p}router_kv_event_sources_blind`)).toBe(1);
    expect(sumOf(s, `${p}router_kv_event_gaps_total`, { worker: 'w0' })).toBe(2);
    expect(sumOf(s, `${p}router_kv_event_decode_errors_total`)).toBe(3);
    expect(sumOf(s, `${p}router_kv_events_total`, { worker: 'w1', kind: 'stored', status: 'applied' })).toBe(1);
    expect(sumOf(s, `${p}router_kv_event_blocks_total`, { worker: 'w1', status: 'applied' })).toBe(99);
    expect(sumOf(s, `${p}router_kv_index_blocks`)).toBe(99);
    expect(sumOf(s, `${p}router_requests_refused_total`, { reason: 'all_busy' })).toBe(1);
    expect(sumOf(s, `${p}router_time_to_first_token_seconds_count`)).toBe(1);
    expect(sumOf(s, `${p}router_inter_token_latency_seconds_count`)).toBe(1);
    expect(sumOf(s, `${p}router_prompt_tokens_sum`)).toBe(BS + 100 * BS);
    // help text warns about the aggregation
    expect(await metrics.render()).toMatch(/# HELP dynamo_component_router_kv_hit_rate .*MEAN OF RATIOS/);
    // the dashboard's JSON carries the same totals
    const d = metrics.dashboardState(123);
    expect(d.reuse.overlapBlocks).toBe(99);
    expect(d.reuse.islBlocks).toBe(101);
    expect(d.workers.w0.blind).toBe(true);
    expect(d.events.gaps).toBe(2);
    expect(d.overhead.total.count).toBe(2);
  });

  it('ingestTotals turns cumulative ingest health into counter increments (and survives a recreated ingest)', async () => {
    const { metrics } = setup();
    metrics.ingestTotals('w0', { gaps: 3, replays: 2, decodeErrors: 1, blind: false });
    metrics.ingestTotals('w0', { gaps: 5, replays: 2, decodeErrors: 1, blind: true });
    metrics.ingestTotals('w0', { gaps: 1, replays: 0, decodeErrors: 1 }); // recreated: counts from zero
    const s = await samples(metrics);
    expect(sumOf(s, 'router_kv_event_gaps_total', { worker: 'w0' })).toBe(6);
    expect(sumOf(s, 'router_kv_event_replays_total', { worker: 'w0' })).toBe(2);
    expect(sumOf(s, 'router_kv_event_decode_errors_total', { worker: 'w0' })).toBe(1);
    expect(sumOf(s, 'router_kv_event_source_blind', { worker: 'w0' })).toBe(1);
    expect(metrics.dashboardState().events.gaps).toBe(6);
  });

  it('workers get zeroed series as soon as they are known; cardinality is bounded', async () => {
    const router = new KvRouter({ blockSize: BS });
    for (let i = 0; i < 4; i++) router.addSource({ workerId: `w${i}`, dpRank: 0 });
    const metrics = new RouterMetrics({ router, maxWorkerLabels: 2 });
    const s = await samples(metrics);
    const workers = new Set(s.filter((x) => x.name === 'router_kv_isl_blocks_total').map((x) => x.labels.worker));
    expect([...workers].sort()).toEqual(['_other', 'w0', 'w1']);
    expect(sumOf(s, 'router_kv_isl_blocks_total')).toBe(0);
    expect(sumOf(s, 'router_kv_hit_rate_count')).toBe(0);
    expect(() => new RouterMetrics({ router, prefix: 'bad-prefix' })).toThrow(/not a valid Prometheus name prefix/);
  });
});
