/**
 * The relay (`kvroute relay`): one engine's KV events -> JetStream, so router replicas need no ZMQ connection to each
 * engine. Per data-parallel rank it runs the router's own ingestion (decode, sequence tracking with gap replay and
 * restart detection, annotation) and publishes the normalised events to `kvroute.events.<worker>.<dp>`.
 *
 * Ordering and loss: one source's messages are published one at a time, each expecting the subject's previous stream
 * sequence (so nothing lands out of order, even across a NATS reconnect) and carrying a message id (so a retry of a
 * message that landed but whose ack was lost is dropped as a duplicate). Items that arrive while a publish is in flight
 * are batched into the next message. While NATS is unreachable items queue (bounded); on overflow the queue is
 * replaced by a reset marker: replicas then clear that source (cold, not wrong).
 *
 * Restart: the last message on the subject tells the engine seq L last published and its fingerprint. The relay asks
 * the engine to replay from L; if the engine still holds batch L with the same fingerprint, it is the same engine
 * process and the relay resumes at L + 1 (no reset). Otherwise it publishes a reset and rebuilds the source from the
 * engine's replay buffer (as far as it reaches) and the live stream.
 *
 * Stream gone back: a nats-server killed before its file store flushed loses the newest messages, acknowledged or
 * not, and reuses their sequences after a restart. After every reconnect (and whenever a publish finds the subject's
 * last sequence behind its own) the relay checks that the subject's last message is the last one it had acknowledged;
 * when it is not, the source is started again as a restarted relay would: resumed after the last engine batch the
 * stream still holds (the lost batches are published again from the engine's replay buffer), or reset and rebuilt
 * when the engine no longer has it. Counted as `discontinuities`.
 */
import { connect, InvalidArgumentError, type NatsConnection, type Subscription } from '@nats-io/transport-node';
import { jetstream, JetStreamApiCodes, JetStreamApiError, type JetStreamClient } from '@nats-io/jetstream';
import { randomBytes } from 'node:crypto';
import { sourceKey, type KvEvent } from '../../core/types.ts';
import { emptyCounts, type DecodedBatch, type ZmqWire } from '../../engines/common.ts';
import { type EngineName, engineAdapter } from '../../engines/index.ts';
import { decodeBatch } from '../../engines/vllm/events.ts';
import { SourceIngest } from '../../ingest/source-ingest.ts';
import { consoleLog, type LogSink } from '../../log.ts';
import type { SourceHealth } from '../../ingest/health.ts';
import { replayClient, requestReplay } from '../replay.ts';
import { TrtllmPoll } from '../trtllm-poll.ts';
import { rankEndpoint, ZmqSource } from '../zmq-source.ts';
import {
  batchFingerprint,
  checkWorkerId,
  decodeEventMessage,
  decodeWorkerEntry,
  encodeEventMessage,
  encodeWorkerEntry,
  eventSubject,
  REGISTRY_BUCKET,
  resyncSubject,
  STREAM,
  type EventItem,
  type WorkerEntry,
} from './protocol.ts';
import { ensureEventPlane, type EventPlane, type StreamLimits } from './setup.ts';

export interface RelayOptions {
  /** NATS server URL(s), or an open connection (the relay then does not close it). */
  readonly servers?: string | string[];
  readonly nc?: NatsConnection;
  readonly workerId: string;
  /**
   * Rank 0's KV event endpoint (tcp://host:5557); rank r uses port + r. Absent for an engine the registry polls over
   * HTTP (TensorRT-LLM): its events are then polled from `url`.
   */
  readonly events?: string;
  /** Rank 0's replay endpoint (tcp://host:5558); absent: gaps and relay restarts reset the source. */
  readonly replay?: string | null;
  readonly dpRanks?: number;
  readonly model?: string | null;
  /** The engine's OpenAI base URL, published in the registry for the router's proxy. */
  readonly url?: string | null;
  /** The router's block size (events of a multiple are split, others quarantined, as in the router). */
  readonly blockSize?: number;
  /** The engine (default vllm): its ZMQ payload layout, or its HTTP event endpoint without `events`; published. */
  readonly flavor?: EngineName;
  /** Disaggregated serving: published in the registry entry (absent: aggregated). */
  readonly role?: 'prefill' | 'decode' | 'both';
  /** SGLang prefill: the bootstrap port, published in the registry entry. */
  readonly bootstrapPort?: number;
  readonly topic?: string;
  readonly relayId?: string;
  /** Registry heartbeat period. Default 2 s. */
  readonly heartbeatMs?: number;
  /** Items (engine batches + resets) queued per source while NATS is slow or down. Default 200,000. */
  readonly maxPendingItems?: number;
  /** Upper bound of one message's encoded size (NATS max_payload is 1 MiB by default). Default 512 KiB. */
  readonly maxMessageBytes?: number;
  readonly publishTimeoutMs?: number;
  readonly replayTimeoutMs?: number;
  readonly limits?: StreamLimits;
  readonly log?: LogSink;
}

