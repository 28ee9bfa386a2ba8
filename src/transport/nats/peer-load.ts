/**
 * Active load shared between replicas on `kvroute.load`: this replica's requests are announced as they are routed,
 * peers' announcements are folded into the router with trackRemote / firstToken / finish under the id
 * `<peer>/<request>`, and a peer silent for `peerTtlMs` (or saying bye) has its requests freed. A starting (or
 * reconnected) replica says hello; peers answer by re-announcing what they have in flight.
 *
 * Messages are published at the end of the event-loop turn that made them, in order: the NATS client writes what is
 * published in one synchronous run as one socket write, so a busy replica pays one write per turn, not one per
 * lifecycle step (bench:core's `replicas` fleet measures it).
 */
import type { KvRouter } from '../../core/router.ts';
import type { RouteDecision } from '../../core/types.ts';
import type { LogSink } from '../../log.ts';
import { decodeLoad, encodeLoad, type LoadMessage } from './protocol.ts';

type Added = Extract<LoadMessage, { kind: 'added' }>;

interface Peer {
  lastSeen: number;
  readonly requests: Set<string>;
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
  lifecyclePublished: number;
  lifecyclePublishErrors: number;
  remoteAdded: number;
  remoteExpired: number;
  peers: number;
}

export class PeerLoad {
  private readonly peers = new Map<string, Peer>();
  private readonly local = new Map<string, Added>();
  private closed = false;
  /** Encoded messages of this turn, published by `flush` (setImmediate). */
  private queued: Uint8Array[] = [];
  private scheduled = false;
  readonly stats: PeerLoadStats = { lifecyclePublished: 0, lifecyclePublishErrors: 0, remoteAdded: 0, remoteExpired: 0, peers: 0 };

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

  hello(): void {
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
    this.queued.push(encodeLoad(m));
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => this.flush());
  }

  /** Publishes the queued messages in order (one socket write for all of them: see the file's header). */
  flush(): void {
    this.scheduled = false;
    if (this.closed) {
      this.queued = [];
      return;
    }
    const q = this.queued;
    this.queued = [];
    for (const data of q) {
      try {
        this.d.send(data);
        this.stats.lifecyclePublished++;
      } catch {
        this.stats.lifecyclePublishErrors++;
      }
    }
  }

  /** One message from the load subject. */
  onMessage(data: Uint8Array): void {
    const m = decodeLoad(data);
    if (!m || m.replica === this.d.replicaId) return;
    const now = this.d.now();
    let peer = this.peers.get(m.replica);
    if (!peer) {
      peer = { lastSeen: now, requests: new Set() };
      this.peers.set(m.replica, peer);
      this.stats.peers = this.peers.size;
    }
    peer.lastSeen = now;
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
