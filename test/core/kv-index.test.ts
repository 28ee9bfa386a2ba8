import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { KvIndex } from '../../src/core/index/kv-index.ts';
import { computeSeqHashes, hashSeed } from '../../src/core/hashing.ts';
import type { KvEvent } from '../../src/core/types.ts';

const BS = 4;

/** A source's engine: sequences of blocks with engine ids unrelated to the router's hash (a counter). */
function storedFor(
  tokens: number[],
  fromBlock: number,
  toBlock: number,
  ids: bigint[],
  blockSize = BS,
  extra: Partial<KvEvent> = {},
): KvEvent {
  return {
    kind: 'stored',
    parent: fromBlock === 0 ? null : ids[fromBlock - 1],
    engineIds: ids.slice(fromBlock, toBlock),
    tokens: tokens.slice(fromBlock * blockSize, toBlock * blockSize),
    blockSize,
    ...extra,
  } as KvEvent;
}

/** Brute force: per source a set of router seq hashes; overlap = leading blocks present. */
function bruteOverlap(held: Set<bigint>, seq: BigUint64Array): number {
  let i = 0;
  while (i < seq.length && held.has(seq[i])) i++;
  return i;
}

describe('KvIndex', () => {
  it('finds contiguous leading overlap per source, keyed by engine ids it never reproduces', () => {
    const idx = new KvIndex({ blockSize: BS });
    idx.addSource(0);
    idx.addSource(1);
    const tokens = Array.from({ length: 20 }, (_, i) => i + 100);
    const ids = [11n, 22n, 33n, 44n, 55n];
    expect(idx.apply(0, storedFor(tokens, 0, 3, ids))).toEqual({ applied: 3, rejected: 0 });
    expect(idx.apply(0, storedFor(tokens, 3, 5, ids))).toEqual({ applied: 2, rejected: 0 });
    expect(idx.apply(1, storedFor(tokens, 0, 2, [7n, 8n]))).toEqual({ applied: 2, rejected: 0 });
    const seq = computeSeqHashes(tokens, BS);
    let m = idx.findMatches(seq);
    expect([m[0], m[1]]).toEqual([5, 2]);
    expect(idx.cachedBlocks(0)).toBe(5);
    // Removing block 2 on source 0 cuts its contiguous overlap at 2.
    expect(idx.apply(0, { kind: 'removed', engineIds: [33n] })).toEqual({ applied: 1, rejected: 0 });
    m = idx.findMatches(seq);
    expect([m[0], m[1]]).toEqual([2, 2]);
    // A prompt diverging at block 1 matches one block on both.
    const other = tokens.slice();
    other[5] = 9999;
    m = idx.findMatches(computeSeqHashes(other, BS));
    expect([m[0], m[1]]).toEqual([1, 1]);
  });

  it('rejects and counts bad events without throwing', () => {
    const idx = new KvIndex({ blockSize: BS });
    idx.addSource(0);
    const tokens = Array.from({ length: 8 }, (_, i) => i);
    expect(idx.apply(3, storedFor(tokens, 0, 1, [1n])).reason).toBe('unknown_source');
    expect(idx.apply(0, { kind: 'stored', parent: 99n, engineIds: [1n], tokens: tokens.slice(0, 4), blockSize: BS }).reason).toBe(
      'unknown_parent',
    );
    expect(idx.apply(0, { kind: 'stored', parent: null, engineIds: [1n], tokens: tokens.slice(0, 3), blockSize: BS }).reason).toBe(
      'token_count_mismatch',
    );
    expect(idx.apply(0, { kind: 'stored', parent: null, engineIds: [1n], tokens: tokens.slice(0, 6), blockSize: 6 }).reason).toBe(
      'block_size_mismatch',
    );
    expect(idx.apply(0, { kind: 'stored', parent: null, engineIds: [], tokens: [], blockSize: BS }).reason).toBe('empty_event');
    expect(idx.apply(0, { kind: 'removed', engineIds: [42n] }).reason).toBe('unknown_block');
    expect(idx.apply(0, storedFor(tokens, 0, 1, [1n]))).toEqual({ applied: 1, rejected: 0 });
    expect(idx.apply(0, storedFor(tokens, 0, 1, [1n])).reason).toBe('duplicate_block');
    expect(idx.apply(0, { kind: 'stored', parent: null, engineIds: [5n], tokens: [], blockSize: BS, medium: 'CPU' }).reason).toBe(
      'unsupported_medium',
    );
    const st = idx.stats();
    expect(st.rejected).toMatchObject({
      unknown_source: 1,
      unknown_parent: 1,
      token_count_mismatch: 1,
      block_size_mismatch: 1,
      empty_event: 1,
      unknown_block: 1,
      duplicate_block: 1,
      unsupported_medium: 1,
    });
    expect(st.blocks).toBe(1);
  });

  it('splits engine blocks that are a multiple of the router block size', () => {
    const idx = new KvIndex({ blockSize: BS });
    idx.addSource(0);
    const tokens = Array.from({ length: 16 }, (_, i) => i * 3);
    // Engine block size 8 = two router blocks each.
    expect(idx.apply(0, storedFor(tokens, 0, 2, [1n, 2n], 8))).toEqual({ applied: 2, rejected: 0 });
    const seq = computeSeqHashes(tokens, BS);
    expect(idx.findMatches(seq)[0]).toBe(4);
    idx.apply(0, { kind: 'removed', engineIds: [2n] });
    expect(idx.findMatches(seq)[0]).toBe(2);
    expect(idx.cachedBlocks(0)).toBe(2);
  });

  it('LoRA and cache_salt from events feed the hash seed', () => {
    const idx = new KvIndex({ blockSize: BS });
    idx.addSource(0);
    const tokens = [1, 2, 3, 4, 5, 6, 7, 8];
    idx.apply(0, storedFor(tokens, 0, 2, [1n, 2n], BS, { loraName: 'sql-adapter' } as Partial<KvEvent>));
    expect(idx.findMatches(computeSeqHashes(tokens, BS))[0]).toBe(0);
    expect(idx.findMatches(computeSeqHashes(tokens, BS, hashSeed('sql-adapter')))[0]).toBe(2);
  });

  it('works past 32 and 64 sources', () => {
    const idx = new KvIndex({ blockSize: BS });
    const tokens = [1, 2, 3, 4, 5, 6, 7, 8];
    for (let s = 0; s < 100; s++) {
      idx.addSource(s);
      idx.apply(s, storedFor(tokens, 0, s % 3 === 0 ? 2 : 1, [BigInt(s * 10), BigInt(s * 10 + 1)]));
    }
    const m = idx.findMatches(computeSeqHashes(tokens, BS));
    for (let s = 0; s < 100; s++) expect(m[s]).toBe(s % 3 === 0 ? 2 : 1);
    idx.removeSource(99);
    expect(idx.findMatches(computeSeqHashes(tokens, BS))[99]).toBe(0);
  });

  it('matches a brute-force model on random workloads, and dump() rebuilds it exactly', () => {
    const op = fc.oneof(
      fc.record({ t: fc.constant('store' as const), src: fc.nat(4), seq: fc.nat(5), len: fc.integer({ min: 1, max: 6 }) }),
      fc.record({ t: fc.constant('remove' as const), src: fc.nat(4), seq: fc.nat(5), block: fc.nat(5) }),
      fc.record({ t: fc.constant('clear' as const), src: fc.nat(4) }),
    );
    fc.assert(
      fc.property(fc.array(op, { maxLength: 60 }), (ops) => {
        // Six base sequences sharing prefixes (sequence k shares its first k % 3 blocks with sequence 0).
        const base = Array.from({ length: 6 }, (_, k) =>
          Array.from({ length: 6 * BS }, (_, i) => (Math.floor(i / BS) < k % 3 ? i : 1000 * (k + 1) + i)),
        );
        const seqs = base.map((t) => computeSeqHashes(t, BS));
        const idx = new KvIndex({ blockSize: BS });
        const held: Set<bigint>[] = [];
        // Per source, engine id of (sequence, block) is a source-specific counter-like value.
        const eid = (src: number, k: number, b: number) => BigInt(src * 1_000_000 + k * 100 + b + 1);
        const has: Map<bigint, bigint>[] = [];
        for (let s = 0; s < 5; s++) {
          idx.addSource(s);
          held.push(new Set());
          has.push(new Map());
        }
        for (const o of ops) {
          if (o.t === 'store') {
            // Store blocks [start, len) where start is the first block this source lacks for that sequence.
            const k = o.seq;
            let start = 0;
            while (start < o.len && has[o.src].has(eid(o.src, k, start))) start++;
            if (start >= o.len) continue;
            const ids = Array.from({ length: 6 }, (_, b) => eid(o.src, k, b));
            // The parent must be known by its engine id on this source.
            if (start > 0 && !has[o.src].has(ids[start - 1])) continue;
            // Like an engine, announce only newly cached blocks: the run up to the next block it still holds.
            let end = start;
            while (end < o.len && !has[o.src].has(ids[end])) end++;
            const r = idx.apply(o.src, storedFor(base[k], start, end, ids));
            expect(r.rejected).toBe(0);
            for (let b = start; b < end; b++) {
              held[o.src].add(seqs[k][b]);
              has[o.src].set(ids[b], seqs[k][b]);
            }
          } else if (o.t === 'remove') {
            const id = eid(o.src, o.seq, o.block);
            const r = idx.apply(o.src, { kind: 'removed', engineIds: [id] });
            const h = has[o.src].get(id);
            expect(r.applied).toBe(h === undefined ? 0 : 1);
            if (h !== undefined) {
              has[o.src].delete(id);
              // Another engine id on this source may name the same prefix (shared blocks): brute force keeps it if so.
              if (![...has[o.src].values()].includes(h)) held[o.src].delete(h);
            }
          } else {
            idx.apply(o.src, { kind: 'cleared' });
            held[o.src].clear();
            has[o.src].clear();
          }
        }
        const rebuilt = new KvIndex({ blockSize: BS });
        for (let s = 0; s < 5; s++) rebuilt.addSource(s);
        for (const { source, event } of idx.dump()) expect(rebuilt.apply(source, event).rejected).toBe(0);
        for (const seq of seqs) {
          const m = idx.findMatches(seq);
          const got = Array.from({ length: 5 }, (_, s) => m[s]);
          expect(got).toEqual(held.map((h) => bruteOverlap(h, seq)));
          const r = rebuilt.findMatches(seq);
          expect(Array.from({ length: 5 }, (_, s) => r[s])).toEqual(got);
        }
        for (let s = 0; s < 5; s++) {
          expect(idx.cachedBlocks(s)).toBe(idx.blocksOf(s).size);
          expect([...idx.blocksOf(s)].sort()).toEqual([...rebuilt.blocksOf(s)].sort());
        }
      }),
      { numRuns: 150 },
    );
  });

  it('with a cap, prunes least recently used leaves and keeps prefixes matchable', () => {
    const idx = new KvIndex({ blockSize: BS, maxBlocks: 6 });
    idx.addSource(0);
    const a = Array.from({ length: 16 }, (_, i) => i);
    const b = Array.from({ length: 16 }, (_, i) => 500 + i);
    idx.apply(0, storedFor(a, 0, 4, [1n, 2n, 3n, 4n]));
    idx.apply(0, storedFor(b, 0, 4, [11n, 12n, 13n, 14n]));
    const st = idx.stats();
    expect(st.blocks).toBe(6);
    expect(st.pruned).toBe(2);
    // The oldest chain lost its leaves, not its root: a keeps a contiguous prefix of 2 blocks.
    expect(idx.findMatches(computeSeqHashes(a, BS))[0]).toBe(2);
    expect(idx.findMatches(computeSeqHashes(b, BS))[0]).toBe(4);
    // A Removed for a pruned block is counted, not crashed on; a Stored continuing it is rejected as unknown parent.
    expect(idx.apply(0, { kind: 'removed', engineIds: [4n] }).reason).toBe('unknown_block');
    expect(idx.cachedBlocks(0)).toBe(6);
  });
});