export interface RelayRankStats {
  readonly sourceKey: string;
  readonly subject: string;
  messages: number;
  batches: number;
  blocks: number;
  resets: number;
  retries: number;
  duplicates: number;
  overflows: number;
  /** Publishes rejected because another writer had published on the subject meanwhile. */
  conflicts: number;
  /** Times acknowledged messages of this source were found gone from the stream (NATS lost them): source restarted. */
  discontinuities: number;
  /** Messages dropped because NATS refused their size (the source was reset instead). */
  dropped: number;
  pending: number;
  lastStreamSeq: number;
  /** How the relay started: resumed after a verified seq, or reset. */
  start: 'resumed' | 'reset' | 'starting';
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Upper estimate of an event's encoded size (msgpack overhead + 8 bytes per id / hash, 4 per token). */
function eventBytes(e: KvEvent): number {
  if (e.kind === 'stored') return 40 + e.engineIds.length * 8 + (e.tokens?.length ?? 0) * 4 + (e.seqHashes?.length ?? 0) * 8;
  if (e.kind === 'removed') return 16 + e.engineIds.length * 8;
  return 4;
}

function eventBlocks(e: KvEvent): number {
  return e.kind === 'cleared' ? 0 : e.engineIds.length;
}

/** Cuts one event into pieces of at most `maxBlocks` blocks; stored pieces chain to the previous piece's last block. */
function splitEvent(e: KvEvent, maxBlocks: number): KvEvent[] {
  if (e.kind === 'cleared' || e.engineIds.length <= maxBlocks) return [e];
  const out: KvEvent[] = [];
  for (let i = 0; i < e.engineIds.length; i += maxBlocks) {
    const ids = e.engineIds.slice(i, i + maxBlocks);
    if (e.kind === 'removed') {
      out.push({ ...e, engineIds: ids });
      continue;
    }
    const per = e.blockSize;
    const split = e.seqHashes ? e.seqHashes.length / e.engineIds.length : 0;
    out.push({
      ...e,
      parent: i === 0 ? e.parent : e.engineIds[i - 1],
      engineIds: ids,
      tokens: e.tokens ? Array.prototype.slice.call(e.tokens, i * per, (i + ids.length) * per) : null,
      seqHashes: e.seqHashes ? e.seqHashes.slice(i * split, (i + ids.length) * split) : undefined,
    });
  }
  return out;
}

function emptyBatch(): DecodedBatch {
  return {
    ok: true,
    ts: 0,
    dataParallelRank: null,
    events: [],
    counts: emptyCounts(),
    skippedIds: [],
  };
}

class RankPipe {
  readonly subject: string;
  readonly key: string;
  readonly stats: RelayRankStats;
  ingest!: SourceIngest;
  zmq?: ZmqSource;
  private outbox: EventItem[] = [];
  private inflight: { items: EventItem[]; data: Uint8Array; msgId: string; blocks: number; batches: number } | null = null;
  private pumping = false;
  private closed = false;
  private readonly fps = new Map<bigint, number>();
  private priming: Array<{ seq: bigint; batch: DecodedBatch }> | null = [];
  /** Last engine batch published and acknowledged: the resume point a restarted relay verifies. */
  lastPublished: { seq: bigint; fp: number } | null = null;
  /** Message id of the last message acknowledged on the subject ('' when it had none, null before any). */
  private lastAckedMsgId: string | null = null;
  /** Set after a reconnect: check the subject still ends with our last acknowledged message before publishing on. */
  private needVerify = false;
  private wakePump: (() => void) | null = null;
  /** The backlog overflowed: the source is being started again (replay), later batches are dropped meanwhile. */
  private overflowed = false;
  /** Ends the wait for an in-flight publish when NATS reconnects (its reply may never come: retried, by id). */
  private interruptPublish: (() => void) | null = null;

  constructor(
    private readonly relay: NatsRelay,
    readonly dpRank: number,
    carried?: RelayRankStats,
    /** A pipe started again: the last batch its predecessor had acknowledged (when snapshots purged the subject). */
    private readonly resumeHint: { seq: bigint; fp: number } | null = null,
    /** Asked by a replica to rebuild: reset and replay from the engine's first batch, never resume. */
    private readonly rebuild = false,
  ) {
    this.subject = eventSubject(relay.workerId, dpRank);
    this.key = sourceKey({ workerId: relay.workerId, dpRank });
    this.stats = {
      sourceKey: this.key,
      subject: this.subject,
      messages: 0,
      batches: 0,
      blocks: 0,
      resets: 0,
      retries: 0,
      duplicates: 0,
      overflows: 0,
      conflicts: 0,
      discontinuities: 0,
      dropped: 0,
      pending: 0,
      lastStreamSeq: 0,
      start: 'starting',
    };
    // A pipe started again after a discontinuity keeps its counters.
    if (carried) Object.assign(this.stats, { ...carried, pending: 0, lastStreamSeq: 0, start: 'starting' });
  }

