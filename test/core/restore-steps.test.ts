/**
 * Restoring in steps (KvRouter.restoreSteps / resetSteps): the same index as a one-piece restore (answers, counts,
 * engine-id mappings, parent links), bounded work per step, routing reading a source being rewritten as unknown, and
 * its events held and applied after, never lost.
 */
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { KvRouter } from '../../src/core/router.ts';
import { createRng } from '../../src/core/rng.ts';
import type { SourceSnapshot } from '../../src/core/index/snapshot.ts';
import type { KvEvent } from '../../src/core/types.ts';
import { BS, Engines, goodSnapshot, makeRouter, overlapByKey, sequences } from '../fixtures/snapshot-engines.ts';

/** Runs a generator to its end, calling `between` at every pause; returns the value and the pause count. */
function drive<T>(steps: Generator<void, T, void>, between: (pause: number) => void = () => {}): { value: T; pauses: number } {
  let pauses = 0;
  let r = steps.next();
  while (!r.done) {
    between(++pauses);
    r = steps.next();
  }
  return { value: r.value, pauses };
}

/** A source's snapshot as engine id -> [router hashes, parent engine id]: what must survive, whatever the order. */
function shape(router: KvRouter, key: string): Map<bigint, [bigint[], bigint | null]> {
  const s = router.snapshot().source(key);
  const out = new Map<bigint, [bigint[], bigint | null]>();
  if (!s) return out;
  const split = s.seqHashes.length / s.engineIds.length;
  s.engineIds.forEach((id, j) => {
    const p = s.parents![j];
    out.set(id, [Array.from(s.seqHashes.subarray(j * split, j * split + split)), p < 0 ? null : s.engineIds[p]]);
  });
  return out;
}

/**
 * The shape without the parents that form a cycle: an index can export one itself (a stale parent link whose slot a
 * descendant reused), and a restore loads one block of each cycle unlinked. Every other parent link must survive.
 */
function comparable(
  m: Map<bigint, [bigint[], bigint | null]>,
  ref: Map<bigint, [bigint[], bigint | null]>,
  others: ReadonlySet<bigint>,
): Map<bigint, [bigint[], bigint | null | 'cycle' | 'shared']> {
  const out = new Map<bigint, [bigint[], bigint | null | 'cycle' | 'shared']>();
  for (const [id, [hashes, parent]] of m) {
    if (others.has(hashes[0])) {
      out.set(id, [hashes, 'shared']);
      continue;
    }
    let at: bigint | null = ref.get(id)?.[1] ?? null;
    let hops = 0;
    while (at !== null && hops <= ref.size) {
      at = ref.get(at)?.[1] ?? null;
      hops++;
    }
    out.set(id, [hashes, hops > ref.size ? 'cycle' : parent]);
  }
  return out;
}

/**
 * First router hashes of the other sources' blocks. A block several sources hold is created by the first restored
 * of them, and links to a parent only if that one held it: the index's insert path does not link an existing block
 * afterwards (the one-piece restore does). So links are compared only on blocks no other source holds.
 */
function shared(sources: readonly SourceSnapshot[], key: string): Set<bigint> {
  const out = new Set<bigint>();
  for (const s of sources) {
    if (s.key === key) continue;
    const split = s.seqHashes.length / s.engineIds.length;
    for (let j = 0; j < s.engineIds.length; j++) out.add(s.seqHashes[j * split]);
  }
  return out;
}

function fill(keys: string[], seed: number, split: number, steps = 600): { router: KvRouter; engines: Engines; seqs: bigint[][] } {
  const rand = createRng(seed);
  const seqs = sequences(rand, 24, 8 * split);
  const engines = new Engines(rand, keys, seqs, split);
  const router = makeRouter(keys);
  for (let i = 0; i < steps; i++) engines.step((k, ev) => router.applyEvents(k, [ev]));
  return { router, engines, seqs };
}

