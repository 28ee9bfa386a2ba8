import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { KvRouter } from '../../src/core/router.ts';
import { RouterMetrics } from '../../src/metrics/registry.ts';
import { EngineMirror, parsePrometheusText, sumOf } from '../../src/metrics/scrape.ts';

/** vLLM-format /metrics text (v1 engine, as served by `vllm serve`): counters in tokens, labels model_name + engine. */
function vllmMetrics(byRank: Array<{ queries: number; hits: number }>): string {
  const lines = [
    '# HELP vllm:num_requests_running Number of requests in model execution batches.',
    '# TYPE vllm:num_requests_running gauge',
    'vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0',
    '# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.',
    '# TYPE vllm:prefix_cache_queries_total counter',
    ...byRank.map((r, i) => `vllm:prefix_cache_queries_total{engine="${i}",model_name="Qwen/Qwen3-8B"} ${r.queries.toFixed(1)}`),
    '# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.',
    '# TYPE vllm:prefix_cache_queries_created gauge',
    'vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7645e+09',
    '# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.',
    '# TYPE vllm:prefix_cache_hits_total counter',
    ...byRank.map((r, i) => `vllm:prefix_cache_hits_total{engine="${i}",model_name="Qwen/Qwen3-8B"} ${r.hits.toFixed(1)}`),
    'vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.25',
  ];
  return `${lines.join('\n')}\n`;
}

const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});

