import { describe, expect, it } from 'vitest';
import { KvIndex } from '../../src/core/index/kv-index.ts';
import { computeSeqHashes, hashSeed } from '../../src/core/hashing.ts';
import type { KvEvent } from '../../src/core/types.ts';
import { encodeVllmBatch, vllmFrames, type WireEvent } from '../../src/engines/vllm/events.ts';
import { SourceIngest, type ReplayFn } from '../../src/ingest/source-ingest.ts';
import { quietLog, type LogSink } from '../../src/log.ts';
import { FakeEngine } from './fake-engine.ts';

function harness(opts: { blockSize?: number; engineBlockSize?: number; replay?: ReplayFn | null; now?: () => number; log?: LogSink } = {}) {
  const index = new KvIndex({ blockSize: opts.blockSize ?? 4 });
  index.addSource(0);
  const resets: string[] = [];
  const ingest = new SourceIngest({
    source: { workerId: 'w0', dpRank: 0 },
    routerBlockSize: opts.blockSize ?? 4,
    sink: (_k, events: KvEvent[]) => {
      for (const e of events) index.apply(0, e);
    },
    onReset: (_k, reason) => {
      resets.push(reason);
      index.apply(0, { kind: 'cleared' });
    },
    replay: opts.replay ?? null,
    log: opts.log ?? quietLog,
    now: opts.now,
  });
  let seq = 0n;
  const send = (events: WireEvent[], s = seq++) =>
    ingest.onFrames(vllmFrames('t', s, encodeVllmBatch({ ts: 1, events, dataParallelRank: 0 }, { format: 'map', hashType: 'u64' })));
  return { index, ingest, resets, send };
}

const T = (n: number, base = 100) => Array.from({ length: n }, (_, i) => base + i);