  /** NATS is back: verify the subject before the next publish, and retry now rather than after the backoff. */
  reconnected(): void {
    this.needVerify = true;
    this.wakePump?.();
    this.interruptPublish?.();
    if (!this.pumping && !this.closed) void this.pump();
  }

  /**
   * Does the subject still end with the last message we had acknowledged? 'ok', 'lost' (the stream went back:
   * acknowledged messages are gone), or 'other' (another writer's message is last: handled as a conflict).
   */
  private async verify(): Promise<'ok' | 'lost' | 'other'> {
    const r = this.relay;
    const last = await r.plane.jsm.streams.getMessage(STREAM, { last_by_subj: this.subject });
    const id = last?.header?.get('Nats-Msg-Id') ?? '';
    if (this.inflight && last && id === this.inflight.msgId) {
      this.acked(last.seq, id);
      return 'ok';
    }
    if (this.lastAckedMsgId === null) return last === null ? 'ok' : last.seq > this.stats.lastStreamSeq ? 'other' : 'lost';
    if (last && last.seq === this.stats.lastStreamSeq && id === this.lastAckedMsgId) return 'ok';
    if (last && last.seq > this.stats.lastStreamSeq) return 'other';
    return (await this.purged()) ? 'ok' : 'lost';
  }

  /**
   * The subject ends before our last acknowledged message: purged by a snapshot (the stream now starts after it:
   * nothing lost; the subject's end is adopted) or lost (false)?
   */
  private async purged(): Promise<boolean> {
    const jsm = this.relay.plane.jsm;
    const first = (await jsm.streams.info(STREAM)).state.first_seq;
    if (this.stats.lastStreamSeq >= first) return false;
    const last = await jsm.streams.getMessage(STREAM, { last_by_subj: this.subject });
    this.stats.lastStreamSeq = last?.seq ?? 0;
    this.lastAckedMsgId = last ? (last.header?.get('Nats-Msg-Id') ?? '') : null;
    return true;
  }

  /** The stream lost acknowledged messages of this source: start the source again (resume or reset). */
  private lost(why: string): void {
    const r = this.relay;
    this.stats.discontinuities++;
    r.log.error(
      { source: this.key, subject: this.subject, lastStreamSeq: this.stats.lastStreamSeq, why },
      `messages of ${this.key} acknowledged by JetStream are gone from the stream (${why}): starting the source again from the engine's replay`,
    );
    void r.restartPipe(this);
  }

  private push(item: EventItem): void {
    if (this.overflowed) return; // the source is being started again: these batches come back from the replay
    if (this.outbox.length >= this.relay.maxPendingItems) {
      this.stats.overflows++;
      if (this.relay.replay !== null) {
        // The backlog is dropped, not lost: the source starts again once NATS answers, resumed after the last batch
        // the stream holds, and the engine's replay buffer gives the dropped batches back (or the restart resets).
        this.relay.log.error(
          { source: this.key, pending: this.outbox.length },
          `relay backlog of ${this.key} overflowed: dropped; the source starts again from the engine's replay`,
        );
        this.overflowed = true;
        this.outbox = [];
        this.stats.pending = 0;
        setImmediate(() => void this.relay.restartPipe(this));
        return;
      }
      // No replay: the replicas cannot be told what was dropped; a reset makes them treat the source as cold instead.
      this.relay.log.error(
        { source: this.key, pending: this.outbox.length },
        `relay backlog of ${this.key} overflowed: publishing a reset`,
      );
      this.outbox = [{ kind: 'reset', reason: 'relay_backlog_overflow' }];
    }
    this.outbox.push(item);
    this.stats.pending = this.outbox.length;
    if (!this.pumping) void this.pump();
  }

  private onEvents(events: KvEvent[]): void {
    // Valid inside the sink: the seq of the engine batch these events came from.
    const seq = this.ingest.lastDeliveredSeq ?? -1n;
    const fp = this.fps.get(seq) ?? 0;
    this.fps.delete(seq);
    // An engine batch too big for one message (NATS max_payload) becomes several items with the same seq.
    const limit = this.relay.maxMessageBytes / 2;
    let size = 0;
    for (const e of events) size += eventBytes(e);
    if (size <= limit) {
      this.push({ kind: 'batch', seq, fp, events });
      return;
    }
    let chunk: KvEvent[] = [];
    let chunkBytes = 0;
    for (const e of events) {
      const perBlock = Math.max(1, eventBytes(e) / Math.max(1, eventBlocks(e)));
      for (const piece of splitEvent(e, Math.max(1, Math.floor(limit / perBlock) - 1))) {
        const b = eventBytes(piece);
        if (chunk.length > 0 && chunkBytes + b > limit) {
          this.push({ kind: 'batch', seq, fp, events: chunk });
          chunk = [];
          chunkBytes = 0;
        }
        chunk.push(piece);
        chunkBytes += b;
      }
    }
    if (chunk.length > 0) this.push({ kind: 'batch', seq, fp, events: chunk });
  }

  private onReset(reason: string): void {
    this.push({ kind: 'reset', reason });
  }

