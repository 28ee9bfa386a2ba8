import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KvRouter } from '../../src/core/router.ts';
import { startMocker, type MockerHandle } from '../../src/mocker/server.ts';
import { buildReport } from '../../src/metrics/hitrate-report.ts';
import { RouterMetrics } from '../../src/metrics/registry.ts';
import { EngineMirror, parsePrometheusText, sumOf } from '../../src/metrics/scrape.ts';

const BS = 16;
let mocker: MockerHandle;

beforeAll(async () => {
  mocker = await startMocker({ zmqEndpoint: null, replayEndpoint: null, speedup: 1000, defaultMaxTokens: 3 });
});
afterAll(async () => {
  await mocker.close();
});

/** Streams a completion from the mock engine and returns the usage of its final chunk. */
async function complete(prompt: number[]): Promise<{ prompt_tokens: number; prompt_tokens_details?: { cached_tokens: number } }> {
  const res = await fetch(`${mocker.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock-model', prompt, stream: true, stream_options: { include_usage: true }, max_tokens: 3 }),
  });
  expect(res.status).toBe(200);
  let usage: unknown;
  for (const block of (await res.text()).split('\n\n')) {
    const line = block.trim();
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const chunk = JSON.parse(line.slice(6)) as { usage?: unknown };
    if (chunk.usage) usage = chunk.usage;
  }
  expect(usage).toBeDefined();
  return usage as { prompt_tokens: number; prompt_tokens_details?: { cached_tokens: number } };
}

describe('against a real mock engine (src/mocker)', () => {
  it('delivered reuse from usage chunks, the mirrored engine counters, and the report agree', async () => {
    const router = new KvRouter({ blockSize: BS });
    // No KV events from this mocker: approximate mode, the router records its own decisions.
    router.addSource({ workerId: 'm0', dpRank: 0 }, { mode: 'approx' });
    const metrics = new RouterMetrics({ router });
    const mirror = new EngineMirror({ registry: metrics.registry, targets: () => [{ workerId: 'm0', url: mocker.url }] });
    metrics.attachMirror(mirror);
    await mirror.scrapeOnce(); // baseline
    const before = await metrics.render();

    const prompt = Array.from({ length: 20 * BS + 5 }, (_, i) => 100 + i);
    const deliveredCached: number[] = [];
    for (let i = 0; i < 2; i++) {
      const d = router.route({ requestId: `q${i}`, tokens: prompt }, Date.now());
      if (d.kind !== 'routed') throw new Error(d.reason);
      metrics.routed(d, { tokenize: 0 });
      const usage = await complete(prompt);
      expect(usage.prompt_tokens).toBe(prompt.length);
      const cached = usage.prompt_tokens_details!.cached_tokens;
      deliveredCached.push(cached);
      const f = router.finish(d.requestId, { cachedTokens: cached, outcome: 'ok' }, Date.now())!;
      metrics.finished(f);
      metrics.outcome('ok');
    }
    // vLLM semantics: the repeat hits every full block but never the last token: floor((325-1)/16)*16 = 320
    expect(deliveredCached).toEqual([0, 320]);

    await mirror.scrapeOnce();
    const after = await metrics.render();
    const s = parsePrometheusText(after).samples;
    // delivered (from usage) and predicted for the same requests
    expect(sumOf(s, 'router_kv_engine_cached_tokens_total', { worker: 'm0' })).toBe(320);
    expect(sumOf(s, 'router_kv_engine_prompt_tokens_total', { worker: 'm0' })).toBe(650);
    expect(sumOf(s, 'router_kv_predicted_cached_tokens_total', { worker: 'm0' })).toBe(320);
    expect(sumOf(s, 'router_kv_prediction_error_tokens_sum', { worker: 'm0' })).toBe(0);
    // the engine's own counters, mirrored: the same tokens, seen from the engine side
    expect(sumOf(s, 'router_engine_prefix_cache_queries_total', { worker: 'm0' })).toBe(650);
    expect(sumOf(s, 'router_engine_prefix_cache_hits_total', { worker: 'm0' })).toBe(320);

    const r = buildReport({ from: before, to: after, windowS: 1 });
    expect(r.engineSource).toBe('mirror');
    expect(r.overall.engine.ratio).toBeCloseTo(320 / 650, 12);
    expect(r.overall.delivered.tokenWeighted).toBeCloseTo(320 / 650, 12);
    expect(r.overall.predicted.blockWeighted).toBeCloseTo(20 / 42, 12); // isl = ceil(325/16) = 21 per request
    expect(r.verdict).toBe('router view accurate: block-weighted 0.476 vs engine 0.492');

    // engine restart: its counters go back to zero; the mirror stitches instead of going negative
    await mocker.restart();
    await complete(prompt.slice(0, 2 * BS + 1));
    await mirror.scrapeOnce();
    const s2 = parsePrometheusText(await metrics.render()).samples;
    expect(sumOf(s2, 'router_engine_prefix_cache_queries_total', { worker: 'm0' })).toBe(650 + 2 * BS + 1);
    expect(sumOf(s2, 'router_engine_counter_resets_total', { worker: 'm0' })).toBe(1);
  });
});
