/**
 * kvroute serve in front of disaggregated mock fleets (real sockets: HTTP legs, ZMQ events, the SGLang bootstrap
 * server), driven by the official openai SDK: each flavour streams; the headers, the client's usage, the ledger and
 * the metrics tell the prefill pool's truth; prefill death, lease expiry, decode failure and client disconnect.
 */
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { startMocker, type MockerHandle, type MockerOptions } from '../../src/mocker/server.ts';
import type { RunningServer } from '../../src/server/app.ts';
import { randomTokens, serve, until } from './helpers.ts';

const started: { close(): Promise<void> }[] = [];
afterEach(async () => {
  await Promise.all(started.splice(0).map((s) => s.close()));
});

async function mock(pd: MockerOptions['pd'], seed: number, extra: Partial<MockerOptions> = {}): Promise<MockerHandle> {
  // TensorRT-LLM engines publish their KV events as trtllm-serve does: drained over HTTP (the router polls them).
  const format = pd?.protocol === 'trtllm' ? { eventFormat: 'trtllm' as const } : {};
  const m = await startMocker({ model: 'm', speedup: 50, seed, pd, ...format, ...extra });
  started.push(m);
  return m;
}

async function pdFleet(
  protocol: 'vllm' | 'sglang' | 'trtllm',
  opts: { prefill?: number; decode?: number; leaseMs?: number; policy?: 'fail' | 'recompute' } = {},
) {
  const prefill: MockerHandle[] = [];
  const decode: MockerHandle[] = [];
  for (let i = 0; i < (opts.prefill ?? 2); i++) {
    prefill.push(await mock({ role: 'prefill', protocol, leaseMs: opts.leaseMs, bootstrapPort: 0 }, 10 + i));
  }
  for (let i = 0; i < (opts.decode ?? 2); i++) {
    decode.push(await mock({ role: 'decode', protocol, loadFailurePolicy: opts.policy }, 20 + i));
  }
  const spec = (m: MockerHandle, id: string, role: string) => ({
    url: m.url,
    id,
    ...(m.zmqEndpoint !== null ? { events: m.zmqEndpoint } : {}),
    role,
    engine: protocol,
    ...(m.bootstrapPort !== null ? { bootstrap: m.bootstrapPort } : {}),
    models: ['m'],
  });
  return {
    prefill,
    decode,
    workers: [...prefill.map((m, i) => spec(m, `p${i}`, 'prefill')), ...decode.map((m, i) => spec(m, `d${i}`, 'decode'))],
  };
}

async function router(workers: unknown[], overrides: Record<string, unknown> = {}): Promise<RunningServer> {
  const s = await serve({ workers: workers as never, disaggMinUncachedTokens: 0, ...overrides });
  started.push({ close: () => s.close(200) });
  return s;
}

async function streamCompletion(s: RunningServer, prompt: number[], maxTokens = 6) {
  const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  const { data: stream, response } = await client.completions
    .create({ model: 'm', prompt, max_tokens: maxTokens, stream: true, stream_options: { include_usage: true } })
    .withResponse();
  let text = 0;
  let usage: OpenAI.Completions.CompletionUsage | undefined;
  for await (const chunk of stream) {
    if (chunk.choices[0]?.text !== undefined) text++;
    if (chunk.usage) usage = chunk.usage;
  }
  return { headers: response.headers, text, usage };
}