  /** Highest seq fed from the replay at start, and those batches' fingerprints (cleared once live passes it). */
  private fedUpTo: bigint | null = null;
  private readonly fedFps = new Map<bigint, number>();

  /**
   * A live batch the start's replay already fed (the live socket delivers it after the replay returned it): dropped,
   * or the tracker would take the repeated seq for an engine restart. A batch with another fingerprint at that seq
   * is a new engine process and goes on.
   */
  private alreadyFed(seq: bigint, batch: DecodedBatch): boolean {
    if (this.fedUpTo === null) return false;
    if (seq > this.fedUpTo) {
      this.fedUpTo = null;
      this.fedFps.clear();
      return false;
    }
    return batch.ok && this.fedFps.get(seq) === batchFingerprint(batch.events);
  }

  private remember(seq: bigint, batch: DecodedBatch): void {
    if (this.fps.size > 50_000) this.fps.clear(); // batches that were never delivered (reset away): forget them
    this.fps.set(seq, batchFingerprint(batch.events));
  }

  async start(): Promise<void> {
    const r = this.relay;
    this.priming = [];
    const events = r.pollUrl ? `${r.pollUrl}/kv_cache_events` : rankEndpoint(r.events, this.dpRank);
    const replayEp = r.replay ? rankEndpoint(r.replay, this.dpRank) : null;
    const inner = replayEp ? replayClient(replayEp, { timeoutMs: r.replayTimeoutMs }) : null;
    this.ingest = new SourceIngest({
      source: { workerId: r.workerId, dpRank: this.dpRank },
      flavor: r.wire,
      routerBlockSize: r.blockSize,
      sink: (_key, evs) => this.onEvents(evs),
      onReset: (_key, reason) => this.onReset(reason),
      replay: inner
        ? (from, onBatch) =>
            inner(from, (seq, payload) => {
              const b = decodeBatch(payload, r.wire);
              if (b.ok) this.remember(seq, b);
              onBatch(seq, payload);
            })
        : null,
      log: r.log,
      // The relay primes the tracker itself (resume after the last published seq, or reset + replay from 0).
      catchUp: false,
      endpoint: events,
      mode: 'connect',
    });
    // Polled over HTTP (TensorRT-LLM): the relay's poll feeds the ingests; no ZMQ, no replay, so a start is a reset.
    if (r.pollUrl === null)
      this.zmq = new ZmqSource(
        { source: { workerId: r.workerId, dpRank: this.dpRank }, endpoint: events, topic: r.topic, flavor: r.wire },
        {
          onBatch: (seq, batch) => {
            this.lastBatchAt = Date.now();
            if (batch.ok) this.remember(seq, batch);
            if (this.priming) this.priming.push({ seq, batch });
            else if (!this.alreadyFed(seq, batch)) this.ingest.onBatch(seq, batch);
          },
          onBadFrame: (kind, detail) => this.ingest.onBadFrame(kind, detail),
          onConnection: (c) => this.ingest.setConnected(c),
        },
      );

    // Where did the previous relay of this source stop?
    // The stream's last message on the subject, or (when snapshots purged it) the registry's resume point.
    let last: { seq: bigint; fp: number } | null = this.resumeHint ?? r.previousResume.get(this.dpRank) ?? null;
    const stored = await r.plane.jsm.streams.getMessage(STREAM, { last_by_subj: this.subject }).catch(() => null);
    if (stored) {
      this.stats.lastStreamSeq = stored.seq;
      this.lastAckedMsgId = stored.header?.get('Nats-Msg-Id') ?? '';
      const msg = decodeEventMessage(stored.data);
      last = null;
      for (const it of msg?.items ?? []) {
        // A reset after the last batch leaves nothing to resume.
        last = it.kind === 'batch' ? { seq: it.seq, fp: it.fp } : null;
      }
    }
    const known = stored !== null || last !== null;
    await this.zmq?.start();

    const collected: Array<{ seq: bigint; batch: DecodedBatch }> = [];
    const collect = (seq: bigint, payload: Uint8Array) => {
      const b = decodeBatch(payload, r.wire);
      if (b.ok) this.remember(seq, b);
      collected.push({ seq, batch: b });
    };
    let resumed = false;
    if (replayEp && last && last.seq >= 0n && !this.rebuild) {
      const res = await requestReplay(replayEp, last.seq, collect, { timeoutMs: r.replayTimeoutMs });
      const first = collected[0];
      resumed =
        res.ok && first !== undefined && first.seq === last.seq && first.batch.ok && batchFingerprint(first.batch.events) === last.fp;
      if (!resumed) collected.length = 0;
    }
    let lastFed: bigint | null = null;
    const feed = (seq: bigint, batch: DecodedBatch) => {
      if (lastFed !== null && seq <= lastFed) return;
      lastFed = seq;
      this.fedUpTo = seq;
      if (batch.ok) this.fedFps.set(seq, batchFingerprint(batch.events));
      this.ingest.onBatch(seq, batch);
    };
    if (resumed) {
      this.stats.start = 'resumed';
      r.log.info({ source: this.key, seq: last!.seq }, `relay resumes ${this.key} after engine seq ${last!.seq}`);
      // Batch L itself is already published: an empty stand-in tells the tracker to expect L + 1, so a gap before
      // the first live batch (events sent while the subscription was being set up) is replayed, not skipped.
      feed(last!.seq, emptyBatch());
      for (const c of collected) feed(c.seq, c.batch);
    } else {
      // Unknown what replicas hold for this source versus what the engine holds: clear, then rebuild from seq 0.
      this.stats.start = 'reset';
      let whole = false;
      if (replayEp) {
        const res = await requestReplay(replayEp, 0n, collect, { timeoutMs: r.replayTimeoutMs });
        if (!res.ok)
          r.log.warn({ source: this.key, reason: res.reason }, `catch-up replay of ${this.key} failed: starting from live events`);
        // The rebuild is whole when the engine's buffer still reaches its first batch (or it has sent none yet).
        whole = res.ok && (collected.length === 0 || collected[0].seq === 0n);
      }
      // The reason tells the replicas whether the source is whole after it (relay_start, relay_restart) or events the
      // engine sent before are missing (…_partial: degraded until the engine clears or restarts).
      const base = this.rebuild ? 'resync' : known ? 'relay_restart' : 'relay_start';
      this.onReset(whole ? base : `${base}_partial`);
      for (const c of collected) feed(c.seq, c.batch);
    }
    const early = this.priming ?? [];
    this.priming = null;
    for (const e of early) feed(e.seq, e.batch);
  }

