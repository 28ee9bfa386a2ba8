/** Offload tiers: every medium's tier, locality, the credits the policy gives them, store-only ageing, unknown media. */
import fc from 'fast-check';
import { Packr } from 'msgpackr';
import { describe, expect, it } from 'vitest';
import { computeSeqHashes } from '../../src/core/hashing.ts';
import { KvRouter, TIER_CREDIT_ON } from '../../src/core/router.ts';
import { TierIndex, tierOf } from '../../src/core/tiers.ts';
import type { KvEvent } from '../../src/core/types.ts';
import { decodeVllmBatch, encodeVllmBatch } from '../../src/engines/vllm/events.ts';

const BS = 4;
const T = Array.from({ length: 16 }, (_, i) => 100 + i);

describe('tierOf', () => {
  it('maps every medium engines send to a tier; locality decides FS / OBJ; unknown media are null', () => {
    const cases: [string, 'LOCAL' | 'REMOTE' | undefined, string | null][] = [
      ['CPU', undefined, 'host'], // vLLM CPU offloading, LMCache's CPU backend, TensorRT-LLM's secondary pool
      ['cpu', undefined, 'host'],
      ['CPU_PINNED', undefined, 'host'], // SGLang HiCache
      ['HOST', undefined, 'host'],
      ['DISK', undefined, 'disk'],
      ['LOCAL_DISK', undefined, 'disk'],
      ['FS', 'LOCAL', 'disk'],
      ['FS', undefined, 'disk'],
      ['OBJ', 'LOCAL', 'disk'],
      ['FS', 'REMOTE', 'remote'],
      ['OBJ', 'REMOTE', 'remote'],
      ['CPU', 'REMOTE', 'remote'],
      ['NVME_OF', undefined, null],
      ['', undefined, null],
    ];
    for (const [m, l, tier] of cases) expect(tierOf(m, l), `${m}/${l}`).toBe(tier);
  });
});

/** A router with one source holding T's four blocks on GPU (engine ids 1..4). */
function routerWithGpu(knobs: Record<string, number> = {}, storeOnlyTtlMs?: number) {
  const r = new KvRouter({ blockSize: BS, overlay: false, knobs, storeOnlyTtlMs });
  r.addSource({ workerId: 'w0', dpRank: 0 });
  r.addSource({ workerId: 'w1', dpRank: 0 });
  r.applyEvents('w0', [{ kind: 'stored', parent: null, engineIds: [1n, 2n, 3n, 4n], tokens: T, blockSize: BS }], 0);
  return r;
}

const offload = (ids: bigint[], medium: string, locality?: 'LOCAL' | 'REMOTE'): KvEvent => ({
  kind: 'stored',
  parent: null,
  engineIds: ids,
  tokens: [],
  blockSize: BS,
  medium,
  ...(locality ? { locality } : {}),
});

describe('tiers in the router', () => {
  it('host, disk and remote copies after the GPU prefix; REMOTE earns no credit unless configured', () => {
    const seq = computeSeqHashes([...T, 1], BS);
    const r = routerWithGpu();
    r.applyEvents('w0', [offload([2n], 'CPU_PINNED'), offload([3n], 'FS', 'LOCAL'), offload([4n], 'OBJ', 'REMOTE')], 0);
    r.applyEvents('w0', [{ kind: 'removed', engineIds: [2n, 3n, 4n] }], 0); // the GPU copies are gone
    expect(r.tiers.overlap(0, seq, 1)).toEqual({ host: 1, disk: 1, remote: 1 });
    const cost = (knobs: Record<string, number>) => {
      const d = r.route({ requestId: `x${Math.random()}`, tokens: [...T, 1], knobs, policy: 'kv' }, 0);
      if (d.kind !== 'routed') throw new Error('refused');
      r.finish(d.requestId, { outcome: 'cancelled' }, 0);
      return d.candidates.find((c) => c.source === 'w0')!.cost;
    };
    const off = cost({});
    const on = cost({ ...TIER_CREDIT_ON });
    const remote = cost({ ...TIER_CREDIT_ON, remoteTierCredit: 0.5 });
    // credited = 1 GPU + 0.75 host + 0.25 disk (+ 0.5 remote when configured) of 5 blocks' prefill.
    expect(off - on).toBeCloseTo(1.0, 6);
    expect(on - remote).toBeCloseTo(0.5, 6);
  });

  it('a medium kvroute does not know: counted, not tracked, the event rejected with unknown_medium', () => {
    const r = routerWithGpu();
    const res = r.applyEvents('w0', [offload([2n, 3n], 'NVME_OF')], 0);
    expect(res).toMatchObject({ applied: 0, rejected: 2, reason: 'unknown_medium' });
    expect(r.tiers.counters.unknownMediumBlocks).toBe(2);
    expect(r.tiers.blocks(0)).toBe(0);
  });

  it('store-only media (LMCache CPU: stores, never removals) age out after the TTL; a removal proves evictions are reported', () => {
    const seq = computeSeqHashes([...T, 1], BS);
    const r = routerWithGpu({}, 1000);
    r.applyEvents('w0', [offload([2n, 3n], 'CPU')], 0);
    r.applyEvents('w0', [{ kind: 'removed', engineIds: [2n, 3n, 4n] }], 0);
    expect(r.tiers.overlap(0, seq, 1, 1000)).toEqual({ host: 2, disk: 0, remote: 0 });
    expect(r.tiers.overlap(0, seq, 1, 1001)).toEqual({ host: 0, disk: 0, remote: 0 });
    // A new Stored refreshes the block's age; sweep drops what expired.
    r.applyEvents('w0', [offload([2n], 'CPU')], 900);
    expect(r.tiers.overlap(0, seq, 1, 1500)).toEqual({ host: 1, disk: 0, remote: 0 });
    r.sweep(1500);
    expect(r.tiers.blocks(0)).toBe(1);
    expect(r.tiers.counters.expiredBlocks).toBe(1);
    // Once the medium sends a removal, its blocks no longer age (block 2, stored at 900, still counts much later).
    r.applyEvents('w0', [{ kind: 'removed', engineIds: [99n], medium: 'CPU' }], 1500);
    expect(r.tiers.overlap(0, seq, 1, 1_000_000)).toEqual({ host: 1, disk: 0, remote: 0 });
    // An expired block announced again by id alone cannot be matched any more (its GPU copy is gone): counted unknown.
    expect(r.applyEvents('w0', [offload([3n], 'CPU')], 1500)).toMatchObject({ applied: 0, reason: 'unknown_block' });
  });

  it('ageing off with a TTL of 0', () => {
    const t = new TierIndex({ storeOnlyTtlMs: 0 });
    t.apply(0, offload([1n], 'CPU'), () => 7n, 0);
    expect(t.overlap(0, BigUint64Array.of(7n), 0, 1e12)).toEqual({ host: 1, disk: 0, remote: 0 });
  });
});