/** A local engine whose /metrics body is whatever `body()` returns now (status 500 when it returns null). */
async function engine(body: () => string | null): Promise<string> {
  const server = createServer((req, res) => {
    if (req.url !== '/metrics') {
      res.writeHead(404).end();
      return;
    }
    const b = body();
    if (b === null) res.writeHead(500).end('boom');
    else res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(b);
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

describe('parsePrometheusText', () => {
  it('reads names, escaped labels, special values, timestamps; counts bad lines instead of throwing', () => {
    const text = [
      '# HELP x a metric',
      'a_total 3',
      'b{path="/v1/chat",msg="say \\"hi\\"\\nthere",back="c:\\\\x"} 1.5e3 1700000000000',
      'c{le="+Inf"} +Inf',
      'd NaN',
      'e{x="1",} -2',
      'f{broken="} 1',
      'g notanumber',
      'h 0x10',
      '',
      '# EOF',
    ].join('\n');
    const { samples, badLines } = parsePrometheusText(text);
    expect(badLines).toBe(3);
    expect(samples.map((s) => s.name)).toEqual(['a_total', 'b', 'c', 'd', 'e']);
    expect(samples[1].labels).toEqual({ path: '/v1/chat', msg: 'say "hi"\nthere', back: 'c:\\x' });
    expect(samples[1].value).toBe(1500);
    expect(samples[2].value).toBe(Infinity);
    expect(Number.isNaN(samples[3].value)).toBe(true);
    expect(samples[4]).toEqual({ name: 'e', labels: { x: '1' }, value: -2 });
    expect(sumOf(samples, 'missing')).toBeUndefined();
  });

  it('round-trips prom-client output', async () => {
    const router = new KvRouter({ blockSize: 16 });
    router.addSource({ workerId: 'a', dpRank: 0 });
    const m = new RouterMetrics({ router });
    const { samples, badLines } = parsePrometheusText(await m.render());
    expect(badLines).toBe(0);
    expect(samples.length).toBeGreaterThan(50);
  });
});

describe('EngineMirror against a local HTTP engine serving vLLM /metrics', () => {
  it('re-exports per-worker (and per DP rank) prefix-cache counters, baselined at first sight, stitched across restarts', async () => {
    let state: Array<{ queries: number; hits: number }> | null = [
      { queries: 10_000, hits: 4_000 },
      { queries: 500, hits: 100 },
    ];
    const url = await engine(() => (state ? vllmMetrics(state) : null));
    const router = new KvRouter({ blockSize: 16 });
    router.addSource({ workerId: 'w1', dpRank: 0 });
    const metrics = new RouterMetrics({ router });
    const mirror = new EngineMirror({ registry: metrics.registry, targets: () => [{ workerId: 'w1', url }] });
    metrics.attachMirror(mirror);
    const read = async () => parsePrometheusText(await metrics.render()).samples;

    await mirror.scrapeOnce(); // baseline: history before the router watched is not re-exported as traffic
    let s = await read();
    expect(sumOf(s, 'router_engine_prefix_cache_queries_total', { worker: 'w1' })).toBe(0);
    expect(sumOf(s, 'router_engine_scrape_up', { worker: 'w1' })).toBe(1);

    state = [
      { queries: 12_000, hits: 5_500 },
      { queries: 800, hits: 250 },
    ];
    await mirror.scrapeOnce();
    s = await read();
    expect(sumOf(s, 'router_engine_prefix_cache_queries_total', { worker: 'w1' })).toBe(2_000);
    expect(sumOf(s, 'router_engine_prefix_cache_hits_total', { worker: 'w1' })).toBe(1_500);
    expect(sumOf(s, 'router_engine_prefix_cache_queries_total', { worker: 'w1#1' })).toBe(300);
    expect(sumOf(s, 'router_engine_prefix_cache_hits_total', { worker: 'w1#1' })).toBe(150);

    // engine down: counted, values kept
    state = null;
    await mirror.scrapeOnce();
    s = await read();
    expect(sumOf(s, 'router_engine_scrape_up', { worker: 'w1' })).toBe(0);
    expect(sumOf(s, 'router_engine_scrape_failures_total', { worker: 'w1' })).toBe(1);
    expect(mirror.targets.get('w1')!.lastError).toBe('HTTP 500');
    expect(sumOf(s, 'router_engine_prefix_cache_queries_total', { worker: 'w1' })).toBe(2_000);

    // engine restarted: counters start again from zero; the mirror adds the new values instead of going negative
    state = [
      { queries: 700, hits: 300 },
      { queries: 0, hits: 0 },
    ];
    await mirror.scrapeOnce();
    s = await read();
    expect(sumOf(s, 'router_engine_prefix_cache_queries_total', { worker: 'w1' })).toBe(2_700);
    expect(sumOf(s, 'router_engine_prefix_cache_hits_total', { worker: 'w1' })).toBe(1_800);
    expect(sumOf(s, 'router_engine_counter_resets_total', { worker: 'w1' })).toBe(1);
    expect(mirror.totals()).toEqual({ queries: 2_700 + 300, hits: 1_800 + 150 });
    expect(metrics.dashboardState().engine).toEqual({ queries: 3_000, hits: 1_950 });
    expect(metrics.dashboardState().workers.w1.engine).toEqual({ queries: 2_700, hits: 1_800, hitRateGauge: null });
  });

  it('handles an engine without prefix-cache metrics, an SGLang gauge, and an unreachable engine', async () => {
    const plain = await engine(() => 'vllm:num_requests_running{engine="0"} 1\n');
    const sglang = await engine(() => 'sglang:cache_hit_rate{model_name="m"} 0.625\nsglang:num_running_reqs 2\n');
    const router = new KvRouter({ blockSize: 16 });
    const metrics = new RouterMetrics({ router });
    const mirror = new EngineMirror({
      registry: metrics.registry,
      timeoutMs: 1_000,
      targets: () => [
        { workerId: 'plain', url: plain },
        { workerId: 'sg', url: `${sglang}/metrics` },
        { workerId: 'gone', url: 'http://127.0.0.1:1' },
      ],
    });
    await mirror.scrapeOnce();
    await mirror.scrapeOnce();
    const s = parsePrometheusText(await metrics.render()).samples;
    expect(sumOf(s, 'router_engine_prefix_cache_queries_total', { worker: 'plain' })).toBeUndefined();
    expect(mirror.targets.get('plain')!.flavour).toBe('none');
    expect(sumOf(s, 'router_engine_cache_hit_rate', { worker: 'sg' })).toBe(0.625);
    expect(mirror.targets.get('sg')!.flavour).toBe('sglang');
    expect(sumOf(s, 'router_engine_scrape_up', { worker: 'gone' })).toBe(0);
    expect(sumOf(s, 'router_engine_scrape_failures_total', { worker: 'gone' })).toBe(2);
  });

  it('start() scrapes on an interval and stop() ends it', async () => {
    let n = 0;
    const url = await engine(() => {
      n++;
      return vllmMetrics([{ queries: n * 100, hits: n * 10 }]);
    });
    const mirror = new EngineMirror({ targets: () => [{ workerId: 'w', url }], intervalMs: 50 });
    mirror.start();
    await new Promise((r) => setTimeout(r, 400));
    await mirror.stop();
    const seen = n;
    expect(seen).toBeGreaterThanOrEqual(3);
    // after k scrapes the mirrored total is (k-1)*100: the first was the baseline
    expect(mirror.sources.get('w')!.queries).toBe((seen - 1) * 100);
    await new Promise((r) => setTimeout(r, 150));
    expect(n).toBe(seen);
  });
});
