/**
 * `kvroute epp` as a user runs it: the built package's CLI in its own process, real mock engines behind it (HTTP and
 * ZMQ KV events), and a gRPC client playing Envoy's side of ext_proc (test/epp/envoy-side.ts): request headers, the
 * body in chunks, then the request proxied to the endpoint the picker named and its response reported back.
 * Asserted: the pick is the one `kvroute serve` makes for the same cache state; fallbacks; the subset hint; the
 * immediate responses; malformed streams end in an error and the process goes on; the accounting after served,
 * cancelled and fallen-back requests; gRPC health; P/D through the picker.
 */
import { spawn, spawnSync } from 'node:child_process';
import * as grpc from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eppSchema } from '../../src/config/serve.ts';
import { longFlag, settingsOf } from '../../src/config/settings.ts';
import { DESTINATION_HEADER, protocols } from '../../src/epp/protocol.ts';
import { startMocker, type MockerHandle, type MockerOptions } from '../../src/mocker/server.ts';
import type { RunningServer } from '../../src/server/app.ts';
import { randomTokens, serve } from '../server/helpers.ts';
import { EnvoySide } from './envoy-side.ts';
import { CLI, type EppProcess, eventually, metric, metricsText, startEpp } from './picker.ts';

const mocks: MockerHandle[] = [];
const clients: EnvoySide[] = [];
const procs: EppProcess[] = [];
const epp = (args: string[]) => track(startEpp(args));

async function track(p: Promise<EppProcess>): Promise<EppProcess> {
  const started = await p;
  procs.push(started);
  return started;
}

async function mock(seed: number, extra: Partial<MockerOptions> = {}): Promise<MockerHandle> {
  const m = await startMocker({ model: 'm', speedup: 50, seed, ...extra } as MockerOptions);
  mocks.push(m);
  return m;
}

function side(p: EppProcess): EnvoySide {
  const c = new EnvoySide(p.address);
  clients.push(c);
  return c;
}

const hostPort = (url: string) => new URL(url).host;

const completion = (prompt: number[], extra: Record<string, unknown> = {}) =>
  JSON.stringify({ model: 'm', prompt, max_tokens: 3, ...extra });

afterAll(async () => {
  for (const c of clients) c.close();
  await Promise.all(procs.map((p) => p.stop()));
  await Promise.all(mocks.map((m) => m.close()));
});