describe('media, locality and ownership: any value on the wire (property)', () => {
  it('never throws; every lower-tier block is applied, unknown, or of an unknown medium', () => {
    const medium = fc.oneof(
      fc.constantFrom('GPU', 'CPU', 'CPU_PINNED', 'DISK', 'FS', 'OBJ', 'cpu', ''),
      fc.string({ maxLength: 8 }),
      fc.constant(null),
    );
    const locality = fc.oneof(fc.constantFrom('LOCAL', 'REMOTE', 'local', undefined), fc.anything());
    const ev = fc.record({
      type: fc.constantFrom('BlockStored', 'BlockRemoved'),
      block_hashes: fc.array(fc.bigInt({ min: 1n, max: 6n }), { minLength: 1, maxLength: 3 }),
      parent_block_hash: fc.constant(null),
      token_ids: fc.constant([]),
      block_size: fc.constant(BS),
      medium,
      locality,
      ownership: fc.oneof(fc.string({ maxLength: 4 }), fc.anything()),
    });
    fc.assert(
      fc.property(fc.array(ev, { maxLength: 10 }), (events) => {
        const r = routerWithGpu({ ...TIER_CREDIT_ON, remoteTierCredit: 0.5 });
        const b = decodeVllmBatch(new Packr({ useRecords: false }).pack([1, events, 0]));
        expect(b.ok).toBe(true);
        let lowerBlocks = 0;
        for (const e of b.events)
          if (e.kind !== 'cleared' && e.medium !== undefined && e.medium !== 'GPU') lowerBlocks += e.engineIds.length;
        const before = r.tiers.counters.unknownMediumBlocks + r.tiers.counters.unknownBlocks;
        let applied = 0;
        for (const e of b.events) {
          const res = r.applyEvents('w0', [e], 0);
          if (e.kind !== 'cleared' && e.medium !== undefined && e.medium !== 'GPU') applied += res.applied;
        }
        const counted = r.tiers.counters.unknownMediumBlocks + r.tiers.counters.unknownBlocks - before;
        expect(applied + counted).toBe(lowerBlocks);
        const d = r.route({ requestId: 'p', tokens: [...T, 1] }, 0);
        expect(d.kind).toBe('routed');
      }),
      { numRuns: 300 },
    );
  });
});

describe('vLLM main: locality and ownership on the wire', () => {
  it('decoded from map events, kept on the normalised event; a bad locality is malformed', () => {
    const payload = encodeVllmBatch(
      {
        ts: 1,
        dataParallelRank: 0,
        events: [
          {
            type: 'BlockStored',
            blockHashes: [5n],
            parentBlockHash: null,
            tokenIds: [],
            blockSize: 16,
            medium: 'OBJ',
            locality: 'REMOTE',
            ownership: 'shared',
          },
          { type: 'BlockRemoved', blockHashes: [5n], medium: 'FS', locality: 'LOCAL' },
          { type: 'BlockStored', blockHashes: [6n], parentBlockHash: null, tokenIds: [], blockSize: 16, medium: 'FS', locality: 'NEARBY' },
        ],
      },
      { format: 'map', hashType: 'u64' },
    );
    const b = decodeVllmBatch(payload);
    expect(b.events[0]).toMatchObject({ kind: 'stored', medium: 'OBJ', locality: 'REMOTE', ownership: 'shared' });
    expect(b.events[1]).toMatchObject({ kind: 'removed', medium: 'FS', locality: 'LOCAL' });
    expect(b.events.length).toBe(2);
    expect(b.counts.malformedEvents).toBe(1);
  });
});