  /** Publishes the outbox in order, one message in flight per source, retrying until acknowledged. */
  private async pump(): Promise<void> {
    this.pumping = true;
    const r = this.relay;
    let backoff = 50;
    try {
      while (!this.closed && (this.needVerify || this.inflight || this.outbox.length > 0)) {
        if (this.needVerify) {
          try {
            const v = await this.verify();
            this.needVerify = false;
            if (v === 'lost') {
              this.lost('checked after a reconnect');
              return;
            }
          } catch {
            if (this.closed) break;
            await this.sleep(backoff);
            backoff = Math.min(backoff * 2, 500);
            continue;
          }
          if (!this.inflight && this.outbox.length === 0) break;
        }
        if (!this.inflight) this.inflight = this.take();
        const m = this.inflight;
        try {
          const publish = r.js.publish(this.subject, m.data, {
            msgID: m.msgId,
            expect: { lastSubjectSequence: this.stats.lastStreamSeq },
            timeout: r.publishTimeoutMs,
          });
          // A publish sent around a reconnect may never be answered: stop waiting when NATS is back, and verify the
          // subject before sending it again (the message id makes a second copy a duplicate).
          const interrupted = new Promise<null>((resolve) => {
            this.interruptPublish = () => resolve(null);
          });
          publish.catch(() => {});
          const ack = await Promise.race([publish, interrupted]);
          this.interruptPublish = null;
          if (ack === null) continue;
          if (ack.duplicate) this.stats.duplicates++;
          this.acked(ack.seq, m.msgId);
          backoff = 50;
        } catch (err) {
          if (this.closed) break;
          if (err instanceof JetStreamApiError && err.code === JetStreamApiCodes.StreamWrongLastSequence) {
            // Either our previous attempt landed and its ack was lost, or another writer published on the subject.
            const lastMsg = await r.plane.jsm.streams.getMessage(STREAM, { last_by_subj: this.subject }).catch(() => null);
            if (lastMsg && lastMsg.header.get('Nats-Msg-Id') === m.msgId) {
              this.acked(lastMsg.seq, m.msgId);
              continue;
            }
            // The subject ends before our last acknowledged message (or at another message in its place): purged by
            // a snapshot, or the stream went back; not another writer.
            const lastId = lastMsg?.header?.get('Nats-Msg-Id') ?? '';
            if (
              this.lastAckedMsgId !== null &&
              (!lastMsg ||
                lastMsg.seq < this.stats.lastStreamSeq ||
                (lastMsg.seq === this.stats.lastStreamSeq && lastId !== this.lastAckedMsgId))
            ) {
              // Purged by a snapshot (the stream starts after it) is no loss: publish on from the subject's end.
              const purged = await this.purged().catch(() => null);
              if (purged === null) continue; // NATS unreachable again: the next attempt asks again
              if (purged) continue;
              this.lost('the subject ends before our last acknowledged message');
              return;
            }
            this.stats.conflicts++;
            r.log.error(
              { source: this.key, subject: this.subject },
              `another writer published on ${this.subject}: is a second relay running for ${r.workerId}?`,
            );
            this.stats.lastStreamSeq = lastMsg?.seq ?? 0;
            continue;
          }
          // The client refuses a message before sending it with InvalidArgumentError; for a publish with a valid
          // subject and our options, the only such check is the payload against the server's max_payload.
          if (err instanceof InvalidArgumentError) {
            // Retrying cannot help; the source's state on the replicas is unknown from here: reset it.
            this.stats.dropped++;
            r.log.error(
              { source: this.key, bytes: m.data.byteLength },
              `message for ${this.subject} exceeds the NATS max_payload: dropped, source reset`,
            );
            this.inflight = null;
            this.outbox.unshift({ kind: 'reset', reason: 'message_too_large' });
            continue;
          }
          this.stats.retries++;
          if (this.stats.retries === 1 || this.stats.retries % 100 === 0) {
            r.log.warn(
              { source: this.key, err: String(err), retries: this.stats.retries, pending: this.outbox.length },
              `publish to ${this.subject} failed: retrying`,
            );
          }
          await this.sleep(backoff);
          backoff = Math.min(backoff * 2, 1000);
        }
      }
    } finally {
      this.pumping = false;
    }
  }

