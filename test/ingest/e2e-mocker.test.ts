/**
 * End to end: 4 mock vLLM engines (src/mocker, real HTTP + real ZMQ PUB/ROUTER) with different wire formats and hash
 * types, the ingestion shell subscribed to all of them, a real KvIndex as the sink. After a random workload with
 * evictions, dropped event batches (recovered by replay, the last ones by tail probes) and an engine restart, the index
 * holds exactly each engine's cached blocks (the mocker's own dump).
 */
import { afterAll, describe, expect, it } from 'vitest';
import { KvIndex } from '../../src/core/index/kv-index.ts';
import type { KvEvent } from '../../src/core/types.ts';
import { startMocker, type MockerHandle } from '../../src/mocker/server.ts';
import { EventIngest } from '../../src/transport/event-ingest.ts';
import { quietLog } from '../../src/log.ts';
import { mulberry32 } from './fake-engine.ts';

async function until(cond: () => boolean, ms = 8000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 20));
  }
}

const sameSet = (a: Set<bigint>, b: Set<bigint>) => a.size === b.size && [...a].every((x) => b.has(x));

const mockers: MockerHandle[] = [];
let ingest: EventIngest | null = null;
afterAll(async () => {
  await ingest?.close();
  await Promise.all(mockers.map((m) => m.close()));
});

describe('ingestion against 4 mock engines', () => {
  it('index equals every engine cache after evictions, dropped batches (replay) and a restart', async () => {
    const variants = [
      { eventFormat: 'array', hashType: 'u64' },
      { eventFormat: 'map', hashType: 'u64' },
      { eventFormat: 'map', hashType: 'bytes' },
      { eventFormat: 'array', hashType: 'i64' },
    ] as const;
    for (const [i, v] of variants.entries()) {
      mockers.push(
        await startMocker({
          model: 'm',
          seed: i,
          speedup: 200,
          engine: { blockSize: 16, numGpuBlocks: 96 },
          zmqEndpoint: 'tcp://127.0.0.1:*',
          replayEndpoint: 'tcp://127.0.0.1:*',
          eventFormat: v.eventFormat,
          hashType: v.hashType,
          defaultMaxTokens: 20,
          faults: { dropEventFraction: i % 2 === 0 ? 0.15 : 0 },
        }),
      );
    }
    const index = new KvIndex({ blockSize: 16 });
    const sourceNo = new Map<string, number>();
    const resets: string[] = [];
    ingest = new EventIngest({
      routerBlockSize: 16,
      log: quietLog,
      replayTimeoutMs: 1000,
      // A batch dropped last is only visible to a tail probe (no later batch reveals the gap).
      tailProbeMs: 200,
      sink: (key, events: KvEvent[]) => {
        for (const e of events) index.apply(sourceNo.get(key)!, e);
      },
      onReset: (key, reason) => {
        resets.push(`${key}:${reason}`);
        index.apply(sourceNo.get(key)!, { kind: 'cleared' });
      },
    });
    for (const [i, m] of mockers.entries()) {
      sourceNo.set(`w${i}`, i);
      index.addSource(i);
      await ingest.addWorker({ workerId: `w${i}`, endpoint: m.zmqEndpoint!, replayEndpoint: m.replayEndpoint! });
    }
    await until(() => ingest!.health().every((h) => h.connected));
    await new Promise((r) => setTimeout(r, 150));

    const rnd = mulberry32(4);
    const prefixes = Array.from({ length: 5 }, (_, p) => Array.from({ length: 16 * (2 + p) }, (_, k) => 100 + 1000 * p + k));
    const workload = async (m: MockerHandle, n: number) => {
      const reqs: Promise<unknown>[] = [];
      for (let r = 0; r < n; r++) {
        const prefix = prefixes[Math.floor(rnd() * prefixes.length)];
        const suffix = Array.from({ length: Math.floor(rnd() * 60) }, () => Math.floor(rnd() * 30000));
        const body: Record<string, unknown> = { model: 'm', prompt: prefix.concat(suffix), max_tokens: 1 + Math.floor(rnd() * 30) };
        if (rnd() < 0.25) body.cache_salt = `tenant-${Math.floor(rnd() * 2)}`;
        reqs.push(
          fetch(`${m.url}/v1/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify(body),
          }).then((res) => res.text()),
        );
        if (r % 8 === 7) await Promise.all(reqs.splice(0));
      }
      await Promise.all(reqs);
    };
    const converged = () => mockers.every((m, i) => sameSet(index.blocksOf(i), m.engine.cachedSeqHashes()));

    await Promise.all(mockers.map((m) => workload(m, 60)));
    await until(converged);
    for (const m of mockers) expect(m.engine.counters.blocksEvicted).toBeGreaterThan(0);
    const dropped = mockers[0].stats.droppedBatches + mockers[2].stats.droppedBatches;
    expect(dropped).toBeGreaterThan(0);
    const h = ingest.health();
    expect(h[0].replays + h[2].replays).toBeGreaterThan(0);
    expect(resets).toEqual([]);
    expect(index.stats().rejected).toEqual({});

    // Restart engine 1 in place: seq back to 0, cache empty, no AllBlocksCleared on the wire.
    await mockers[1].restart();
    await workload(mockers[1], 20);
    await until(converged);
    expect(resets).toEqual(['w1:restart']);
    for (const m of mockers) expect(m.engine.cachedSeqHashes().size).toBeGreaterThan(0);
  }, 30_000);

  it('a data-parallel engine: rank r is a source of its own, subscribed on port + r', async () => {
    const m = await startMocker({
      model: 'm',
      speedup: 200,
      dataParallelSize: 2,
      engine: { blockSize: 16, numGpuBlocks: 64 },
      zmqEndpoint: 'tcp://127.0.0.1:*',
      replayEndpoint: 'tcp://127.0.0.1:*',
      defaultMaxTokens: 8,
    });
    mockers.push(m);
    const index = new KvIndex({ blockSize: 16 });
    const dpIngest = new EventIngest({
      routerBlockSize: 16,
      log: quietLog,
      sink: (key, events: KvEvent[]) => {
        for (const e of events) index.apply(key === 'dp' ? 0 : 1, e);
      },
      onReset: () => {},
    });
    index.addSource(0);
    index.addSource(1);
    try {
      const keys = await dpIngest.addWorker({ workerId: 'dp', endpoint: m.zmqEndpoint!, replayEndpoint: m.replayEndpoint!, dpRanks: 2 });
      expect(keys).toEqual(['dp', 'dp#1']);
      await until(() => dpIngest.health().every((h) => h.connected));
      await new Promise((r) => setTimeout(r, 150));
      const rnd = mulberry32(9);
      for (let i = 0; i < 24; i++) {
        const prompt = Array.from({ length: 40 + Math.floor(rnd() * 80) }, (_, k) => (k < 32 ? 7 + k : Math.floor(rnd() * 30000)));
        const res = await fetch(`${m.url}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-data-parallel-rank': String(i % 2) },
          body: JSON.stringify({ model: 'm', prompt, max_tokens: 4 }),
        });
        await res.text();
      }
      await until(() => [0, 1].every((r) => sameSet(index.blocksOf(r), m.engines[r].cachedSeqHashes())));
      for (const r of [0, 1]) expect(m.engines[r].cachedSeqHashes().size).toBeGreaterThan(0);
      expect(dpIngest.health().map((h) => [h.sourceKey, h.dpRankMismatchBatches])).toEqual([
        ['dp', 0],
        ['dp#1', 0],
      ]);
    } finally {
      await dpIngest.close();
    }
  }, 20_000);
});
