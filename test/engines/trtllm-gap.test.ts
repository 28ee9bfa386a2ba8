/**
 * TensorRT-LLM polling after lost events, against the mock engine over HTTP (POST /kv_cache_events, a buffer of 6
 * events as `event_buffer_max_size` bounds it; prompts sent to the engine directly, so only its events tell the
 * router): a poll that finds the ids skipping ahead clears the source and marks it degraded, never keeps a block the
 * engine dropped, and relearns it from the events that follow; an engine restart (ids from 0) clears it whole and
 * heals it, after which the index is the engine's cache again, block for block.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KvRouter, resetLosesEvents } from '../../src/core/router.ts';
import { SourceIngest } from '../../src/ingest/source-ingest.ts';
import { quietLog } from '../../src/log.ts';
import { startMocker, type MockerHandle } from '../../src/mocker/server.ts';
import { TrtllmPoll } from '../../src/transport/trtllm-poll.ts';

const BS = 16;
let engine: MockerHandle;
beforeAll(async () => {
  engine = await startMocker({ model: 'mock-model', speedup: 100, seed: 3, eventFormat: 'trtllm', bufferSteps: 6 });
}, 60_000);
afterAll(async () => {
  await engine?.close();
});

let prompts = 0;
/** A prompt of its own (several blocks) sent to the engine; resolves when it has answered. */
async function prompt(shared = ''): Promise<void> {
  const text = `${shared}${prompts++} ${'the quick brown fox jumps over the lazy dog '.repeat(24)}${Math.random()}`;
  const res = await fetch(`${engine.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock-model', prompt: text, max_tokens: 1 }),
  });
  expect(res.status).toBe(200);
  await res.arrayBuffer();
}

describe('TensorRT-LLM polling: a gap or a restart clears and relearns the source', () => {
  it('lost events: cleared, degraded, never stale, relearnt; restart: cleared and healed, equal to the engine', async () => {
    const router = new KvRouter({ blockSize: BS, overlay: false });
    const key = router.addSource({ workerId: 't0', dpRank: 0 });
    const resets: string[] = [];
    const ingest = new SourceIngest({
      source: { workerId: 't0', dpRank: 0 },
      routerBlockSize: BS,
      sink: (k, events) => {
        router.applyEvents(k, events);
        if (events.some((e) => e.kind === 'cleared')) router.markHealed(k);
      },
      onReset: (k, reason) => {
        resets.push(reason);
        router.resetSource(k);
        if (resetLosesEvents(reason)) router.markDegraded(k, reason, Date.now());
        else router.markHealed(k);
      },
      replay: null,
      log: quietLog,
    });
    const poll = new TrtllmPoll({ url: engine.url, ingests: new Map([[0, ingest]]), routerBlockSize: BS, log: quietLog });
    const indexed = () => router.index.blocksOf(0);
    const truth = () => engine.engine.cachedSeqHashes();

    // Polled after every prompt (a few events each): nothing lost, the index is the engine's cache.
    await poll.pollOnce();
    for (let i = 0; i < 3; i++) {
      await prompt();
      await poll.pollOnce();
    }
    expect(indexed()).toEqual(truth());
    expect(indexed().size).toBeGreaterThan(10);
    expect(router.degradedSources().size).toBe(0);

    // Twelve prompts between two polls: the engine's buffer of 6 events keeps the last 6, the older ones are lost.
    for (let i = 0; i < 12; i++) await prompt();
    await poll.pollOnce();
    expect(resets).toEqual(['gap_without_replay']);
    expect(router.degradedSources().get(key)).toMatchObject({ reason: 'gap_without_replay', losses: 1 });
    // Cleared, then only what the kept events said: every indexed block is in the engine's cache (none stale), and
    // blocks the lost events announced are missing (hence degraded).
    const afterGap = indexed();
    for (const h of afterGap) expect(truth().has(h)).toBe(true);
    expect(afterGap.size).toBeLessThan(truth().size);
    // Relearnt from the events that follow: a new prompt's blocks are indexed again.
    const before = new Set(truth());
    await prompt();
    await poll.pollOnce();
    const learnt = [...truth()].filter((h) => !before.has(h));
    expect(learnt.length).toBeGreaterThan(0);
    for (const h of learnt) expect(indexed().has(h)).toBe(true);
    for (const h of indexed()) expect(truth().has(h)).toBe(true);

    // The engine restarts (empty cache, ids from 0): the source is cleared whole and healed.
    await engine.restart();
    await prompt();
    await poll.pollOnce();
    expect(resets).toEqual(['gap_without_replay', 'restart']);
    expect(router.degradedSources().size).toBe(0);
    for (let i = 0; i < 2; i++) {
      await prompt();
      await poll.pollOnce();
    }
    expect(indexed()).toEqual(truth());
    expect(ingest.health().gaps).toBeGreaterThanOrEqual(1);
    await poll.close();
  });
});
