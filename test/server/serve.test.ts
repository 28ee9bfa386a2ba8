import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../../src/server/app.ts';
import { FakeEngine } from './fake-engine.ts';
import { json, post, randomTokens, serve, sleep, until } from './helpers.ts';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

async function fleet(n: number, opts: ConstructorParameters<typeof FakeEngine>[0] = {}): Promise<FakeEngine[]> {
  const engines = await Promise.all(Array.from({ length: n }, () => new FakeEngine(opts).start()));
  cleanups.push(async () => {
    await Promise.all(engines.map((e) => e.stop()));
  });
  return engines;
}

async function router(engines: FakeEngine[], overrides: Parameters<typeof serve>[0] = {}): Promise<RunningServer> {
  const s = await serve({ workers: engines.map((e) => ({ url: e.url })), ...overrides });
  cleanups.push(() => s.close(200));
  return s;
}

function client(s: RunningServer): OpenAI {
  return new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });
}

describe('kvroute serve with the openai client', () => {
  it('streams a chat completion, hiding the usage chunk it asked for on the client’s behalf', async () => {
    const engines = await fleet(2);
    const s = await router(engines);
    const { data: stream, response } = await client(s)
      .chat.completions.create({ model: 'fake-model', messages: [{ role: 'user', content: 'hi' }], stream: true })
      .withResponse();
    expect(response.headers.get('x-kvroute-worker')).toMatch(/^127\.0\.0\.1:\d+$/);
    expect(response.headers.get('x-kvroute-isl-blocks')).toBe('0'); // no tokenizer: routed without affinity
    let text = '';
    let usageChunks = 0;
    for await (const chunk of stream) {
      if (chunk.usage) usageChunks++;
      text += chunk.choices[0]?.delta?.content ?? '';
    }
    expect(text).toBe('xxx');
    expect(usageChunks).toBe(0);
    const upstream = engines.find((e) => e.requests === 1)!;
    expect(upstream.lastBody?.stream_options).toEqual({ include_usage: true });
    await until(() => s.router.state().inFlight === 0);
  });

  it('forwards the client’s bytes of a token-id completion as they came (a stream: with the usage request appended)', async () => {
    const engines = await fleet(1);
    const s = await router(engines);
    const ids = randomTokens(300, 7);
    const plain = `{ "model" : "fake-model",\n "prompt": [ ${ids.join(' ,')} ], "max_tokens": 2, "user": "é😀" }  `;
    expect((await post(`${s.url}/v1/completions`, plain)).status).toBe(200);
    expect(engines[0].lastRaw?.toString('utf8')).toBe(plain);
    const streamed = `{"model":"fake-model","prompt":[${ids.join(',')}],"stream":true,"max_tokens":2}`;
    const res = await post(`${s.url}/v1/completions`, streamed);
    expect(res.status).toBe(200);
    await res.text();
    expect(engines[0].lastRaw?.toString('utf8')).toBe(`${streamed.slice(0, -1)},"stream_options":{"include_usage":true}}`);
    // Bytes that are not valid UTF-8 go upstream as their decoded text, as before.
    const invalid = Buffer.concat([
      Buffer.from(`{"model":"fake-model","prompt":[${ids.join(',')}],"user":"`),
      Buffer.from([0xff]),
      Buffer.from('"}'),
    ]);
    const bad = await fetch(`${s.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: invalid });
    expect(bad.status).toBe(200);
    expect(engines[0].lastRaw?.equals(Buffer.from(invalid.toString('utf8')))).toBe(true);
    expect(engines[0].lastBody?.prompt).toEqual(ids);
    await until(() => s.router.state().inFlight === 0);
  });

  it('passes the usage chunk through when the client asks for it', async () => {
    const engines = await fleet(1);
    const s = await router(engines);
    const stream = await client(s).completions.create({
      model: 'fake-model',
      prompt: randomTokens(40, 1),
      stream: true,
      stream_options: { include_usage: true },
    });
    const usage = [];
    for await (const chunk of stream) if (chunk.usage) usage.push(chunk.usage);
    expect(usage).toHaveLength(1);
    expect(usage[0].prompt_tokens).toBe(40);
  });

  it('answers a non-streaming completion with token-id prompts and routing headers', async () => {
    const engines = await fleet(2);
    const s = await router(engines);
    const prompt = randomTokens(100, 2);
    const { data, response } = await client(s).completions.create({ model: 'fake-model', prompt }).withResponse();
    expect(data.choices[0].text).toBe('xxx');
    expect(response.headers.get('x-kvroute-isl-blocks')).toBe(String(Math.ceil(100 / 16)));
    expect(response.headers.get('x-kvroute-overlap-blocks')).toBe('0');
    const again = await client(s).completions.create({ model: 'fake-model', prompt }).withResponse();
    expect(again.response.headers.get('x-kvroute-worker')).toBe(response.headers.get('x-kvroute-worker'));
    expect(again.response.headers.get('x-kvroute-overlap-blocks')).toBe('6');
    // The engine's delivered cached tokens reached the ledger.
    expect(s.router.ledger.total.deliveredCachedTokens).toBe(96);
  });

  it('turns bad input into OpenAI errors the SDK understands (never a 500)', async () => {
    const engines = await fleet(1);
    const s = await router(engines);
    const c = client(s);
    await expect(c.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] })).rejects.toMatchObject({
      status: 404,
      code: 'model_not_found',
    });
    await expect(c.chat.completions.create({ model: 'fake-model', messages: [] })).rejects.toMatchObject({
      status: 400,
      param: 'messages',
    });
    await expect(c.completions.create({ model: 'fake-model', prompt: [1.5, -2] as unknown as number[] })).rejects.toMatchObject({
      status: 400,
      param: 'prompt',
    });
    for (const [body, code] of [
      ['{not json', 'invalid_json'],
      ['[1,2]', 'invalid_request'],
      [JSON.stringify({ model: 'fake-model', prompt: 'x', kvroute: { policy: 'telepathy' } }), 'invalid_request'],
      [JSON.stringify({ model: 'fake-model', prompt: 'x', stream: 'yes' }), 'invalid_request'],
    ]) {
      const r = await post(`${s.url}/v1/completions`, body);
      expect(r.status).toBe(400);
      expect((await json(r)).error.code).toBe(code);
    }
    const r404 = await fetch(`${s.url}/nowhere`);
    expect(r404.status).toBe(404);
    expect((await json(r404)).error.type).toBe('not_found_error');
  });
});

describe('prefix affinity', () => {
  it('10 request pairs sharing an 8k-token prefix: the second lands on the first’s worker with ≥96% reuse predicted and delivered', async () => {
    const engines = await fleet(4);
    const s = await router(engines);
    const c = client(s);
    for (let pair = 0; pair < 10; pair++) {
      const prefix = randomTokens(8192, 100 + pair);
      const first = await c.completions
        .create({ model: 'fake-model', prompt: [...prefix, ...randomTokens(64, 1000 + pair)], max_tokens: 4 })
        .withResponse();
      const second = await c.completions
        .create({ model: 'fake-model', prompt: [...prefix, ...randomTokens(64, 2000 + pair)], max_tokens: 4 })
        .withResponse();
      const h = second.response.headers;
      expect(h.get('x-kvroute-worker')).toBe(first.response.headers.get('x-kvroute-worker'));
      const predicted = Number(h.get('x-kvroute-overlap-blocks')) / Number(h.get('x-kvroute-isl-blocks'));
      const usage = second.data.usage!;
      const delivered = usage.prompt_tokens_details!.cached_tokens! / usage.prompt_tokens;
      expect(predicted).toBeGreaterThanOrEqual(0.96);
      expect(delivered).toBeGreaterThanOrEqual(0.96);
    }
    // Pairs spread over the fleet instead of piling onto one worker.
    expect(engines.filter((e) => e.requests > 0).length).toBeGreaterThan(1);
  });

  it('keeps LoRA adapters and cache_salt tenants apart in the hash seed', async () => {
    const engines = await fleet(1, { adapters: ['sql-lora'] });
    const s = await router(engines);
    const prompt = randomTokens(320, 7);
    const overlap = async (body: Record<string, unknown>) =>
      (await post(`${s.url}/v1/completions`, { prompt, ...body })).headers.get('x-kvroute-overlap-blocks');
    expect(await overlap({ model: 'fake-model' })).toBe('0');
    expect(await overlap({ model: 'fake-model' })).toBe('20');
    expect(await overlap({ model: 'sql-lora' })).toBe('0'); // same tokens, different adapter: no reuse
    expect(await overlap({ model: 'sql-lora' })).toBe('20');
    expect(await overlap({ model: 'fake-model', cache_salt: 'tenant-a' })).toBe('0');
    expect(await overlap({ model: 'fake-model', cache_salt: 'tenant-a' })).toBe('20');
  });
});

describe('workers', () => {
  it('sends data-parallel ranks as separate sources, naming the rank to the engine', async () => {
    const engines = await fleet(1);
    const s = await serve({ workers: [{ url: engines[0].url, id: 'dp', dp: 2 }] });
    cleanups.push(() => s.close(200));
    expect(s.router.sourceKeys().sort()).toEqual(['dp', 'dp#1']);
    const ranks = new Set<string>();
    for (let i = 0; i < 6; i++) {
      const r = await post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: randomTokens(64, 300 + i), stream: true });
      await r.text();
      const worker = r.headers.get('x-kvroute-worker')!;
      expect(engines[0].lastHeaders['x-data-parallel-rank']).toBe(worker === 'dp' ? '0' : '1');
      ranks.add(worker);
    }
    expect(ranks.size).toBe(2); // load spreads over both ranks
  });

  it('tokenizes through the worker’s POST /tokenize when there is no local tokenizer, once per distinct prompt', async () => {
    const engines = await fleet(2);
    const s = await router(engines, { remoteTokenize: true });
    const body = {
      model: 'fake-model',
      messages: [
        { role: 'system', content: 'S'.repeat(400) },
        { role: 'user', content: 'hi' },
      ],
    };
    const a = await post(`${s.url}/v1/chat/completions`, body);
    const b = await post(`${s.url}/v1/chat/completions`, body);
    expect(Number(a.headers.get('x-kvroute-isl-blocks'))).toBeGreaterThan(20);
    expect(b.headers.get('x-kvroute-worker')).toBe(a.headers.get('x-kvroute-worker'));
    expect(Number(b.headers.get('x-kvroute-overlap-blocks'))).toBeGreaterThan(20);
    expect(engines[0].tokenizeCalls + engines[1].tokenizeCalls).toBe(1); // the second came from the cache
    // The answer cache's memory gauges: one answer, its estimate within the default 64 MiB budget.
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toContain(`router_tokenizer_cache_limit_bytes ${64 * 2 ** 20}`);
    expect(metrics).toContain('router_tokenizer_cache_entries 1');
    expect(Number(/router_tokenizer_cache_bytes (\d+)/.exec(metrics)?.[1])).toBeGreaterThan(400); // the key alone is 400+ characters
  });
});

describe('failures', () => {
  it('retries on the next best worker after a 5xx or a refused connection', async () => {
    const engines = await fleet(3);
    engines[0].fail = 'status500';
    engines[1].fail = 'status500';
    const dead = await new FakeEngine().start();
    await dead.stop(); // its port now refuses connections
    const s = await router([...engines, dead], { retries: 3 });
    for (let i = 0; i < 6; i++) {
      const r = await post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: randomTokens(64, 50 + i) });
      expect(r.status).toBe(200);
      expect(r.headers.get('x-kvroute-worker')).toBe(new URL(engines[2].url).host);
    }
    expect(engines[0].requests + engines[1].requests).toBeGreaterThan(0);
    expect(s.router.state().inFlight).toBe(0);
    // Each request counts once in the hit-rate accounting, where it was served, not once per attempt.
    const islPerRequest = Math.ceil(64 / 16);
    expect(s.router.ledger.view().requests).toBe(6);
    expect(s.router.ledger.total.islBlocks).toBe(6 * islPerRequest);
    const text = await (await fetch(`${s.url}/metrics`)).text();
    const sum = (name: string) =>
      text
        .split('\n')
        .filter((l) => l.startsWith(name))
        .reduce((a, l) => a + Number(l.split(' ').pop()), 0);
    expect(sum('router_kv_isl_blocks_total{')).toBe(6 * islPerRequest);
    expect(sum('router_kv_hit_rate_count{')).toBe(6);
  });

  it('answers 502 in the OpenAI shape when every attempt fails', async () => {
    const engines = await fleet(2);
    for (const e of engines) e.fail = 'status500';
    const s = await router(engines, { retries: 2 });
    const r = await post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: 'hello' });
    expect(r.status).toBe(502);
    const body = await json(r);
    expect(body.error.type).toBe('upstream_error');
    expect(body.error.message).toContain('500');
    expect(s.router.state().inFlight).toBe(0);
  });

  it('opens the circuit breaker after repeated failures', async () => {
    const engines = await fleet(2);
    engines[0].fail = 'status500';
    const s = await router(engines, { breakerThreshold: 2, breakerCooldownMs: 60_000 });
    for (let i = 0; i < 8; i++) await post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: randomTokens(32, i) });
    expect(s.workers.get(new URL(engines[0].url).host)!.breaker).toBe('open');
    expect(engines[0].requests).toBe(2); // no traffic once open
  });

  it('reports a mid-stream failure as an SSE error event, then closes and frees the load', async () => {
    const engines = await fleet(1, { chunks: 5, chunkDelayMs: 30 });
    engines[0].fail = 'midstream';
    const s = await router(engines);
    const r = await post(`${s.url}/v1/chat/completions`, {
      model: 'fake-model',
      messages: [{ role: 'user', content: 'x' }],
      stream: true,
    });
    expect(r.status).toBe(200);
    const text = await r.text();
    const events = text.split('\n\n').filter(Boolean);
    expect(events[0]).toContain('chat.completion.chunk');
    const last = JSON.parse(events[events.length - 1].slice('data: '.length));
    expect(last.error.type).toBe('upstream_error');
    expect(s.router.state().inFlight).toBe(0);
  });

  it('a whole answer cut mid-body failed before answering: retried on the next worker, its usage read, nothing leaked', async () => {
    const engines = await fleet(2);
    engines[0].fail = 'midstream';
    const s = await router(engines, { retries: 2 });
    for (let i = 0; i < 4; i++) {
      const r = await post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: randomTokens(64, 80 + i) });
      expect(r.status).toBe(200);
      expect(r.headers.get('x-kvroute-worker')).toBe(new URL(engines[1].url).host);
      const body = (await r.json()) as { usage: { prompt_tokens: number } };
      expect(body.usage.prompt_tokens).toBe(64);
    }
    expect(engines[0].requests).toBeGreaterThan(0);
    expect(s.router.state().inFlight).toBe(0);
    expect(s.router.ledger.view().requests).toBe(4);
  });

  it('sends a stream’s head as soon as the engine does, before its first event; head, events and end arrive whole', async () => {
    // An engine that sends its head at once and its first event only once told to (or after 3 s): the client must see
    // the head first. The events that come with or after it reach the client as sent.
    let release: () => void = () => {};
    const released = new Promise<void>((r) => {
      release = r;
    });
    const order: string[] = [];
    const ev = (text: string) => `data: {"id":"e","object":"text_completion","choices":[{"index":0,"text":"${text}"}]}\n\n`;
    const sent = `${ev('a')}${ev('b')}data: [DONE]\n\n`;
    const engine = createServer((req, res) => {
      req.resume();
      if (req.method !== 'POST') {
        // Health checks and the model list.
        res.writeHead(200, { 'content-type': 'application/json' }).end('{"object":"list","data":[{"id":"fake-model","object":"model"}]}');
        return;
      }
      req.on('end', async () => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.flushHeaders();
        await Promise.race([released, sleep(3000)]);
        order.push('first event sent');
        res.end(sent);
      });
    });
    await new Promise<void>((r) => engine.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise((r) => engine.close(() => r())));
    const s = await serve({ workers: [{ url: `http://127.0.0.1:${(engine.address() as AddressInfo).port}` }] });
    cleanups.push(() => s.close(200));
    const r = await post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: randomTokens(64, 5), stream: true });
    order.push('head received');
    release();
    expect(r.status).toBe(200);
    expect(r.headers.get('content-type')).toBe('text/event-stream');
    expect(r.headers.get('x-kvroute-worker')).toMatch(/^127\.0\.0\.1:\d+$/);
    const text = await r.text();
    expect(order).toEqual(['head received', 'first event sent']);
    expect(text).toBe(sent);
    await until(() => s.router.state().inFlight === 0);
  });

  it('aborts the upstream when the client disconnects, and active load returns to zero', async () => {
    const engines = await fleet(1, { chunks: 50, chunkDelayMs: 50 });
    const s = await router(engines);
    const ac = new AbortController();
    const r = await fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'fake-model', prompt: randomTokens(256, 3), stream: true }),
      signal: ac.signal,
    });
    const reader = r.body!.getReader();
    await reader.read(); // first chunk arrived
    expect(s.router.state().sources[0].activeBlocks).toBeGreaterThan(0);
    ac.abort();
    await until(() => engines[0].aborted === 1);
    await until(() => s.router.state().inFlight === 0);
    const src = s.router.state().sources[0];
    expect(src.activeRequests).toBe(0);
    expect(src.activeBlocks).toBe(0);
    expect(src.activePrefillTokens).toBe(0);
  });
});

