/**
 * Index snapshots in and out of the object store, through KvRouter's public snapshot API, without stalling routing.
 * Writing: the router's `snapshotSteps()` copies the index's typed arrays a few MiB per step while the replica holds
 * back its events (routing goes on: it only reads the index; the copy is consistent because nothing writes it), then
 * each source is exported from that copy with `sourceSteps` and encoded frame by frame while events flow again. One
 * bounded step per event-loop turn (`setImmediate` in between). Loading decodes in steps the same way and restores
 * in steps too (`restoreSteps`: old blocks removed and the snapshot's loaded a chunk at a time).
 */
import type { ObjectStore } from '@nats-io/obj';
import type { RouterSnapshot, SourceSnapshot } from '../../core/index/snapshot.ts';
import type { KvRouter } from '../../core/router.ts';
import { SNAPSHOT_NAME } from './protocol.ts';
import { decodeSnapshotSteps, SnapshotEncoder, type SnapshotHeader, type SnapshotRefusal } from './snapshot-format.ts';

/**
 * Object chunks of 128 KiB (the store's default): the client hashes each chunk (SHA-256 in JavaScript) in one piece, a
 * millisecond or two at this size; 512 KiB chunks made that a routing stall of its own.
 */
const OBJECT_CHUNK = 128 * 1024;

const turn = () => new Promise<void>((resolve) => setImmediate(resolve));

/**
 * Drives a generator of bounded steps, one step per event-loop turn; `onStep` gets each step's wall time and the
 * process CPU time it used (on a host short of cores, wall time also counts the time the OS ran something else).
 */
export async function runSteps<T>(steps: Generator<void, T, void>, onStep?: (ms: number, cpuMs: number) => void): Promise<T> {
  for (;;) {
    const c0 = onStep ? process.cpuUsage() : null;
    const t0 = performance.now();
    const r = steps.next();
    if (c0) {
      const ms = performance.now() - t0;
      const c = process.cpuUsage(c0);
      onStep!(ms, (c.user + c.system) / 1000);
    }
    if (r.done) return r.value;
    await turn();
  }
}

export interface SnapshotExport {
  /** The stream sequence the snapshot covers (applied when the copy was taken). */
  readonly streamSeq: number;
  readonly chunks: Uint8Array[];
  readonly bytes: number;
  readonly blocks: number;
  /** The index copy (`KvRouter.snapshotSteps()`, in steps, events held back meanwhile), event-loop turns included. */
  readonly captureMs: number;
  /** The longest synchronous piece of the whole export, the capture included: routing waited at most this long. */
  readonly longestStepMs: number;
  /** The most CPU time one step used (process CPU: the step's own work, without the time the OS ran others). */
  readonly longestStepCpuMs: number;
  /** Capture to last frame, event-loop turns included. */
  readonly ms: number;
}

/** Work per export step (KvRouter's units: a table cell or an engine id, ~0.1-0.2 us each on a loaded host): a few ms. */
const EXPORT_STEP = 16_384;
/** A capture the index changed under (a worker removed meanwhile) is taken again, this many times in all. */
const CAPTURE_ATTEMPTS = 3;

/** Runs `work` with the replica's event application held back (the stepped capture needs an unchanging index). */
export type HoldEvents = <T>(work: () => Promise<T>) => Promise<T>;

export class SnapshotCaptureError extends Error {
  readonly code = 'index_changed';
  constructor(attempts: number) {
    super(`the index changed during each of ${attempts} snapshot captures`);
    this.name = 'SnapshotCaptureError';
  }
}

/**
 * The router's index as snapshot bytes, built in steps (see the file comment): the capture with events held back,
 * then each source's export and encoding with events flowing again.
 */
export async function exportSnapshot(
  router: KvRouter,
  hold: HoldEvents,
  /** Called with events held back, just before the copy: the stream sequence, time and writer the snapshot states. */
  header: () => Omit<SnapshotHeader, 'routerBlockSize'>,
): Promise<SnapshotExport> {
  const t0 = performance.now();
  let longest = 0;
  let longestCpu = 0;
  const onStep = (ms: number, cpuMs: number) => {
    if (ms > longest) longest = ms;
    if (cpuMs > longestCpu) longestCpu = cpuMs;
  };
  let snap: RouterSnapshot | null = null;
  let head = header();
  for (let attempt = 0; !snap; attempt++) {
    if (attempt === CAPTURE_ATTEMPTS) throw new SnapshotCaptureError(attempt);
    snap = await hold(() => {
      head = header();
      return runSteps(router.snapshotSteps(), onStep);
    });
  }
  const captureMs = performance.now() - t0;
  const keys = snap.keys;
  const enc = new SnapshotEncoder({ ...head, routerBlockSize: snap.blockSize }, keys.length);
  for (const key of keys) {
    await turn();
    const s: SourceSnapshot = (await runSteps(snap.sourceSteps(key, EXPORT_STEP), onStep)) ?? {
      key,
      blockSize: snap.blockSize,
      engineIds: new BigUint64Array(0),
      seqHashes: new BigUint64Array(0),
    };
    await runSteps(enc.addSource(s), onStep);
  }
  const out = enc.finish();
  return { ...out, streamSeq: head.streamSeq, captureMs, longestStepMs: longest, longestStepCpuMs: longestCpu, ms: performance.now() - t0 };
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
export async function putSnapshot(store: ObjectStore, exp: SnapshotExport, replica: string): Promise<void> {
  // Pieces of at most one object chunk: the client then never joins more than two chunks' worth of bytes at once.
  let i = 0;
  let at = 0;
  const stream = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (i === exp.chunks.length) {
        controller.close();
        return;
      }
      const c = exp.chunks[i];
      const end = Math.min(c.byteLength, at + OBJECT_CHUNK);
      controller.enqueue(c.subarray(at, end));
      at = end;
      if (at === c.byteLength) {
        i++;
        at = 0;
      }
    },
  });
  await store.put(
    { name: SNAPSHOT_NAME, description: JSON.stringify({ streamSeq: exp.streamSeq, replica }), options: { max_chunk_size: OBJECT_CHUNK } },
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

/**
 * Restores decoded sources into the router in steps of bounded work (`KvRouter.restoreSteps`: a few ms each, one per
 * event-loop turn, a large source's old blocks removed and its snapshot loaded a chunk at a time); returns the blocks
 * applied. `onStep` gets each step's wall and CPU time, as for the export.
 */
export async function restoreSnapshot(
  router: KvRouter,
  sources: readonly SourceSnapshot[],
  onStep?: (ms: number, cpuMs: number) => void,
): Promise<{ applied: number; rejected: number }> {
  const r = await runSteps(router.restoreSteps(sources), onStep);
  return { applied: r.blocks, rejected: r.rejected.reduce((n, x) => n + x.blocks, 0) };
}
