/**
 * The snapshot byte format (src/transport/nats/snapshot-format.ts) in memory: a router's snapshot survives
 * encode -> decode -> restore by source key, and anything that is not a whole format-2 snapshot is refused with its
 * reason code (never a throw): another version, foreign bytes, truncation at any length, any flipped byte.
 */
import fc from 'fast-check';
import { Packr } from 'msgpackr';
import { describe, expect, it } from 'vitest';
import { KvRouter } from '../../src/core/router.ts';
import { decodeSnapshot, encodeSnapshot, FRAME_BLOCKS, SnapshotEncoder } from '../../src/transport/nats/snapshot-format.ts';
import { blocksOf, matchesByKey } from './fleet.ts';

const header = { streamSeq: 9, routerBlockSize: 4, takenAt: 1, replica: 'x' };

/** Three sources with 50 engine blocks of 2 router blocks each, chains of 5 events; index numbers differ from a fresh router's. */
function populated(): KvRouter {
  const a = new KvRouter({ blockSize: 4, overlay: false });
  a.addSource({ workerId: 'w0', dpRank: 0 });
  a.addSource({ workerId: 'w0', dpRank: 1 });
  a.addSource({ workerId: 'w1', dpRank: 0 });
  a.removeSource('w0');
  a.addSource({ workerId: 'w2', dpRank: 0 });
  let id = 1n;
  for (const key of ['w0#1', 'w1', 'w2']) {
    let parent: bigint | null = null;
    for (let b = 0; b < 50; b++) {
      const ids = [id++, id++];
      a.applyEvents(key, [
        { kind: 'stored', parent, engineIds: ids, tokens: Array.from({ length: 8 }, (_, i) => b * 8 + i + key.length), blockSize: 4 },
      ]);
      parent = b % 5 === 4 ? null : ids[1];
    }
  }
  return a;
}

const byKey = (r: KvRouter) => Object.fromEntries(r.state().sources.map((s) => [s.source, s.cachedBlocks]));

