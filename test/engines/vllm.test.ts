import { describe, expect, it } from 'vitest';
import { KvIndex } from '../../src/core/index/kv-index.ts';
import { computeSeqHashes, hashSeed } from '../../src/core/hashing.ts';
import type { RemovedEvent, StoredEvent } from '../../src/core/types.ts';
import { xxh3 } from '@node-rs/xxhash';
import { unpack } from 'msgpackr';
import {
  decodeVllmBatch,
  encodeVllmBatch,
  vllmFrames,
  type HashType,
  type WireBatch,
  type WireFormat,
} from '../../src/engines/vllm/events.ts';
import { readSeqFrame } from '../../src/engines/common.ts';
import { hand, KTHENA_BATCH, KTHENA_HASH, KTHENA_TOKENS } from './msgpack-hand.ts';

const BIG = (1n << 64n) - 5n; // >= 2^63: arrives as msgpack uint64
const MID = (1n << 62n) + 7n;

function sampleBatch(): WireBatch {
  const tokens = Array.from({ length: 32 }, (_, i) => (i * 7919) % 152000);
  return {
    ts: 1789095808.83,
    dataParallelRank: 3,
    events: [
      { type: 'BlockStored', blockHashes: [BIG, MID], parentBlockHash: null, tokenIds: tokens, blockSize: 16, medium: 'GPU' },
      {
        type: 'BlockStored',
        blockHashes: [5n],
        parentBlockHash: MID,
        tokenIds: tokens.slice(0, 16),
        blockSize: 16,
        loraName: 'sql',
        groupIdx: 0,
      },
      { type: 'BlockRemoved', blockHashes: [5n], medium: 'GPU' },
      { type: 'AllBlocksCleared' },
    ],
  };
}