describe('KvIndex aliases', () => {
  it('two engine ids naming the same prefix on one source: the block stays until both are removed', () => {
    const idx = new KvIndex({ blockSize: BS });
    idx.addSource(0);
    const tokens = [1, 2, 3, 4];
    idx.apply(0, { kind: 'stored', parent: null, engineIds: [1n], tokens, blockSize: BS });
    idx.apply(0, { kind: 'stored', parent: null, engineIds: [2n], tokens, blockSize: BS });
    const seq = computeSeqHashes(tokens, BS);
    expect(idx.cachedBlocks(0)).toBe(1);
    idx.apply(0, { kind: 'removed', engineIds: [1n] });
    expect(idx.findMatches(seq)[0]).toBe(1);
    idx.apply(0, { kind: 'removed', engineIds: [2n] });
    expect(idx.findMatches(seq)[0]).toBe(0);
    expect(idx.stats().blocks).toBe(0);
  });
});

describe('KvIndex engine blocks of several router blocks', () => {
  it('two engine blocks sharing their first router block: removing one keeps what the other covers', () => {
    const idx = new KvIndex({ blockSize: BS });
    idx.addSource(0);
    // Engine block size 8 = two router blocks; the prompts agree on the first 4 tokens only.
    const a = [1, 2, 3, 4, 5, 6, 7, 8];
    const b = [1, 2, 3, 4, 9, 9, 9, 9];
    idx.apply(0, { kind: 'stored', parent: null, engineIds: [1n], tokens: a, blockSize: 2 * BS });
    idx.apply(0, { kind: 'stored', parent: null, engineIds: [2n], tokens: b, blockSize: 2 * BS });
    expect(idx.cachedBlocks(0)).toBe(3);
    idx.apply(0, { kind: 'removed', engineIds: [1n] });
    expect(idx.findMatches(computeSeqHashes(b, BS))[0]).toBe(2);
    expect(idx.findMatches(computeSeqHashes(a, BS))[0]).toBe(1);
    expect(idx.cachedBlocks(0)).toBe(2);
    idx.apply(0, { kind: 'removed', engineIds: [2n] });
    expect(idx.stats().blocks).toBe(0);
    expect(idx.cachedBlocks(0)).toBe(0);
  });

  it('refuses a source number it cannot represent, with a clear error', () => {
    const idx = new KvIndex({ blockSize: BS });
    expect(() => idx.addSource(32767)).toThrow(/source number must be an integer in \[0, 32766\]/);
    expect(() => idx.addSource(-1)).toThrow(RangeError);
    idx.addSource(32766);
    expect(idx.hasSource(32766)).toBe(true);
  });
});

