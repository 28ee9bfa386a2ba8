import { afterAll, describe, expect, it } from 'vitest';
import * as zmq from 'zeromq';
import { KvRouter } from '../../src/core/router.ts';
import { decodeVllmBatch } from '../../src/engines/vllm/events.ts';
import { SourceAnnotator } from '../../src/ingest/annotate.ts';
import { MOCK_MM_PLACEHOLDER_TOKENS } from '../../src/mocker/openai.ts';
import { startMocker, type MockerHandle } from '../../src/mocker/server.ts';
import { chatMediaParts, withMediaMarkers } from '../../src/tokenizer/multimodal.ts';

const open: MockerHandle[] = [];
const sockets: zmq.Socket[] = [];
afterAll(async () => {
  for (const s of sockets) s.close();
  await Promise.all(open.map((m) => m.close()));
});

const png = (seed: number) =>
  `data:image/png;base64,${Buffer.from(Array.from({ length: 64 }, (_, i) => (i * 31 + seed) & 0xff)).toString('base64')}`;

const chat = (image: string, question = 'What is in this picture? Describe it in one short sentence.') => ({
  model: 'mock-model',
  max_tokens: 1,
  messages: [
    { role: 'system', content: 'You are a careful assistant who answers questions about images in plain words.' },
    {
      role: 'user',
      content: [
        { type: 'text', text: 'Look at this:' },
        { type: 'image_url', image_url: { url: image } },
        { type: 'text', text: question },
      ],
    },
  ],
});

describe('multimodal chat parts', () => {
  it('identity: the uuid when given, else sha256 of the data URL bytes or of input_audio data, else the URL', () => {
    const parts = chatMediaParts([
      {
        role: 'user',
        content: [
          { type: 'image_url', image_url: { url: 'data:image/png;base64,AAEC' } },
          { type: 'image_url', image_url: { url: 'https://example.com/cat.png' } },
          { type: 'image_url', image_url: { url: 'data:image/png;base64,AAEC' }, uuid: 'img-42' },
          { type: 'input_audio', input_audio: { data: 'AAEC', format: 'wav' } },
          { type: 'text', text: 'hi' },
          { type: 'image_url' },
        ],
      },
      { role: 'assistant', content: 'plain' },
    ]);
    const bytes = 'sha256:ae4b3280e56e2faf83f414a6e3dabe9d5fbe18976544c05fed121accb85b53fc'; // sha256 of 00 01 02
    expect(parts).toEqual([
      { kind: 'image', identifier: bytes },
      { kind: 'image', identifier: 'url:https://example.com/cat.png' },
      { kind: 'image', identifier: 'img-42' },
      { kind: 'audio', identifier: bytes },
    ]);
    expect(withMediaMarkers([{ role: 'user', content: [{ type: 'image_url', image_url: 'x' }, 'y'] }], '#')).toEqual([
      { role: 'user', content: [{ type: 'text', text: '#' }, 'y'] },
    ]);
  });

  it('the mock engine expands each image, caches the same image, never another, and publishes its (identifier, offset) keys', async () => {
    const m = await startMocker({ speedup: 1000, zmqEndpoint: 'tcp://127.0.0.1:*', replayEndpoint: null, dataParallelSize: 1 });
    open.push(m);
    const sub = new zmq.Subscriber({ linger: 0 });
    sockets.push(sub);
    sub.connect(m.zmqEndpoints[0]);
    sub.subscribe();
    const batches: Buffer[] = [];
    void (async () => {
      try {
        for await (const frames of sub) batches.push(frames[2]);
      } catch {
        // closed
      }
    })();
    await new Promise((r) => setTimeout(r, 300)); // ZMQ slow joiner
    const send = async (body: unknown) => {
      const res = await fetch(`${m.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      expect(res.status).toBe(200);
      return (await res.json()) as { usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number } } };
    };
    const first = await send(chat(png(1)));
    expect(first.usage.prompt_tokens).toBeGreaterThan(MOCK_MM_PLACEHOLDER_TOKENS);
    expect(first.usage.prompt_tokens_details.cached_tokens).toBe(0);
    const same = await send(chat(png(1)));
    expect(same.usage.prompt_tokens_details.cached_tokens).toBe(Math.floor((same.usage.prompt_tokens - 1) / 16) * 16);
    const other = await send(chat(png(2)));
    // Only the blocks before the image's first block: its placeholder tokens are the same, its identity is not.
    expect(other.usage.prompt_tokens_details.cached_tokens).toBeLessThan(same.usage.prompt_tokens_details.cached_tokens);
    const t0 = Date.now();
    while (batches.length < 2 && Date.now() - t0 < 5000) await new Promise((r) => setTimeout(r, 10));
    // The router, fed the engine's events, keys the image blocks by identity too.
    const router = new KvRouter({ blockSize: 16, overlay: false });
    router.addSource({ workerId: 'm', dpRank: 0 });
    const annotator = new SourceAnnotator(16);
    let mmBlocks = 0;
    for (const b of batches) {
      const d = decodeVllmBatch(b);
      for (const ev of d.events) if (ev.kind === 'stored') mmBlocks += (ev.mmKeys ?? []).filter((k) => k !== null).length;
      expect(router.applyEvents('m', annotator.process(d)).rejected).toBe(0);
    }
    expect(mmBlocks).toBeGreaterThanOrEqual(2 * Math.floor(MOCK_MM_PLACEHOLDER_TOKENS / 16));
    expect(router.state().index.rejected).toEqual({});
  });
});
