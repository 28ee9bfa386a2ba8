/**
 * "An engine written independently from vLLM's and SGLang's documented protocols must accept every leg kvroute sends":
 * kvroute serve in front of the strict fake engines of ./pd-checker.ts, for chat and completions, streamed or not,
 * with the fields the protocols single out (max_completion_tokens, min_tokens, stream_options).
 */
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { type CheckerEngine, checkerWorld, startChecker } from './pd-checker.ts';
import { serve } from './helpers.ts';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((c) => c()));
});

const BODIES: Record<string, unknown>[] = [
  {
    model: 'm',
    prompt: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20],
    max_tokens: 7,
    stream: true,
    stream_options: { include_usage: true },
    min_tokens: 2,
  },
  { model: 'm', prompt: Array.from({ length: 40 }, (_, i) => i + 5), max_tokens: 5, temperature: 0.5 },
  { model: 'm', messages: [{ role: 'user', content: 'hello there' }], max_completion_tokens: 9, stream: true, min_completion_tokens: 1 },
  { model: 'm', messages: [{ role: 'user', content: 'no stream' }], max_tokens: 3, seed: 4 },
];

describe.each(['vllm', 'sglang'] as const)('the strict %s checker accepts every leg', (flavor) => {
  it('for chat and completions, streamed or not; the client sees the prefill’s cached tokens', async () => {
    const world = checkerWorld();
    const p: CheckerEngine = await startChecker(world, { flavor, role: 'prefill', cached: 32, bootstrapPort: 9911 });
    const d: CheckerEngine = await startChecker(world, { flavor, role: 'decode', decodeCached: 99 });
    closers.push(p.close, d.close);
    const s = await serve({
      workers: [
        { url: p.url, id: 'p0', role: 'prefill', engine: flavor, bootstrap: 9911, models: ['m'] },
        { url: d.url, id: 'd0', role: 'decode', engine: flavor, models: ['m'] },
      ] as never,
      disaggMinUncachedTokens: 0,
    });
    closers.push(() => s.close(200));
    const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    for (const body of BODIES) {
      world.client = body;
      const chat = 'messages' in body;
      const path = chat ? '/chat/completions' : '/completions';
      if (body.stream) {
        const stream = await client.post(path, { body, stream: true } as never);
        let usage: { prompt_tokens_details?: { cached_tokens?: number } } | undefined;
        let chunks = 0;
        for await (const c of stream as unknown as AsyncIterable<{ usage?: typeof usage }>) {
          chunks++;
          if (c.usage) usage = c.usage;
        }
        expect(chunks).toBeGreaterThanOrEqual(2);
        if ((body.stream_options as { include_usage?: boolean } | undefined)?.include_usage) {
          expect(usage?.prompt_tokens_details?.cached_tokens).toBe(32);
        } else expect(usage).toBeUndefined();
      } else {
        const r = (await client.post(path, { body } as never)) as { usage: { prompt_tokens_details: { cached_tokens: number } } };
        expect(r.usage.prompt_tokens_details.cached_tokens).toBe(32);
      }
    }
    expect(world.violations).toEqual([]);
    expect(world.seen).toEqual({ prefill: BODIES.length, decode: BODIES.length });
    expect(s.dispatcher.pdStats.paths.disaggregated).toBe(BODIES.length);
  });

  it('refuses a leg that deviates (the checker can fail)', async () => {
    const world = checkerWorld();
    const p = await startChecker(world, { flavor, role: 'prefill', bootstrapPort: 9912 });
    closers.push(p.close);
    world.client = { model: 'm', prompt: [1, 2, 3], max_tokens: 4, stream: true };
    const deviant =
      flavor === 'vllm'
        ? { ...world.client, kv_transfer_params: { do_remote_decode: true }, max_tokens: 1 }
        : { ...world.client, bootstrap_host: '127.0.0.1', bootstrap_port: 9912, bootstrap_room: -1 };
    const r = await fetch(`${p.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': 'x' },
      body: JSON.stringify(deviant),
    });
    expect(r.status).toBe(400);
    expect(world.violations).toHaveLength(1);
  });
});
