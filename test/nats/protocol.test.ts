/**
 * The NATS wire codecs: round trips (property-based) and bad input -> null, never a throw.
 */
import fc from 'fast-check';
import { Packr } from 'msgpackr';
import { describe, expect, it } from 'vitest';
import type { KvEvent } from '../../src/core/types.ts';
import {
  batchFingerprint,
  checkWorkerId,
  decodeEventMessage,
  decodeLoad,
  decodeWorkerEntry,
  encodeEventMessage,
  encodeLoad,
  encodeWorkerEntry,
  eventSubject,
  subjectSource,
  type EventItem,
} from '../../src/transport/nats/protocol.ts';

const u64 = fc.bigInt({ min: 0n, max: (1n << 64n) - 1n });
const stored = fc
  .record({
    kind: fc.constant('stored' as const),
    parent: fc.option(u64, { nil: null }),
    n: fc.integer({ min: 1, max: 4 }),
    blockSize: fc.constantFrom(4, 16),
    loraName: fc.option(fc.string({ maxLength: 8 }), { nil: undefined }),
    cacheSalt: fc.option(fc.string({ maxLength: 8 }), { nil: undefined }),
    medium: fc.option(fc.constantFrom('GPU', 'CPU'), { nil: undefined }),
    groupIdx: fc.option(fc.nat(3), { nil: undefined }),
    groupKind: fc.option(fc.constantFrom('full_attention', 'sliding_window', 'mamba', 'unknown'), { nil: undefined }),
    slidingWindow: fc.option(fc.integer({ min: 1, max: 4096 }), { nil: undefined }),
    mm: fc.option(fc.tuple(fc.string({ minLength: 1, maxLength: 6 }), fc.integer({ min: -64, max: 64 })), { nil: undefined }),
    seed: fc.integer({ min: 0, max: 1000 }),
  })
  .map((r): KvEvent => {
    const ev: Record<string, unknown> = {
      kind: 'stored',
      parent: r.parent,
      engineIds: Array.from({ length: r.n }, (_, i) => (BigInt(r.seed * 10 + i) * 0x9e3779b97f4a7c15n) % (1n << 64n)),
      tokens: Uint32Array.from({ length: r.n * r.blockSize }, (_, i) => (r.seed + i * 7) % 150_000),
      blockSize: r.blockSize,
    };
    if (r.loraName !== undefined) ev.loraName = r.loraName;
    if (r.cacheSalt !== undefined) ev.cacheSalt = r.cacheSalt;
    if (r.medium !== undefined) ev.medium = r.medium;
    if (r.groupIdx !== undefined) ev.groupIdx = r.groupIdx;
    if (r.groupKind !== undefined) ev.groupKind = r.groupKind;
    if (r.slidingWindow !== undefined) ev.slidingWindow = r.slidingWindow;
    if (r.mm !== undefined) ev.mmKeys = Array.from({ length: r.n }, (_, i) => (i === 0 ? [r.mm] : null));
    return ev as unknown as KvEvent;
  });
const removed = fc.array(u64, { minLength: 1, maxLength: 5 }).map((ids): KvEvent => ({ kind: 'removed', engineIds: ids }));
const event = fc.oneof(stored, removed, fc.constant({ kind: 'cleared' } as KvEvent));
const item: fc.Arbitrary<EventItem> = fc.oneof(
  fc.record({
    kind: fc.constant('batch' as const),
    seq: fc.bigInt({ min: 0n, max: (1n << 63n) - 1n }),
    fp: fc.integer({ min: 0, max: 2 ** 32 - 1 }),
    events: fc.array(event, { maxLength: 4 }),
  }),
  fc.record({ kind: fc.constant('reset' as const), reason: fc.string({ maxLength: 20 }) }),
);

