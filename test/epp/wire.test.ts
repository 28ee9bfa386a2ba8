/**
 * `kvroute epp` on the wire where Envoy is strict, as a process from the built package with a client playing Envoy's
 * side (test/epp/envoy-side.ts, which checks what Envoy checks); Envoy's limits over TLS, the picker's default. Written against envoyproxy/data-plane-api @84e84367
 * (envoy/extensions/filters/http/ext_proc/v3/processing_mode.proto: FULL_DUPLEX_STREAMED, chunks of at most 64 KiB,
 * trailer mode SEND; envoy/service/ext_proc/v3/external_processor.proto: a trailers message needs a TrailersResponse)
 * and the reference picker, llm-d/llm-d-inference-scheduler @520af478 (pkg/common/envoy/chunking.go: 62,000-byte
 * chunks, one empty end_of_stream chunk for an empty body; pkg/epp/requestcontrol/admission.go and
 * pkg/common/error/error.go: 429 for a capacity rejection, 503 for a queue TTL, the x-llm-d-request-dropped-reason
 * header).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DESTINATION_HEADER } from '../../src/epp/protocol.ts';
import { type MockerHandle, startMocker } from '../../src/mocker/server.ts';
import { randomTokens } from '../server/helpers.ts';
import { EnvoySide } from './envoy-side.ts';
import { type EppProcess, eventually, metric, metricsText, startEpp } from './picker.ts';

const mocks: MockerHandle[] = [];
const procs: EppProcess[] = [];
const clients: EnvoySide[] = [];

async function picker(args: string[], tls = false): Promise<{ p: EppProcess; envoy: EnvoySide; engine: MockerHandle }> {
  const engine = await startMocker({ model: 'm', speedup: 50, seed: 7 });
  mocks.push(engine);
  const p = await startEpp(['-w', `${engine.url},events=${engine.zmqEndpoint},id=w0,model=m`, ...args], { tls });
  procs.push(p);
  const envoy = new EnvoySide(p.address, { tls });
  clients.push(envoy);
  await eventually(async () => (await envoy.check('readiness')).status === 1);
  return { p, envoy, engine };
}

const completion = (prompt: number[], extra: Record<string, unknown> = {}) =>
  JSON.stringify({ model: 'm', prompt, max_tokens: 2, ...extra });

afterAll(async () => {
  for (const c of clients) c.close();
  await Promise.all(procs.map((p) => p.stop()));
  await Promise.all(mocks.map((m) => m.close()));
});

describe('kvroute epp on the wire, over TLS as it serves by default', () => {
  let p: EppProcess;
  let envoy: EnvoySide;

  beforeAll(async () => {
    ({ p, envoy } = await picker([], true));
    expect(p.tls).toBe('TLS (self-signed certificate)');
  }, 60_000);

  it('streams a large body back in chunks of at most 62,000 bytes, unchanged', async () => {
    // A long prompt (about 400 KB of JSON) arriving in Envoy's 64 KiB pieces.
    const body = completion(randomTokens(60_000, 3));
    expect(body.length).toBeGreaterThan(300_000);
    const s = envoy.stream();
    const r = await s.request({ body, chunkBytes: 64 * 1024 });
    if (!('picked' in r)) throw new Error(`immediate: ${JSON.stringify(r.immediate)}`);
    expect(r.picked.body.toString()).toBe(body);
    expect(r.picked.largestChunk).toBe(62_000);
    expect(r.picked.bodyChunks).toBe(Math.ceil(body.length / 62_000));
    s.cancel();
    await s.status;
  });

  it('answers a zero-byte body delivered with end_of_stream with one empty end_of_stream chunk', async () => {
    const s = envoy.stream();
    const r = await s.request({ method: 'GET', path: '/v1/models', streamEmpty: true });
    if (!('picked' in r)) throw new Error(`immediate: ${JSON.stringify(r.immediate)}`);
    expect(r.picked.bodyChunks).toBe(1);
    expect(r.picked.body.length).toBe(0);
    s.end();
    await s.status;
  });

  it('answers request and response trailers; the last body chunk before trailers does not claim end_of_stream', async () => {
    const before = await metricsText(p);
    const body = completion(randomTokens(80, 5));
    const s = envoy.stream();
    const r = await s.request({ body, chunks: 2, trailers: { 'x-trailer': 'done' } });
    if (!('picked' in r)) throw new Error(`immediate: ${JSON.stringify(r.immediate)}`);
    expect(r.picked.trailersAnswered).toBe(true);
    expect(r.picked.body.toString()).toBe(body);
    // The response ends with trailers too: answered, and the request finishes as served (not as cancelled).
    const res = await s.proxy(r.picked, { trailers: { 'grpc-status': '0' } });
    expect(res.status).toBe(200);
    expect(res.echoed).toBe(res.body);
    s.end();
    await s.status;
    await eventually(
      async () =>
        metric(await metricsText(p), 'router_requests_total', 'outcome="ok"') ===
        metric(before, 'router_requests_total', 'outcome="ok"') + 1,
    );
    const after = await metricsText(p);
    expect(metric(after, 'router_requests_total', 'outcome="cancelled"')).toBe(
      metric(before, 'router_requests_total', 'outcome="cancelled"'),
    );
    expect(metric(after, 'router_requests_in_flight')).toBe(0);
  });

  it('trailers straight after the headers: the headers answer, then the trailers answer, no body', async () => {
    const s = envoy.stream();
    const r = await s.request({ method: 'GET', path: '/v1/models', trailers: { 'x-trailer': 'x' } });
    if (!('picked' in r)) throw new Error(`immediate: ${JSON.stringify(r.immediate)}`);
    expect(r.picked.trailersAnswered).toBe(true);
    expect(r.picked.bodyChunks).toBe(0);
    s.end();
    await s.status;
  });
});

describe('kvroute epp refusing as the reference picker does', () => {
  /** One request picked and left in flight (its stream open, no response yet): the engine is busy with it. */
  async function occupy(envoy: EnvoySide) {
    const s = envoy.stream();
    const r = await s.request({ body: completion(randomTokens(64, 11)) });
    if (!('picked' in r)) throw new Error(`immediate: ${JSON.stringify(r.immediate)}`);
    return s;
  }

  it('a full queue is a 429 with the dropped reason rejected-saturated', async () => {
    const { p, envoy } = await picker(['--busy-prefill-tokens', '0', '--queue-limit', '0']);
    const held = await occupy(envoy);
    const r = await envoy.roundTrip({ body: completion(randomTokens(64, 12)) });
    if (!('immediate' in r)) throw new Error('picked');
    expect(r.immediate.status).toBe(429);
    expect(r.immediate.headers['x-llm-d-request-dropped-reason']).toBe('rejected-saturated');
    expect(Number(r.immediate.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(JSON.parse(r.immediate.body).error.code).toBe('queue_full');
    expect(metric(await metricsText(p), 'epp_immediate_responses_total', 'status="429"')).toBe(1);
    held.cancel();
    await held.status;
  }, 60_000);

  it('a request that times out in the queue is a 503 with the dropped reason rejected-ttl-expired', async () => {
    const { envoy } = await picker(['--busy-prefill-tokens', '0', '--queue-timeout-ms', '300']);
    const held = await occupy(envoy);
    const r = await envoy.roundTrip({ body: completion(randomTokens(64, 13)) });
    if (!('immediate' in r)) throw new Error('picked');
    expect(r.immediate.status).toBe(503);
    expect(r.immediate.headers['x-llm-d-request-dropped-reason']).toBe('rejected-ttl-expired');
    expect(JSON.parse(r.immediate.body).error.code).toBe('queue_timeout');
    held.cancel();
    await held.status;
  }, 60_000);

  it('past --decision-timeout-ms the picker answers 503 itself, and the request leaves the queue', async () => {
    const { p, envoy } = await picker(['--busy-prefill-tokens', '0', '--decision-timeout-ms', '400']);
    const held = await occupy(envoy);
    const r = await envoy.roundTrip({ body: completion(randomTokens(64, 14)) });
    if (!('immediate' in r)) throw new Error('picked');
    expect(r.immediate.status).toBe(503);
    expect(r.immediate.headers['x-llm-d-request-dropped-reason']).toBe('rejected-ttl-expired');
    expect(JSON.parse(r.immediate.body).error.message).toContain('--decision-timeout-ms');
    const t = await metricsText(p);
    expect(metric(t, 'epp_requests_total', 'result="timed_out"')).toBe(1);
    expect(metric(t, 'router_flow_queued_requests')).toBe(0);
    // The held request still runs: once it is gone, a new one is picked at once.
    held.cancel();
    await held.status;
    await eventually(async () => metric(await metricsText(p), 'router_requests_in_flight') === 0);
    const ok = await envoy.roundTrip({ body: completion(randomTokens(64, 15)) });
    expect('picked' in ok && ok.picked.headers[DESTINATION_HEADER]).toBeTruthy();
  }, 60_000);
});
