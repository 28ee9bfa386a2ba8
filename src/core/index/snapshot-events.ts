/**
 * A snapshot source as Stored events, in steps: how `KvRouter.restoreSteps` loads a large source without one long
 * synchronous piece. The blocks go through the index's one public insert path (`KvIndex.apply`), so this file knows
 * nothing of the index's layout.
 *
 * Parents come before their children (a depth-first walk of the parent positions), and each event is a chain: block
 * k + 1's parent is block k, the first block's parent is named by engine id (already applied, so the index links
 * it). Work is counted in blocks; a step ends after at most `budget` of them (the event that crosses it is cut there).
 */
import type { StoredEvent } from '../types.ts';
import type { SourceBlocks } from './snapshot.ts';

const NONE = -1;
/** Blocks per restore step by default: a few milliseconds of index work. */
export const RESTORE_STEP = 4_096;
/** Parent-array entries ordered per block of budget. */
const ORDER_WORK = 64;

/** One step's events, plus the entries counted as invalid (bad parent positions) since the previous step. */
export interface SnapshotEventBatch {
  readonly events: StoredEvent[];
  readonly invalid: number;
}

/**
 * The events that rebuild `blocks` from empty, in batches of at most `budget` blocks (ordering costs two passes
 * over the parent array, in steps of 64 x `budget` entries that yield empty batches). A parent position out of
 * range or a block its own parent is counted in `invalid`; such a block, and one block of each cycle of parents, is
 * loaded without a parent. The caller has checked `seqHashes.length` against `engineIds.length` and the block size.
 */
export function* snapshotEvents(blocks: SourceBlocks, budget = RESTORE_STEP): Generator<SnapshotEventBatch, void, void> {
  const n = blocks.engineIds.length;
  if (n === 0) return;
  const split = blocks.seqHashes.length / n;
  const ids = blocks.engineIds;
  const hashes = blocks.seqHashes;
  const given = blocks.parents;
  const step = Math.max(1, Math.floor(budget));
  // The ordering passes cost a few ns per entry, the events ~0.5 us per block: steps of the same length.
  const passStep = step * ORDER_WORK;
  const idle: SnapshotEventBatch = { events: [], invalid: 0 };
  let invalid = 0;
  let work = 0;

  // Parent of each block (NONE for a root or a bad position), then children lists (counting sort by parent).
  const parent = new Int32Array(n).fill(NONE);
  const first = new Int32Array(n + 1);
  if (given) {
    for (let j = 0; j < n; j++) {
      const p = given[j];
      if (p >= 0) {
        if (p >= n || p === j || !Number.isInteger(p)) invalid++;
        else {
          parent[j] = p;
          first[p + 1]++;
        }
      }
      if (++work >= passStep) {
        work = 0;
        yield idle;
      }
    }
  }
  for (let j = 0; j < n; j++) first[j + 1] += first[j];
  const fill = first.slice(0, n);
  const children = new Int32Array(first[n]);
  for (let j = 0; j < n; j++) {
    const p = parent[j];
    if (p !== NONE) children[fill[p]++] = j;
    if (++work >= passStep) {
      work = 0;
      yield idle;
    }
  }

  // Depth-first from the roots: a chain follows first children; the other children wait on the stack.
  const done = new Uint8Array(n);
  const stack = new Int32Array(n);
  let events: StoredEvent[] = [];
  let inStep = 0;
  let chainIds: bigint[] = [];
  let chainStart = NONE;
  let chainLen = 0;
  // One scratch for the chain being built; each event gets a copy of its part.
  const chainHashes = new BigUint64Array(Math.min(step, n) * split);
  // Hashes are copied as u32 halves: reading a BigUint64Array element allocates a bigint.
  const c32 = new Int32Array(chainHashes.buffer);
  const h32 = new Int32Array(hashes.buffer, hashes.byteOffset, 2 * n * split);
  const flushChain = () => {
    if (chainLen === 0) return;
    const p = parent[chainStart];
    events.push({
      kind: 'stored',
      parent: p === NONE ? null : ids[p],
      engineIds: chainIds,
      tokens: null,
      blockSize: blocks.blockSize,
      seqHashes: chainHashes.slice(0, chainLen * split),
    });
    chainIds = [];
    chainLen = 0;
  };
  /** Walks the tree under `root` (its parent applied already, or none); yields when a step's budget is spent. */
  const walk = function* (root: number): Generator<SnapshotEventBatch, void, void> {
    let top = 0;
    stack[top++] = root;
    while (top > 0) {
      let u = stack[--top];
      // A chain from u down its first children.
      chainStart = u;
      for (;;) {
        done[u] = 1;
        chainIds.push(ids[u]);
        for (let k = 0, from = 2 * u * split, to = 2 * chainLen * split; k < 2 * split; k++) c32[to + k] = h32[from + k];
        chainLen++;
        inStep++;
        let next = NONE;
        for (let c = first[u]; c < first[u + 1]; c++) {
          const v = children[c];
          if (done[v]) continue;
          if (next === NONE) next = v;
          else stack[top++] = v;
        }
        if (inStep >= step || next === NONE || chainLen * split >= chainHashes.length) {
          flushChain();
          if (inStep >= step) {
            yield { events, invalid };
            events = [];
            invalid = 0;
            inStep = 0;
          }
          if (next === NONE) break;
          // The chain goes on in a new event whose parent (u) is applied by then.
          chainStart = next;
        }
        u = next;
      }
    }
  };
  for (let j = 0; j < n; j++) if (parent[j] === NONE) yield* walk(j);
  // Blocks on a cycle of parents are reachable from no root: the break in each is loaded unlinked. Not counted: an
  // index exports one itself when a parent link went stale (its slot freed and reused by a descendant).
  for (let j = 0; j < n; j++) {
    if (done[j]) continue;
    parent[j] = NONE;
    yield* walk(j);
  }
  if (events.length > 0 || invalid > 0) yield { events, invalid };
}