describe('kvroute epp in front of three mock engines', () => {
  let engines: MockerHandle[];
  let picker: EppProcess;
  let envoy: EnvoySide;
  let router: RunningServer;
  let specs: string[];
  const prefixes = [0, 1, 2].map((i) => randomTokens(256, 100 + i));

  beforeAll(async () => {
    engines = [await mock(1), await mock(2), await mock(3)];
    specs = engines.map((m, i) => `${m.url},events=${m.zmqEndpoint},id=w${i},model=m`);
    picker = await epp([...specs.flatMap((s) => ['-w', s]), '--tenant-token-budgets', 'tiny=10']);
    envoy = side(picker);
    router = await serve({
      workers: engines.map((m, i) => ({ url: m.url, events: m.zmqEndpoint!, id: `w${i}`, models: ['m'] })) as never,
    });
    // Each engine caches its own prefix (requests straight to the engine, past both routers): both learn it from the
    // engines' KV events, the same cache state.
    for (const [i, m] of engines.entries()) {
      const r = await fetch(`${m.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: completion(prefixes[i], { max_tokens: 1 }),
      });
      expect(r.status).toBe(200);
    }
    await eventually(async () => metric(await metricsText(picker), 'router_kv_index_blocks') >= 48);
    await eventually(async () => metric(await (await fetch(`${router.url}/metrics`)).text(), 'router_kv_index_blocks') >= 48);
  }, 60_000);

  afterAll(async () => {
    await router?.close(200);
  });

  it('picks what kvroute serve picks for the same cache state: the engine holding the prefix, with fallbacks', async () => {
    for (const [i, prefix] of prefixes.entries()) {
      const prompt = [...prefix, ...randomTokens(20, 900 + i)];
      const viaServe = await fetch(`${router.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: completion(prompt),
      });
      expect(viaServe.status).toBe(200);
      await viaServe.text();
      const body = completion(prompt);
      const r = await envoy.roundTrip({ body, chunks: 4 });
      if (!('picked' in r)) throw new Error(`immediate response: ${JSON.stringify(r.immediate)}`);
      const { picked, response } = r;
      const endpoints = picked.headers[DESTINATION_HEADER].split(',');
      expect(picked.headers['x-kvroute-worker']).toBe(viaServe.headers.get('x-kvroute-worker'));
      expect(endpoints[0]).toBe(hostPort(engines[i].url));
      // Fallbacks: the other engines, each once; the metadata form carries the very same value.
      expect(new Set(endpoints).size).toBe(3);
      expect(new Set(endpoints)).toEqual(new Set(engines.map((m) => hostPort(m.url))));
      expect(picked.metadata).toBe(picked.headers[DESTINATION_HEADER]);
      expect(picked.clearRouteCache).toBe(true);
      // The body went back unchanged; the engine answered through the "proxy", and the bytes came back as they were.
      expect(picked.body.toString()).toBe(body);
      expect(response.status).toBe(200);
      expect(response.echoed).toBe(response.body);
      expect(JSON.parse(response.body).usage.prompt_tokens_details.cached_tokens).toBeGreaterThanOrEqual(256);
    }
  });

  it('counts served requests like serve: routed, delivered cached tokens, ok outcome, nothing left in flight', async () => {
    const before = await metricsText(picker);
    const prompt = [...prefixes[1], ...randomTokens(30, 77)];
    const r = await envoy.roundTrip({ body: completion(prompt, { stream: true, stream_options: { include_usage: true } }) });
    if (!('picked' in r)) throw new Error('immediate');
    expect(r.response.body).toContain('data: [DONE]');
    expect(r.response.echoed).toBe(r.response.body);
    await eventually(
      async () =>
        metric(await metricsText(picker), 'router_requests_total', 'outcome="ok"') >
        metric(before, 'router_requests_total', 'outcome="ok"'),
    );
    const after = await metricsText(picker);
    expect(
      metric(after, 'router_kv_engine_cached_tokens_total') - metric(before, 'router_kv_engine_cached_tokens_total'),
    ).toBeGreaterThanOrEqual(256);
    expect(metric(after, 'router_kv_overlap_blocks_total') - metric(before, 'router_kv_overlap_blocks_total')).toBeGreaterThanOrEqual(16);
    expect(metric(after, 'router_requests_in_flight')).toBe(0);
    expect(metric(after, 'epp_requests_total', 'result="routed"')).toBeGreaterThanOrEqual(4);
    expect(metric(after, 'router_time_to_first_token_seconds_count')).toBeGreaterThan(
      metric(before, 'router_time_to_first_token_seconds_count'),
    );
  });

  it('serves the miss-ratio curves as serve does: GET /debug/mrc on the metrics listener and the router_kv_mrc_* gauges', async () => {
    const routed = await envoy.roundTrip({ body: completion([...prefixes[2], ...randomTokens(40, 4242)]) });
    expect('picked' in routed).toBe(true);
    const res = await fetch(`${picker.metricsUrl}/debug/mrc?host_blocks=1024`);
    expect(res.status).toBe(200);
    const r = (await res.json()) as { requests: number; sampledRefs: number; fleet: unknown[]; hostTier: { hostBlocksPerEngine: number } };
    // The requests routed through the picker so far, each fed once.
    expect(r.requests).toBeGreaterThanOrEqual(1);
    expect(r.sampledRefs).toBeGreaterThan(0);
    expect(r.fleet.length).toBe(8);
    expect(r.hostTier.hostBlocksPerEngine).toBe(1024);
    const bad = await fetch(`${picker.metricsUrl}/debug/mrc?host_blocks=-1`);
    expect(bad.status).toBe(400);
    expect(await bad.text()).toContain('host_blocks must be an integer >= 0');
    const text = await metricsText(picker);
    expect(text).toMatch(/# HELP router_kv_mrc_hit_ratio .*SHARDS/);
    expect(metric(text, 'router_kv_mrc_sample_rate')).toBeGreaterThan(0);
    expect(metric(text, 'router_kv_mrc_memory_bytes')).toBeGreaterThan(0);
  });

  it('a stream that ends mid-response finishes the request as cancelled: no load leaks', async () => {
    const before = await metricsText(picker);
    const s = envoy.stream();
    const r = await s.request({ body: completion(randomTokens(200, 5), { stream: true, max_tokens: 40 }) });
    if (!('picked' in r)) throw new Error('immediate');
    await s.proxy(r.picked, { stopAfterChunks: 1 });
    s.cancel();
    await s.status;
    await eventually(async () => {
      const t = await metricsText(picker);
      return (
        metric(t, 'router_requests_total', 'outcome="cancelled"') === metric(before, 'router_requests_total', 'outcome="cancelled"') + 1
      );
    });
    expect(metric(await metricsText(picker), 'router_requests_in_flight')).toBe(0);
  });

  it('honours the subset hint (list or comma-separated string); none of it eligible or empty: 503', async () => {
    const prompt = [...prefixes[0], ...randomTokens(10, 3)];
    const only = hostPort(engines[2].url);
    for (const subset of [[only], `${only}, 10.9.9.9:1`]) {
      const r = await envoy.roundTrip({ body: completion(prompt), subset });
      if (!('picked' in r)) throw new Error(`immediate: ${JSON.stringify(r.immediate)}`);
      expect(r.picked.headers[DESTINATION_HEADER]).toBe(only); // not the prefix holder, and no fallback outside it
    }
    for (const subset of [['10.9.9.9:1'], []]) {
      const r = await envoy.roundTrip({ body: completion(prompt), subset });
      if (!('immediate' in r)) throw new Error('picked');
      expect(r.immediate.status).toBe(503);
      expect(JSON.parse(r.immediate.body).error.code).toBe('subset_unavailable');
    }
  });

  it('answers bad requests and refusals with immediate responses: 400, 404, 413-free chunks, 429', async () => {
    const bad = await envoy.roundTrip({ body: '{"model": "m", "prompt": ' });
    if (!('immediate' in bad)) throw new Error('picked');
    expect(bad.immediate.status).toBe(400);
    expect(bad.immediate.headers['content-type']).toBe('application/json');
    const noModel = await envoy.roundTrip({ body: JSON.stringify({ prompt: 'hi' }) });
    expect('immediate' in noModel && noModel.immediate.status).toBe(400);
    const unknown = await envoy.roundTrip({ body: JSON.stringify({ model: 'nope', prompt: 'hi' }) });
    expect('immediate' in unknown && unknown.immediate.status).toBe(404);
    // The budget admits a request while the tenant has tokens left (the first uses them up); the next is refused.
    await envoy.roundTrip({ body: completion(randomTokens(50, 9)), headers: { 'x-kvroute-tenant': 'tiny' } });
    const budget = await envoy.roundTrip({ body: completion(randomTokens(50, 10)), headers: { 'x-kvroute-tenant': 'tiny' } });
    if (!('immediate' in budget)) throw new Error('picked');
    expect(budget.immediate.status).toBe(429);
    expect(Number(budget.immediate.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(JSON.parse(budget.immediate.body).error.code).toBe('token_budget_exceeded');
    const t = await metricsText(picker);
    expect(metric(t, 'epp_immediate_responses_total', 'status="400"')).toBeGreaterThanOrEqual(2);
    expect(metric(t, 'epp_immediate_responses_total', 'status="429"')).toBe(1);
  });

  it('a path that is not routed goes to a worker without accounting (GET /v1/models, no body)', async () => {
    const s = envoy.stream();
    const r = await s.request({ method: 'GET', path: '/v1/models' });
    if (!('picked' in r)) throw new Error('immediate');
    expect(engines.map((m) => hostPort(m.url))).toContain(r.picked.headers[DESTINATION_HEADER]);
    expect(r.picked.bodyChunks).toBe(0);
    s.end();
    await s.status;
  });

  it('counts a request where the proxy says it was served (a fallback), not where it was picked', async () => {
    const before = await metricsText(picker);
    const prompt = [...prefixes[0], ...randomTokens(10, 44)];
    const s = envoy.stream();
    const r = await s.request({ body: completion(prompt) });
    if (!('picked' in r)) throw new Error('immediate');
    const [, fallback] = r.picked.headers[DESTINATION_HEADER].split(',');
    const res = await s.proxy(r.picked, { endpoint: fallback, served: fallback });
    expect(res.status).toBe(200);
    s.end();
    await s.status;
    await eventually(async () => metric(await metricsText(picker), 'epp_served_elsewhere_total', 'outcome="moved"') === 1);
    const after = await metricsText(picker);
    expect(metric(after, 'router_requests_in_flight')).toBe(0);
    // Counted once, as served: one more ok request.
    expect(metric(after, 'router_requests_total', 'outcome="ok"') - metric(before, 'router_requests_total', 'outcome="ok"')).toBe(1);
  });

  it('malformed streams end in an error status; the process goes on serving', async () => {
    const empty = envoy.stream();
    empty.write({});
    expect((await empty.status).code).toBe(grpc.status.INVALID_ARGUMENT);
    const early = envoy.stream();
    early.write({ request_body: { body: Buffer.from('{}'), end_of_stream: true } });
    expect((await early.status).code).toBe(grpc.status.INVALID_ARGUMENT);
    const responseFirst = envoy.stream();
    responseFirst.write({ response_headers: { headers: { headers: [] } } });
    expect((await responseFirst.status).code).toBe(grpc.status.INVALID_ARGUMENT);
    const buffered = envoy.stream();
    buffered.write({
      request_headers: { headers: { headers: [] }, end_of_stream: false },
      protocol_config: { request_body_mode: 2, response_body_mode: 4 },
    });
    const bufferedStatus = await buffered.status;
    expect(bufferedStatus.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(bufferedStatus.details).toContain('FULL_DUPLEX_STREAMED');
    // Bytes that are no protobuf at all: a raw client on the same method.
    const raw = new grpc.Client(picker.address, grpc.credentials.createInsecure());
    clients.push({ close: () => raw.close() } as EnvoySide);
    const call = raw.makeBidiStreamRequest(
      '/envoy.service.ext_proc.v3.ExternalProcessor/Process',
      (b: Buffer) => b,
      (b: Buffer) => b,
    );
    const status = new Promise<grpc.StatusObject>((resolve) => call.on('status', resolve));
    call.on('error', () => {});
    call.on('data', () => {});
    call.write(Buffer.from([0xff, 0xff, 0xff, 0x0f, 0x01]));
    expect((await status).code).not.toBe(grpc.status.OK);
    // Still serving, nothing in flight, the errors counted.
    const ok = await envoy.roundTrip({ body: completion(randomTokens(40, 11)) });
    expect('picked' in ok).toBe(true);
    expect(picker.proc.exitCode).toBe(null);
    const t = await metricsText(picker);
    expect(metric(t, 'epp_requests_total', 'result="protocol_error"')).toBeGreaterThanOrEqual(4);
    expect(metric(t, 'router_requests_in_flight')).toBe(0);
  });

  it('gRPC health: liveness, readiness and the ext_proc service serving; an unknown service is NOT_FOUND', async () => {
    for (const service of ['', 'liveness', 'readiness', 'envoy.service.ext_proc.v3.ExternalProcessor']) {
      expect((await envoy.check(service)).status, service).toBe(1);
    }
    expect((await envoy.check('nope')).error?.code).toBe(grpc.status.NOT_FOUND);
    const health = await fetch(`${picker.metricsUrl}/health`);
    expect(health.status).toBe(200);
  });

  it('stops on SIGTERM with exit status 0', async () => {
    const code = await picker.stop();
    expect(code).toBe(0);
  });
});

describe('kvroute epp without a healthy endpoint', () => {
  it('answers 503; readiness and the ext_proc service are NOT_SERVING while liveness is SERVING', async () => {
    const picker = await epp(['-w', 'http://127.0.0.1:1,id=dead,model=m', '--eject-after', '1']);
    const envoy = side(picker);
    await eventually(async () => (await envoy.check('readiness')).status === 2);
    expect((await envoy.check('liveness')).status).toBe(1);
    expect((await envoy.check('envoy.service.ext_proc.v3.ExternalProcessor')).status).toBe(2);
    const r = await envoy.roundTrip({ body: completion(randomTokens(20, 1)) });
    if (!('immediate' in r)) throw new Error('picked');
    expect(r.immediate.status).toBe(503);
    expect(Number(r.immediate.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect((await fetch(`${picker.metricsUrl}/health`)).status).toBe(503);
    // Watch streams the current status first.
    const { Health } = protocols();
    const h = new Health(picker.address, grpc.credentials.createInsecure());
    const watch = (h as unknown as { Watch(r: unknown): grpc.ClientReadableStream<{ status: number }> }).Watch({ service: 'readiness' });
    const first = await new Promise<{ status: number }>((resolve) => watch.once('data', resolve));
    expect(first.status).toBe(2);
    watch.cancel();
    watch.on('error', () => {});
    h.close();
  }, 30_000);

  it('--help is complete: the picker, its ports, and every serve setting with its variable and config key', () => {
    const r = spawnSync(process.execPath, [CLI, 'epp', '--help'], { encoding: 'utf8' });
    expect(r.status).toBe(0);
    const help = r.stdout.replace(/\s+/g, ' ');
    for (const word of [
      'ext_proc',
      'x-gateway-destination-endpoint',
      'FULL_DUPLEX_STREAMED',
      'liveness',
      'readiness',
      'inference-extension',
      'docs/endpoint-picker.md',
      '--pool-name',
      '--secure-serving',
    ]) {
      expect(help).toContain(word);
    }
    // Every serve setting and the picker's own (listeners, TLS, metrics auth, the decision bound, --config-file).
    for (const { key, entry } of settingsOf(eppSchema)) {
      expect(help, key).toContain(longFlag(entry));
      expect(help, key).toContain(`env: ${entry.env}`);
      expect(help, key).toContain(`config: ${key}`);
    }
  });

  it('a bad setting exits 2 with one line', async () => {
    const proc = spawn(process.execPath, [CLI, 'epp', '--port', 'x'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let err = '';
    proc.stderr.on('data', (d: Buffer) => {
      err += d.toString();
    });
    const code = await new Promise((r) => proc.once('exit', r));
    expect(code).toBe(2);
    expect(err.trim().split('\n')).toHaveLength(1);
    expect(err).toMatch(/^kvroute epp: .*port/);
  });
});

describe.each(['vllm', 'sglang'] as const)('kvroute epp in front of a disaggregated %s fleet', (protocol) => {
  it('runs the prefill leg itself and sends the proxy to the decode worker with the handoff in the body', async () => {
    const prefill = await mock(31, { pd: { role: 'prefill', protocol, bootstrapPort: 0 } } as Partial<MockerOptions>);
    const decode = await mock(32, { pd: { role: 'decode', protocol } } as Partial<MockerOptions>);
    const bootstrap = protocol === 'sglang' ? `,bootstrap=${prefill.bootstrapPort}` : '';
    const picker = await epp([
      '-w',
      `${prefill.url},events=${prefill.zmqEndpoint},id=p0,model=m,role=prefill,engine=${protocol}${bootstrap}`,
      '-w',
      `${decode.url},events=${decode.zmqEndpoint},id=d0,model=m,role=decode,engine=${protocol}`,
      '--disagg-min-uncached-tokens',
      '0',
    ]);
    const envoy = side(picker);
    const prompt = randomTokens(300, 8);
    const r = await envoy.roundTrip({ body: completion(prompt, { stream: true, stream_options: { include_usage: true } }) });
    if (!('picked' in r)) throw new Error(`immediate: ${JSON.stringify(r.immediate)}`);
    expect(r.picked.headers[DESTINATION_HEADER].split(',')[0]).toBe(hostPort(decode.url));
    expect(r.picked.headers['x-kvroute-prefill-worker']).toBe('p0');
    const sent = JSON.parse(r.picked.body.toString());
    if (protocol === 'vllm') expect(sent.kv_transfer_params).toBeTruthy();
    else {
      expect(sent.bootstrap_host).toBe(new URL(prefill.url).hostname);
      expect(sent.bootstrap_port).toBe(prefill.bootstrapPort);
      expect(typeof sent.bootstrap_room).toBe('number');
    }
    expect(sent.stream).toBe(true);
    expect(sent.prompt).toEqual(prompt);
    expect(Number(r.picked.headers['content-length'])).toBe(r.picked.body.length);
    expect(r.response.status).toBe(200);
    expect(r.response.body).toContain('data: [DONE]');
    await eventually(async () => metric(await metricsText(picker), 'router_pd_requests_total', 'path="disaggregated"') === 1);
    const t = await metricsText(picker);
    expect(metric(t, 'router_pd_handoff_failures_total')).toBe(0);
    expect(metric(t, 'router_requests_in_flight')).toBe(0);
  }, 60_000);
});
