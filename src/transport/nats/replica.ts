/**
 * A router replica's side of the NATS event plane (`kvroute serve --nats URL`): the composition of its four parts
 * around one KvRouter, each in its own file:
 *
 * - `event-consumer.ts`: the event stream into the index, from the sequence after the latest snapshot;
 * - `registry-watch.ts`: workers from the registry bucket (added, changed, removed when deleted or silent);
 * - `peer-load.ts`: active load shared with the peer replicas on `kvroute.load`;
 * - `snapshot-lease.ts`: every `snapshotIntervalMs` the lease holder writes the index to the object store
 *   (`snapshot-store.ts`: in bounded steps, so routing never waits long) and purges the stream below the previous one.
 *
 * Here: connecting, loading the snapshot at start, readiness, the timers, and NATS going away (routing continues on
 * the current view: `degraded`, counted, logged; the client reconnects and the consumer resumes after the last
 * applied sequence). The clock and the id source are injected (`now`, `newId`); the defaults are the shell's.
 *
 * `ready` resolves once the snapshot is loaded and the stream is consumed up to its last sequence at start.
 */
import { randomBytes } from 'node:crypto';
import { jetstream } from '@nats-io/jetstream';
import type { ObjectStore } from '@nats-io/obj';
import { connect, type NatsConnection, type Subscription } from '@nats-io/transport-node';
import type { KvRouter } from '../../core/router.ts';
import type { RouteDecision } from '../../core/types.ts';
import { consoleLog, type LogSink } from '../../log.ts';
import { EventConsumer, type EventConsumerStats } from './event-consumer.ts';
import { PeerLoad, type PeerLoadStats } from './peer-load.ts';
import { LOAD_SUBJECT, resyncSubject, STREAM, type LoadMessage, type WorkerEntry } from './protocol.ts';
import { RegistryWatch } from './registry-watch.ts';
import { ensureEventPlane, type StreamLimits } from './setup.ts';
import { SnapshotLease, type SnapshotLeaseStats, type SnapshotWrite } from './snapshot-lease.ts';
import { readSnapshot, restoreSnapshot, type SnapshotLoadRefusal, type SnapshotRead } from './snapshot-store.ts';

export interface ReplicaOptions {
  readonly servers?: string | string[];
  /** An open connection (not closed by the replica). */
  readonly nc?: NatsConnection;
  /** Default `r-` + the id source's value. */
  readonly replicaId?: string;
  /** Snapshot attempt period; 0 disables writing snapshots (loading still happens). Default 30 s. */
  readonly snapshotIntervalMs?: number;
  /** How long a snapshot lease lasts without renewal. Default 3 x the snapshot interval. */
  readonly leaseTtlMs?: number;
  /** Lifecycle heartbeat period. Default 1 s. */
  readonly heartbeatMs?: number;
  /** A peer silent this long has its requests freed. Default 5 s. */
  readonly peerTtlMs?: number;
  /** A worker whose relay has not refreshed its entry for this long (while we were connected) is removed. Default 30 s. */
  readonly workerTtlMs?: number;
  readonly limits?: StreamLimits;
  readonly log?: LogSink;
  /** Wall clock, ms since the epoch (registry heartbeats and the lease are compared across processes). Default Date.now. */
  readonly now?: () => number;
  /** Id source for the default replica id. Default 8 random hex digits. */
  readonly newId?: () => string;
  /** Registry changes, for the server to add or drop the worker's HTTP endpoint. `entry` null: the worker left. */
  readonly onWorker?: (workerId: string, entry: WorkerEntry | null) => void;
  /** A peer pinned a session to a source (session affinity shared across replicas). */
  readonly onSession?: (sessionId: string, sourceKey: string, expiresAt: number) => void;
}

