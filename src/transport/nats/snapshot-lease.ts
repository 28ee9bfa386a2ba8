/**
 * Who writes snapshots, and the write itself: the replica holding the lease (a KV key updated by revision, with an
 * expiry in wall-clock ms) writes the index with the stream sequence it covers to the object store, then purges the
 * stream below the previous snapshot (one interval of history stays for replicas that lag).
 */
import type { KV } from '@nats-io/kv';
import type { JetStreamManager } from '@nats-io/jetstream';
import type { ObjectStore } from '@nats-io/obj';
import type { KvRouter } from '../../core/router.ts';
import { LEASE_KEY, SNAPSHOT_NAME, STREAM } from './protocol.ts';
import { describedSeq, exportSnapshot, putSnapshot, type HoldEvents } from './snapshot-store.ts';

export interface SnapshotLeaseDeps {
  readonly lease: KV;
  readonly snapshots: ObjectStore;
  readonly jsm: JetStreamManager;
  readonly router: KvRouter;
  readonly replicaId: string;
  /** Wall clock (ms since the epoch): lease expiry is compared across replicas. */
  readonly now: () => number;
  readonly leaseTtlMs: number;
  /** Holds back event application while the index is copied. */
  readonly holdEvents: HoldEvents;
}

export interface SnapshotWrite {
  readonly streamSeq: number;
  readonly bytes: number;
  /** Capture, export, upload and purge. */
  readonly ms: number;
  /** The synchronous index copy. */
  readonly captureMs: number;
  /** The longest synchronous piece of the export (capture included): the longest routing waited on this write. */
  readonly longestStepMs: number;
  /** The most CPU time one export step used. */
  readonly longestStepCpuMs: number;
  readonly purged: number;
}

export interface SnapshotLeaseStats {
  snapshotsWritten: number;
  snapshotWriteMs: number;
  snapshotCaptureMs: number;
  snapshotLongestStepMs: number;
  purged: number;
}

export class SnapshotLease {
  private writing = false;
  /** Stream sequence of the latest snapshot loaded or written here: nothing to write until the index moves past it. */
  coveredSeq = 0;
  readonly stats: SnapshotLeaseStats = {
    snapshotsWritten: 0,
    snapshotWriteMs: 0,
    snapshotCaptureMs: 0,
    snapshotLongestStepMs: 0,
    purged: 0,
  };

  constructor(private readonly d: SnapshotLeaseDeps) {}

  /** Takes or renews the lease; true when this replica holds it. */
  async acquire(): Promise<boolean> {
    const now = this.d.now();
    const value = new TextEncoder().encode(JSON.stringify({ holder: this.d.replicaId, until: now + this.d.leaseTtlMs }));
    try {
      const e = await this.d.lease.get(LEASE_KEY);
      if (e?.operation !== 'PUT') {
        await this.d.lease.create(LEASE_KEY, value);
        return true;
      }
      const cur = e.json<{ holder?: string; until?: number }>();
      if (cur.holder !== this.d.replicaId && (cur.until ?? 0) > now) return false;
      await this.d.lease.update(LEASE_KEY, value, e.revision);
      return true;
    } catch {
      return false; // lost the race (revision moved) or NATS unreachable
    }
  }

  /** A periodic attempt: writes when the index moved past the last snapshot and the lease is ours. */
  async attempt(appliedSeq: () => number): Promise<SnapshotWrite | null> {
    if (this.writing || appliedSeq() <= this.coveredSeq) return null;
    if (!(await this.acquire())) return null;
    return this.write(appliedSeq);
  }

  /** Writes a snapshot covering the applied sequence (read once events are held back), then purges below the previous one. */
  async write(appliedSeq: () => number): Promise<SnapshotWrite> {
    this.writing = true;
    try {
      const t0 = performance.now();
      const exp = await exportSnapshot(this.d.router, this.d.holdEvents, () => ({
        streamSeq: appliedSeq(),
        takenAt: this.d.now(),
        replica: this.d.replicaId,
      }));
      const streamSeq = exp.streamSeq;
      const prev = await this.d.snapshots.info(SNAPSHOT_NAME).catch(() => null);
      const prevSeq = describedSeq(prev?.description);
      const base = { captureMs: exp.captureMs, longestStepMs: exp.longestStepMs, longestStepCpuMs: exp.longestStepCpuMs };
      if (prevSeq >= streamSeq) return { streamSeq: prevSeq, bytes: 0, ms: 0, purged: 0, ...base }; // a peer was further along
      await putSnapshot(this.d.snapshots, exp, this.d.replicaId);
      this.coveredSeq = streamSeq;
      this.stats.snapshotsWritten++;
      let purged = 0;
      if (prevSeq > 0) {
        // Keep (prevSeq, streamSeq]: replicas that lag up to one interval still find their next message.
        purged = (await this.d.jsm.streams.purge(STREAM, { seq: prevSeq + 1 })).purged;
        this.stats.purged += purged;
      }
      const ms = performance.now() - t0;
      this.stats.snapshotWriteMs = ms;
      this.stats.snapshotCaptureMs = exp.captureMs;
      this.stats.snapshotLongestStepMs = exp.longestStepMs;
      return { streamSeq, bytes: exp.bytes, ms, purged, ...base };
    } finally {
      this.writing = false;
    }
  }
}