const metric = (text: string, name: string, labels: string) => {
  const m = new RegExp(`^${name}${labels ? `\\{${labels}\\}` : ''} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
};

describe.each(['vllm', 'sglang', 'trtllm'] as const)('P/D fleet, %s handoff', (protocol) => {
  it('the openai SDK streams through it; headers, usage, ledger and metrics tell the prefill pool’s truth', async () => {
    const f = await pdFleet(protocol);
    const s = await router(f.workers);
    const prompt = randomTokens(600, 7);
    const a = await streamCompletion(s, prompt);
    expect(a.text).toBe(6);
    expect(a.headers.get('x-kvroute-prefill-worker')).toMatch(/^p\d$/);
    expect(a.headers.get('x-kvroute-worker')).toMatch(/^d\d$/);
    // Cold on the prefill pool: no prefix hit, whatever the decode engine counted for the KV it received.
    expect(a.usage?.prompt_tokens).toBe(600);
    expect(a.usage?.prompt_tokens_details?.cached_tokens).toBe(0);
    // The same prompt again: the prefill pool chases its cache, and the client sees the prefill's hit.
    await until(() => s.router.state().index.blocks > 0);
    const b = await streamCompletion(s, prompt);
    expect(b.headers.get('x-kvroute-prefill-worker')).toBe(a.headers.get('x-kvroute-prefill-worker'));
    const overlap = Number(b.headers.get('x-kvroute-overlap-blocks'));
    expect(overlap).toBeGreaterThan(30);
    expect(b.usage?.prompt_tokens_details?.cached_tokens).toBe(overlap * 16);
    // Ledger and metrics: two requests, counted on the prefill workers only.
    const sources = [...s.router.ledger.bySource.entries()].filter(([, t]) => t.requests > 0).map(([k]) => k);
    expect(sources.every((k) => k.startsWith('p'))).toBe(true);
    expect(s.router.ledger.total.deliveredCachedTokens).toBe(overlap * 16);
    const text = await (await fetch(`${s.url}/metrics`)).text();
    expect(metric(text, 'router_pd_requests_total', 'path="disaggregated"')).toBe(2);
    expect(metric(text, 'router_pd_transferred_tokens_total', '')).toBe(1200);
    const delivered = ['p0', 'p1'].reduce((x, w) => x + metric(text, 'router_kv_engine_cached_tokens_total', `worker="${w}"`), 0);
    expect(delivered).toBe(overlap * 16);
    expect(
      metric(text, 'router_kv_engine_cached_tokens_total', 'worker="d0"') +
        metric(text, 'router_kv_engine_cached_tokens_total', 'worker="d1"'),
    ).toBe(0);
    expect(text).toMatch(/router_pd_leg_duration_seconds_count\{leg="prefill"\} 2/);
    // The decode side received the KV (and publishes it: its blocks reach the index as well).
    expect(f.decode.reduce((x, m) => x + (m.pd?.stats.transferredTokens ?? 0), 0)).toBeGreaterThan(0);
    if (protocol !== 'sglang') expect(f.prefill.reduce((x, m) => x + (m.pd?.stats.pulls ?? 0), 0)).toBe(2);
    if (protocol === 'trtllm') {
      // Each context leg carried its own positive 63-bit disagg_request_id, this replica's machine id in bits 12-21.
      const ids = f.prefill.flatMap((m) => m.pd?.stats.disaggRequestIds ?? []).map(BigInt);
      expect(ids.length).toBe(2);
      expect(new Set(ids).size).toBe(2);
      for (const id of ids) expect(id > 0n && id < 1n << 63n).toBe(true);
      expect(new Set(ids.map((id) => (id >> 12n) & 1023n)).size).toBe(1);
    }
  });

  it('a prefill worker that died: the prefill leg goes elsewhere; none left: decode alone', async () => {
    const f = await pdFleet(protocol, { prefill: 2 });
    const s = await router(f.workers);
    const prompt = randomTokens(400, 3);
    const warm = await streamCompletion(s, prompt);
    const p = Number(warm.headers.get('x-kvroute-prefill-worker')!.slice(1));
    await until(() => s.router.state().index.blocks > 0);
    await f.prefill[p].die(); // the warm one: the router will pick it again
    const again = await streamCompletion(s, prompt);
    expect(again.text).toBe(6);
    expect(again.headers.get('x-kvroute-prefill-worker')).toBe(`p${1 - p}`);
    expect(s.dispatcher.pdStats.handoffFailures.prefill_failed).toBe(1);
    await f.prefill[1 - p].die();
    const alone = await streamCompletion(s, randomTokens(400, 4));
    expect(alone.text).toBe(6);
    expect(alone.headers.get('x-kvroute-prefill-worker')).toBeNull();
    expect(s.dispatcher.pdStats.paths.decode_fallback).toBe(1);
  });

  it('DP ranks on both roles: each leg runs on the rank the router chose', async () => {
    const p = await mock({ role: 'prefill', protocol, bootstrapPort: 0 }, 31, { dataParallelSize: 2 });
    const d = await mock({ role: 'decode', protocol }, 32, { dataParallelSize: 2 });
    const w = (m: MockerHandle, id: string, role: string) => ({
      url: m.url,
      id,
      ...(m.zmqEndpoint !== null ? { events: m.zmqEndpoint } : {}),
      dp: 2,
      role,
      engine: protocol,
      ...(m.bootstrapPort !== null ? { bootstrap: m.bootstrapPort } : {}),
      models: ['m'],
    });
    const s = await router([w(p, 'p0', 'prefill'), w(d, 'd0', 'decode')]);
    const chosen = { p: [0, 0], d: [0, 0] };
    for (let i = 0; i < 6; i++) {
      const r = await streamCompletion(s, randomTokens(200, 100 + i), 2);
      chosen.p[r.headers.get('x-kvroute-prefill-worker') === 'p0#1' ? 1 : 0]++;
      chosen.d[r.headers.get('x-kvroute-worker') === 'd0#1' ? 1 : 0]++;
    }
    expect(p.engines.map((e) => e.counters.requestsFinished)).toEqual(chosen.p);
    expect(d.engines.map((e) => e.counters.requestsFinished)).toEqual(chosen.d);
    expect(chosen.d[0] > 0 && chosen.d[1] > 0).toBe(true); // the decode leg balances the ranks
  });

  it('client disconnect cancels both legs', async () => {
    const f = await pdFleet(protocol, { prefill: 1, decode: 1 });
    for (const m of f.prefill) m.faults.slowdown = 400; // a prefill that takes seconds
    const s = await router(f.workers);
    const ac = new AbortController();
    const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const pending = client.completions
      .create({ model: 'm', prompt: randomTokens(2000, 9), max_tokens: 4, stream: true }, { signal: ac.signal })
      .then(async (st) => {
        for await (const _ of st) {
          /* drain */
        }
      })
      .catch(() => undefined);
    await until(() => s.router.state().inFlight === 2);
    ac.abort();
    await pending;
    await until(() => s.router.state().inFlight === 0);
    expect(s.dispatcher.pdStats.handoffFailures.cancelled).toBe(1);
    await until(() => f.prefill[0].engine.numRunning + f.prefill[0].engine.numWaiting === 0);
  });
});

describe('vLLM leases and decode failures', () => {
  it('a lease gone before the pull: with recompute the decode side computes the prompt; with fail, a new pair per retry', async () => {
    const r = await pdFleet('vllm', { prefill: 1, decode: 1, leaseMs: 0, policy: 'recompute' });
    const s = await router(r.workers);
    const ok = await streamCompletion(s, randomTokens(300, 1));
    expect(ok.text).toBe(6);
    expect(r.prefill[0].pd?.stats.pullsGone).toBe(1);

    const f = await pdFleet('vllm', { prefill: 1, decode: 2, leaseMs: 0, policy: 'fail' });
    const s2 = await router(f.workers, { retries: 2, breakerThreshold: 10 });
    const client = new OpenAI({ baseURL: `${s2.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const err = await client.completions.create({ model: 'm', prompt: randomTokens(300, 2), max_tokens: 4, stream: true }).then(
      () => null,
      (e: unknown) => e as { status?: number },
    );
    expect(err?.status).toBe(502);
    // The retry of the decode leg (on the other decode worker) came with a new prefill leg: two pairs, two pulls.
    expect(f.prefill[0].pd?.stats.pulls).toBe(2);
    expect(s2.dispatcher.pdStats.handoffFailures.decode_failed).toBe(2);
  });

  it('dead decode workers: each pair fails, the next goes to another decode worker with a new prefill leg; back up, served', async () => {
    const f = await pdFleet('vllm', { prefill: 1, decode: 2 });
    const s = await router(f.workers, { retries: 1, breakerThreshold: 10 });
    await f.decode[0].die();
    await f.decode[1].die();
    const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const err = await client.completions.create({ model: 'm', prompt: randomTokens(300, 5), max_tokens: 4 }).then(
      () => null,
      (e: unknown) => e as { status?: number },
    );
    expect(err?.status).toBe(502);
    expect(s.dispatcher.pdStats.handoffFailures.decode_failed).toBe(2);
    await f.decode[0].restart();
    const ok = await client.completions.create({ model: 'm', prompt: randomTokens(300, 5), max_tokens: 4 });
    expect(ok.usage?.completion_tokens).toBe(4);
    // Non-streamed, the whole answer's usage is rewritten to the prefill's figure too: the failed pairs left the prompt
    // in p0's cache (18 full blocks, the last token never cached = 288), where the decode engine counted the 299 tokens
    // it received.
    expect(ok.usage?.prompt_tokens_details?.cached_tokens).toBe(288);
  });
});
