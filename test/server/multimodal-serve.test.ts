/**
 * `kvroute serve --mm-placeholder-tokens 64` as a process (the built package) with its embedded mock engines, which
 * expand each image or audio part into 64 placeholder tokens keyed by the part's identity (docs/engines.md,
 * "Multimodal block keys"). The router must key the image's blocks the same way: the same image matches, another
 * image with the same text matches only the blocks before it, and what the router predicts is what the engine reuses.
 * Without the setting the router routes on the text only.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { freePort, ShellProcess } from '../fixtures/processes.ts';

const ROOT = new URL('../..', import.meta.url).pathname;
const procs: ShellProcess[] = [];
afterAll(async () => {
  await Promise.all(procs.map((p) => p.stop()));
});

async function startRouter(extra: string): Promise<string> {
  const port = await freePort();
  const proc = new ShellProcess(`node bin/kvroute.mjs serve --port ${port} --mock-workers 2 --log-level info ${extra}`, { cwd: ROOT });
  procs.push(proc);
  await proc.waitFor(/kvroute listening on/, 60_000);
  return `http://127.0.0.1:${port}`;
}

const image = (seed: string) => `data:image/png;base64,${Buffer.from(`png-bytes-${seed}`.repeat(8)).toString('base64')}`;
const system = 'You are a meticulous visual inspector of solar panel installations. '.repeat(12);

async function ask(url: string, img: string, question: string) {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'mock-model',
      max_tokens: 2,
      chat_template_kwargs: { enable_thinking: false },
      messages: [
        { role: 'system', content: system },
        {
          role: 'user',
          content: [
            { type: 'text', text: 'Look at this roof. ' },
            { type: 'image_url', image_url: { url: img } },
            { type: 'text', text: question },
          ],
        },
      ],
    }),
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as { usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens?: number } } };
  return {
    worker: res.headers.get('x-kvroute-worker'),
    predicted: Number(res.headers.get('x-kvroute-overlap-blocks')) * 16,
    cached: body.usage.prompt_tokens_details?.cached_tokens ?? 0,
    promptTokens: body.usage.prompt_tokens,
  };
}

const settle = () => new Promise((r) => setTimeout(r, 500)); // the engine's KV events reach the router

describe('kvroute serve --mm-placeholder-tokens', () => {
  it('keys image blocks as the engine does: the same image matches, another image only up to itself', async () => {
    const url = await startRouter('--mm-placeholder-tokens 64');
    const first = await ask(url, image('a'), ' Are any panels cracked?');
    await settle();
    const again = await ask(url, image('a'), ' Are any panels cracked?');
    await settle();
    const other = await ask(url, image('b'), ' Are any panels cracked?');
    // The same request again: the whole prompt but its last partial block, image blocks included, predicted and reused.
    expect(again.worker).toBe(first.worker);
    expect(again.predicted).toBe(Math.floor((again.promptTokens - 1) / 16) * 16);
    expect(again.cached).toBe(again.predicted);
    // Another image, same text: only the blocks before the image (the system prompt) — predicted as the engine reuses.
    expect(other.predicted).toBeLessThan(again.predicted - 64);
    expect(other.predicted).toBeGreaterThan(0);
    if (other.worker === first.worker) expect(other.cached).toBe(other.predicted);
  }, 120_000);

  it('without it, a request with an image routes on its text and never credits the image', async () => {
    const url = await startRouter('');
    await ask(url, image('a'), ' Are any panels cracked?');
    await settle();
    const again = await ask(url, image('a'), ' Are any panels cracked?');
    // The router's text-only tokens differ from the engine's from the image on: it under-predicts, never over.
    expect(again.predicted).toBeLessThan(again.cached);
  }, 120_000);
});