describe('SourceIngest', () => {
  it('carries cache_salt from the first block to continuation events', () => {
    const { index, send } = harness();
    const tokens = T(12);
    send([
      {
        type: 'BlockStored',
        blockHashes: [1n],
        parentBlockHash: null,
        tokenIds: tokens.slice(0, 4),
        blockSize: 4,
        extraKeys: [['tenant-a']],
      },
    ]);
    send([
      { type: 'BlockStored', blockHashes: [2n, 3n], parentBlockHash: 1n, tokenIds: tokens.slice(4), blockSize: 4, extraKeys: [null, null] },
    ]);
    expect(index.findMatches(computeSeqHashes(tokens, 4, hashSeed(null, 'tenant-a')))[0]).toBe(3);
    expect(index.findMatches(computeSeqHashes(tokens, 4))[0]).toBe(0);
  });

  it('skips blocks whose identity is not hashable (prompt embeds) and their descendants, counted; their removal never reaches the index', () => {
    const { index, ingest, send } = harness();
    const tokens = T(12);
    send([
      {
        type: 'BlockStored',
        blockHashes: [1n, 2n],
        parentBlockHash: null,
        tokenIds: tokens.slice(0, 8),
        blockSize: 4,
        extraKeys: [null, [new Uint8Array([0xde, 0xad])]],
      },
    ]);
    send([{ type: 'BlockStored', blockHashes: [3n], parentBlockHash: 2n, tokenIds: tokens.slice(8), blockSize: 4 }]);
    send([{ type: 'BlockRemoved', blockHashes: [3n, 2n] }]);
    const h = ingest.health();
    expect(h.multimodalBlocks).toBe(2);
    expect(index.findMatches(computeSeqHashes(tokens, 4))[0]).toBe(1);
    expect(index.stats().rejected).toEqual({});
  });

  it('learns the block size: a multiple is split (reported once), others are quarantined with their descendants', () => {
    const logged: string[] = [];
    const log: LogSink = { info() {}, warn() {}, error: (_o, m) => logged.push(m) };
    const a = harness({ blockSize: 4, log });
    const tokens = T(16);
    a.send([{ type: 'BlockStored', blockHashes: [1n], parentBlockHash: null, tokenIds: tokens.slice(0, 8), blockSize: 8 }]);
    a.send([{ type: 'BlockStored', blockHashes: [2n], parentBlockHash: 1n, tokenIds: tokens.slice(8), blockSize: 8 }]);
    expect(a.index.findMatches(computeSeqHashes(tokens, 4))[0]).toBe(4);
    expect(logged).toHaveLength(1);
    expect(logged[0]).toMatch(/block size mismatch: engine 8, router 4/);
    expect(a.ingest.health()).toMatchObject({ engineBlockSize: 8, blockSizeMismatch: true, quarantinedBlocks: 0 });

    logged.length = 0;
    const b = harness({ blockSize: 4, log });
    b.send([{ type: 'BlockStored', blockHashes: [1n], parentBlockHash: null, tokenIds: T(6), blockSize: 6 }]);
    b.send([{ type: 'BlockStored', blockHashes: [2n], parentBlockHash: 1n, tokenIds: T(6, 200), blockSize: 6 }]);
    expect(logged).toHaveLength(1);
    expect(logged[0]).toMatch(/quarantined/);
    expect(b.ingest.health().quarantinedBlocks).toBe(2);
    expect(b.index.stats().blocks).toBe(0);
    expect(b.index.stats().rejected).toEqual({});
  });

  it('drops non-primary KV groups and tracks offload tiers by engine id', () => {
    const { index, ingest, send } = harness();
    send([{ type: 'BlockStored', blockHashes: [1n], parentBlockHash: null, tokenIds: T(4), blockSize: 4, groupIdx: 1 }]);
    send([{ type: 'BlockStored', blockHashes: [7n, 8n], parentBlockHash: null, tokenIds: [], blockSize: 4, medium: 'CPU' }]);
    send([{ type: 'BlockRemoved', blockHashes: [7n], medium: 'CPU' }]);
    const h = ingest.health();
    expect(h.otherGroupEvents).toBe(1);
    expect(h.offloadEvents).toBe(2);
    expect(h.tierBlocks).toEqual({ CPU: 1 });
    expect(index.stats().blocks).toBe(0);
  });

  it('counts bad frames; an undecodable payload with a valid seq resets the source', () => {
    const { ingest, resets, send } = harness();
    send([{ type: 'BlockStored', blockHashes: [1n], parentBlockHash: null, tokenIds: T(4), blockSize: 4 }]);
    ingest.onFrames([Buffer.from('t'), Buffer.alloc(8)]);
    ingest.onFrames([Buffer.from('t'), Buffer.alloc(5), Buffer.from([0x90])]);
    ingest.onFrames(vllmFrames('t', 1n, Buffer.from([0xc1])));
    const h = ingest.health();
    expect(h.badFrames).toBe(3);
    expect(h.decodeErrors).toBe(1);
    expect(resets).toEqual(['undecodable_batch']);
    expect(h.lastSeq).toBe('1');
    send([{ type: 'AllBlocksCleared' }], 2n);
    expect(ingest.health().cleared).toBe(1);
  });

  it("counts batches whose dp rank is not the subscription's, logging once", () => {
    const logged: string[] = [];
    const { ingest } = harness({ log: { info() {}, warn() {}, error: (_o, m) => logged.push(m) } });
    for (let s = 0n; s < 3n; s++)
      ingest.onFrames(
        vllmFrames('t', s, encodeVllmBatch({ ts: 1, events: [], dataParallelRank: 2 }, { format: 'array', hashType: 'u64' })),
      );
    expect(ingest.health().dpRankMismatchBatches).toBe(3);
    expect(logged).toHaveLength(1);
    expect(logged[0]).toMatch(/dp rank mismatch on w0: batches say rank 2/);
  });

  it('reports a source blind when it serves traffic without events', () => {
    let now = 1_000_000;
    const { ingest, send } = harness({ now: () => now });
    for (let i = 0; i < 5; i++) ingest.noteRequestRouted();
    expect(ingest.health().blind).toBe(false); // not silent long enough yet
    now += 11_000;
    expect(ingest.health().blind).toBe(true);
    send([{ type: 'BlockStored', blockHashes: [1n], parentBlockHash: null, tokenIds: T(4), blockSize: 4 }]);
    const h = ingest.health();
    expect(h.blind).toBe(false);
    expect(h.requestsSinceLastEvent).toBe(0);
    expect(h.eventsPerSec).toBeCloseTo(0.1);
    expect(JSON.parse(JSON.stringify(h))).toEqual(h);
  });

  it('probes the tail once per quiet period: a lost last batch is recovered without new traffic', async () => {
    let now = 1_000;
    const engine = new FakeEngine({ blockSize: 4, capacity: 30, format: 'map', hashType: 'u64', seed: 3 });
    let probes = 0;
    const replay: ReplayFn = async (from, onBatch) => {
      probes++;
      for (let s = from; s < engine.seq; s++) onBatch(s, engine.history.get(s)!);
      return { ok: true };
    };
    const { index, ingest, resets } = harness({ replay, now: () => now });
    for (let i = 0; i < 10; i++) ingest.onFrames(engine.publish());
    engine.publish(); // the last batch is lost on the wire
    expect(ingest.maybeProbeTail(1000)).toBe(false); // not quiet yet
    now += 1500;
    expect(ingest.maybeProbeTail(1000)).toBe(true);
    await new Promise((r) => setImmediate(r));
    expect(ingest.maybeProbeTail(1000)).toBe(false); // the probe just delivered a batch: not quiet
    now += 1500;
    expect(ingest.maybeProbeTail(1000)).toBe(true); // a new quiet period after that batch
    await new Promise((r) => setImmediate(r));
    now += 5000;
    expect(ingest.maybeProbeTail(1000)).toBe(false); // nothing arrived since the last probe: do not poll forever
    expect(probes).toBe(2);
    expect(index.blocksOf(0)).toEqual(engine.truth());
    expect(ingest.health()).toMatchObject({ tailProbes: 2, replays: 0, resets: 0, lastSeq: '10' });
    expect(resets).toEqual([]);
  });

  it('recovers dropped batches through replay and ends equal to the engine', async () => {
    const engine = new FakeEngine({ blockSize: 4, capacity: 60, format: 'array', hashType: 'u64', seed: 7, salts: true });
    const replay: ReplayFn = async (from, onBatch) => {
      for (let s = from; s < engine.seq; s++) {
        const p = engine.history.get(s);
        if (p) onBatch(s, p);
      }
      return { ok: true };
    };
    const { index, ingest, resets } = harness({ replay });
    for (let i = 0; i < 400; i++) {
      const frames = engine.publish();
      if (i % 37 === 5) continue; // dropped on the wire
      ingest.onFrames(frames);
      if (i % 10 === 0) await new Promise((r) => setImmediate(r));
    }
    await new Promise((r) => setImmediate(r));
    expect(resets).toEqual([]);
    expect(ingest.health().replays).toBeGreaterThan(5);
    expect(index.blocksOf(0)).toEqual(engine.truth());
  });
});
