import { describe, expect, it } from 'vitest';
import { createRng } from '../../src/core/rng.ts';
import { KvRouter } from '../../src/core/router.ts';
import type { MmItem } from '../../src/core/types.ts';
import { decodeVllmBatch, encodeVllmBatch } from '../../src/engines/vllm/events.ts';
import { SourceAnnotator } from '../../src/ingest/annotate.ts';
import { type EngineCacheGroup, HYBRID_PRESETS, parseCacheGroups } from '../../src/mocker/engine/hybrid.ts';
import { MockEngine } from '../../src/mocker/engine/index.ts';
import { toWireEvents } from '../../src/mocker/events.ts';

const BS = 16;
const seqTokens = (n: number, base: number) => Array.from({ length: n }, (_, i) => base + i);

/** Runs one request to the end on its own; returns its cached_tokens and every event the engine published. */
function serve(engine: MockEngine, id: string, tokens: number[], mmItems?: MmItem[], now = { t: 0 }) {
  engine.addRequest({ requestId: id, promptTokens: tokens, maxTokens: 2, mmItems }, now.t);
  const events = [];
  for (;;) {
    now.t += 10;
    const s = engine.step(now.t);
    events.push(...s.events);
    const out = s.outputs.find((o) => o.requestId === id && o.finished);
    if (out) return { cached: out.cachedTokens, events };
  }
}

