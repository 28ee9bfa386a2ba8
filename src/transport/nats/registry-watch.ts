/**
 * Workers from the registry bucket: current entries at start (so sources exist before their events), then a watch.
 * A worker whose entry is deleted, or whose relay has not refreshed it for `workerTtlMs` while this replica was
 * connected, is removed from the router; the shell hears every change through `onWorker`.
 */
import type { KV } from '@nats-io/kv';
import type { KvRouter } from '../../core/router.ts';
import { sourceKey } from '../../core/types.ts';
import type { LogSink } from '../../log.ts';
import { decodeWorkerEntry, type WorkerEntry } from './protocol.ts';

export interface RegistryWatchDeps {
  readonly registry: KV;
  readonly router: KvRouter;
  /** Wall clock (ms since the epoch): entries carry the relay's heartbeat time. */
  readonly now: () => number;
  readonly workerTtlMs: number;
  readonly log: LogSink;
  readonly onWorker?: (workerId: string, entry: WorkerEntry | null) => void;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class RegistryWatch {
  private readonly workers = new Map<string, { entry: WorkerEntry; seenAt: number }>();
  /** Workers removed while their relay may have kept publishing: back, their blocks are unknown (degraded). */
  private readonly removed = new Set<string>();
  private closed = false;
  private connectedSince: number;
  readonly stats = { workersRemoved: 0 };

  constructor(private readonly d: RegistryWatchDeps) {
    this.connectedSince = d.now();
  }

  /** Loads the current entries, then watches for changes until `close`. */
  async start(): Promise<void> {
    for await (const key of await this.d.registry.keys()) {
      const e = await this.d.registry.get(key);
      if (e && e.operation === 'PUT' && !this.staleAtStart(key, e.value)) this.put(key, e.value);
    }
    void this.watch();
  }

  private async watch(): Promise<void> {
    while (!this.closed) {
      try {
        const it = await this.d.registry.watch();
        for await (const e of it) {
          if (this.closed) return;
          if (e.operation === 'PUT') {
            // The watch starts with the current values: the same staleness rule as the initial load.
            if (!e.isUpdate && this.staleAtStart(e.key, e.value)) continue;
            this.put(e.key, e.value);
          } else this.drop(e.key, 'deregistered');
        }
      } catch (err) {
        if (this.closed) return;
        this.d.log.warn({ err: String(err) }, 'registry watch stopped: restarting it');
        await sleep(500);
      }
    }
  }

  /**
   * An entry found at start whose relay stopped heartbeating long ago (by the relay's clock) is a worker that is
   * gone: not added. Later updates always count (a live relay's heartbeats are fresh).
   */
  private staleAtStart(key: string, value: Uint8Array): boolean {
    if (this.workers.has(key)) return false;
    const age = this.d.now() - (decodeWorkerEntry(value)?.heartbeatAt ?? 0);
    if (age <= this.d.workerTtlMs) return false;
    this.d.log.info({ worker: key, heartbeatAgeMs: age }, `registry entry of ${key} is stale: ignored`);
    return true;
  }

  private put(key: string, value: Uint8Array): void {
    const entry = decodeWorkerEntry(value);
    if (!entry || entry.workerId !== key) {
      this.d.log.warn({ key }, 'unusable registry entry ignored');
      return;
    }
    const router = this.d.router;
    const known = this.workers.get(key);
    this.workers.set(key, { entry, seenAt: this.d.now() });
    if (entry.blockSize !== router.blockSize && !known) {
      this.d.log.error({ worker: key, relay: entry.blockSize, router: router.blockSize }, `relay of ${key} runs with another block size`);
    }
    for (const dp of entry.dpRanks) {
      const id = { workerId: key, dpRank: dp };
      if (!router.hasSource(sourceKey(id))) router.addSource(id, { mode: 'events' });
      // Its blocks were dropped when it was removed; the engine kept them: unknown until its relay rebuilds it.
      if (this.removed.has(key)) router.markDegraded(sourceKey(id), 'worker_rejoined', this.d.now());
    }
    this.removed.delete(key);
    if (
      !known ||
      known.entry.url !== entry.url ||
      known.entry.model !== entry.model ||
      known.entry.dpRanks.join() !== entry.dpRanks.join()
    ) {
      this.d.onWorker?.(key, entry);
    }
  }

  private drop(workerId: string, why: string): void {
    if (!this.workers.delete(workerId)) return;
    this.d.router.removeWorker(workerId);
    if (why !== 'deregistered') this.removed.add(workerId);
    this.stats.workersRemoved++;
    this.d.log.warn({ worker: workerId, why }, `worker ${workerId} removed (${why})`);
    this.d.onWorker?.(workerId, null);
  }

  /** Expires workers whose relay went silent; only judged while connected (`degraded` false) for a whole TTL. */
  tick(degraded: boolean): void {
    const now = this.d.now();
    const ttl = this.d.workerTtlMs;
    if (degraded || now - this.connectedSince <= ttl) return;
    for (const [id, w] of this.workers) if (now - w.seenAt > ttl) this.drop(id, 'relay heartbeat expired');
  }

  /** After a reconnect: heartbeats missed while away say nothing about the relays. */
  reconnected(): void {
    this.connectedSince = this.d.now();
    for (const w of this.workers.values()) w.seenAt = this.connectedSince;
  }

  entries(): WorkerEntry[] {
    return [...this.workers.values()].map((w) => w.entry);
  }

  close(): void {
    this.closed = true;
  }
}
