/**
 * A router replica's side of the NATS event plane (`kvroute serve --nats URL`). Given the replica's KvRouter it:
 *
 * - discovers workers from the registry bucket (sources added; a worker whose entry is deleted, or whose relay has
 *   been silent for `workerTtlMs` while this replica was connected, is removed);
 * - keeps the index in step with the event stream through an ordered consumer, starting after the latest snapshot;
 * - shares active load: `publishLifecycle` announces this replica's requests, peers' announcements are folded in with
 *   trackRemote / firstToken / finish under the id `<peer>/<request>`, and a peer silent for `peerTtlMs` has its
 *   requests freed; a starting (or reconnected) replica says hello and peers re-announce what they have in flight;
 * - snapshots: every `snapshotIntervalMs` the replica holding the lease (a KV key updated by revision) writes the
 *   index with the stream sequence it covers to the object store, then purges the stream below the previous snapshot
 *   (one interval of history stays for replicas that lag);
 * - NATS down: routing continues on the current view (`degraded`, counted, logged); the client reconnects and the
 *   ordered consumer resumes after the last applied sequence.
 *
 * `ready` resolves once the snapshot is loaded and the stream is consumed up to its last sequence at start.
 */
import { connect, type NatsConnection, type Subscription } from '@nats-io/transport-node';
import { DeliverPolicy, jetstream, type ConsumerMessages, type JetStreamClient } from '@nats-io/jetstream';
import { randomBytes } from 'node:crypto';
import type { KvRouter } from '../../core/router.ts';
import { parseSourceKey, sourceKey, type RouteDecision } from '../../core/types.ts';
import { consoleLog, type LogSink } from '../../log.ts';
import {
  decodeEventMessage,
  decodeLoad,
  decodeSnapshot,
  decodeWorkerEntry,
  encodeLoad,
  encodeSnapshot,
  LEASE_KEY,
  LOAD_SUBJECT,
  SNAPSHOT_NAME,
  STREAM,
  subjectSource,
  type LoadMessage,
  type Snapshot,
  type SnapshotSource,
  type WorkerEntry,
} from './protocol.ts';
import { ensureEventPlane, type EventPlane, type StreamLimits } from './setup.ts';

export interface ReplicaOptions {
  readonly servers?: string | string[];
  /** An open connection (not closed by the replica). */
  readonly nc?: NatsConnection;
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
  readonly now?: () => number;
  /** Registry changes, for the server to add or drop the worker's HTTP endpoint. `entry` null: the worker left. */
  readonly onWorker?: (workerId: string, entry: WorkerEntry | null) => void;
  /** A peer pinned a session to a source (session affinity shared across replicas). */
  readonly onSession?: (sessionId: string, sourceKey: string, expiresAt: number) => void;
}

export interface ReplicaStats {
  replicaId: string;
  ready: boolean;
  degraded: boolean;
  appliedSeq: number;
  snapshotSeq: number;
  messages: number;
  badMessages: number;
  badEvents: number;
  blocksApplied: number;
  blocksRejected: number;
  resets: number;
  streamGaps: number;
  disconnects: number;
  lifecyclePublished: number;
  lifecyclePublishErrors: number;
  remoteAdded: number;
  remoteExpired: number;
  peers: number;
  snapshotsWritten: number;
  snapshotWriteMs: number;
  /** Synchronous part of the last snapshot write (dump + encode): routing on this replica waits that long. */
  snapshotDumpMs: number;
  snapshotLoadMs: number;
  snapshotBlocks: number;
  purged: number;
  workersRemoved: number;
}

interface Peer {
  lastSeen: number;
  readonly requests: Set<string>;
}

type Added = Extract<LoadMessage, { kind: 'added' }>;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Internal index number of each source key (KvIndex.dump() names sources by number). */
function indexKeys(router: KvRouter): Map<number, string> {
  const sources = (router as unknown as { sources: Map<string, { index: number }> }).sources;
  const out = new Map<number, string>();
  for (const [key, e] of sources) out.set(e.index, key);
  return out;
}