describe('queue and limits', () => {
  it('queues while all workers are busy, then routes when load frees up', async () => {
    const engines = await fleet(1, { firstChunkDelayMs: 200 });
    const s = await router(engines, { busyPrefillTokens: 0, queueLimit: 4, queueTimeoutMs: 5000 });
    const a = post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: randomTokens(64, 1), stream: true });
    await until(() => engines[0].requests === 1);
    const b = post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: randomTokens(64, 2), stream: true });
    await until(() => s.dispatcher.queueLength === 1);
    expect(engines[0].requests).toBe(1);
    const [ra, rb] = await Promise.all([a, b]);
    expect(ra.status).toBe(200);
    expect(rb.status).toBe(200);
    await Promise.all([ra.text(), rb.text()]);
    expect(engines[0].requests).toBe(2);
  });

  it('answers 503 with Retry-After when the queue is full or the wait times out', async () => {
    const engines = await fleet(1, { firstChunkDelayMs: 600 });
    const s = await router(engines, { busyPrefillTokens: 0, queueLimit: 1, queueTimeoutMs: 150 });
    const a = post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: randomTokens(64, 1), stream: true });
    await until(() => engines[0].requests === 1);
    const b = post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: randomTokens(64, 2) });
    await until(() => s.dispatcher.queueLength === 1);
    const c = await post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: randomTokens(64, 3) });
    expect(c.status).toBe(503);
    expect(c.headers.get('retry-after')).toBe('1');
    expect((await json(c)).error.code).toBe('queue_full');
    const rb = await b;
    expect(rb.status).toBe(503);
    expect(rb.headers.get('retry-after')).not.toBeNull();
    expect((await json(rb)).error.message).toContain('busy');
    await (await a).text();
  });

  it('a client that gives up while queued leaves the queue and never reaches an engine', async () => {
    const engines = await fleet(1, { firstChunkDelayMs: 400 });
    const s = await router(engines, { busyPrefillTokens: 0, queueLimit: 4, queueTimeoutMs: 5000 });
    const a = post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: randomTokens(64, 1), stream: true });
    await until(() => engines[0].requests === 1);
    const ac = new AbortController();
    const b = fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'fake-model', prompt: randomTokens(64, 2) }),
      signal: ac.signal,
    }).catch((e: Error) => e);
    await until(() => s.dispatcher.queueLength === 1);
    ac.abort();
    await until(() => s.dispatcher.queueLength === 0);
    expect(await b).toBeInstanceOf(Error);
    await (await a).text();
    expect(engines[0].requests).toBe(1);
    await until(() => s.router.state().inFlight === 0);
  });

  it('rejects bodies over the limit with 413', async () => {
    const engines = await fleet(1);
    const s = await router(engines, { bodyLimitBytes: 1024 });
    const r = await post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: 'x'.repeat(4000) });
    expect(r.status).toBe(413);
    expect((await json(r)).error.code).toBe('request_too_large');
    expect(engines[0].requests).toBe(0);
  });
});