describe('event messages', () => {
  it('round-trip any items', () => {
    fc.assert(
      fc.property(fc.array(item, { maxLength: 6 }), (items) => {
        const back = decodeEventMessage(encodeEventMessage(items));
        expect(back).not.toBeNull();
        expect(back!.badEvents).toBe(0);
        expect(back!.items).toEqual(items);
      }),
      { numRuns: 200 },
    );
  });

  it('return null or count bad events for garbage, never throw', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 64 }), (bytes) => {
        const r = decodeEventMessage(bytes);
        expect(r === null || Array.isArray(r.items)).toBe(true);
      }),
      { numRuns: 500 },
    );
    // A well-formed message with one malformed event: the event is dropped and counted.
    const good = encodeEventMessage([{ kind: 'batch', seq: 1n, fp: 0, events: [{ kind: 'cleared' }] }]);
    expect(decodeEventMessage(good)!.items).toHaveLength(1);
    // Engine ids of 3 bytes (not a multiple of 8) and a block size of 0: both events dropped and counted.
    const packr = new Packr({ useRecords: false });
    const bad = decodeEventMessage(
      packr.pack([
        1,
        [
          [
            0,
            1n,
            0,
            [
              [0, null, new Uint8Array(3), null, 16, null, null, null, null, null],
              [0, null, new Uint8Array(8), null, 0, null, null, null, null, null],
              [2],
            ],
          ],
        ],
      ]),
    );
    expect(bad!.badEvents).toBe(2);
    expect(bad!.items[0]).toEqual({ kind: 'batch', seq: 1n, fp: 0, events: [{ kind: 'cleared' }] });
  });

  it('fingerprints differ when ids or kinds differ', () => {
    const a = batchFingerprint([{ kind: 'removed', engineIds: [1n, 2n] }]);
    expect(batchFingerprint([{ kind: 'removed', engineIds: [1n, 2n] }])).toBe(a);
    expect(batchFingerprint([{ kind: 'removed', engineIds: [1n, 3n] }])).not.toBe(a);
    expect(batchFingerprint([{ kind: 'stored', parent: null, engineIds: [1n, 2n], tokens: null, blockSize: 16 }])).not.toBe(a);
  });
});

describe('subjects, registry, lifecycle', () => {
  it('maps subjects to sources and rejects unsafe worker ids', () => {
    expect(subjectSource(eventSubject('w-1', 3))).toEqual({ workerId: 'w-1', dpRank: 3 });
    expect(subjectSource('kvroute.events.w')).toBeNull();
    expect(subjectSource('kvroute.events.w.x')).toBeNull();
    expect(subjectSource('other.events.w.0')).toBeNull();
    expect(checkWorkerId('vllm-0')).toBeNull();
    for (const bad of ['a.b', 'a*', '>', '', 'a b']) expect(checkWorkerId(bad)).toMatch(/must match/);
  });

  it('registry entries round-trip; bad ones are null', () => {
    const e = {
      workerId: 'w0',
      url: 'http://x:8000',
      model: 'm',
      blockSize: 16,
      dpRanks: [0, 1],
      relayId: 'r',
      heartbeatAt: 5,
      resume: { '0': { seq: '12', fp: 7 } },
    };
    expect(decodeWorkerEntry(encodeWorkerEntry(e))).toEqual(e);
    const enc = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));
    expect(decodeWorkerEntry(enc({ ...e, workerId: 'a.b' }))).toBeNull();
    expect(decodeWorkerEntry(enc({ ...e, blockSize: 0 }))).toBeNull();
    expect(decodeWorkerEntry(enc({ ...e, dpRanks: [-1] }))).toBeNull();
    expect(decodeWorkerEntry(new TextEncoder().encode('{not json'))).toBeNull();
    expect(decodeWorkerEntry(enc({ ...e, resume: { '0': { seq: 'x', fp: 1 } } }))!.resume).toEqual({});
  });

  it('lifecycle messages round-trip; garbage is null', () => {
    const seqHashes = new BigUint64Array([1n, (1n << 64n) - 1n]);
    const a = { kind: 'added' as const, replica: 'r', requestId: 'q', sourceKey: 'w#1', seqHashes, promptTokens: 40, overlapBlocks: 1 };
    expect(decodeLoad(encodeLoad(a))).toEqual(a);
    for (const kind of ['first_token', 'finished'] as const)
      expect(decodeLoad(encodeLoad({ kind, replica: 'r', requestId: 'q' }))).toEqual({ kind, replica: 'r', requestId: 'q' });
    for (const kind of ['heartbeat', 'hello', 'bye'] as const)
      expect(decodeLoad(encodeLoad({ kind, replica: 'r' }))).toEqual({ kind, replica: 'r' });
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 40 }), (b) => {
        const m = decodeLoad(b);
        expect(m === null || typeof m.replica === 'string').toBe(true);
      }),
      { numRuns: 300 },
    );
  });
});
