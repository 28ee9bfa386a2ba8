/**
 * Active load shared between replicas on `kvroute.load`: this replica's requests are announced as they are routed,
 * peers' announcements are folded into the router with trackRemote / firstToken / finish under the id
 * `<peer>/<request>`, and a peer silent for `peerTtlMs` (or saying bye) has its requests freed. A starting (or
 * reconnected) replica says hello; peers answer by re-announcing what they have in flight.
 *
 * Messages are published at the end of the event-loop turn that made them, in order, and a turn's lifecycle steps
 * (added, first token, finished, session) go in one frame (protocol 2, protocol.ts `encodeLoadFrame`): a busy replica
 * pays one publish, one socket write and, on every peer, one NATS message per turn, not one per step (bench:core's
 * `replicas` fleet measures it). Frames are sent only while every live peer has said protocol 2 in its heartbeat or
 * hello, and not before this replica has ticked twice since its hello (heard every peer's heartbeat once, at start
 * and after a reconnect: peers may have come and gone meanwhile): until then, or while a
 * protocol-1 replica is around (a rolling upgrade), each step is its own message, as protocol 1 reads them. A message
 * or frame that cannot be decoded is dropped and counted (`lifecycleDropped`).
 */
import type { KvRouter } from '../../core/router.ts';
import type { RouteDecision } from '../../core/types.ts';
import type { LogSink } from '../../log.ts';
import { decodeLoadMessage, encodeLoad, encodeLoadFrame, type LoadMessage, type LoadStep, loadStepBytes } from './protocol.ts';

type Added = Extract<LoadMessage, { kind: 'added' }>;

interface Peer {
  lastSeen: number;
  readonly requests: Set<string>;
  /** Load protocol it said in its last heartbeat / hello (1 until it says more, or sends a frame). */
  version: number;
}

/** A frame is closed at about this many bytes (NATS's default max payload is 1 MiB); a larger step goes alone. */
const FRAME_BYTES = 256 * 1024;
/** Ticks (heartbeat periods) before frames may be sent: by then every live peer has said its version. */
const TICKS_BEFORE_FRAMES = 2;

function isStep(m: LoadMessage): m is LoadStep {
  return m.kind === 'added' || m.kind === 'first_token' || m.kind === 'finished' || m.kind === 'session';
}

export interface PeerLoadDeps {
  readonly router: KvRouter;
  readonly replicaId: string;
  /** Publishes one encoded message on the load subject (may throw: counted). */
  readonly send: (data: Uint8Array) => void;
  readonly now: () => number;
  readonly peerTtlMs: number;
  readonly log: LogSink;
  readonly onSession?: (sessionId: string, sourceKey: string, expiresAt: number) => void;
}

export interface PeerLoadStats {
  /** NATS messages published on the load subject (a frame counts once). */
  lifecyclePublished: number;
  /** Frames published (each one message of several steps). */
  lifecycleFrames: number;
  /** Lifecycle steps published (in frames or alone). */
  lifecycleSteps: number;
  /** Load messages or frames from peers that could not be decoded (dropped). */
  lifecycleDropped: number;
  lifecyclePublishErrors: number;
  remoteAdded: number;
  remoteExpired: number;
  peers: number;
}

export class PeerLoad {
  private readonly peers = new Map<string, Peer>();
  private readonly local = new Map<string, Added>();
  private closed = false;
  /** Messages of this turn, encoded and published by `flush` (setImmediate). */
  private queued: LoadMessage[] = [];
  private scheduled = false;
  private ticks = 0;
  readonly stats: PeerLoadStats = {
    lifecyclePublished: 0,
    lifecycleFrames: 0,
    lifecycleSteps: 0,
    lifecycleDropped: 0,
    lifecyclePublishErrors: 0,
    remoteAdded: 0,
    remoteExpired: 0,
    peers: 0,
  };

  constructor(private readonly d: PeerLoadDeps) {}

  /** Announce a request this replica routed (call right after `router.route`). */
  routed(r: RouteDecision): void {
    const m: Added = {
      kind: 'added',
      replica: this.d.replicaId,
      requestId: r.requestId,
      sourceKey: r.sourceKey,
      seqHashes: r.seqHashes,
      promptTokens: r.promptTokens,
      overlapBlocks: r.overlapBlocks,
    };
    this.local.set(r.requestId, m);
    this.publish(m);
  }

  firstToken(requestId: string): void {
    if (this.local.has(requestId)) this.publish({ kind: 'first_token', replica: this.d.replicaId, requestId });
  }

  finished(requestId: string): void {
    if (this.local.delete(requestId)) this.publish({ kind: 'finished', replica: this.d.replicaId, requestId });
  }

  /** Tells the peers where a session is pinned now. */
  publishSession(sessionId: string, sourceKey: string, expiresAt: number): void {
    this.publish({ kind: 'session', replica: this.d.replicaId, sessionId, sourceKey, expiresAt });
  }

  /** Generic form of routed / firstToken / finished. */
  publishLifecycle(m: LoadMessage): void {
    if (m.kind === 'added') this.local.set(m.requestId, m);
    else if (m.kind === 'finished') this.local.delete(m.requestId);
    this.publish(m);
  }