describe('mock engine: hybrid cache groups as vLLM hybrid allocator', () => {
  it('parses presets and layouts; refuses a layout without full attention', () => {
    expect(parseCacheGroups('gpt-oss')).toBe(HYBRID_PRESETS['gpt-oss']);
    expect(parseCacheGroups('full,sliding:256,mamba')).toEqual([
      { kind: 'full_attention' },
      { kind: 'sliding_window', slidingWindow: 256 },
      { kind: 'mamba' },
    ]);
    expect(() => parseCacheGroups('mamba,sliding:64')).toThrow(/full-attention/);
    expect(() => parseCacheGroups('sliding:1,full')).toThrow(/bad cache group/);
  });

  it('mamba: state only at the end of a step, so a shared prefix shorter than the prompt is no hit', () => {
    const engine = new MockEngine({ blockSize: BS, numGpuBlocks: 400, cacheGroups: HYBRID_PRESETS.mamba });
    const now = { t: 0 };
    const a = seqTokens(300, 1000); // 18 full blocks; prefilled in one step: one state, at block 17
    const first = serve(engine, 'a', a, undefined, now);
    expect(first.cached).toBe(0);
    const mambaStored = first.events.filter((e) => e.kind === 'stored' && e.groupIdx === 1);
    expect(mambaStored.map((e) => (e.kind === 'stored' ? e.engineIds.length : 0))).toEqual([1]);
    expect(mambaStored[0]).toMatchObject({ groupKind: 'mamba' });
    // 200 shared tokens: full attention would give 12 blocks, but no state was saved at or before block 12.
    expect(serve(engine, 'b', [...a.slice(0, 200), ...seqTokens(50, 9000)], undefined, now).cached).toBe(0);
    // The same prompt again: state at 18, cap floor(299 / 16) = 18 blocks.
    expect(serve(engine, 'c', a, undefined, now).cached).toBe(18 * BS);
  });

  it('sliding window: blocks outside the window are released while the request runs and evicted first', () => {
    const groups: EngineCacheGroup[] = [{ kind: 'full_attention' }, { kind: 'sliding_window', slidingWindow: 64 }];
    const engine = new MockEngine({ blockSize: BS, numGpuBlocks: 60, cacheGroups: groups });
    const now = { t: 0 };
    const a = seqTokens(400, 1000); // 25 blocks per group: 50 of the 60 blocks once both groups cached it
    serve(engine, 'a', a, undefined, now);
    // Another prompt needs blocks: the LRU evicts the sliding group's released head of `a` before anything else.
    const b = serve(engine, 'b', seqTokens(200, 50_000), undefined, now);
    const evicted = b.events.filter((e) => e.kind === 'removed');
    expect(evicted.length).toBeGreaterThan(0);
    expect(evicted.every((e) => e.groupIdx === 1)).toBe(true);
    // Released last block first (as vLLM's remove_skipped_blocks frees them), blocks 20, 19, ... of the window group
    // went first: 15 evictions left it 0..5 and 21..24 (released at the end). `a` again: full attention holds 24
    // blocks, but a whole window (4 blocks) before the cut survives only at [2, 6): the engine reuses 6 blocks.
    expect(serve(engine, 'c', a, undefined, now).cached).toBe(6 * BS);
  });

  for (const preset of ['gpt-oss', 'mamba', 'mixed']) {
    it(`router prediction equals the engine's cached_tokens, request by request (${preset}, events over the wire)`, () => {
      const engine = new MockEngine({ blockSize: BS, numGpuBlocks: 500, maxNumBatchedTokens: 512, cacheGroups: HYBRID_PRESETS[preset] });
      const router = new KvRouter({ blockSize: BS });
      router.addSource({ workerId: 'e', dpRank: 0 });
      const annotator = new SourceAnnotator(BS);
      const rng = createRng(7);
      const roots = [seqTokens(700, 1000), seqTokens(500, 20_000), seqTokens(900, 40_000)];
      const now = { t: 0 };
      let nonTrivial = 0;
      for (let i = 0; i < 60; i++) {
        const root = roots[Math.floor(rng() * roots.length)];
        const cut = 16 + Math.floor(rng() * (root.length - 16));
        const tokens = [...root.slice(0, cut), ...seqTokens(Math.floor(rng() * 40), 70_000 + i * 100)];
        const d = router.route({ requestId: `r${i}`, tokens }, now.t);
        if (d.kind !== 'routed') throw new Error(d.reason);
        const { cached, events } = serve(engine, `r${i}`, tokens, undefined, now);
        expect(d.overlapBlocks * BS, `request ${i}`).toBe(cached);
        if (cached > 0) nonTrivial++;
        router.finish(`r${i}`, { cachedTokens: cached }, now.t);
        const batch = decodeVllmBatch(
          encodeVllmBatch({ ts: 0, events: toWireEvents(events, 'u64'), dataParallelRank: null }, { format: 'array', hashType: 'u64' }),
        );
        const r = router.applyEvents('e', annotator.process(batch));
        expect(r.rejected).toBe(0);
      }
      expect(nonTrivial).toBeGreaterThan(5);
    });
  }

  it('multimodal prompts: the engine publishes (identifier, offset) keys and the router matches the same image only', () => {
    const engine = new MockEngine({ blockSize: BS, numGpuBlocks: 400 });
    const router = new KvRouter({ blockSize: BS, overlay: false });
    router.addSource({ workerId: 'e', dpRank: 0 });
    const annotator = new SourceAnnotator(BS);
    const text = seqTokens(40, 1000);
    const withImage = [...text, ...new Array(64).fill(151655), ...seqTokens(30, 5000)];
    const img = (identifier: string): MmItem[] => [{ identifier, offset: 40, length: 64 }];
    const now = { t: 0 };
    const a = serve(engine, 'a', withImage, img('sha256:cat'), now);
    const stored = a.events.find((e) => e.kind === 'stored');
    expect(stored?.kind === 'stored' && stored.extraKeys[2]).toEqual([['sha256:cat', 40 - 32]]);
    const batch = decodeVllmBatch(
      encodeVllmBatch({ ts: 0, events: toWireEvents(a.events, 'u64'), dataParallelRank: null }, { format: 'map', hashType: 'u64' }),
    );
    router.applyEvents('e', annotator.process(batch));
    const predict = (identifier: string, id: string) => {
      const d = router.route({ requestId: id, tokens: withImage, mmItems: img(identifier) }, now.t);
      if (d.kind !== 'routed') throw new Error(d.reason);
      router.finish(id, {}, now.t);
      return d.overlapBlocks;
    };
    // Same image: every full block but the last token's (cap floor(133 / 16) = 8).
    expect(predict('sha256:cat', 'p1')).toBe(8);
    expect(serve(engine, 'b', withImage, img('sha256:cat'), now).cached).toBe(8 * BS);
    // Same text, another image: the two text blocks before it only, on both sides.
    expect(predict('sha256:dog', 'p2')).toBe(2);
    expect(serve(engine, 'c', withImage, img('sha256:dog'), now).cached).toBe(2 * BS);
    expect(() => engine.addRequest({ requestId: 'bad', promptTokens: text, maxTokens: 1, mmItems: img('x') }, 0)).toThrow(
      /ends past the prompt/,
    );
  });
});