describe('KvIndex consistency under engine misbehaviour', () => {
  const holds = (idx: KvIndex, s: number) => {
    expect(idx.cachedBlocks(s)).toBe(idx.blocksOf(s).size);
  };

  it('an engine id re-announced for other content replaces the old block (nothing left unreachable)', () => {
    const idx = new KvIndex({ blockSize: BS });
    idx.addSource(0);
    const a = [1, 2, 3, 4];
    const b = [5, 6, 7, 8];
    idx.apply(0, { kind: 'stored', parent: null, engineIds: [9n], tokens: a, blockSize: BS });
    idx.apply(0, { kind: 'stored', parent: null, engineIds: [9n], tokens: b, blockSize: BS });
    expect(idx.findMatches(computeSeqHashes(a, BS))[0]).toBe(0);
    expect(idx.findMatches(computeSeqHashes(b, BS))[0]).toBe(1);
    expect(idx.stats().rejected.engine_id_reused).toBe(1);
    holds(idx, 0);
    idx.apply(0, { kind: 'cleared' });
    holds(idx, 0);
    expect(idx.stats().blocks).toBe(0);
  });

  it('a block size different from the one learned for the source is quarantined', () => {
    const idx = new KvIndex({ blockSize: BS });
    idx.addSource(0);
    const t = Array.from({ length: 16 }, (_, i) => i);
    expect(idx.apply(0, { kind: 'stored', parent: null, engineIds: [1n, 2n], tokens: t.slice(0, 8), blockSize: BS }).rejected).toBe(0);
    expect(idx.apply(0, { kind: 'stored', parent: 2n, engineIds: [3n], tokens: t.slice(8, 16), blockSize: 2 * BS }).reason).toBe(
      'block_size_mismatch',
    );
    idx.apply(0, { kind: 'removed', engineIds: [2n] });
    holds(idx, 0);
    expect(idx.findMatches(computeSeqHashes(t, BS))[0]).toBe(1);
    // After a clear (engine restart) the source may announce another block size.
    idx.apply(0, { kind: 'cleared' });
    expect(idx.apply(0, { kind: 'stored', parent: null, engineIds: [7n], tokens: t.slice(0, 8), blockSize: 2 * BS }).rejected).toBe(0);
    expect(idx.findMatches(computeSeqHashes(t, BS))[0]).toBe(2);
    holds(idx, 0);
  });
});

