/**
 * The event stream into the router: an ordered consumer of KVROUTE_EVENTS from the sequence after the last one
 * applied (after the snapshot at start; resumed there after a reconnect). Messages this replica never saw that are
 * gone from the stream (retention, or a purge while it lagged) make a gap: it reloads the latest snapshot if that
 * covers the hole, and otherwise resets every source (cold, never wrong).
 *
 * A stream that went back (nats-server killed before its file store flushed the newest messages, then restarted on the
 * same store: sequences this replica applied are gone or reused by new messages) is a discontinuity. Before every
 * (re)start of the consumer the message at the last applied sequence is checked by its message id; when it is gone or
 * another message, the replica finds the last sequence it applied that the stream still holds (ids of the recent
 * applied messages are kept) and consumes on from there. The relays whose acknowledged messages were lost see it too
 * and publish those engine batches again (resumed from the engine's replay buffer), so applying them twice ends in
 * the same state. With no surviving sequence known, every source is reset and the stream replayed (snapshot first
 * when one is older than the surviving part).
 */
import { DeliverPolicy, type ConsumerMessages, type JetStreamClient, type JetStreamManager } from '@nats-io/jetstream';
import type { ObjectStore } from '@nats-io/obj';
import { type KvRouter, resetLosesEvents } from '../../core/router.ts';
import { sourceKey } from '../../core/types.ts';
import type { LogSink } from '../../log.ts';
import { decodeEventMessage, STREAM, subjectSource } from './protocol.ts';
import { readSnapshot, restoreSnapshot, runSteps, type SnapshotRead } from './snapshot-store.ts';

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
  /** The stream went back: messages this replica applied were lost or their sequences reused. */
  streamDiscontinuities: number;
}

