import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { KvRouter } from '../../src/core/router.ts';
import { slidingWindowBlocks } from '../../src/core/index/groups.ts';
import type { CacheGroupKind, KvEvent } from '../../src/core/types.ts';

const BS = 4;

/** Tokens 0..n-1 offset by `base` (a distinct prompt per base). */
const tokens = (n: number, base = 0) => Array.from({ length: n }, (_, i) => base + i);

/** One engine id per block of a prompt: the same in every group, as vLLM's. */
const ids = (blocks: number, base = 1000n) => Array.from({ length: blocks }, (_, i) => base + BigInt(i));

interface Group {
  idx: number;
  kind: CacheGroupKind;
  window?: number;
}

/** Stored event of blocks [from, to) of `prompt` in one group (parent: block from - 1). */
function stored(prompt: number[], from: number, to: number, g: Group, base = 1000n): KvEvent {
  const all = ids(Math.floor(prompt.length / BS), base);
  return {
    kind: 'stored',
    parent: from === 0 ? null : all[from - 1],
    engineIds: all.slice(from, to),
    tokens: prompt.slice(from * BS, to * BS),
    blockSize: BS,
    groupIdx: g.idx,
    groupKind: g.kind,
    ...(g.window !== undefined ? { slidingWindow: g.window } : {}),
  };
}

function removed(blocks: number[], g: Group, base = 1000n): KvEvent {
  return { kind: 'removed', engineIds: blocks.map((b) => base + BigInt(b)), groupIdx: g.idx };
}

function overlap(r: KvRouter, prompt: number[], id: string): number {
  const d = r.route({ requestId: id, tokens: prompt }, 0);
  if (d.kind !== 'routed') throw new Error(d.reason);
  r.finish(id, {}, 0);
  return d.overlapBlocks;
}

const FULL: Group = { idx: 0, kind: 'full_attention' };
const SW: Group = { idx: 1, kind: 'sliding_window', window: 8 }; // ceil(7 / 4) = 2 blocks before the cut
const MAMBA: Group = { idx: 2, kind: 'mamba' };

function router(): KvRouter {
  const r = new KvRouter({ blockSize: BS, overlay: false });
  r.addSource({ workerId: 'w', dpRank: 0 });
  return r;
}

describe('hybrid cache groups: the prefix hit vLLM would deliver', () => {
  it('sliding-window blocks per hit: cdiv(window - 1, block)', () => {
    expect(slidingWindowBlocks(8, 4)).toBe(2);
    expect(slidingWindowBlocks(9, 4)).toBe(2);
    expect(slidingWindowBlocks(10, 4)).toBe(3);
    expect(slidingWindowBlocks(128, 16)).toBe(8);
  });

  it('full attention + sliding window + mamba: the cut moves to where every group can resume', () => {
    const r = router();
    const p = tokens(41); // 10 full blocks + 1 token: the engine may reuse up to 10 blocks
    r.applyEvents('w', [stored(p, 0, 10, FULL), stored(p, 0, 10, SW), stored(p, 4, 5, MAMBA), stored(p, 9, 10, MAMBA)]);
    expect(r.groups.isHybrid(0)).toBe(true);
    expect(r.state().cacheGroups?.blocks).toEqual({ '1': 10, '2': 2 });
    expect(overlap(r, p, 'a')).toBe(10);
    // The sliding-window group freed what fell out of its window; the window before 10 is still there.
    r.applyEvents('w', [removed([0, 1, 2, 3, 4, 5], SW)]);
    expect(overlap(r, p, 'b')).toBe(10);
    // Its last block evicted: SW accepts 9 at most ([7, 9)), Mamba then only 5 (state saved at 5), SW nothing at 5.
    r.applyEvents('w', [removed([9], SW)]);
    expect(overlap(r, p, 'c')).toBe(0);
    // A state at 9 makes 9 usable by every group.
    r.applyEvents('w', [stored(p, 8, 9, MAMBA)]);
    expect(overlap(r, p, 'd')).toBe(9);
  });

  it('the prompt last token is never reused: 40 tokens cap the hit at 9 blocks', () => {
    const r = router();
    const p = tokens(40);
    r.applyEvents('w', [stored(p, 0, 10, FULL), stored(p, 0, 10, SW), stored(p, 9, 10, MAMBA), stored(p, 8, 9, MAMBA)]);
    expect(overlap(r, p, 'a')).toBe(9);
  });

  it('a short prefix inside the window is a hit (the window before it is all of it)', () => {
    const r = router();
    const p = tokens(41);
    r.applyEvents('w', [stored(p, 0, 10, FULL), stored(p, 0, 1, { ...SW, window: 64 })]);
    expect(overlap(r, p, 'a')).toBe(1);
  });

  it('group 0 may be the sliding-window group (gpt-oss order): the full-attention group is found by kind', () => {
    const r = router();
    const p = tokens(41);
    const sw0: Group = { idx: 0, kind: 'sliding_window', window: 8 };
    const full1: Group = { idx: 1, kind: 'full_attention' };
    r.applyEvents('w', [stored(p, 0, 10, sw0), stored(p, 0, 6, full1)]);
    expect(r.groups.groupsOf(0).primary).toBe(1);
    expect(overlap(r, p, 'a')).toBe(6);
    r.applyEvents('w', [removed([5], sw0)]);
    expect(overlap(r, p, 'b')).toBe(5); // [3, 5) held
    r.applyEvents('w', [{ kind: 'cleared' }]);
    expect(overlap(r, p, 'c')).toBe(0);
  });

  it('a model with one group is untouched by the hybrid rule (cap and overlay as before)', () => {
    const r = router();
    const p = tokens(40);
    r.applyEvents('w', [stored(p, 0, 10, FULL)]);
    expect(r.groups.isHybrid(0)).toBe(false);
    expect(r.state().cacheGroups).toBeUndefined();
    expect(overlap(r, p, 'a')).toBe(10);
  });

  it('matches a brute-force reading of the rule on random group contents', () => {
    const kinds: Group[] = [FULL, SW, MAMBA, { idx: 3, kind: 'sliding_window', window: 13 }];
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 14 }),
        fc.array(fc.array(fc.boolean(), { minLength: 14, maxLength: 14 }), { minLength: 4, maxLength: 4 }),
        fc.integer({ min: 1, max: 3 }),
        (fullLen, held, extra) => {
          const groups = kinds.slice(0, 1 + extra);
          const r = router();
          const p = tokens(14 * BS + 1);
          r.applyEvents('w', [stored(p, 0, fullLen, FULL)]);
          for (const g of groups.slice(1)) {
            r.applyEvents('w', [stored(p, 0, 14, g)]);
            const gone = held[g.idx].flatMap((h, b) => (h ? [] : [b]));
            if (gone.length > 0) r.applyEvents('w', [removed(gone, g)]);
          }
          const has = (g: Group, b: number) => held[g.idx][b];
          const ok = (L: number) =>
            L <= fullLen &&
            groups.slice(1).every((g) => {
              if (L === 0) return true;
              if (g.kind === 'mamba') return has(g, L - 1);
              const w = slidingWindowBlocks(g.window ?? 0, BS);
              for (let b = Math.max(0, L - w); b < L; b++) if (!has(g, b)) return false;
              return true;
            });
          let want = 14;
          while (!ok(want)) want--;
          expect(overlap(r, p, 'q')).toBe(want);
        },
      ),
      { numRuns: 300 },
    );
  });
});