export interface ReplicaStats extends EventConsumerStats, PeerLoadStats, SnapshotLeaseStats {
  replicaId: string;
  ready: boolean;
  degraded: boolean;
  snapshotSeq: number;
  disconnects: number;
  snapshotLoadMs: number;
  snapshotBlocks: number;
  /** Stored snapshots refused (unreadable, another format version, truncated, corrupt, another block size). */
  snapshotErrors: number;
  /** Reason code of the last refusal, '' when none. */
  lastSnapshotError: SnapshotLoadRefusal | '';
  workersRemoved: number;
  /** Rebuilds asked of relays for degraded workers. */
  resyncRequests: number;
}

/** The shell's defaults for the injected clock and id source. */
const systemNow = () => Date.now();
const systemId = () => randomBytes(4).toString('hex');

/** Spreads replicas' snapshot timers apart (0..min(1 s, interval / 10)) by their id, so they do not race every tick. */
function jitter(id: string, intervalMs: number): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 0x01000193);
  return (h >>> 0) % Math.max(1, Math.floor(Math.min(1000, intervalMs / 10)));
}

export class NatsReplica {
  readonly replicaId: string;
  readonly ready: Promise<void>;
  private resolveReady!: () => void;
  private readyFlag = false;
  private router!: KvRouter;
  private nc!: NatsConnection;
  private ownsConnection = false;
  private closed = false;
  private loadSub: Subscription | null = null;
  private timers: NodeJS.Timeout[] = [];
  private readonly now: () => number;
  private readonly log: LogSink;
  private targetSeq = 0;
  private events!: EventConsumer;
  private registry!: RegistryWatch;
  private peers!: PeerLoad;
  private lease!: SnapshotLease;
  private readonly c = {
    degraded: false,
    snapshotSeq: 0,
    disconnects: 0,
    snapshotLoadMs: 0,
    snapshotBlocks: 0,
    snapshotErrors: 0,
    lastSnapshotError: '' as SnapshotLoadRefusal | '',
    resyncRequests: 0,
  };

  constructor(private readonly opts: ReplicaOptions = {}) {
    this.replicaId = opts.replicaId ?? `r-${(opts.newId ?? systemId)()}`;
    this.now = opts.now ?? systemNow;
    this.log = opts.log ?? consoleLog;
    this.ready = new Promise((r) => (this.resolveReady = r));
  }

  /** Snapshot loaded and stream caught up (the server's /health should answer 503 until then). */
  isReady(): boolean {
    return this.readyFlag;
  }

  get degraded(): boolean {
    return this.c.degraded;
  }

  /** Connects, loads the latest snapshot and the registry, and starts consuming. Resolves when `ready` does. */
  async start(router: KvRouter): Promise<void> {
    this.router = router;
    if (this.opts.nc) this.nc = this.opts.nc;
    else {
      this.nc = await connect({
        servers: this.opts.servers ?? '127.0.0.1:4222',
        maxReconnectAttempts: -1,
        reconnectTimeWait: 250,
        waitOnFirstConnect: true,
        // Its own lifecycle frames are not delivered back to it (a frame's bytes read and parsed only to be dropped).
        // Nothing else on this connection needs its own publishes: JetStream, KV and replies come from the server.
        noEcho: true,
        name: `kvroute-replica-${this.replicaId}`,
      });
      this.ownsConnection = true;
    }
    const plane = await ensureEventPlane(this.nc, this.opts.limits);
    const snapEvery = this.opts.snapshotIntervalMs ?? 30_000;
    this.events = new EventConsumer({
      js: jetstream(this.nc),
      jsm: plane.jsm,
      snapshots: plane.snapshots,
      router,
      log: this.log,
      onSnapshotRefused: (r) => this.refused(r),
      onSnapshotLoaded: (seq) => {
        this.c.snapshotSeq = seq;
        this.lease.coveredSeq = Math.max(this.lease.coveredSeq, seq);
      },
    });
    this.registry = new RegistryWatch({
      registry: plane.registry,
      router,
      now: this.now,
      workerTtlMs: this.opts.workerTtlMs ?? 30_000,
      log: this.log,
      onWorker: this.opts.onWorker,
    });
    this.peers = new PeerLoad({
      router,
      replicaId: this.replicaId,
      send: (data) => this.nc.publish(LOAD_SUBJECT, data),
      now: this.now,
      peerTtlMs: this.opts.peerTtlMs ?? 5000,
      log: this.log,
      onSession: this.opts.onSession,
    });
    this.lease = new SnapshotLease({
      lease: plane.lease,
      snapshots: plane.snapshots,
      jsm: plane.jsm,
      router,
      replicaId: this.replicaId,
      now: this.now,
      leaseTtlMs: this.opts.leaseTtlMs ?? Math.max(10_000, 3 * snapEvery),
      holdEvents: (work) => this.events.hold(work),
    });
    void this.watchStatus();

    const startSeq = await this.loadSnapshot(plane.snapshots);
    await this.registry.start();
    this.loadSub = this.nc.subscribe(LOAD_SUBJECT, {
      callback: (err, msg) => {
        if (!err) this.peers.onMessage(msg.data);
      },
    });
    this.targetSeq = (await plane.jsm.streams.info(STREAM)).state.last_seq;
    this.events.start(startSeq, () => {
      if (!this.readyFlag) this.checkReady();
    });
    this.checkReady();

    this.peers.hello();
    this.timers.push(setInterval(() => this.tick(), this.opts.heartbeatMs ?? 1000));
    if (snapEvery > 0) this.timers.push(setInterval(() => void this.maybeSnapshot(), snapEvery + jitter(this.replicaId, snapEvery)));
    for (const t of this.timers) t.unref();
    await this.ready;
  }

