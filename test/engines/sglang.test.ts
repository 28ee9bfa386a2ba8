import { describe, expect, it } from 'vitest';
import { decodeSglangBatch, encodeSglangBatch } from '../../src/engines/sglang/events.ts';
import { decodeVllmBatch } from '../../src/engines/vllm/events.ts';
import { KvIndex } from '../../src/core/index/kv-index.ts';
import { computeSeqHashes, hashSeed } from '../../src/core/hashing.ts';
import { hand } from './msgpack-hand.ts';

const NEG = BigInt.asUintN(64, -1234567890123n); // arrives as a negative int64

describe('SGLang codec', () => {
  for (const format of ['array', 'map'] as const) {
    it(`decodes ${format} events with signed hashes and metadata.cache_salt`, () => {
      const tokens = Array.from({ length: 8 }, (_, i) => 500 + i);
      const payload = encodeSglangBatch(
        {
          ts: 3.25,
          attnDpRank: 2,
          events: [
            {
              type: 'BlockStored',
              blockHashes: [NEG, 7n],
              parentBlockHash: null,
              tokenIds: tokens,
              blockSize: 4,
              medium: 'GPU',
              cacheSalt: 'tenant-a',
            },
            { type: 'BlockRemoved', blockHashes: [7n] },
            { type: 'AllBlocksCleared' },
          ],
        },
        format,
      );
      const d = decodeSglangBatch(payload);
      expect(d.ok).toBe(true);
      expect(d.dataParallelRank).toBe(2);
      expect(d.events[0]).toMatchObject({
        kind: 'stored',
        engineIds: [NEG, 7n],
        parent: null,
        cacheSalt: 'tenant-a',
        loraName: null,
        medium: 'GPU',
      });
      expect(d.events[1]).toMatchObject({ kind: 'removed', engineIds: [7n] });
      expect(d.events[2]).toEqual({ kind: 'cleared' });
      const idx = new KvIndex({ blockSize: 4 });
      idx.addSource(0);
      idx.apply(0, d.events[0]);
      expect(idx.findMatches(computeSeqHashes(tokens, 4, hashSeed(null, 'tenant-a')))[0]).toBe(2);
    });
  }

  it('reads positional index 7 as metadata, where vLLM reads lora_name', () => {
    const ev = ['BlockStored', [-5n], null, [1, 2], 2, null, 'GPU', { cache_salt: 's' }];
    const s = decodeSglangBatch(hand([1, [ev as never], 0]));
    expect(s.events[0]).toMatchObject({ engineIds: [BigInt.asUintN(64, -5n)], cacheSalt: 's', loraName: null });
    const v = decodeVllmBatch(hand([1, [ev as never], 0]));
    expect(v.events[0]).toMatchObject({ cacheSalt: null, loraName: null });
  });
});