/** The router's index as a key-based snapshot body (what `KvRouter.dumpSources()` should return). */
export function dumpRouter(router: KvRouter): SnapshotSource[] {
  const keys = indexKeys(router);
  const out: SnapshotSource[] = [];
  for (const { source, event } of router.index.dump()) {
    const key = keys.get(source);
    if (key === undefined || !event.seqHashes) continue;
    out.push(
      shuffled({ sourceKey: key, blockSize: event.blockSize, engineIds: BigUint64Array.from(event.engineIds), seqHashes: event.seqHashes }),
    );
  }
  return out;
}

/**
 * The dump lists engine ids in the index's hash-table order; inserting keys into an open-addressing table in another
 * table's order clusters them (loading 200k blocks took 38 s instead of 0.1 s). A seeded shuffle breaks the pattern.
 */
function shuffled(s: SnapshotSource): SnapshotSource {
  const n = s.engineIds.length;
  const split = n === 0 ? 1 : s.seqHashes.length / n;
  const ids = s.engineIds.slice();
  const hs = s.seqHashes.slice();
  // Swapped as u32 halves: reading a BigUint64Array element allocates a bigint.
  const id32 = new Uint32Array(ids.buffer);
  const h32 = new Uint32Array(hs.buffer);
  const w = 2 * split;
  let x = 0x9e3779b9;
  for (let i = n - 1; i > 0; i--) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    const j = (x >>> 0) % (i + 1);
    let t = id32[2 * i];
    id32[2 * i] = id32[2 * j];
    id32[2 * j] = t;
    t = id32[2 * i + 1];
    id32[2 * i + 1] = id32[2 * j + 1];
    id32[2 * j + 1] = t;
    for (let m = 0; m < w; m++) {
      t = h32[i * w + m];
      h32[i * w + m] = h32[j * w + m];
      h32[j * w + m] = t;
    }
  }
  return { ...s, engineIds: ids, seqHashes: hs };
}

/** Replaces the blocks of each snapshot source in `router` (sources are added as event sources when missing). */
export function loadRouter(router: KvRouter, sources: readonly SnapshotSource[]): number {
  let blocks = 0;
  for (const s of sources) {
    if (!router.hasSource(s.sourceKey)) router.addSource(parseSourceKey(s.sourceKey), { mode: 'events' });
    router.resetSource(s.sourceKey);
    const r = router.applyEvents(s.sourceKey, [
      // The index only indexes engineIds and reads .length: the typed array saves building a million-element array.
      {
        kind: 'stored',
        parent: null,
        engineIds: s.engineIds as unknown as bigint[],
        tokens: null,
        blockSize: s.blockSize,
        seqHashes: s.seqHashes,
      },
    ]);
    blocks += r.applied;
  }
  return blocks;
}

class Resync extends Error {}

export class NatsReplica {
  readonly replicaId: string;
  readonly ready: Promise<void>;
  private resolveReady!: () => void;
  private readyFlag = false;
  private router!: KvRouter;
  private nc!: NatsConnection;
  private js!: JetStreamClient;
  private plane!: EventPlane;
  private ownsConnection = false;
  private closed = false;
  private consumerMessages: ConsumerMessages | null = null;
  private loadSub: Subscription | null = null;
  private timers: NodeJS.Timeout[] = [];
  private readonly now: () => number;
  private readonly log: LogSink;
  private readonly peers = new Map<string, Peer>();
  private readonly local = new Map<string, Added>();
  private readonly workers = new Map<string, { entry: WorkerEntry; seenAt: number }>();
  private connectedSince = 0;
  private targetSeq = 0;
  private lastSnapshotSeq = 0;
  private snapshotting = false;
  private consumeLoop: Promise<void> | null = null;
  private readonly c: ReplicaStats;