  /** A backoff wait that a reconnect ends early. */
  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.wakePump = null;
        resolve();
      }, ms);
      this.wakePump = () => {
        clearTimeout(t);
        this.wakePump = null;
        resolve();
      };
    });
  }

  private acked(seq: number, msgId: string): void {
    const m = this.inflight!;
    this.inflight = null;
    this.stats.lastStreamSeq = seq;
    this.lastAckedMsgId = msgId;
    this.stats.messages++;
    this.stats.batches += m.batches;
    this.stats.blocks += m.blocks;
    for (const it of m.items) {
      if (it.kind === 'reset') this.stats.resets++;
      this.lastPublished = it.kind === 'batch' ? { seq: it.seq, fp: it.fp } : null;
    }
  }

  private take(): { items: EventItem[]; data: Uint8Array; msgId: string; blocks: number; batches: number } {
    const r = this.relay;
    let bytes = 0;
    let n = 0;
    let blocks = 0;
    let batches = 0;
    while (n < this.outbox.length) {
      const it = this.outbox[n];
      let size = 16;
      let itemBlocks = 0;
      if (it.kind === 'batch') {
        for (const e of it.events) {
          size += eventBytes(e);
          itemBlocks += eventBlocks(e);
        }
      }
      if (n > 0 && bytes + size > r.maxMessageBytes) break;
      bytes += size;
      blocks += itemBlocks;
      if (it.kind === 'batch') batches++;
      n++;
    }
    const items = this.outbox.splice(0, n);
    this.stats.pending = this.outbox.length;
    const seqs = items.filter((i) => i.kind === 'batch').map((i) => (i as { seq: bigint }).seq);
    const span = seqs.length > 0 ? `${seqs[0]}-${seqs[seqs.length - 1]}` : 'reset';
    return {
      items,
      data: encodeEventMessage(items),
      // <worker>:<dp>:<engine seqs>, made unique per relay process (resets carry no engine seq).
      msgId: `${r.workerId}:${this.dpRank}:${span}:${r.relayId}.${r.msgCounter++}`,
      blocks,
      batches,
    };
  }

  /** When the last engine batch arrived over ZMQ (0: none yet). */
  lastBatchAt = 0;

  /**
   * Resolves once no engine batch has arrived for `quietMs` (or at `deadline`): batches the engine already sent may
   * still sit in the ZMQ socket, and a shutdown that ignored them would leave them unpublished.
   */
  async settle(quietMs: number, deadline: number): Promise<void> {
    while (Date.now() < deadline && Date.now() - this.lastBatchAt < quietMs) await sleep(10);
  }

  /** Resolves when everything queued so far has been acknowledged (or the timeout passes). */
  async drain(timeoutMs: number): Promise<boolean> {
    const end = Date.now() + timeoutMs;
    while (this.inflight || this.outbox.length > 0) {
      if (Date.now() > end) return false;
      await sleep(5);
    }
    return true;
  }

  async close(): Promise<void> {
    this.closed = true;
    this.wakePump?.();
    this.ingest?.close();
    await this.zmq?.close();
  }

  health(): SourceHealth | null {
    return this.ingest ? this.ingest.health() : null;
  }

  /** Polled engines: no replay to resume from, so the source is reset on the subject's current end. */
  resetAfterLoss(): void {
    this.needVerify = false;
    this.inflight = null; // events before the reset: the reset clears them anyway
    this.lastAckedMsgId = null;
    this.stats.lastStreamSeq = 0;
    void this.relay.plane.jsm.streams
      .getMessage(STREAM, { last_by_subj: this.subject })
      .catch(() => null)
      .then((m) => {
        this.stats.lastStreamSeq = m?.seq ?? 0;
        this.lastAckedMsgId = m ? (m.header?.get('Nats-Msg-Id') ?? '') : null;
        this.outbox.unshift({ kind: 'reset', reason: 'stream_discontinuity' });
        if (!this.pumping) void this.pump();
      });
  }
}

