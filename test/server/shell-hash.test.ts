/**
 * `serve --processes`: an HTTP shell hashes each prompt's blocks before the primary routes it (ShellHasher,
 * src/server/cluster/shell.ts). The router given the shell's hashes must decide as it does given the token ids: the
 * same hashes, prompt length and request blocks, for every block size, partial last blocks, adapters, salts and
 * multimodal items. test/server/processes.test.ts checks the same end to end (recorded traces of one process and two
 * shells).
 */
import { describe, expect, it } from 'vitest';
import type { Submission } from '../../src/core/dispatch/dispatcher.ts';
import { KvRouter } from '../../src/core/router.ts';
import { hashLoraOf, type FilterableWorker } from '../../src/core/scheduling/filters.ts';
import { ShellHasher } from '../../src/server/cluster/shell.ts';
import { randomTokens } from './helpers.ts';

/** The decision of a fresh router (one source) for a request given as `sub` says, with `lora` as eligibility gives it. */
function routed(blockSize: number, sub: Submission, lora: string | null) {
  const router = new KvRouter({ blockSize, seed: 1 });
  router.addSource({ workerId: 'w0', dpRank: 0 });
  const d = router.route(
    {
      requestId: sub.requestId,
      tokens: sub.tokens,
      seqHashes: sub.seqHashes,
      promptTokens: sub.promptTokens,
      mmItems: sub.mmItems,
      loraName: lora,
      cacheSalt: sub.cacheSalt,
    },
    0,
  );
  if (d.kind !== 'routed') throw new Error(`refused: ${d.reason}`);
  return { hashes: [...d.seqHashes], promptTokens: d.promptTokens, islBlocks: d.islBlocks };
}

describe('ShellHasher', () => {
  const cases: [string, Partial<Submission>][] = [
    ['a partial last block', { tokens: randomTokens(3 * 64 + 5, 1) }],
    ['whole blocks', { tokens: Uint32Array.from(randomTokens(4 * 64, 2)) }],
    ['fewer tokens than a block', { tokens: randomTokens(7, 3) }],
    ['no tokens', { tokens: [] }],
    ['a salt', { tokens: randomTokens(2 * 64 + 1, 4), cacheSalt: 'tenant-a' }],
    [
      'multimodal items',
      {
        tokens: randomTokens(3 * 64, 5),
        mmItems: [
          { identifier: 'img-1', offset: 10, length: 40 },
          { identifier: 'img-2', offset: 70, length: 100 },
        ],
      },
    ],
  ];
  for (const blockSize of [16, 32, 64]) {
    for (const [what, over] of cases) {
      it(`block size ${blockSize}, ${what}: the router decides on the shell's hashes as on the token ids`, () => {
        const sub: Submission = { requestId: 'r1', model: 'm', ...over };
        const wire = new ShellHasher(blockSize).wire(sub);
        // What crosses: hashes and the prompt length; no token ids, no multimodal items (both are in the hashes).
        expect(wire.lora).toBeNull();
        expect(wire.sub.tokens).toBeUndefined();
        expect(wire.sub.mmItems).toBeUndefined();
        expect(wire.sub.seqHashes).toBeInstanceOf(BigUint64Array);
        expect(wire.sub.seqHashes).toHaveLength(Math.floor(sub.tokens!.length / blockSize));
        expect(routed(blockSize, wire.sub, null)).toEqual(routed(blockSize, sub, null));
      });
    }
  }

  it('hashes with the adapter it learnt, forgets it when told the model is none, and keeps the tokens it cannot hash', () => {
    const hasher = new ShellHasher(16);
    const sub: Submission = { requestId: 'r1', model: 'sql-lora', tokens: randomTokens(50, 6), cacheSalt: 'tenant-b' };
    const plain = hasher.wire(sub);
    hasher.learn('sql-lora', 'sql-lora');
    const adapted = hasher.wire(sub);
    expect(adapted.lora).toBe('sql-lora');
    expect(routed(16, adapted.sub, 'sql-lora')).toEqual(routed(16, sub, 'sql-lora'));
    expect([...adapted.sub.seqHashes!]).not.toEqual([...plain.sub.seqHashes!]);
    // Another model is not an adapter for it.
    expect(hasher.wire({ ...sub, model: 'other' }).lora).toBeNull();
    hasher.learn('sql-lora', null);
    expect(hasher.wire(sub)).toEqual(plain);
    // Already hashed (or nothing to hash): sent as it is.
    const hashed: Submission = { requestId: 'r2', model: 'm', seqHashes: new BigUint64Array(1), promptTokens: 16 };
    expect(hasher.wire(hashed)).toEqual({ sub: hashed });
  });
});

describe('hashLoraOf', () => {
  const worker = (id: string, over: Partial<FilterableWorker> = {}): FilterableWorker => ({
    id,
    role: 'both',
    engine: 'vllm',
    sourceKeys: [id],
    healthy: true,
    adapters: new Set(),
    breaker: { admits: () => true },
    serves: () => true,
    ...over,
  });

  it("names the model when a worker passing the model and role filters lists it as an adapter (healthy or not), as eligibility's loraName", () => {
    const lora = worker('a', { adapters: new Set(['sql-lora']), healthy: false });
    expect(hashLoraOf([worker('b'), lora], { model: 'sql-lora' }, 0)).toBe('sql-lora');
    expect(hashLoraOf([worker('b'), lora], { model: 'base' }, 0)).toBeNull();
    // A prefill worker listing it does not count for the aggregated leg; a pin to another worker leaves it out.
    expect(hashLoraOf([worker('b'), { ...lora, role: 'prefill' }], { model: 'sql-lora' }, 0)).toBeNull();
    expect(hashLoraOf([worker('b'), lora], { model: 'sql-lora', pinned: 'b' }, 0)).toBeNull();
    expect(hashLoraOf([worker('b'), lora], { model: 'sql-lora', pinned: 'a' }, 0)).toBe('sql-lora');
  });
});