  constructor(private readonly opts: ReplicaOptions = {}) {
    this.replicaId = opts.replicaId ?? `r-${randomBytes(4).toString('hex')}`;
    this.now = opts.now ?? Date.now;
    this.log = opts.log ?? consoleLog;
    this.ready = new Promise((r) => (this.resolveReady = r));
    this.c = {
      replicaId: this.replicaId,
      ready: false,
      degraded: false,
      appliedSeq: 0,
      snapshotSeq: 0,
      messages: 0,
      badMessages: 0,
      badEvents: 0,
      blocksApplied: 0,
      blocksRejected: 0,
      resets: 0,
      streamGaps: 0,
      disconnects: 0,
      lifecyclePublished: 0,
      lifecyclePublishErrors: 0,
      remoteAdded: 0,
      remoteExpired: 0,
      peers: 0,
      snapshotsWritten: 0,
      snapshotWriteMs: 0,
      snapshotDumpMs: 0,
      snapshotLoadMs: 0,
      snapshotBlocks: 0,
      purged: 0,
      workersRemoved: 0,
    };
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
        name: `kvroute-replica-${this.replicaId}`,
      });
      this.ownsConnection = true;
    }
    this.connectedSince = this.now();
    void this.watchStatus();
    this.js = jetstream(this.nc);
    this.plane = await ensureEventPlane(this.nc, this.opts.limits);

    await this.loadSnapshot();
    // Registry: current entries first (so sources exist before their events), then a watch for changes.
    const workerTtl = this.opts.workerTtlMs ?? 30_000;
    for await (const key of await this.plane.registry.keys()) {
      const e = await this.plane.registry.get(key);
      if (e && e.operation === 'PUT' && !this.staleAtStart(key, e.value, workerTtl)) this.onRegistry(key, e.value);
    }
    void this.watchRegistry();

    this.loadSub = this.nc.subscribe(LOAD_SUBJECT, {
      callback: (err, msg) => {
        if (!err) this.onLoad(msg.data);
      },
    });
    const info = await this.plane.jsm.streams.info(STREAM);
    this.targetSeq = info.state.last_seq;
    this.consumeLoop = this.consume();
    this.checkReady();

    const hb = this.opts.heartbeatMs ?? 1000;
    this.publish({ kind: 'hello', replica: this.replicaId });
    this.timers.push(setInterval(() => this.tick(), hb));
    const snapEvery = this.opts.snapshotIntervalMs ?? 30_000;
    if (snapEvery > 0) {
      // Jitter so replicas started together do not race for the lease on every tick.
      this.timers.push(
        setInterval(() => void this.maybeSnapshot(), snapEvery + Math.floor(Math.random() * Math.min(1000, snapEvery / 10))),
      );
    }
    for (const t of this.timers) t.unref();
    await this.ready;
  }

  private checkReady(): void {
    if (!this.readyFlag && this.c.appliedSeq >= this.targetSeq) {
      this.readyFlag = true;
      this.c.ready = true;
      this.log.info({ replica: this.replicaId, seq: this.c.appliedSeq }, 'replica caught up with the event stream: ready');
      this.resolveReady();
    }
  }

  // ------------------------------------------------------------------------------------------ events

  private async loadSnapshot(): Promise<void> {
    const t0 = performance.now();
    const data = await this.plane.snapshots.getBlob(SNAPSHOT_NAME).catch((err) => {
      this.log.warn({ err: String(err) }, 'could not read the index snapshot: replaying the stream from its start');
      return null;
    });
    if (!data) return;
    const snap = decodeSnapshot(data);
    if (!snap) {
      this.log.error({ bytes: data.byteLength }, 'index snapshot undecodable: replaying the stream from its start');
      return;
    }
    if (snap.routerBlockSize !== this.router.blockSize) {
      this.log.error({ snapshot: snap.routerBlockSize, router: this.router.blockSize }, 'index snapshot has another block size: ignored');
      return;
    }
    this.c.snapshotBlocks = loadRouter(this.router, snap.sources);
    this.c.appliedSeq = snap.streamSeq;
    this.c.snapshotSeq = snap.streamSeq;
    this.lastSnapshotSeq = snap.streamSeq;
    this.c.snapshotLoadMs = performance.now() - t0;
    this.log.info({ seq: snap.streamSeq, blocks: this.c.snapshotBlocks, ms: this.c.snapshotLoadMs }, 'index snapshot loaded');
  }

  private async consume(): Promise<void> {
    while (!this.closed) {
      try {
        const consumer = await this.js.consumers.get(STREAM, {
          deliver_policy: DeliverPolicy.StartSequence,
          opt_start_seq: this.c.appliedSeq + 1,
        });
        // Few messages per pull (one may carry 512 KiB of events). Short pulls with heartbeats: a pull request lost
        // while NATS restarts would otherwise stall delivery for the default 30 s expiry.
        const msgs = await consumer.consume({ max_messages: 64, expires: 2000, idle_heartbeat: 1000 });
        this.consumerMessages = msgs;
        void (async () => {
          for await (const st of msgs.status()) {
            // Pulls and heartbeats are routine; resets and recreations are what an operator wants to see.
            if (st.type === 'next' || st.type === 'heartbeat' || st.type === 'debug') continue;
            this.log.info({ status: st.type }, `event stream consumer: ${st.type}`);
          }
        })().catch(() => {});
        for await (const m of msgs) {
          if (this.closed) break;
          this.onMessage(m.seq, m.subject, m.data);
        }
      } catch (err) {
        if (this.closed) return;
        if (err instanceof Resync) {
          await this.resync();
          continue;
        }
        this.log.warn({ err: String(err) }, 'event stream consumer stopped: restarting it');
        await sleep(250);
      } finally {
        this.consumerMessages?.stop();
        this.consumerMessages = null;
      }
    }
  }

  private onMessage(seq: number, subject: string, data: Uint8Array): void {
    if (seq <= this.c.appliedSeq) return; // redelivered after a consumer restart
    if (seq > this.c.appliedSeq + 1) {
      // Messages this replica never saw were removed (retention limits, or a purge while it lagged).
      this.c.streamGaps++;
      this.log.error({ from: this.c.appliedSeq + 1, to: seq - 1 }, 'events missing from the stream: resynchronising from the snapshot');
      throw new Resync();
    }
    this.c.appliedSeq = seq;
    this.c.messages++;
    const src = subjectSource(subject);
    const msg = decodeEventMessage(data);
    if (!src || !msg) {
      this.c.badMessages++;
    } else {
      this.c.badEvents += msg.badEvents;
      const key = sourceKey(src);
      if (!this.router.hasSource(key)) this.router.addSource(src, { mode: 'events' });
      for (const it of msg.items) {
        if (it.kind === 'reset') {
          this.c.resets++;
          this.router.resetSource(key);
        } else {
          const r = this.router.applyEvents(key, it.events);
          this.c.blocksApplied += r.applied;
          this.c.blocksRejected += r.rejected;
        }
      }
    }
    if (!this.readyFlag) this.checkReady();
  }

  /** After lost messages: reload the latest snapshot if it covers them, else treat every source as cold. */
  private async resync(): Promise<void> {
    const data = await this.plane.snapshots.getBlob(SNAPSHOT_NAME).catch(() => null);
    const snap: Snapshot | null = data ? decodeSnapshot(data) : null;
    const first = (await this.plane.jsm.streams.info(STREAM).catch(() => null))?.state.first_seq ?? 0;
    for (const key of this.router.sourceKeys()) this.router.resetSource(key);
    if (snap && snap.routerBlockSize === this.router.blockSize && snap.streamSeq + 1 >= first) {
      loadRouter(this.router, snap.sources);
      this.c.appliedSeq = snap.streamSeq;
      this.c.snapshotSeq = snap.streamSeq;
    } else {
      this.log.error({ first }, 'no snapshot covers the missing events: every source reset (cold until new events)');
      this.c.appliedSeq = Math.max(0, first - 1);
    }
  }

  // ------------------------------------------------------------------------------------------ registry

  private async watchRegistry(): Promise<void> {
    while (!this.closed) {
      try {
        const it = await this.plane.registry.watch();
        for await (const e of it) {
          if (this.closed) return;
          if (e.operation === 'PUT') {
            // The watch starts with the current values: the same staleness rule as the initial load.
            if (!e.isUpdate && this.staleAtStart(e.key, e.value, this.opts.workerTtlMs ?? 30_000)) continue;
            this.onRegistry(e.key, e.value);
          } else this.dropWorker(e.key, 'deregistered');
        }
      } catch (err) {
        if (this.closed) return;
        this.log.warn({ err: String(err) }, 'registry watch stopped: restarting it');
        await sleep(500);
      }
    }
  }

  /**
   * An entry found at start whose relay stopped heartbeating long ago (by the relay's clock) is a worker that is
   * gone: not added. Later updates always count (a live relay's heartbeats are fresh).
   */
  private staleAtStart(key: string, value: Uint8Array, ttlMs: number): boolean {
    if (this.workers.has(key)) return false;
    const age = Date.now() - (decodeWorkerEntry(value)?.heartbeatAt ?? 0);
    if (age <= ttlMs) return false;
    this.log.info({ worker: key, heartbeatAgeMs: age }, `registry entry of ${key} is stale: ignored`);
    return true;
  }

  private onRegistry(key: string, value: Uint8Array): void {
    const entry = decodeWorkerEntry(value);
    if (!entry || entry.workerId !== key) {
      this.log.warn({ key }, 'unusable registry entry ignored');
      return;
    }
    const known = this.workers.get(key);
    this.workers.set(key, { entry, seenAt: this.now() });
    if (entry.blockSize !== this.router.blockSize && !known) {
      this.log.error(
        { worker: key, relay: entry.blockSize, router: this.router.blockSize },
        `relay of ${key} runs with another block size`,
      );
    }
    for (const dp of entry.dpRanks) {
      if (!this.router.hasSource(sourceKey({ workerId: key, dpRank: dp })))
        this.router.addSource({ workerId: key, dpRank: dp }, { mode: 'events' });
    }
    if (
      !known ||
      known.entry.url !== entry.url ||
      known.entry.model !== entry.model ||
      known.entry.dpRanks.join() !== entry.dpRanks.join()
    ) {
      this.opts.onWorker?.(key, entry);
    }
  }

  private dropWorker(workerId: string, why: string): void {
    if (!this.workers.delete(workerId)) return;
    this.router.removeWorker(workerId);
    this.c.workersRemoved++;
    this.log.warn({ worker: workerId, why }, `worker ${workerId} removed (${why})`);
    this.opts.onWorker?.(workerId, null);
  }

  /** Workers known from the registry. */
  workerEntries(): WorkerEntry[] {
    return [...this.workers.values()].map((w) => w.entry);
  }

  // ------------------------------------------------------------------------------------------ active load

  /** Announce a request this replica routed (call right after `router.route`). */
  routed(d: RouteDecision): void {
    const m: Added = {
      kind: 'added',
      replica: this.replicaId,
      requestId: d.requestId,
      sourceKey: d.sourceKey,
      seqHashes: d.seqHashes,
      promptTokens: d.promptTokens,
      overlapBlocks: d.overlapBlocks,
    };
    this.local.set(d.requestId, m);
    this.publish(m);
  }

  firstToken(requestId: string): void {
    if (this.local.has(requestId)) this.publish({ kind: 'first_token', replica: this.replicaId, requestId });
  }

  finished(requestId: string): void {
    if (this.local.delete(requestId)) this.publish({ kind: 'finished', replica: this.replicaId, requestId });
  }

  /** Generic form of routed / firstToken / finished. */
  /** Tells the peers where a session is pinned now. */
  publishSession(sessionId: string, sourceKey: string, expiresAt: number): void {
    this.publish({ kind: 'session', replica: this.replicaId, sessionId, sourceKey, expiresAt });
  }

  publishLifecycle(m: LoadMessage): void {
    if (m.kind === 'added') this.local.set(m.requestId, m);
    else if (m.kind === 'finished') this.local.delete(m.requestId);
    this.publish(m);
  }

  private publish(m: LoadMessage): void {
    if (this.closed && m.kind !== 'bye') return;
    try {
      this.nc.publish(LOAD_SUBJECT, encodeLoad(m));
      this.c.lifecyclePublished++;
    } catch {
      this.c.lifecyclePublishErrors++;
    }
  }

  private onLoad(data: Uint8Array): void {
    const m = decodeLoad(data);
    if (!m || m.replica === this.replicaId) return;
    const now = this.now();
    let peer = this.peers.get(m.replica);
    if (!peer) {
      peer = { lastSeen: now, requests: new Set() };
      this.peers.set(m.replica, peer);
      this.c.peers = this.peers.size;
    }
    peer.lastSeen = now;
    switch (m.kind) {
      case 'added': {
        const id = `${m.replica}/${m.requestId}`;
        if (
          this.router.trackRemote(
            { requestId: id, sourceKey: m.sourceKey, seqHashes: m.seqHashes, promptTokens: m.promptTokens, overlapBlocks: m.overlapBlocks },
            now,
          )
        ) {
          peer.requests.add(id);
          this.c.remoteAdded++;
        }
        break;
      }
      case 'first_token':
        this.router.firstToken(`${m.replica}/${m.requestId}`, now);
        break;
      case 'finished': {
        const id = `${m.replica}/${m.requestId}`;
        if (peer.requests.delete(id)) this.router.finish(id, {}, now);
        break;
      }
      case 'session':
        this.opts.onSession?.(m.sessionId, m.sourceKey, m.expiresAt);
        break;
      case 'hello':
        for (const a of this.local.values()) this.publish(a);
        break;
      case 'bye':
        this.expirePeer(m.replica, peer);
        break;
      default:
        break;
    }
  }

  private expirePeer(id: string, peer: Peer): void {
    const now = this.now();
    for (const r of peer.requests) this.router.finish(r, {}, now);
    this.c.remoteExpired += peer.requests.size;
    this.peers.delete(id);
    this.c.peers = this.peers.size;
  }

  private tick(): void {
    const now = this.now();
    this.publish({ kind: 'heartbeat', replica: this.replicaId });
    const peerTtl = this.opts.peerTtlMs ?? 5000;
    for (const [id, p] of this.peers) {
      if (now - p.lastSeen > peerTtl) {
        this.log.warn({ peer: id, requests: p.requests.size }, `peer replica ${id} silent: its requests no longer count`);
        this.expirePeer(id, p);
      }
    }
    // Only judge relays by their heartbeats while we could have heard them.
    const workerTtl = this.opts.workerTtlMs ?? 30_000;
    if (!this.c.degraded && now - this.connectedSince > workerTtl) {
      for (const [id, w] of this.workers) if (now - w.seenAt > workerTtl) this.dropWorker(id, 'relay heartbeat expired');
    }
  }

  // ------------------------------------------------------------------------------------------ connection

  private async watchStatus(): Promise<void> {
    for await (const s of this.nc.status()) {
      if (s.type === 'disconnect') {
        if (!this.c.degraded) {
          this.c.degraded = true;
          this.c.disconnects++;
          this.log.warn({ replica: this.replicaId, seq: this.c.appliedSeq }, 'NATS unreachable: routing on the current view (degraded)');
        }
      } else if (s.type === 'reconnect') {
        this.c.degraded = false;
        this.connectedSince = this.now();
        for (const w of this.workers.values()) w.seenAt = this.connectedSince;
        this.log.info({ replica: this.replicaId }, 'NATS reconnected: catching up');
        // The server may have lost the consumer: start a new one from the last applied sequence now rather than
        // waiting for missed heartbeats to tell the old one is gone.
        this.consumerMessages?.stop();
        this.publish({ kind: 'hello', replica: this.replicaId });
      }
    }
  }

  // ------------------------------------------------------------------------------------------ snapshots

  /** Takes or renews the snapshot lease; true when this replica holds it. */
  async acquireLease(): Promise<boolean> {
    const now = Date.now();
    const ttl = this.opts.leaseTtlMs ?? Math.max(10_000, 3 * (this.opts.snapshotIntervalMs ?? 30_000));
    const value = new TextEncoder().encode(JSON.stringify({ holder: this.replicaId, until: now + ttl }));
    try {
      const e = await this.plane.lease.get(LEASE_KEY);
      if (e?.operation !== 'PUT') {
        await this.plane.lease.create(LEASE_KEY, value);
        return true;
      }
      const cur = e.json<{ holder?: string; until?: number }>();
      if (cur.holder !== this.replicaId && (cur.until ?? 0) > now) return false;
      await this.plane.lease.update(LEASE_KEY, value, e.revision);
      return true;
    } catch {
      return false; // lost the race (revision moved) or NATS unreachable
    }
  }

  private async maybeSnapshot(): Promise<void> {
    if (!this.readyFlag || this.c.degraded || this.snapshotting || this.c.appliedSeq <= this.lastSnapshotSeq) return;
    if (!(await this.acquireLease())) return;
    await this.writeSnapshot().catch((err) => this.log.warn({ err: String(err) }, 'snapshot write failed'));
  }

  /** Writes a snapshot of the current index, then purges the stream below the previous snapshot. */
  async writeSnapshot(): Promise<{ streamSeq: number; bytes: number; ms: number; dumpMs: number; purged: number }> {
    this.snapshotting = true;
    try {
      const t0 = performance.now();
      const streamSeq = this.c.appliedSeq;
      const snap: Snapshot = {
        streamSeq,
        routerBlockSize: this.router.blockSize,
        takenAt: Date.now(),
        replica: this.replicaId,
        sources: dumpRouter(this.router),
      };
      const bytes = encodeSnapshot(snap);
      // Dump + encode run synchronously: the only part of a snapshot that holds up routing on this replica.
      const dumpMs = performance.now() - t0;
      const prev = await this.plane.snapshots.info(SNAPSHOT_NAME).catch(() => null);
      let prevSeq = 0;
      try {
        prevSeq = prev?.description ? Number(JSON.parse(prev.description).streamSeq) || 0 : 0;
      } catch {
        prevSeq = 0;
      }
      if (prevSeq >= streamSeq) return { streamSeq: prevSeq, bytes: 0, ms: 0, dumpMs, purged: 0 }; // a peer was further along
      await this.plane.snapshots.putBlob(
        // 512 KiB chunks (default 128 KiB): fewer messages for a starting replica to fetch.
        {
          name: SNAPSHOT_NAME,
          description: JSON.stringify({ streamSeq, replica: this.replicaId }),
          options: { max_chunk_size: 512 * 1024 },
        },
        bytes,
      );
      this.lastSnapshotSeq = streamSeq;
      this.c.snapshotSeq = streamSeq;
      this.c.snapshotsWritten++;
      let purged = 0;
      if (prevSeq > 0) {
        // Keep (prevSeq, streamSeq]: replicas that lag up to one interval still find their next message.
        const r = await this.plane.jsm.streams.purge(STREAM, { seq: prevSeq + 1 });
        purged = r.purged;
        this.c.purged += purged;
      }
      const ms = performance.now() - t0;
      this.c.snapshotWriteMs = ms;
      this.c.snapshotDumpMs = dumpMs;
      this.log.info({ seq: streamSeq, bytes: bytes.byteLength, ms, dumpMs, purged }, 'index snapshot written');
      return { streamSeq, bytes: bytes.byteLength, ms, dumpMs, purged };
    } finally {
      this.snapshotting = false;
    }
  }

  stats(): ReplicaStats {
    return { ...this.c };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.publish({ kind: 'bye', replica: this.replicaId });
    this.closed = true;
    for (const t of this.timers) clearInterval(t);
    this.loadSub?.unsubscribe();
    this.consumerMessages?.stop();
    if (this.ownsConnection) {
      await this.nc.drain().catch(() => {});
    }
    await this.consumeLoop?.catch(() => {});
  }
}