  /** At start and after a reconnect: single messages again until two ticks have heard every peer (see the header). */
  hello(): void {
    this.ticks = 0;
    this.publish({ kind: 'hello', replica: this.d.replicaId });
  }

  /** Says bye (peers free this replica's requests at once) after what is queued; nothing is published after it. */
  bye(): void {
    this.publish({ kind: 'bye', replica: this.d.replicaId });
    this.flush();
    this.closed = true;
  }

  private publish(m: LoadMessage): void {
    if (this.closed) return;
    this.queued.push(m);
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => this.flush());
  }

  /** True when the peers read frames (see the file's header). */
  framesOk(): boolean {
    if (this.ticks < TICKS_BEFORE_FRAMES) return false;
    for (const p of this.peers.values()) if (p.version < 2) return false;
    return true;
  }

  /** Publishes the queued messages in order: the steps in frames when the peers read them (see the file's header). */
  flush(): void {
    this.scheduled = false;
    if (this.closed) {
      this.queued = [];
      return;
    }
    const q = this.queued;
    this.queued = [];
    if (!this.framesOk()) {
      for (const m of q) this.send(() => encodeLoad(m), isStep(m) ? 1 : 0);
      return;
    }
    let steps: LoadStep[] = [];
    let bytes = 0;
    for (const m of q) {
      if (!isStep(m)) {
        if (steps.length > 0) this.sendFrame(steps);
        steps = [];
        bytes = 0;
        this.send(() => encodeLoad(m), 0);
        continue;
      }
      const b = loadStepBytes(m);
      if (steps.length > 0 && bytes + b > FRAME_BYTES) {
        this.sendFrame(steps);
        steps = [];
        bytes = 0;
      }
      steps.push(m);
      bytes += b;
    }
    if (steps.length > 0) this.sendFrame(steps);
  }

  private sendFrame(steps: LoadStep[]): void {
    if (this.send(() => encodeLoadFrame(this.d.replicaId, steps), steps.length)) this.stats.lifecycleFrames++;
  }

  private send(encode: () => Uint8Array, steps: number): boolean {
    try {
      this.d.send(encode());
      this.stats.lifecyclePublished++;
      this.stats.lifecycleSteps += steps;
      return true;
    } catch {
      this.stats.lifecyclePublishErrors++;
      return false;
    }
  }

  /** One message (or frame) from the load subject. */
  onMessage(data: Uint8Array): void {
    const d = decodeLoadMessage(data, this.d.replicaId);
    if (!d) {
      this.stats.lifecycleDropped++;
      return;
    }
    const replica = d.kind === 'single' ? d.message.replica : d.replica;
    if (replica === this.d.replicaId) return;
    if (d.kind === 'frame' && d.steps === null) {
      this.stats.lifecycleDropped++;
      return;
    }
    const now = this.d.now();
    let peer = this.peers.get(replica);
    if (!peer) {
      peer = { lastSeen: now, requests: new Set(), version: 1 };
      this.peers.set(replica, peer);
      this.stats.peers = this.peers.size;
    }
    peer.lastSeen = now;
    if (d.kind === 'frame') {
      peer.version = Math.max(peer.version, 2);
      for (const m of d.steps ?? []) this.fold(m, peer, now);
      return;
    }
    const m = d.message;
    if (m.kind === 'heartbeat' || m.kind === 'hello' || m.kind === 'bye') peer.version = d.version;
    this.fold(m, peer, now);
  }

  private fold(m: LoadMessage, peer: Peer, now: number): void {
    const router = this.d.router;
    switch (m.kind) {
      case 'added': {
        const id = `${m.replica}/${m.requestId}`;
        const tracked = router.trackRemote(
          { requestId: id, sourceKey: m.sourceKey, seqHashes: m.seqHashes, promptTokens: m.promptTokens, overlapBlocks: m.overlapBlocks },
          now,
        );
        if (tracked) {
          peer.requests.add(id);
          this.stats.remoteAdded++;
        }
        break;
      }
      case 'first_token':
        router.firstToken(`${m.replica}/${m.requestId}`, now);
        break;
      case 'finished': {
        const id = `${m.replica}/${m.requestId}`;
        if (peer.requests.delete(id)) router.finish(id, {}, now);
        break;
      }
      case 'session':
        this.d.onSession?.(m.sessionId, m.sourceKey, m.expiresAt);
        break;
      case 'hello':
        for (const a of this.local.values()) this.publish(a);
        break;
      case 'bye':
        this.expire(m.replica, peer);
        break;
      default:
        break;
    }
  }

  private expire(id: string, peer: Peer): void {
    const now = this.d.now();
    for (const r of peer.requests) this.d.router.finish(r, {}, now);
    this.stats.remoteExpired += peer.requests.size;
    this.peers.delete(id);
    this.stats.peers = this.peers.size;
  }

  /** Heartbeat to the peers, and expiry of the silent ones. */
  tick(): void {
    this.ticks++;
    const now = this.d.now();
    this.publish({ kind: 'heartbeat', replica: this.d.replicaId });
    for (const [id, p] of this.peers) {
      if (now - p.lastSeen > this.d.peerTtlMs) {
        this.d.log.warn({ peer: id, requests: p.requests.size }, `peer replica ${id} silent: its requests no longer count`);
        this.expire(id, p);
      }
    }
  }
}