describe('U64Map walk order', () => {
  it('re-inserting a walk into a growing map stays as short-probed as random order (no O(n^2) snapshot load)', async () => {
    const { U64Map } = await import('../../src/core/index/u64-map.ts');
    const rng = (await import('../../src/core/rng.ts')).createRng(5);
    const n = 60_000;
    const big = new U64Map(16);
    for (let i = 0; i < n; i++) big.set((rng() * 2 ** 32) >>> 0, (rng() * 2 ** 32) >>> 0, i);
    const walk: number[] = [];
    big.forEach((lo, hi, v) => {
      walk.push(lo, hi, v);
    });
    expect(walk.length).toBe(3 * n); // every entry exactly once
    expect(new Set(walk.filter((_, i) => i % 3 === 2)).size).toBe(n);
    const shuffled = walk.slice();
    for (let i = n - 1; i > 0; i--) {
      const j = Math.floor(rng() * (i + 1));
      for (let f = 0; f < 3; f++) [shuffled[3 * i + f], shuffled[3 * j + f]] = [shuffled[3 * j + f], shuffled[3 * i + f]];
    }
    // Position (home) order, what forEach must not give: keys pile into one probe run while the map is small.
    const positions = new Int32Array(n);
    big.positions(positions, false);
    const homeOrder = Array.from(positions).flatMap((p) => [big.cells[3 * p] >>> 0, big.cells[3 * p + 1] >>> 0, big.valueAt(p)]);
    // The longest probe run seen at checkpoints while filling: a deterministic stand-in for the insertion cost (a
    // growth re-spreads the keys, so only the table as it fills shows the clustering).
    const worstRun = (keys: number[]) => {
      const m = new U64Map(16);
      let worst = 0;
      for (let k = 0; k < n; k++) {
        m.set(keys[3 * k], keys[3 * k + 1], keys[3 * k + 2]);
        if (k % 2000 === 1999) worst = Math.max(worst, m.maxDisplacement());
      }
      expect(m.size).toBe(n);
      return worst;
    };
    const random = worstRun(shuffled);
    expect(worstRun(walk)).toBeLessThan(3 * random + 10);
    expect(worstRun(homeOrder)).toBeGreaterThan(20 * random);
  });
});