/** Applied messages remembered by id, to find where a stream that went back still agrees with this replica. */
const RECENT_IDS = 4096;

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
    streamDiscontinuities: 0,
  };
  /** Message ids of recently applied sequences (seq -> Nats-Msg-Id, '' when the message had none). */
  private readonly recent = new Map<number, string>();
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

  /** Called with the sequences involved when the stream went back (the replica names the degraded sources). */
  onDiscontinuity: ((info: { appliedSeq: number; resumedAfter: number; reset: boolean }) => void) | null = null;

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
        await this.checkContinuity();
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
          if (this.apply(m.seq, m.subject, m.data, m.headers?.get('Nats-Msg-Id') ?? '') === 'gap') {
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
      // A stream that went back also looks like a gap (its new messages are past ours): check that first.
      if (gap && !this.closed && !(await this.checkContinuity().catch(() => false))) await this.resync();
    }
  }

  private async logStatus(msgs: ConsumerMessages): Promise<void> {
    try {
      for await (const st of msgs.status()) {
        // Pulls and heartbeats are routine; resets and recreations are what an operator wants to see.
        if (st.type === 'next' || st.type === 'heartbeat' || st.type === 'debug') continue;
        this.d.log.info({ status: st.type }, `event stream consumer: ${st.type}`);
        // The client recreated the consumer on its own (after the stream or consumer was lost): start ours again, so
        // the stream is checked for having gone back before more is applied.
        if (st.type === 'reset' || st.type === 'ordered_consumer_recreated') msgs.stop();
      }
    } catch {
      // the status iterator ends with its consumer
    }
  }

  /** One stream message; 'gap' when messages before it are missing. */
  apply(seq: number, subject: string, data: Uint8Array, msgId = ''): 'applied' | 'duplicate' | 'gap' {
    const c = this.stats;
    if (seq <= c.appliedSeq) return 'duplicate'; // redelivered after a consumer restart
    if (seq > c.appliedSeq + 1) {
      c.streamGaps++;
      this.d.log.error({ from: c.appliedSeq + 1, to: seq - 1 }, 'events missing from the stream: resynchronising from the snapshot');
      return 'gap';
    }
    c.appliedSeq = seq;
    c.messages++;
    this.recent.set(seq, msgId);
    if (this.recent.size > RECENT_IDS) this.recent.delete(this.recent.keys().next().value!);
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
          // The relay names why: a start or restart it rebuilt fully leaves the source whole, anything else lost events.
          if (resetLosesEvents(it.reason)) router.markDegraded(key, it.reason, Date.now());
          else router.markHealed(key);
        } else {
          const r = router.applyEvents(key, it.events);
          c.blocksApplied += r.applied;
          c.blocksRejected += r.rejected;
          if (it.events.some((e) => e.kind === 'cleared')) router.markHealed(key);
        }
      }
    }
    this.listener?.();
    return 'applied';
  }

  /** Whether the stream still holds the message applied at `seq`: true, false (gone or another), null (purged below). */
  private async holds(seq: number, firstSeq: number): Promise<boolean | null> {
    const id = this.recent.get(seq);
    if (id === undefined) return null;
    const m = await this.d.jsm.streams.getMessage(STREAM, { seq }).catch((err: unknown) => {
      // "no message found" is an answer; anything else (NATS still starting) is retried by the caller's loop.
      if (/no message found|10037/i.test(String(err))) return null;
      throw err;
    });
    if (m === null) return seq < firstSeq ? null : false;
    return (m.header?.get('Nats-Msg-Id') ?? '') === id;
  }

  /**
   * Before a consumer starts: does the stream still hold what this replica applied last? If not (the stream went
   * back), go back to the last sequence it still agrees on, or reset everything when none is known.
   */
  private async checkContinuity(): Promise<boolean> {
    const applied = this.stats.appliedSeq;
    if (applied === 0 || !this.recent.has(applied)) return false;
    const state = (await this.d.jsm.streams.info(STREAM)).state;
    const verdict = await this.holds(applied, state.first_seq);
    if (verdict !== false) return false;
    this.stats.streamDiscontinuities++;
    let agreed = 0;
    for (const seq of [...this.recent.keys()].reverse()) {
      if (seq >= applied) continue;
      const v = await this.holds(seq, state.first_seq);
      if (v === true) {
        agreed = seq;
        break;
      }
      if (v === null) break;
    }
    for (const seq of [...this.recent.keys()]) if (seq > agreed) this.recent.delete(seq);
    if (agreed > 0) {
      this.d.log.error(
        { applied, resumedAfter: agreed, streamLastSeq: state.last_seq },
        `the event stream went back (messages ${agreed + 1}..${applied} applied here are gone or replaced): consuming again after ${agreed}`,
      );
      this.stats.appliedSeq = agreed;
      this.onDiscontinuity?.({ appliedSeq: applied, resumedAfter: agreed, reset: false });
      return true;
    }
    this.d.log.error(
      { applied, streamLastSeq: state.last_seq },
      'the event stream went back and no message applied here survives: every source reset, the stream replayed',
    );
    this.recent.clear();
    this.onDiscontinuity?.({ appliedSeq: applied, resumedAfter: 0, reset: true });
    await this.resync(state.last_seq);
    return true;
  }

  /** After lost messages: reload the latest snapshot if it covers them, else treat every source as cold. */
  private async resync(notAfter = Number.POSITIVE_INFINITY): Promise<void> {
    const router = this.d.router;
    const read = await readSnapshot(this.d.snapshots, router.blockSize);
    if (read.kind === 'refused') this.d.onSnapshotRefused(read);
    const first = (await this.d.jsm.streams.info(STREAM).catch(() => null))?.state.first_seq ?? 0;
    // After the stream went back, a snapshot of sequences it no longer holds describes a lost history: not used.
    const usable = read.kind === 'decoded' && read.streamSeq + 1 >= first && read.streamSeq <= notAfter;
    // Every source is cleared (the snapshot's ones by restoreSteps), in steps: a large index never stalls routing.
    const listed = new Set(usable ? read.sources.map((s) => s.key) : []);
    await runSteps(router.resetSteps(router.sourceKeys().filter((k) => !listed.has(k))));
    if (usable) {
      await restoreSnapshot(router, read.sources);
      this.stats.appliedSeq = read.streamSeq;
      this.d.onSnapshotLoaded(read.streamSeq);
    } else {
      this.d.log.error({ first }, 'no snapshot covers the missing events: every source reset (cold until new events)');
      this.stats.appliedSeq = Math.max(0, first - 1);
      for (const key of router.sourceKeys())
        router.markDegraded(key, notAfter < Number.POSITIVE_INFINITY ? 'stream_discontinuity' : 'stream_gap', Date.now());
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    this.messages?.stop();
    await this.loop?.catch(() => {});
  }
}
