/**
 * The event stream into the router: an ordered consumer of KVROUTE_EVENTS from the sequence after the last one
 * applied (after the snapshot at start; resumed there after a reconnect). Messages this replica never saw that are
 * gone from the stream (retention, or a purge while it lagged) make a gap: it reloads the latest snapshot if that
 * covers the hole, and otherwise resets every source (cold, never wrong).
 */
import { DeliverPolicy, type ConsumerMessages, type JetStreamClient, type JetStreamManager } from '@nats-io/jetstream';
import type { ObjectStore } from '@nats-io/obj';
import type { KvRouter } from '../../core/router.ts';
import { sourceKey } from '../../core/types.ts';
import type { LogSink } from '../../log.ts';
import { decodeEventMessage, STREAM, subjectSource } from './protocol.ts';
import { readSnapshot, restoreSnapshot, type SnapshotRead } from './snapshot-store.ts';

export interface EventConsumerDeps {
  readonly js: JetStreamClient;
  readonly jsm: JetStreamManager;
  readonly snapshots: ObjectStore;
  readonly router: KvRouter;
  readonly log: LogSink;
  /** A stored snapshot was refused (gap recovery): counted by the replica. */
  readonly onSnapshotRefused: (r: Extract<SnapshotRead, { kind: 'refused' }>) => void;
  /** A snapshot was loaded to fill a gap. */
  readonly onSnapshotLoaded: (streamSeq: number) => void;
}

export interface EventConsumerStats {
  appliedSeq: number;
  messages: number;
  badMessages: number;
  badEvents: number;
  blocksApplied: number;
  blocksRejected: number;
  resets: number;
  streamGaps: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class EventConsumer {
  readonly stats: EventConsumerStats = {
    appliedSeq: 0,
    messages: 0,
    badMessages: 0,
    badEvents: 0,
    blocksApplied: 0,
    blocksRejected: 0,
    resets: 0,
    streamGaps: 0,
  };
  private closed = false;
  private messages: ConsumerMessages | null = null;
  private loop: Promise<void> | null = null;
  private listener: (() => void) | null = null;
  /** While set, messages wait before they are applied (a snapshot is copying the index). */
  private held: Promise<void> | null = null;

  constructor(private readonly d: EventConsumerDeps) {}

  get appliedSeq(): number {
    return this.stats.appliedSeq;
  }

  /** Starts after `seq` (the snapshot's, or 0); `onApplied` runs after every applied message. */
  start(seq: number, onApplied: () => void): void {
    this.stats.appliedSeq = seq;
    this.listener = onApplied;
    this.loop = this.consume();
  }

  /**
   * Runs `work` with event application held back: messages already received wait (the client keeps pulling up to
   * its batch), none is lost or reordered. Routing is not held (it only reads the index).
   */
  async hold<T>(work: () => Promise<T>): Promise<T> {
    let release!: () => void;
    const previous = this.held;
    const mine = new Promise<void>((r) => (release = r));
    this.held = mine;
    try {
      await previous;
      return await work();
    } finally {
      if (this.held === mine) this.held = null;
      release();
    }
  }

  /** Drops the current consumer and starts a new one from the last applied sequence (after a reconnect). */
  restart(): void {
    this.messages?.stop();
  }

  private async consume(): Promise<void> {
    while (!this.closed) {
      let gap = false;
      try {
        const consumer = await this.d.js.consumers.get(STREAM, {
          deliver_policy: DeliverPolicy.StartSequence,
          opt_start_seq: this.stats.appliedSeq + 1,
        });
        // Few messages per pull (one may carry 512 KiB of events). Short pulls with heartbeats: a pull request lost
        // while NATS restarts would otherwise stall delivery for the default 30 s expiry.
        const msgs = await consumer.consume({ max_messages: 64, expires: 2000, idle_heartbeat: 1000 });
        this.messages = msgs;
        void this.logStatus(msgs);
        for await (const m of msgs) {
          while (this.held) await this.held;
          if (this.closed) break;
          if (this.apply(m.seq, m.subject, m.data) === 'gap') {
            gap = true;
            break;
          }
        }
      } catch (err) {
        if (this.closed) return;
        this.d.log.warn({ err: String(err) }, 'event stream consumer stopped: restarting it');
        await sleep(250);
      } finally {
        this.messages?.stop();
        this.messages = null;
      }
      if (gap && !this.closed) await this.resync();
    }
  }

  private async logStatus(msgs: ConsumerMessages): Promise<void> {
    try {
      for await (const st of msgs.status()) {
        // Pulls and heartbeats are routine; resets and recreations are what an operator wants to see.
        if (st.type === 'next' || st.type === 'heartbeat' || st.type === 'debug') continue;
        this.d.log.info({ status: st.type }, `event stream consumer: ${st.type}`);
      }
    } catch {
      // the status iterator ends with its consumer
    }
  }

  /** One stream message; 'gap' when messages before it are missing. */
  apply(seq: number, subject: string, data: Uint8Array): 'applied' | 'duplicate' | 'gap' {
    const c = this.stats;
    if (seq <= c.appliedSeq) return 'duplicate'; // redelivered after a consumer restart
    if (seq > c.appliedSeq + 1) {
      c.streamGaps++;
      this.d.log.error({ from: c.appliedSeq + 1, to: seq - 1 }, 'events missing from the stream: resynchronising from the snapshot');
      return 'gap';
    }
    c.appliedSeq = seq;
    c.messages++;
    const src = subjectSource(subject);
    const msg = decodeEventMessage(data);
    if (!src || !msg) c.badMessages++;
    else {
      c.badEvents += msg.badEvents;
      const router = this.d.router;
      const key = sourceKey(src);
      if (!router.hasSource(key)) router.addSource(src, { mode: 'events' });
      for (const it of msg.items) {
        if (it.kind === 'reset') {
          c.resets++;
          router.resetSource(key);
        } else {
          const r = router.applyEvents(key, it.events);
          c.blocksApplied += r.applied;
          c.blocksRejected += r.rejected;
        }
      }
    }
    this.listener?.();
    return 'applied';
  }

  /** After lost messages: reload the latest snapshot if it covers them, else treat every source as cold. */
  private async resync(): Promise<void> {
    const router = this.d.router;
    const read = await readSnapshot(this.d.snapshots, router.blockSize);
    if (read.kind === 'refused') this.d.onSnapshotRefused(read);
    const first = (await this.d.jsm.streams.info(STREAM).catch(() => null))?.state.first_seq ?? 0;
    for (const key of router.sourceKeys()) router.resetSource(key);
    if (read.kind === 'decoded' && read.streamSeq + 1 >= first) {
      await restoreSnapshot(router, read.sources);
      this.stats.appliedSeq = read.streamSeq;
      this.d.onSnapshotLoaded(read.streamSeq);
    } else {
      this.d.log.error({ first }, 'no snapshot covers the missing events: every source reset (cold until new events)');
      this.stats.appliedSeq = Math.max(0, first - 1);
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    this.messages?.stop();
    await this.loop?.catch(() => {});
  }
}