  private checkReady(): void {
    if (!this.readyFlag && this.events.appliedSeq >= this.targetSeq) {
      this.readyFlag = true;
      this.log.info({ replica: this.replicaId, seq: this.events.appliedSeq }, 'replica caught up with the event stream: ready');
      this.resolveReady();
    }
  }

  private refused(r: Extract<SnapshotRead, { kind: 'refused' }>): void {
    this.c.snapshotErrors++;
    this.c.lastSnapshotError = r.code;
    this.log.error({ code: r.code }, `index snapshot refused (${r.message}): replaying the stream instead`);
  }

  /** The latest snapshot into the router; returns the stream sequence it covers (0 without a usable one). */
  private async loadSnapshot(store: ObjectStore): Promise<number> {
    const t0 = performance.now();
    const read = await readSnapshot(store, this.router.blockSize);
    if (read.kind === 'none') return 0;
    if (read.kind === 'refused') {
      this.refused(read);
      return 0;
    }
    const r = await restoreSnapshot(this.router, read.sources);
    this.c.snapshotBlocks = r.applied;
    this.c.snapshotSeq = read.streamSeq;
    this.lease.coveredSeq = read.streamSeq;
    this.c.snapshotLoadMs = performance.now() - t0;
    this.log.info({ seq: read.streamSeq, blocks: r.applied, rejected: r.rejected, ms: this.c.snapshotLoadMs }, 'index snapshot loaded');
    return read.streamSeq;
  }

  /** Workers known from the registry. */
  workerEntries(): WorkerEntry[] {
    return this.registry.entries();
  }

  /** Announce a request this replica routed (call right after `router.route`). */
  routed(d: RouteDecision): void {
    this.peers.routed(d);
  }

  firstToken(requestId: string): void {
    this.peers.firstToken(requestId);
  }

  finished(requestId: string): void {
    this.peers.finished(requestId);
  }

  /** Tells the peers where a session is pinned now. */
  publishSession(sessionId: string, sourceKey: string, expiresAt: number): void {
    this.peers.publishSession(sessionId, sourceKey, expiresAt);
  }

  /** Generic form of routed / firstToken / finished. */
  publishLifecycle(m: LoadMessage): void {
    this.peers.publishLifecycle(m);
  }

  /** Last resync request per worker (ms) and the wait before the next (3 s, doubling to 60 s while it stays degraded). */
  private readonly resyncAsked = new Map<string, { at: number; waitMs: number }>();