export class NatsRelay {
  readonly workerId: string;
  readonly relayId: string;
  readonly events: string;
  readonly replay: string | null;
  readonly blockSize: number;
  readonly flavor: EngineName;
  /** The ZMQ payload layout of the engine's publisher. */
  readonly wire: ZmqWire;
  /** The engine's base URL when its events are polled over HTTP instead of read over ZMQ. */
  readonly pollUrl: string | null;
  readonly topic: string | undefined;
  readonly maxPendingItems: number;
  readonly maxMessageBytes: number;
  readonly publishTimeoutMs: number;
  readonly replayTimeoutMs: number;
  readonly log: LogSink;
  nc!: NatsConnection;
  js!: JetStreamClient;
  plane!: EventPlane;
  private ownsConnection = false;
  /** Message number of the relay process (not per pipe: a pipe started again must not reuse a message id). */
  msgCounter = 0;
  private readonly pipes: RankPipe[] = [];
  private poll: TrtllmPoll | null = null;
  private heartbeat: NodeJS.Timeout | null = null;
  private closed = false;
  /** NATS connection state, for health and logs. */
  connected = false;
  /** Rebuilds done at a replica's request. */
  rebuilds = 0;
  private lastRebuildAt = 0;
  private resyncSub: Subscription | null = null;
  disconnects = 0;

  constructor(private readonly opts: RelayOptions) {
    const bad = checkWorkerId(opts.workerId);
    if (bad) throw new RangeError(bad);
    const dp = opts.dpRanks ?? 1;
    if (!Number.isInteger(dp) || dp < 1) throw new RangeError(`dpRanks must be a positive integer, got ${dp}`);
    this.workerId = opts.workerId;
    this.relayId = opts.relayId ?? randomBytes(4).toString('hex');
    this.flavor = opts.flavor ?? 'vllm';
    this.wire = engineAdapter(this.flavor).events.zmqWire;
    this.pollUrl = opts.events === undefined && engineAdapter(this.flavor).events.httpPoll && opts.url ? opts.url : null;
    if (opts.events === undefined && this.pollUrl === null)
      throw new RangeError(`worker ${opts.workerId}: no event endpoint (events), and ${this.flavor} events cannot be polled without a url`);
    this.events = opts.events ?? '';
    this.replay = opts.events === undefined ? null : (opts.replay ?? null);
    this.blockSize = opts.blockSize ?? 16;
    this.topic = opts.topic;
    this.maxPendingItems = opts.maxPendingItems ?? 200_000;
    this.maxMessageBytes = opts.maxMessageBytes ?? 512 * 1024;
    this.publishTimeoutMs = opts.publishTimeoutMs ?? 5000;
    this.replayTimeoutMs = opts.replayTimeoutMs ?? 1000;
    this.log = opts.log ?? consoleLog;
    for (let r = 0; r < dp; r++) this.pipes.push(new RankPipe(this, r));
  }

  /** Resume points read from the registry entry of a previous relay of this worker (by dp rank). */
  readonly previousResume = new Map<number, { seq: bigint; fp: number }>();

  entry(): WorkerEntry {
    const resume: Record<string, { seq: string; fp: number }> = {};
    for (const p of this.pipes) if (p.lastPublished) resume[p.dpRank] = { seq: p.lastPublished.seq.toString(), fp: p.lastPublished.fp };
    for (const [dp, r] of this.previousResume) if (!(dp in resume)) resume[dp] = { seq: r.seq.toString(), fp: r.fp };
    return {
      resume,
      workerId: this.workerId,
      url: this.opts.url ?? null,
      model: this.opts.model ?? null,
      ...(this.opts.role ? { role: this.opts.role, engine: this.flavor } : {}),
      ...(this.opts.bootstrapPort ? { bootstrapPort: this.opts.bootstrapPort } : {}),
      blockSize: this.blockSize,
      dpRanks: this.pipes.map((p) => p.dpRank),
      relayId: this.relayId,
      heartbeatAt: Date.now(),
    };
  }