describe('KvRouter.restoreSteps', () => {
  it('gives the index a one-piece restore gives, over a router already holding other blocks (property)', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 2 ** 30 }), fc.constantFrom(1, 2), fc.constantFrom(1, 5, 64), (seed, split, budget) => {
        const keys = ['a', 'b', 'c#1'];
        const { router: a, engines, seqs } = fill(keys, seed, split);
        const data = a.snapshot().data();
        const oneShot = new KvRouter({ blockSize: BS });
        expect(oneShot.restore(data).rejected).toEqual([]);
        // The target holds other blocks for the same sources (and one source the snapshot does not list).
        const { router: b } = fill([...keys, 'd'], seed + 1, split, 300);
        const before = overlapByKey(b, seqs[0]).get('d');
        // As a resync does: the sources the snapshot does not list (they held nothing) are reset, the others restored.
        const listed = new Set(data.sources.map((x) => x.key));
        drive(
          b.resetSteps(
            keys.filter((k) => !listed.has(k)),
            budget,
          ),
        );
        const { value, pauses } = drive(b.restoreSteps(data.sources, budget));
        expect(value.rejected).toEqual([]);
        expect(value.blocks).toBe(data.sources.reduce((n, x) => n + x.engineIds.length, 0));
        expect(pauses).toBeGreaterThanOrEqual(Math.floor(value.blocks / budget));
        for (const s of data.sources) {
          const want = shape(a, s.key);
          expect(comparable(shape(b, s.key), want, shared(data.sources, s.key)), s.key).toEqual(
            comparable(want, want, shared(data.sources, s.key)),
          );
          expect(b.state().sources.find((x) => x.source === s.key)!.cachedBlocks).toBe(a.index.cachedBlocks(a.sourceKeys().indexOf(s.key)));
        }
        expect(overlapByKey(b, seqs[0]).get('d')).toBe(before);
        // The dual key survives: later events apply to it as to the source it was taken from.
        for (let i = 0; i < 200; i++) {
          engines.step((k, ev) => {
            const ra = a.applyEvents(k, [ev]);
            expect(b.applyEvents(k, [ev])).toEqual(ra);
          });
        }
        for (const k of keys) {
          const want = shape(a, k);
          const got = shape(b, k);
          expect(new Set(got.keys())).toEqual(new Set(want.keys()));
          for (const [id, [hashes]] of got) expect(hashes).toEqual(want.get(id)![0]);
        }
        expect(b.state().sources.every((x) => !x.restoring)).toBe(true);
      }),
      { numRuns: 20 },
    );
  });

  it('does at most `budget` blocks of work per step', () => {
    const { router: a } = fill(['a'], 5, 2, 800);
    const data = a.snapshot().data();
    const { router: b } = fill(['a'], 6, 2, 800);
    const held = b.index.cachedBlocks(0);
    expect(held).toBeGreaterThan(40);
    let last = b.index.stats().applied;
    let most = 0;
    drive(b.restoreSteps(data.sources, 16), () => {
      const now = b.index.stats().applied;
      // Engine blocks stored or removed since the previous pause (a step is cut at its budget).
      most = Math.max(most, now.stored - last.stored + now.removed - last.removed);
      last = now;
    });
    expect(most).toBeGreaterThan(0);
    expect(most).toBeLessThanOrEqual(16);
  });

  it('reads a source being rewritten as unknown, holds its events and applies them after the snapshot', () => {
    const { router: a, seqs } = fill(['a', 'b'], 11, 1);
    const data = a.snapshot().data();
    const sa = data.sources.find((s) => s.key === 'a')!;
    const b = makeRouter(['a', 'b']);
    b.applyEvents('a', [
      { kind: 'stored', parent: null, engineIds: [1n], tokens: null, blockSize: BS, seqHashes: new BigUint64Array([seqs[3][0]]) },
    ]);
    const late: KvEvent = {
      kind: 'stored',
      parent: null,
      engineIds: [424242n],
      tokens: null,
      blockSize: BS,
      seqHashes: new BigUint64Array([999n]),
    };
    let sawRestoring = false;
    drive(b.restoreSteps([sa], 4), (pause) => {
      const st = b.state().sources.find((x) => x.source === 'a')!;
      sawRestoring ||= st.restoring;
      // Routing during the restore: the index overlap of 'a' is unknown (0), whatever part is loaded so far.
      const d = b.route({ requestId: `r${pause}`, seqHashes: BigUint64Array.from(seqs[pause % seqs.length]), policy: 'kv' }, pause);
      if (d.kind === 'routed') {
        const ca = d.candidates.find((c) => c.source === 'a');
        if (ca) expect(ca.overlapBlocks).toBe(0);
        b.finish(`r${pause}`, { outcome: 'ok' }, pause);
      }
      if (pause === 2) expect(b.applyEvents('a', [late])).toEqual({ applied: 0, rejected: 0 });
    });
    expect(sawRestoring).toBe(true);
    expect(b.state().sources.find((x) => x.source === 'a')!.restoring).toBe(false);
    // The snapshot's blocks, then the held event; the block stored before the restore is gone.
    const want = shape(a, 'a');
    want.set(424242n, [[999n], null]);
    expect(shape(b, 'a')).toEqual(want);
  });

  it('a stepped snapshot is refused (null) while a source is being rewritten', () => {
    const { router: a } = fill(['a'], 15, 1);
    const b = makeRouter(['a', 'b']);
    let seen = 0;
    drive(b.restoreSteps(a.snapshot().data().sources, 4), () => {
      seen++;
      expect(drive(b.snapshotSteps()).value).toBeNull();
    });
    expect(seen).toBeGreaterThan(0);
    expect(drive(b.snapshotSteps()).value).not.toBeNull();
  });

  it('a reset while restoring is applied after it: the source ends empty', () => {
    const { router: a } = fill(['a'], 12, 1);
    const b = makeRouter(['a']);
    drive(b.restoreSteps(a.snapshot().data().sources, 8), (pause) => {
      if (pause === 1) expect(b.resetSource('a')).toBe(true);
    });
    expect(b.index.cachedBlocks(0)).toBe(0);
  });

  it('a source removed mid-restore is left alone, and so is a new source given its number', () => {
    const { router: a } = fill(['a'], 13, 1);
    const b = makeRouter(['a']);
    const sources = a.snapshot().data().sources;
    // Several steps of 2 blocks: the removal lands mid-restore.
    expect(sources[0].engineIds.length).toBeGreaterThan(6);
    drive(b.restoreSteps(sources, 2), (pause) => {
      if (pause === 1) {
        b.removeSource('a');
        b.addSource({ workerId: 'z', dpRank: 0 });
      }
    });
    expect(b.sourceKeys()).toEqual(['z']);
    expect(b.index.cachedBlocks(0)).toBe(0);
  });

  it('counts bad snapshot data as restore does, and loads a cycle of parents unlinked', () => {
    const r = new KvRouter({ blockSize: BS });
    const { value } = drive(
      r.restoreSteps([
        goodSnapshot('short', { seqHashes: new BigUint64Array([10n]) }),
        goodSnapshot('odd-size', { blockSize: 6 }),
        goodSnapshot('parents-length', { parents: new Int32Array([-1]) }),
        goodSnapshot('parents-range', { parents: new Int32Array([5, 1]) }),
        goodSnapshot('cycle', { parents: new Int32Array([1, 0]) }),
        goodSnapshot('dup', { engineIds: new BigUint64Array([1n, 1n]), parents: new Int32Array([-1, -1]) }),
        goodSnapshot(''),
        goodSnapshot('good'),
      ]),
    );
    expect(value.rejected).toEqual([
      { key: 'short', blocks: 2, reason: 'token_count_mismatch' },
      { key: 'odd-size', blocks: 2, reason: 'block_size_mismatch' },
      { key: 'parents-length', blocks: 2, reason: 'invalid_snapshot' },
      { key: '', blocks: 2, reason: 'unknown_source' },
      { key: 'parents-range', blocks: 0, reason: 'invalid_snapshot' },
    ]);
    // An engine id listed twice goes in as the engine would have sent it: the second names other content and replaces
    // the first (counted by the index as engine_id_reused).
    expect(r.state().sources.find((x) => x.source === 'dup')!.cachedBlocks).toBe(1);
    expect(r.index.stats().rejected).toMatchObject({ engine_id_reused: 1 });
    for (const k of ['parents-range', 'cycle', 'good']) expect(overlapByKey(r, [10n, 11n]).get(k), k).toBe(2);
    expect(value.sources).toBe(4);
  });

  it('resetSteps clears sources in steps, holding their events until done', () => {
    const { router: b } = fill(['a', 'b'], 14, 2, 800);
    const inB = b.index.cachedBlocks(1);
    const { value, pauses } = drive(b.resetSteps(['a', 'missing'], 8), (pause) => {
      if (pause === 1)
        b.applyEvents('a', [
          { kind: 'stored', parent: null, engineIds: [7n], tokens: null, blockSize: 2 * BS, seqHashes: new BigUint64Array([70n, 71n]) },
        ]);
    });
    expect(value).toEqual(['a']);
    expect(pauses).toBeGreaterThan(2);
    expect(shape(b, 'a')).toEqual(new Map([[7n, [[70n, 71n], null]]]));
    expect(b.index.cachedBlocks(1)).toBe(inB);
  });
});