  /**
   * Asks the relays of degraded sources to rebuild them, only while connected. A relay without a replay endpoint
   * cannot: the source stays degraded (shown, counted) and is asked for less and less often.
   */
  private askResync(): void {
    if (this.c.degraded || !this.readyFlag) return;
    const now = this.now();
    const workers = new Map<string, string>();
    for (const [key, d] of this.router.degradedSources()) {
      const workerId = this.router.sourceId(key)?.workerId;
      if (workerId) workers.set(workerId, d.reason);
    }
    for (const id of this.resyncAsked.keys()) if (!workers.has(id)) this.resyncAsked.delete(id);
    for (const [workerId, reason] of workers) {
      const last = this.resyncAsked.get(workerId);
      if (last && now - last.at < last.waitMs) continue;
      this.resyncAsked.set(workerId, { at: now, waitMs: last ? Math.min(60_000, last.waitMs * 2) : 3000 });
      this.c.resyncRequests++;
      this.log.warn({ worker: workerId, reason }, `index of ${workerId} incomplete (${reason}): asking its relay to rebuild it`);
      try {
        this.nc.publish(resyncSubject(workerId), JSON.stringify({ replica: this.replicaId, reason }));
      } catch {
        // NATS going away: asked again at a later tick
      }
    }
  }

  private tick(): void {
    this.askResync();
    this.peers.tick();
    // Only judge relays by their heartbeats while we could have heard them.
    this.registry.tick(this.c.degraded);
  }

  private async watchStatus(): Promise<void> {
    for await (const s of this.nc.status()) {
      if (s.type === 'disconnect') {
        if (!this.c.degraded) {
          this.c.degraded = true;
          this.c.disconnects++;
          this.log.warn(
            { replica: this.replicaId, seq: this.events.appliedSeq },
            'NATS unreachable: routing on the current view (degraded)',
          );
        }
      } else if (s.type === 'reconnect') {
        this.c.degraded = false;
        this.registry.reconnected();
        this.log.info({ replica: this.replicaId }, 'NATS reconnected: catching up');
        // The server may have lost the consumer: start a new one from the last applied sequence now rather than
        // waiting for missed heartbeats to tell the old one is gone.
        this.events.restart();
        this.peers.hello();
      }
    }
  }

  /** Takes or renews the snapshot lease; true when this replica holds it. */
  acquireLease(): Promise<boolean> {
    return this.lease.acquire();
  }

  private async maybeSnapshot(): Promise<void> {
    if (!this.readyFlag || this.c.degraded) return;
    try {
      const w = await this.lease.attempt(() => this.events.appliedSeq);
      if (w) this.written(w);
    } catch (err) {
      this.log.warn({ err: String(err) }, 'snapshot write failed');
    }
  }

  /** Writes a snapshot of the current index (whoever holds the lease), then purges the stream below the previous one. */
  async writeSnapshot(): Promise<SnapshotWrite> {
    const w = await this.lease.write(() => this.events.appliedSeq);
    this.written(w);
    return w;
  }

  private written(w: SnapshotWrite): void {
    if (w.bytes === 0) return; // a peer's snapshot was further along
    this.c.snapshotSeq = w.streamSeq;
    this.log.info(
      { seq: w.streamSeq, bytes: w.bytes, ms: w.ms, captureMs: w.captureMs, longestStepMs: w.longestStepMs, purged: w.purged },
      'index snapshot written',
    );
  }

  stats(): ReplicaStats {
    return {
      replicaId: this.replicaId,
      ready: this.readyFlag,
      ...this.c,
      ...this.events.stats,
      ...this.peers.stats,
      ...this.lease.stats,
      ...this.registry.stats,
    };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.peers?.bye();
    this.closed = true;
    for (const t of this.timers) clearInterval(t);
    this.registry?.close();
    this.loadSub?.unsubscribe();
    const stopping = this.events?.close();
    if (this.ownsConnection) await this.nc.drain().catch(() => {});
    await stopping;
  }
}
