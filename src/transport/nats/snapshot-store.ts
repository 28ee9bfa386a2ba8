/**
 * Index snapshots in and out of the object store, through KvRouter's public snapshot API, without stalling routing:
 * the router's `snapshot()` is a typed-array copy (the one synchronous piece), then each source is exported with
 * `sourceSteps` and encoded frame by frame, one bounded step per event-loop turn (`setImmediate` in between), so
 * routing and event application go on while a snapshot is written. Loading decodes in steps the same way and
 * restores one source per turn.
 */
import type { ObjectStore } from '@nats-io/obj';
import type { SourceSnapshot } from '../../core/index/snapshot.ts';
import type { KvRouter } from '../../core/router.ts';
import { SNAPSHOT_NAME } from './protocol.ts';
import { decodeSnapshotSteps, SnapshotEncoder, type SnapshotHeader, type SnapshotRefusal } from './snapshot-format.ts';

/** 512 KiB object chunks (the store's default is 128 KiB): fewer messages for a starting replica to fetch. */
const OBJECT_CHUNK = 512 * 1024;

const turn = () => new Promise<void>((resolve) => setImmediate(resolve));

/** Drives a generator of bounded steps, one step per event-loop turn; `onStep` gets each step's duration. */
export async function runSteps<T>(steps: Generator<void, T, void>, onStep?: (ms: number) => void): Promise<T> {
  for (;;) {
    const t0 = performance.now();
    const r = steps.next();
    onStep?.(performance.now() - t0);
    if (r.done) return r.value;
    await turn();
  }
}

export interface SnapshotExport {
  readonly chunks: Uint8Array[];
  readonly bytes: number;
  readonly blocks: number;
  /** The synchronous index copy (`KvRouter.snapshot()`). */
  readonly captureMs: number;
  /** The longest synchronous piece of the whole export, the capture included: routing waited at most this long. */
  readonly longestStepMs: number;
  /** Capture to last frame, event-loop turns included. */
  readonly ms: number;
}

/** The router's index as snapshot bytes, built in steps (see the file comment). */
export async function exportSnapshot(router: KvRouter, header: Omit<SnapshotHeader, 'routerBlockSize'>): Promise<SnapshotExport> {
  const t0 = performance.now();
  const snap = router.snapshot();
  const captureMs = performance.now() - t0;
  let longest = captureMs;
  const onStep = (ms: number) => {
    if (ms > longest) longest = ms;
  };
  const keys = snap.keys;
  const enc = new SnapshotEncoder({ ...header, routerBlockSize: snap.blockSize }, keys.length);
  for (const key of keys) {
    await turn();
    const s: SourceSnapshot = (await runSteps(snap.sourceSteps(key), onStep)) ?? {
      key,
      blockSize: snap.blockSize,
      engineIds: new BigUint64Array(0),
      seqHashes: new BigUint64Array(0),
    };
    await runSteps(enc.addSource(s), onStep);
  }
  const out = enc.finish();
  return { ...out, captureMs, longestStepMs: longest, ms: performance.now() - t0 };
}

/** Stream sequence an object's description says its snapshot covers (0 when absent or unreadable). */
export function describedSeq(description: string | undefined): number {
  if (!description) return 0;
  try {
    return Number(JSON.parse(description).streamSeq) || 0;
  } catch {
    return 0;
  }
}

/** Puts exported chunks as the snapshot object (a stream of the chunks: never joined into one buffer). */
export async function putSnapshot(store: ObjectStore, exp: SnapshotExport, streamSeq: number, replica: string): Promise<void> {
  let i = 0;
  const stream = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (i < exp.chunks.length) controller.enqueue(exp.chunks[i++]);
      else controller.close();
    },
  });
  await store.put(
    { name: SNAPSHOT_NAME, description: JSON.stringify({ streamSeq, replica }), options: { max_chunk_size: OBJECT_CHUNK } },
    stream,
  );
}

/** Why a stored snapshot was not used: a format refusal, another router block size, or an object that could not be read. */
export type SnapshotLoadRefusal = SnapshotRefusal | 'block_size' | 'unreadable';

export type SnapshotRead =
  | { readonly kind: 'none' }
  | { readonly kind: 'refused'; readonly code: SnapshotLoadRefusal; readonly message: string }
  | {
      readonly kind: 'decoded';
      readonly streamSeq: number;
      readonly blocks: number;
      readonly sources: readonly SourceSnapshot[];
    };

/** Fetches and decodes the latest snapshot (in steps); never throws. */
export async function readSnapshot(store: ObjectStore, routerBlockSize: number): Promise<SnapshotRead> {
  let bytes: Uint8Array | null;
  try {
    bytes = await store.getBlob(SNAPSHOT_NAME);
  } catch (err) {
    return { kind: 'refused', code: 'unreadable', message: `snapshot object unreadable: ${String(err)}` };
  }
  if (!bytes) return { kind: 'none' };
  const r = await runSteps(decodeSnapshotSteps(bytes));
  if (!r.ok) return { kind: 'refused', code: r.error.code, message: r.error.message };
  const s = r.snapshot;
  if (s.routerBlockSize !== routerBlockSize) {
    return {
      kind: 'refused',
      code: 'block_size',
      message: `snapshot taken with router block size ${s.routerBlockSize}, this router's is ${routerBlockSize}`,
    };
  }
  return { kind: 'decoded', streamSeq: s.streamSeq, blocks: s.blocks, sources: s.data.sources };
}

/** Restores decoded sources into the router, one source per event-loop turn; returns the blocks applied. */
export async function restoreSnapshot(
  router: KvRouter,
  sources: readonly SourceSnapshot[],
): Promise<{ applied: number; rejected: number }> {
  let applied = 0;
  let rejected = 0;
  for (const s of sources) {
    const r = router.restoreSource(s);
    applied += r.applied;
    rejected += r.rejected;
    await turn();
  }
  return { applied, rejected };
}