  async start(): Promise<void> {
    if (this.opts.nc) this.nc = this.opts.nc;
    else {
      this.nc = await connect({
        servers: this.opts.servers ?? '127.0.0.1:4222',
        maxReconnectAttempts: -1,
        reconnectTimeWait: 250,
        waitOnFirstConnect: true,
        name: `kvroute-relay-${this.workerId}`,
      });
      this.ownsConnection = true;
    }
    this.connected = true;
    void this.watchStatus();
    this.js = jetstream(this.nc);
    this.plane = await ensureEventPlane(this.nc, this.opts.limits);
    const prev = await this.plane.registry.get(this.workerId).catch(() => null);
    const prevEntry = prev && prev.operation === 'PUT' ? decodeWorkerEntry(prev.value) : null;
    for (const [dp, r] of Object.entries(prevEntry?.resume ?? {})) {
      try {
        this.previousResume.set(Number(dp), { seq: BigInt(r.seq), fp: r.fp });
      } catch {
        // A malformed resume point only costs a reset.
      }
    }
    // Registered before the first event so replicas know the worker's metadata when its events arrive.
    await this.plane.registry.put(this.workerId, encodeWorkerEntry(this.entry()));
    for (const p of this.pipes) await p.start();
    if (this.pollUrl) {
      this.poll = new TrtllmPoll({
        url: this.pollUrl,
        ingests: new Map(this.pipes.map((p) => [p.dpRank, p.ingest])),
        routerBlockSize: this.blockSize,
        log: this.log,
      });
      this.poll.start();
    }
    // Replicas whose view of this worker is incomplete ask for a rebuild; several ask at once: one rebuild per 2 s.
    this.resyncSub = this.nc.subscribe(resyncSubject(this.workerId), {
      callback: (err, msg) => {
        if (err || this.closed || Date.now() - this.lastRebuildAt < 2000) return;
        this.lastRebuildAt = Date.now();
        this.rebuilds++;
        let why = '';
        try {
          why = String((JSON.parse(new TextDecoder().decode(msg.data)) as { reason?: unknown }).reason ?? '');
        } catch {
          // a request without a readable reason still counts
        }
        this.log.warn(
          { worker: this.workerId, reason: why },
          `a replica asked to rebuild ${this.workerId}: reset and replay from the engine`,
        );
        for (const p of [...this.pipes]) void this.restartPipe(p, true);
      },
    });
    const hb = this.opts.heartbeatMs ?? 2000;
    this.heartbeat = setInterval(() => {
      this.plane.registry.put(this.workerId, encodeWorkerEntry(this.entry())).catch((err) => {
        this.log.warn({ worker: this.workerId, err: String(err) }, 'registry heartbeat failed');
      });
    }, hb);
    this.heartbeat.unref();
    this.log.info({ worker: this.workerId, relay: this.relayId, ranks: this.pipes.length }, `relay for ${this.workerId} started`);
  }

  private async watchStatus(): Promise<void> {
    for await (const s of this.nc.status()) {
      if (s.type === 'disconnect') {
        this.connected = false;
        this.disconnects++;
        this.log.warn({ worker: this.workerId }, 'relay lost NATS: queueing events until it is back');
      } else if (s.type === 'reconnect') {
        this.connected = true;
        this.log.info({ worker: this.workerId }, 'relay reconnected to NATS');
        for (const p of this.pipes) p.reconnected();
      }
    }
  }

  /**
   * Starts one source again after its acknowledged messages were lost from the stream, as a restarted relay would
   * (resume after the last batch the stream holds, else reset + rebuild). A polled engine (no replay, one poll for
   * every rank) gets a reset instead.
   */
  async restartPipe(old: RankPipe, rebuild = false): Promise<void> {
    const i = this.pipes.indexOf(old);
    if (i < 0 || this.closed) return;
    if (rebuild && (this.pollUrl !== null || this.replay === null)) return; // no replay to rebuild from
    if (this.pollUrl !== null) {
      old.resetAfterLoss();
      return;
    }
    await old.close();
    let wait = 100;
    while (!this.closed) {
      const next = new RankPipe(this, old.dpRank, old.stats, old.lastPublished, rebuild);
      this.pipes[i] = next;
      try {
        // Where the stream ends must be known before the source starts again: wait for NATS to answer.
        await this.plane.jsm.streams.info(STREAM);
        await next.start();
        return;
      } catch (err) {
        await next.close();
        this.log.warn({ source: old.key, err: String(err) }, `restarting ${old.key} failed: retrying`);
        await sleep(wait);
        wait = Math.min(wait * 2, 2000);
      }
    }
  }

  stats(): RelayRankStats[] {
    return this.pipes.map((p) => ({ ...p.stats }));
  }

  health(): SourceHealth[] {
    return this.pipes.map((p) => p.health()).filter((h): h is SourceHealth => h !== null);
  }

  /** Waits until every queued item is acknowledged by JetStream. */
  async drain(timeoutMs = 5000): Promise<boolean> {
    const r = await Promise.all(this.pipes.map((p) => p.drain(timeoutMs)));
    return r.every(Boolean);
  }

  /**
   * Stops the relay. The registry entry stays (a restarted relay keeps the worker's blocks on the replicas; the
   * entry expires with its heartbeat otherwise) unless `deregister` is set: then replicas drop the worker.
   */
  async close(options: { deregister?: boolean; drainMs?: number } = {}): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.heartbeat) clearInterval(this.heartbeat);
    this.resyncSub?.unsubscribe();
    await this.poll?.close();
    if (options.drainMs) {
      // Read what the engine already sent (still in the ZMQ sockets), then wait for it to be acknowledged.
      const deadline = Date.now() + options.drainMs;
      await Promise.all(this.pipes.map((p) => p.settle(100, deadline)));
      await this.drain(Math.max(0, deadline - Date.now()));
    }
    await Promise.all(this.pipes.map((p) => p.close()));
    // Final resume points, so the next relay of this worker can resume without a reset.
    if (!options.deregister && this.plane) await this.plane.registry.put(this.workerId, encodeWorkerEntry(this.entry())).catch(() => {});
    if (options.deregister) await this.plane?.registry.delete(this.workerId).catch(() => {});
    if (this.ownsConnection) await this.nc.close().catch(() => {});
  }
}

export { REGISTRY_BUCKET };
