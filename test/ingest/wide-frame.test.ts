/**
 * The wider sequence frame (vLLM's snapshot work: a publisher lifetime id and idle heartbeats) is detected, counted and
 * honoured (a new epoch is a new engine process); decode errors are counted by cause, through to the metric.
 */
import { Packr } from 'msgpackr';
import { describe, expect, it } from 'vitest';
import { KvIndex } from '../../src/core/index/kv-index.ts';
import { computeSeqHashes } from '../../src/core/hashing.ts';
import { KvRouter } from '../../src/core/router.ts';
import type { KvEvent } from '../../src/core/types.ts';
import { encodeVllmBatch, type WireEvent } from '../../src/engines/vllm/events.ts';
import { parseFrames, SourceIngest } from '../../src/ingest/source-ingest.ts';
import { quietLog } from '../../src/log.ts';
import { RouterMetrics } from '../../src/metrics/registry.ts';

const T = Array.from({ length: 8 }, (_, i) => 100 + i);
const seq8 = (n: number) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
};
const epochOf = (byte: number) => Buffer.alloc(16, byte);
const payload = (events: WireEvent[]) => encodeVllmBatch({ ts: 1, events, dataParallelRank: 0 }, { format: 'map', hashType: 'u64' });
const stored = (id: bigint, parent: bigint | null, tokens: number[]): WireEvent => ({
  type: 'BlockStored',
  blockHashes: [id],
  parentBlockHash: parent,
  tokenIds: tokens,
  blockSize: 4,
});

function harness() {
  const index = new KvIndex({ blockSize: 4 });
  index.addSource(0);
  const resets: string[] = [];
  const ingest = new SourceIngest({
    source: { workerId: 'w0', dpRank: 0 },
    routerBlockSize: 4,
    sink: (_k, events: KvEvent[]) => {
      for (const e of events) index.apply(0, e);
    },
    onReset: (_k, reason) => {
      resets.push(reason);
      index.apply(0, { kind: 'cleared' });
    },
    replay: null,
    log: quietLog,
  });
  return { index, ingest, resets };
}

describe('the wider sequence frame', () => {
  it('today’s frame, the 4-frame form and the 24-byte seq frame all decode; other shapes are bad frames by kind', () => {
    const p = payload([stored(1n, null, T.slice(0, 4))]);
    const today = parseFrames([Buffer.from('t'), seq8(5), p], 'vllm');
    expect(today).toMatchObject({ ok: true, seq: 5n });
    expect(today.ok && today.epoch).toBeUndefined();
    const four = parseFrames([Buffer.from('t'), epochOf(0xab), seq8(6), p], 'vllm');
    expect(four).toMatchObject({ ok: true, seq: 6n, epoch: 'ab'.repeat(16) });
    const wide = parseFrames([Buffer.from('t'), Buffer.concat([epochOf(0xcd), seq8(7)]), p], 'vllm');
    expect(wide).toMatchObject({ ok: true, seq: 7n, epoch: 'cd'.repeat(16) });
    expect(wide.ok && wide.batch.events.length).toBe(1);
    const beat = parseFrames([Buffer.from('t'), epochOf(1), seq8(8), Buffer.alloc(0)], 'vllm');
    expect(beat).toMatchObject({ ok: true, seq: 8n, heartbeat: true });
    expect(beat.ok && beat.batch.events).toEqual([]);
    expect(parseFrames([Buffer.from('t'), Buffer.alloc(12), p], 'vllm')).toMatchObject({ ok: false, kind: 'seq_length' });
    expect(parseFrames([Buffer.from('t'), Buffer.alloc(8), seq8(1), p], 'vllm')).toMatchObject({ ok: false, kind: 'frame_count' });
    expect(parseFrames([Buffer.from('t'), p], 'vllm')).toMatchObject({ ok: false, kind: 'frame_count' });
  });

  it('counts wide frames and heartbeats (which advance the seq); a new epoch resets the source even when the seq runs on', () => {
    const { index, ingest, resets } = harness();
    const e1 = epochOf(1);
    ingest.onFrames([Buffer.from('t'), e1, seq8(0), payload([stored(1n, null, T.slice(0, 4))])]);
    ingest.onFrames([Buffer.from('t'), e1, seq8(1), Buffer.alloc(0)]); // idle heartbeat
    ingest.onFrames([Buffer.from('t'), e1, seq8(2), payload([stored(2n, 1n, T.slice(4, 8))])]);
    expect(index.findMatches(computeSeqHashes(T, 4))[0]).toBe(2);
    expect(resets).toEqual([]);
    // Another publisher lifetime whose seq happens to continue: still a new engine with an empty cache.
    ingest.onFrames([Buffer.from('t'), epochOf(2), seq8(3), payload([stored(9n, null, [1, 2, 3, 4])])]);
    expect(resets).toEqual(['restart']);
    expect(index.findMatches(computeSeqHashes(T, 4))[0]).toBe(0);
    expect(index.findMatches(computeSeqHashes([1, 2, 3, 4], 4))[0]).toBe(1);
    const h = ingest.health();
    expect(h).toMatchObject({ wideFrames: 4, heartbeats: 1, epochChanges: 1, badFrames: 0 });
  });
});

describe('decode errors by cause', () => {
  it('frame count, seq length, undecodable payloads, malformed and unknown events, each counted under its cause and in the metric', async () => {
    const { ingest } = harness();
    ingest.onFrames([Buffer.from('t')]);
    ingest.onFrames([Buffer.from('t'), Buffer.alloc(3), Buffer.alloc(1)]);
    ingest.onFrames([Buffer.from('t'), seq8(0), Buffer.from([0xc1])]); // 0xc1: never valid msgpack
    ingest.onFrames([
      Buffer.from('t'),
      seq8(1),
      new Packr({ useRecords: false }).pack([1, [{ type: 'Mystery' }, { type: 'BlockRemoved', block_hashes: ['x'] }], 0]),
    ]);
    const h = ingest.health();
    expect(h.decodeErrorsByCause).toEqual({ frame_count: 1, seq_length: 1, undecodable: 1, malformed_event: 1, unknown_event_type: 1 });
    const metrics = new RouterMetrics({ router: new KvRouter({ blockSize: 4 }) });
    metrics.ingestTotals('w0', h);
    metrics.ingestTotals('w0', h); // totals again: no double count
    const text = await metrics.render();
    for (const cause of ['frame_count', 'seq_length', 'undecodable', 'malformed_event', 'unknown_event_type']) {
      expect(text).toMatch(new RegExp(`router_kv_event_decode_errors_total\\{worker="w0",cause="${cause}"\\} 1\\n`));
    }
    metrics.stop();
  });
});
