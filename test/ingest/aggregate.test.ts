import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { KvIndex } from '../../src/core/index/kv-index.ts';
import { computeSeqHashes, hashSeed } from '../../src/core/hashing.ts';
import type { KvEvent } from '../../src/core/types.ts';
import { encodeSglangBatch, type SglangEvent } from '../../src/engines/sglang/events.ts';
import { vllmFrames } from '../../src/engines/vllm/events.ts';
import { SourceIngest } from '../../src/ingest/source-ingest.ts';
import { quietLog } from '../../src/log.ts';

/** SGLang's radix cache at page size 1: one node per token, one BlockStored per page, leaf-first eviction. */
class RadixEngine {
  private nextId = (1n << 63n) + 12345n; // >= 2^63: goes out as a negative int64
  private readonly nodes = new Map<bigint, { token: number; parent: bigint | null; children: Map<number, bigint> }>();
  private readonly roots = new Map<number, bigint>();
  seq = 0n;

  insert(tokens: number[], perPage: boolean, salt: string | null = null): SglangEvent[] {
    let parent: bigint | null = null;
    let i = 0;
    for (; i < tokens.length; i++) {
      const children: Map<number, bigint> = parent === null ? this.roots : this.nodes.get(parent)!.children;
      const next = children.get(tokens[i]);
      if (next === undefined) break;
      parent = next;
    }
    const ids: bigint[] = [];
    const first = parent;
    for (; i < tokens.length; i++) {
      const id = this.nextId++;
      (parent === null ? this.roots : this.nodes.get(parent)!.children).set(tokens[i], id);
      this.nodes.set(id, { token: tokens[i], parent, children: new Map() });
      ids.push(id);
      parent = id;
    }
    if (ids.length === 0) return [];
    const newTokens = tokens.slice(tokens.length - ids.length);
    if (!perPage)
      return [{ type: 'BlockStored', blockHashes: ids, parentBlockHash: first, tokenIds: newTokens, blockSize: 1, cacheSalt: salt }];
    return ids.map((id, j) => ({
      type: 'BlockStored',
      blockHashes: [id],
      parentBlockHash: j === 0 ? first : ids[j - 1],
      tokenIds: [newTokens[j]],
      blockSize: 1,
      cacheSalt: salt,
    }));
  }

  evictLeaves(n: number, pick: (len: number) => number): SglangEvent[] {
    const out: bigint[] = [];
    for (let r = 0; r < n; r++) {
      const leaves = [...this.nodes].filter(([, v]) => v.children.size === 0).map(([id]) => id);
      if (leaves.length === 0) break;
      const id = leaves[pick(leaves.length)];
      const node = this.nodes.get(id)!;
      (node.parent === null ? this.roots : this.nodes.get(node.parent)!.children).delete(node.token);
      this.nodes.delete(id);
      out.push(id);
    }
    return out.length ? [{ type: 'BlockRemoved', blockHashes: out }] : [];
  }

  /** Router hashes of every full router block the engine holds. */
  truth(k: number, seed: bigint): Set<bigint> {
    const out = new Set<bigint>();
    for (const [id] of this.nodes) {
      const path: number[] = [];
      for (let c: bigint | null = id; c !== null; c = this.nodes.get(c)!.parent) path.push(this.nodes.get(c)!.token);
      path.reverse();
      if (path.length % k === 0) out.add(computeSeqHashes(path, k, seed)[path.length / k - 1]);
    }
    return out;
  }

  frames(events: SglangEvent[]) {
    return vllmFrames('kv', this.seq++, encodeSglangBatch({ ts: 1, events, attnDpRank: 0 }, 'array'));
  }
}

function pipeline(routerBlockSize: number) {
  const index = new KvIndex({ blockSize: routerBlockSize });
  index.addSource(0);
  const ingest = new SourceIngest({
    source: { workerId: 'sglang', dpRank: 0 },
    flavor: 'sglang',
    routerBlockSize,
    log: quietLog,
    sink: (_k, events: KvEvent[]) => {
      for (const e of events) index.apply(0, e);
    },
    onReset: () => index.apply(0, { kind: 'cleared' }),
  });
  return { index, ingest };
}