describe('operations', () => {
  it('serves /health, /v1/models, /metrics and /debug/state', async () => {
    const engines = await fleet(2, { adapters: ['a1'] });
    const s = await router(engines);
    expect((await fetch(`${s.url}/health`)).status).toBe(200);
    const models = await json(await fetch(`${s.url}/v1/models`));
    expect(models.data.map((m: { id: string }) => m.id).sort()).toEqual(['a1', 'fake-model']);
    await post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: randomTokens(64, 9) });
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/router_kv_isl_blocks_total\{worker="127\.0\.0\.1:\d+"\} 4/);
    // The bounded tables' memory gauges, with their budgets.
    expect(metrics).toMatch(/router_table_bytes\{table="sessions"\} 0/);
    expect(metrics).toContain(`router_table_limit_bytes{table="response_pins"} ${32 * 2 ** 20}`);
    const state = await json(await fetch(`${s.url}/debug/state`));
    expect(state.workers).toHaveLength(2);
    expect(state.recentDecisions[0].islBlocks).toBe(4);
    expect(state.router.sources).toHaveLength(2);
    // The pipeline of the policy it ran, from the registry's describe(): scorers with formulas, the picker.
    expect(state.router.policies[0]).toMatchObject({
      name: state.router.policy,
      picker: { name: 'banded-min' },
      scorers: [
        { name: 'prefill-load', weight: 'prefillLoadScale' },
        { name: 'pressure-decode', weight: '1' },
      ],
    });
    const page = await fetch(`${s.url}/dashboard`);
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toContain('text/html');
    const dash = await json(await fetch(`${s.url}/dashboard/data.json`));
    expect(Object.keys(dash.workers)).toHaveLength(2);
  });

  it('ejects a worker after failed health checks, answers 503 without one, and readmits it', async () => {
    const engines = await fleet(1);
    const s = await router(engines, { healthIntervalMs: 30, ejectAfter: 2 });
    engines[0].fail = 'health503';
    await until(() => s.workers.healthyCount() === 0);
    expect((await fetch(`${s.url}/health`)).status).toBe(503);
    const r = await post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: 'x' });
    expect(r.status).toBe(503);
    expect((await json(r)).error.code).toBe('no_healthy_workers');
    engines[0].fail = 'none';
    await until(() => s.workers.healthyCount() === 1);
    expect((await post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: 'x' })).status).toBe(200);
  });

  it('admin API: disabled without a token, bearer-protected with one', async () => {
    const engines = await fleet(2);
    const off = await router([engines[0]]);
    expect((await post(`${off.url}/admin/workers`, { url: engines[1].url })).status).toBe(404);
    const s = await router([engines[0]], { adminToken: 'sekret' });
    expect((await post(`${s.url}/admin/workers`, { url: engines[1].url })).status).toBe(401);
    const auth = { authorization: 'Bearer sekret' };
    const bad = await post(`${s.url}/admin/workers`, { url: 'ftp://x' }, auth);
    expect(bad.status).toBe(400);
    const added = await post(`${s.url}/admin/workers`, { spec: `${engines[1].url},id=second` }, auth);
    expect(added.status).toBe(201);
    expect(s.router.hasSource('second')).toBe(true);
    const del = await fetch(`${s.url}/admin/workers/second`, { method: 'DELETE', headers: auth });
    expect(del.status).toBe(200);
    expect(s.router.hasSource('second')).toBe(false);
    expect((await fetch(`${s.url}/admin/workers/second`, { method: 'DELETE', headers: auth })).status).toBe(404);
  });

  it('security: API keys (401), rate limit (429), worker host allow-list (403), nesting depth (400)', async () => {
    const engines = await fleet(1);
    const s = await router(engines, {
      apiKeys: ['sk-test-0123456789abcdef'],
      rateLimit: '1,2',
      adminToken: 'sekret',
      allowWorkerHosts: ['10.0.0.0/8'],
      maxJsonDepth: 16,
    });
    const body = { model: 'fake-model', prompt: 'x' };
    const noKey = await post(`${s.url}/v1/completions`, body);
    expect(noKey.status).toBe(401);
    expect((await json(noKey)).error.type).toBe('authentication_error');
    const auth = { authorization: 'Bearer sk-test-0123456789abcdef' };
    expect((await post(`${s.url}/v1/completions`, body, auth)).status).toBe(200);
    expect((await post(`${s.url}/v1/completions`, body, auth)).status).toBe(200);
    const limited = await post(`${s.url}/v1/completions`, body, auth);
    expect(limited.status).toBe(429);
    expect(limited.headers.get('retry-after')).toBe('1');
    const outside = await post(`${s.url}/admin/workers`, { url: 'http://192.168.1.5:8000' }, { authorization: 'Bearer sekret' });
    expect(outside.status).toBe(403);
    const deep = await post(`${s.url}/admin/workers`, '['.repeat(5000) + ']'.repeat(5000), { authorization: 'Bearer sekret' });
    expect(deep.status).toBe(400);
    expect((await json(deep)).error.code).toBe('nesting_too_deep');
  });

  it('refuses deeply nested request bodies with 400, never a 500', async () => {
    const engines = await fleet(1);
    const s = await router(engines);
    const content = `${'['.repeat(20_000)}"x"${']'.repeat(20_000)}`; // JSON.stringify itself would overflow on it
    const r = await post(`${s.url}/v1/chat/completions`, `{"model":"fake-model","messages":[{"role":"user","content":${content}}]}`);
    expect(r.status).toBe(400);
    expect((await json(r)).error.code).toBe('nesting_too_deep');
  });

  it('shuts down gracefully: refuses new work, lets an in-flight stream finish', async () => {
    const engines = await fleet(1, { chunks: 4, chunkDelayMs: 60 });
    const s = await serve({ workers: [{ url: engines[0].url }] });
    const r = await post(`${s.url}/v1/completions`, { model: 'fake-model', prompt: 'x', stream: true });
    const closing = s.close(5000);
    const text = await r.text();
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true);
    await closing;
    await expect(fetch(`${s.url}/health`)).rejects.toThrow();
  });
});

// Silence the unused helpers when some tests are filtered.
void sleep;
void beforeAll;
void afterAll;