describe('snapshot format', () => {
  it('carries degraded sources: a router restored from it (in one piece or in steps) is degraded the same way', () => {
    const a = populated();
    a.addSource({ workerId: 'cold', dpRank: 0 });
    a.markDegraded('w1', 'relay_backlog_overflow', 1_000);
    a.markDegraded('w1', 'stream_gap', 2_000);
    a.markDegraded('cold', 'replay_too_old', 3_000); // holds no blocks: listed anyway
    const data = a.snapshot().data();
    expect(data.sources.map((s) => s.key).sort()).toEqual(['cold', 'w0#1', 'w1', 'w2']);
    const r = decodeSnapshot(encodeSnapshot(header, data.sources));
    if (!r.ok) throw r.error;
    const want = new Map([
      ['w1', { since: 1_000, reason: 'stream_gap', losses: 2 }],
      ['cold', { since: 3_000, reason: 'replay_too_old', losses: 1 }],
    ]);
    const whole = new KvRouter({ blockSize: 4, overlay: false });
    expect(whole.restore(r.snapshot.data).rejected).toEqual([]);
    expect(whole.degradedSources()).toEqual(want);
    // In steps, over a router where w1 was trusted and w2 degraded: each restored source takes the snapshot's state.
    const steps = new KvRouter({ blockSize: 4, overlay: false });
    steps.addSource({ workerId: 'w2', dpRank: 0 });
    steps.markDegraded('w2', 'stream_gap', 5);
    const gen = steps.restoreSteps(r.snapshot.data.sources, 16);
    let x = gen.next();
    while (!x.done) x = gen.next();
    expect(x.value.rejected).toEqual([]);
    expect(steps.degradedSources()).toEqual(want);
    expect(byKey(steps)).toEqual(byKey(a));
    // A degraded state that cannot be read is refused with the snapshot, as corrupt.
    const bad = encodeSnapshot(header, [
      { ...data.sources.find((s) => s.key === 'cold')!, degraded: { since: 1, reason: 7 as never, losses: 1 } },
    ]);
    expect(decodeSnapshot(bad)).toMatchObject({ ok: false, error: { code: 'corrupt' } });
  });

  it('encode -> decode -> restore rebuilds an identical index, by source key, engine ids included', () => {
    const a = populated();
    const bytes = encodeSnapshot(header, a.snapshot().data().sources);
    const r = decodeSnapshot(bytes);
    if (!r.ok) throw r.error;
    expect(r.snapshot).toMatchObject({ streamSeq: 9, routerBlockSize: 4, takenAt: 1, replica: 'x', blocks: 300 });
    const b = new KvRouter({ blockSize: 4, overlay: false });
    expect(b.restore(r.snapshot.data)).toEqual({ sources: 3, blocks: 300, rejected: [] });
    expect(b.sourceKeys().sort()).toEqual(['w0#1', 'w1', 'w2']);
    expect(byKey(b)).toEqual(byKey(a));
    for (const k of ['w0#1', 'w1', 'w2']) expect(blocksOf(b, k)).toEqual(blocksOf(a, k));
    // w1's first chain: five events of 8 tokens, 2..41.
    const probe = a.hashRequest(Array.from({ length: 40 }, (_, i) => i + 2));
    expect(matchesByKey(b, probe)).toEqual({ w1: 10, w2: 10 });
    // Removals by engine id work on the restored index (the engine-id mapping survived).
    b.applyEvents('w1', [{ kind: 'removed', engineIds: [101n, 102n] }]);
    a.applyEvents('w1', [{ kind: 'removed', engineIds: [101n, 102n] }]);
    expect(byKey(b)).toEqual(byKey(a));
    expect(matchesByKey(b, probe)).toEqual({ w2: 10 });
  });

  it('a source larger than one data frame is split and joined back in order', () => {
    const n = FRAME_BLOCKS * 2 + 5;
    const engineIds = BigUint64Array.from({ length: n }, (_, i) => BigInt(i + 1));
    const seqHashes = BigUint64Array.from({ length: 2 * n }, (_, i) => (BigInt(i) << 33n) | 7n);
    const parents = Int32Array.from({ length: n }, (_, i) => i - 1);
    const enc = new SnapshotEncoder(header, 1);
    let steps = 0;
    for (const _ of enc.addSource({ key: 'big', blockSize: 8, engineIds, seqHashes, parents })) steps++;
    expect(steps).toBe(3); // one step per data frame
    const { chunks, bytes } = enc.finish();
    const all = new Uint8Array(bytes);
    let at = 0;
    for (const c of chunks) {
      all.set(c, at);
      at += c.byteLength;
    }
    const r = decodeSnapshot(all);
    if (!r.ok) throw r.error;
    const s = r.snapshot.data.sources[0];
    expect(s.key).toBe('big');
    expect(s.engineIds).toEqual(engineIds);
    expect(s.seqHashes).toEqual(seqHashes);
    expect(s.parents).toEqual(parents);
  });

  it('another format version, foreign bytes and format 1 are refused with their codes', () => {
    const bytes = encodeSnapshot(header, populated().snapshot().data().sources);
    const v3 = bytes.slice();
    v3[4] = 3;
    const r3 = decodeSnapshot(v3);
    expect(r3.ok).toBe(false);
    if (!r3.ok) {
      expect(r3.error.code).toBe('version');
      expect(r3.error.message).toBe('snapshot format 3, this replica reads format 2');
    }
    const v1 = new Packr({ useRecords: false }).pack([1, 9, 4, 1, 'x', []]);
    const r1 = decodeSnapshot(v1);
    expect(!r1.ok && r1.error.code).toBe('version');
    expect(!r1.ok && r1.error.message).toBe('snapshot format 1, this replica reads format 2');
    for (const junk of [new Uint8Array(0), new Uint8Array([1, 2, 3]), new TextEncoder().encode('{"streamSeq": 4}')]) {
      const r = decodeSnapshot(junk);
      expect(!r.ok && r.error.code).toBe('not_snapshot');
    }
  });

  it('every truncation is refused as truncated, every single flipped byte as corrupt (or another version): never a throw', () => {
    const bytes = encodeSnapshot(header, populated().snapshot().data().sources);
    for (let len = 6; len < bytes.byteLength; len += 7) {
      const r = decodeSnapshot(bytes.subarray(0, len));
      expect(r.ok, `length ${len}`).toBe(false);
      if (!r.ok) expect(['truncated', 'corrupt'], `length ${len}`).toContain(r.error.code);
    }
    const cut = decodeSnapshot(bytes.subarray(0, bytes.byteLength - 1));
    expect(!cut.ok && cut.error.code).toBe('truncated');
    // One flip is accepted, and rightly: the trailer's block count 300 as uint16 (0xcd) flipped to int16 (0xd1) is the
    // same number in another MessagePack spelling. A flip may pass only if it reads back exactly the original snapshot.
    const original = decodeSnapshot(bytes);
    fc.assert(
      fc.property(fc.integer({ min: 0, max: bytes.byteLength - 1 }), fc.integer({ min: 1, max: 255 }), (at, x) => {
        const bad = bytes.slice();
        bad[at] ^= x;
        const r = decodeSnapshot(bad);
        if (r.ok) {
          expect(r).toEqual(original);
          expect([bytes[at], bad[at]].sort()).toEqual([0xcd, 0xd1]);
          return;
        }
        if (!r.ok) expect(['corrupt', 'truncated', 'version', 'not_snapshot']).toContain(r.error.code);
        if (!r.ok && at >= 6) expect(['corrupt', 'truncated']).toContain(r.error.code);
      }),
      // Always try the one harmless flip (the trailer's uint16 block count), whatever the seed draws.
      { numRuns: 400, examples: [[bytes.lastIndexOf(0xcd), 0xcd ^ 0xd1]] },
    );
  });
});