describe('engine blocks smaller than the router block (SGLang page size 1)', () => {
  it('joins single-token pages into router blocks; branches inside a block and leaf evictions stay exact', () => {
    const engine = new RadixEngine();
    const { index, ingest } = pipeline(4);
    const a = Array.from({ length: 42 }, (_, i) => 500 + i);
    ingest.onFrames(engine.frames(engine.insert(a, true)));
    expect(index.findMatches(computeSeqHashes(a, 4))[0]).toBe(10);
    // Branch after 6 tokens: inside router block 1.
    const b = a.slice(0, 6).concat(Array.from({ length: 10 }, (_, i) => 9000 + i));
    ingest.onFrames(engine.frames(engine.insert(b, false)));
    expect(index.findMatches(computeSeqHashes(b, 4))[0]).toBe(4);
    expect(index.blocksOf(0)).toEqual(engine.truth(4, hashSeed()));
    // Evict b's tail token by token: its last router blocks go as soon as they are no longer whole.
    let i = 0;
    for (; i < 9; i++) ingest.onFrames(engine.frames(engine.evictLeaves(1, () => 0)));
    expect(index.blocksOf(0)).toEqual(engine.truth(4, hashSeed()));
    const h = ingest.health();
    expect(h.engineBlockSize).toBe(1);
    expect(h.blockSizeMismatch).toBe(true);
    expect(h.quarantinedBlocks).toBe(0);
    expect(h.aggregation).toMatchObject({ orphanBlocks: 0 });
    expect(index.stats().rejected).toEqual({});
  });

  it('property: after any inserts (per page or per request, salted or not) and leaf evictions, index = engine', () => {
    let evictionsOfHeldBlocks = 0;
    fc.assert(
      fc.property(
        fc.array(
          fc.oneof(
            fc.record({
              kind: fc.constant('insert' as const),
              prefix: fc.integer({ min: 0, max: 3 }),
              extra: fc.array(fc.integer({ min: 0, max: 5 }), { maxLength: 14 }),
              perPage: fc.boolean(),
              salt: fc.boolean(),
            }),
            fc.record({ kind: fc.constant('evict' as const), n: fc.integer({ min: 1, max: 8 }), at: fc.nat() }),
          ),
          { maxLength: 25 },
        ),
        fc.constantFrom(2, 4),
        (ops, k) => {
          const engine = new RadixEngine();
          const salted = new RadixEngine();
          const { index, ingest } = pipeline(k);
          const other = pipeline(k);
          for (const op of ops) {
            if (op.kind === 'insert') {
              const tokens = Array.from({ length: 3 + op.prefix * 3 }, (_, i) => 100 + i).concat(op.extra);
              if (op.salt) other.ingest.onFrames(salted.frames(salted.insert(tokens, op.perPage, 'tenant')));
              else ingest.onFrames(engine.frames(engine.insert(tokens, op.perPage)));
            } else {
              if (index.blocksOf(0).size > 0) evictionsOfHeldBlocks++;
              ingest.onFrames(engine.frames(engine.evictLeaves(op.n, (len) => op.at % len)));
              other.ingest.onFrames(salted.frames(salted.evictLeaves(op.n, (len) => (op.at * 7) % len)));
            }
            const want = engine.truth(k, hashSeed());
            const got = index.blocksOf(0);
            if (got.size !== want.size || [...got].some((x) => !want.has(x))) return false;
            const wantSalted = salted.truth(k, hashSeed(null, 'tenant'));
            const gotSalted = other.index.blocksOf(0);
            if (gotSalted.size !== wantSalted.size || [...gotSalted].some((x) => !wantSalted.has(x))) return false;
          }
          return Object.keys(index.stats().rejected).length === 0 && (ingest.health().aggregation?.orphanBlocks ?? 0) === 0;
        },
      ),
      { numRuns: 150 },
    );
    expect(evictionsOfHeldBlocks).toBeGreaterThan(100); // the property was exercised on non-empty caches
  });
});