describe('vLLM codec', () => {
  for (const format of ['array', 'map'] as WireFormat[]) {
    for (const hashType of ['u64', 'i64', 'bytes'] as HashType[]) {
      it(`round-trips ${format} layout with ${hashType} hashes`, () => {
        const batch = sampleBatch();
        const d = decodeVllmBatch(encodeVllmBatch(batch, { format, hashType }));
        expect(d.ok).toBe(true);
        expect(d.ts).toBe(1789095808.83);
        expect(d.dataParallelRank).toBe(3);
        const key = (h: bigint) => {
          if (hashType !== 'bytes') return h;
          const b = Buffer.alloc(8);
          b.writeBigUInt64BE(h);
          return xxh3.xxh64(b, 0n);
        };
        expect(d.events).toHaveLength(4);
        const s0 = d.events[0] as StoredEvent;
        expect(s0).toMatchObject({
          kind: 'stored',
          parent: null,
          blockSize: 16,
          medium: 'GPU',
          loraName: null,
          cacheSalt: null,
          groupIdx: 0,
        });
        expect(s0.engineIds).toEqual([key(BIG), key(MID)]);
        expect(Array.from(s0.tokens!)).toEqual(batch.events[0].type === 'BlockStored' ? batch.events[0].tokenIds : []);
        const s1 = d.events[1] as StoredEvent;
        expect(s1.parent).toBe(key(MID));
        expect(s1.loraName).toBe('sql');
        expect(d.events[2]).toEqual({ kind: 'removed', engineIds: [key(5n)], medium: 'GPU', groupIdx: 0 });
        expect(d.events[3]).toEqual({ kind: 'cleared' });
        expect(d.counts).toEqual({
          unknownEventTypes: 0,
          malformedEvents: 0,
          multimodalBlocks: 0,
          loraIdWithoutName: 0,
          badGroupFields: 0,
          badExtraKeys: 0,
        });
      });
    }
  }

  it('writes u64 >= 2^63 as msgpack uint64 and i64 as signed int64', () => {
    const b = { ts: 1, dataParallelRank: null, events: [{ type: 'BlockRemoved' as const, blockHashes: [BIG] }] };
    const u = encodeVllmBatch(b, { format: 'array', hashType: 'u64' });
    const i = encodeVllmBatch(b, { format: 'array', hashType: 'i64' });
    const be = Buffer.alloc(8);
    be.writeBigUInt64BE(BIG);
    expect(u.includes(Buffer.concat([Buffer.from([0xcf]), be]))).toBe(true);
    expect(i.includes(Buffer.concat([Buffer.from([0xd3]), be]))).toBe(true); // same bits, signed tag (-5)
    expect((decodeVllmBatch(u).events[0] as RemovedEvent).engineIds).toEqual([BIG]);
    expect((decodeVllmBatch(i).events[0] as RemovedEvent).engineIds).toEqual([BIG]);
  });

  it('omits trailing defaults in the array layout (varying lengths)', () => {
    const short = encodeVllmBatch(
      {
        ts: 1,
        dataParallelRank: null,
        events: [{ type: 'BlockStored', blockHashes: [1n], parentBlockHash: null, tokenIds: [1, 2], blockSize: 2 }],
      },
      { format: 'array', hashType: 'u64' },
    );
    // [ts, [["BlockStored", [1], nil, [1,2], 2]]]: batch of 2, event of 5.
    const raw = unpack(short) as unknown[][][];
    expect(raw).toHaveLength(2);
    expect(raw[1][0]).toHaveLength(5);
    const withGroup = encodeVllmBatch(
      {
        ts: 1,
        dataParallelRank: 0,
        events: [{ type: 'BlockStored', blockHashes: [1n], parentBlockHash: null, tokenIds: [1, 2], blockSize: 2, groupIdx: 1 }],
      },
      { format: 'array', hashType: 'u64' },
    );
    const raw2 = unpack(withGroup) as unknown[][][];
    expect(raw2).toHaveLength(3);
    expect(raw2[1][0]).toHaveLength(10); // up to group_idx; kv_cache_spec_kind at its default is omitted
    const d = decodeVllmBatch(withGroup);
    expect((d.events[0] as StoredEvent).groupIdx).toBe(1);
  });

  it('decodes the real kthena capture (hand-encoded, uint64 hash >= 2^63) and indexes it', () => {
    const payload = hand(KTHENA_BATCH);
    // The hash is written with the uint64 tag, as msgspec does.
    const be = Buffer.alloc(8);
    be.writeBigUInt64BE(KTHENA_HASH);
    expect(payload.includes(Buffer.concat([Buffer.from([0xcf]), be]))).toBe(true);
    const d = decodeVllmBatch(payload);
    expect(d.ok).toBe(true);
    expect(d.ts).toBe(1789095808.83);
    expect(d.dataParallelRank).toBe(0);
    expect(d.events).toEqual([
      {
        kind: 'stored',
        parent: null,
        engineIds: [KTHENA_HASH],
        tokens: KTHENA_TOKENS,
        blockSize: 16,
        loraName: null,
        cacheSalt: null,
        medium: 'GPU',
        groupIdx: 0,
        groupKind: 'full_attention',
      },
    ]);
    const idx = new KvIndex({ blockSize: 16 });
    idx.addSource(0);
    expect(idx.apply(0, d.events[0])).toEqual({ applied: 1, rejected: 0 });
    expect(idx.findMatches(computeSeqHashes(KTHENA_TOKENS, 16))[0]).toBe(1);
  });

  it('decodes every field generation of the positional layout', () => {
    const t = Array.from({ length: 4 }, (_, i) => i + 64); // 64..67: fixints msgpackr records would misread
    const gens = [
      ['BlockStored', [9n], null, t, 4],
      ['BlockStored', [9n], null, t, 4, null],
      ['BlockStored', [9n], null, t, 4, null, 'GPU'],
      ['BlockStored', [9n], null, t, 4, null, 'GPU', null],
      ['BlockStored', [9n], null, t, 4, null, 'GPU', null, [null]],
      ['BlockStored', [9n], null, t, 4, null, 'GPU', null, [null], 0],
      ['BlockStored', [9n], null, t, 4, null, 'GPU', null, [null], 0, 'full_attention', null],
      // 11 sliding window, 12 locality, 13 ownership, 14 session_id, then a field from the future
      ['BlockStored', [9n], null, t, 4, null, 'GPU', null, [null], 0, 'full_attention', null, null, null, 's-1', 'future-field'],
    ];
    for (const g of gens) {
      const d = decodeVllmBatch(hand([1.5, [g as never]]));
      expect(d.ok).toBe(true);
      expect(d.dataParallelRank).toBe(null);
      expect(d.events).toHaveLength(1);
      expect(d.events[0]).toMatchObject({ kind: 'stored', engineIds: [9n], tokens: t, blockSize: 4, groupIdx: 0 });
    }
    const removed = [
      ['BlockRemoved', [9n]],
      ['BlockRemoved', [9n], 'CPU'],
      ['BlockRemoved', [9n], null, 2],
    ];
    const d = decodeVllmBatch(hand([1, removed as never, 1]));
    expect(d.events).toEqual([
      { kind: 'removed', engineIds: [9n], groupIdx: 0 },
      { kind: 'removed', engineIds: [9n], medium: 'CPU', groupIdx: 0 },
      { kind: 'removed', engineIds: [9n], groupIdx: 2 },
    ]);
  });

  it('accepts a map batch, ignores unknown keys, counts unknown types and malformed events', () => {
    const d = decodeVllmBatch(
      hand({
        ts: 2,
        events: [
          { type: 'BlockStored', block_hashes: [1], parent_block_hash: null, token_ids: [1, 2], block_size: 2, shiny_new_key: [1, 2] },
          { type: 'BlockTeleported', block_hashes: [1] },
          ['SomethingElse', 1],
          { type: 'BlockStored', block_hashes: 'nope', token_ids: [], block_size: 2 },
          { type: 'BlockStored', block_hashes: [1], token_ids: [1, -2], block_size: 2 },
          42,
          { no_type: true },
        ],
        data_parallel_rank: 5,
        also_new: 'x',
      }),
    );
    expect(d.ok).toBe(true);
    expect(d.dataParallelRank).toBe(5);
    expect(d.events).toHaveLength(1);
    expect(d.counts.unknownEventTypes).toBe(2);
    expect(d.counts.malformedEvents).toBe(4);
  });

  it('reports unusable payloads without throwing', () => {
    expect(decodeVllmBatch(Buffer.from([0xc1])).ok).toBe(false);
    expect(decodeVllmBatch(Buffer.alloc(0)).ok).toBe(false);
    expect(decodeVllmBatch(hand('hello')).ok).toBe(false);
    expect(decodeVllmBatch(hand([1, 2, 3])).error).toMatch(/event list/);
    expect(decodeVllmBatch(hand([1, [], 0])).events).toEqual([]);
  });

  it('reads lora_name and cache_salt from extra keys; skips prompt-embeds blocks and counts them', () => {
    const t = Array.from({ length: 12 }, (_, i) => 1000 + i);
    const d = decodeVllmBatch(
      hand([
        1,
        [
          ['BlockStored', [1n, 2n, 3n], null, t, 4, 7, 'GPU', 'sql', [['sql', 'tenant-a'], ['sql'], null]],
          ['BlockStored', [4n, 5n, 6n], null, t, 4, null, 'GPU', null, [null, [new Uint8Array([1, 2, 3])], null]],
          ['BlockStored', [7n], null, t.slice(0, 4), 4, 3],
          ['BlockStored', [8n], null, t.slice(0, 4), 4, 3, 'GPU', 'old-lora', [[3]]],
          ['BlockStored', [9n, 10n], null, t.slice(0, 8), 4, 5, 'GPU', null, [['sql', 'tenant-b'], ['sql']]],
        ],
      ]),
    );
    expect(d.events).toHaveLength(5);
    // No lora_name field: the adapter's name is recovered from the extra keys, the salt still found after it.
    expect(d.events[4]).toMatchObject({ engineIds: [9n, 10n], loraName: 'sql', cacheSalt: 'tenant-b' });
    expect(d.events[0]).toMatchObject({ engineIds: [1n, 2n, 3n], loraName: 'sql', cacheSalt: 'tenant-a' });
    // An integer extra key is an older release's LoRA id, not multimodal identity.
    expect(d.events[3]).toMatchObject({ engineIds: [8n], loraName: 'old-lora', cacheSalt: null });
    expect(d.events[1]).toMatchObject({ engineIds: [4n], tokens: t.slice(0, 4) });
    expect(d.skippedIds).toEqual([5n, 6n]);
    expect(d.counts.multimodalBlocks).toBe(2);
    expect(d.events[2]).toMatchObject({ loraName: 'lora-id:3' });
    expect(d.counts.loraIdWithoutName).toBe(1);
    // The salt feeds the same seed rule as requests.
    const idx = new KvIndex({ blockSize: 4 });
    idx.addSource(0);
    idx.apply(0, d.events[0]);
    expect(idx.findMatches(computeSeqHashes(t, 4, hashSeed('sql', 'tenant-a')))[0]).toBe(3);
    expect(idx.findMatches(computeSeqHashes(t, 4, hashSeed('sql')))[0]).toBe(0);
  });

  it('builds the three frames and reads the seq back', () => {
    const [topic, seq, payload] = vllmFrames('kv-events', 0xfedcba9876543210n, Buffer.from([0x90]));
    expect(topic.toString()).toBe('kv-events');
    expect(seq.toString('hex')).toBe('fedcba9876543210');
    expect(readSeqFrame(seq)).toBe(0xfedcba9876543210n);
    expect(readSeqFrame(Buffer.alloc(7))).toBe(null);
    expect(payload).toEqual(Buffer.from([0x90]));
  });
});
