/**
 * One event source (a worker's dp rank): frames -> decode -> sequence tracker -> annotator -> sink, plus its health.
 * Transport-free: the ZMQ shell (or a test, or the fuzzer) feeds it frames and gives it a replay function.
 * Nothing here throws on bad input; every bad frame is counted.
 */
import { sourceKey, type KvEvent, type SourceId } from '../core/types.ts';
import { emptyCounts, readSeqFrame, type DecodedBatch, type ZmqWire } from '../engines/common.ts';
import { decodeBatch } from '../engines/vllm/events.ts';
import { consoleLog, type LogSink } from '../log.ts';
import { SourceAnnotator } from './annotate.ts';
import { DEFAULT_BLIND_RULE, type DecodeErrorCause, isBlind, RateWindow, type BlindRule, type SourceHealth } from './health.ts';
import { SequenceTracker, type ResetReason, type TrackerOutput } from './sequence-tracker.ts';

export type EventSink = (sourceKey: string, events: KvEvent[]) => void;
/** The source's cache state is unknown from now on: the receiver must clear everything it holds for the source. */
export type ResetSink = (sourceKey: string, reason: string) => void;

export interface ReplayOutcome {
  readonly ok: boolean;
  /** Why it failed ("replay unavailable: timeout after 1000 ms", ...). */
  readonly reason?: string;
}
/** Streams every buffered batch with seq >= fromSeq to `onBatch`, resolving when the engine's end marker arrives. */
export type ReplayFn = (fromSeq: bigint, onBatch: (seq: bigint, payload: Uint8Array) => void) => Promise<ReplayOutcome>;

export type BadFrameKind = 'frame_count' | 'seq_length' | 'undecodable' | 'receive_error';

/** What the wider frame adds to a message: the publisher's lifetime id, and whether it was an idle heartbeat. */
export interface WideFrame {
  readonly epoch: string;
  readonly heartbeat: boolean;
}

export type ParsedFrames =
  | {
      readonly ok: true;
      readonly seq: bigint;
      readonly batch: DecodedBatch;
      /** Wide frames only: the publisher's lifetime id (hex); a change means a new engine process. */
      readonly epoch?: string;
      /** Wide frames only: a sequence-numbered heartbeat (empty payload), no events. */
      readonly heartbeat?: boolean;
    }
  | { readonly ok: false; readonly kind: 'frame_count' | 'seq_length'; readonly detail: string };

/** The publisher's lifetime id in the wide frame: a UUID. */
const EPOCH_BYTES = 16;

const HEARTBEAT: DecodedBatch = {
  ok: true,
  ts: NaN,
  dataParallelRank: null,
  events: [],
  counts: emptyCounts(),
  skippedIds: [],
};

/**
 * Checks one ZMQ message and decodes its payload. Never throws. Today's frame is `[topic, seq u64 BE, payload]`
 * (docs/engines.md). The wider frame of vLLM's snapshot work (a publisher lifetime UUID and idle heartbeats; the
 * layout is *unverified*, so both plausible shapes are accepted) is detected: `[topic, epoch (16 bytes), seq u64 BE,
 * payload]`, or a 24-byte seq frame (epoch, then seq). A wide frame with an empty payload is a heartbeat.
 */
export function parseFrames(frames: readonly Uint8Array[], flavor: ZmqWire): ParsedFrames {
  if (frames.length === 3 && frames[1].length === 8) {
    const seq = readSeqFrame(frames[1])!;
    return { ok: true, seq, batch: decodeBatch(frames[2], flavor) };
  }
  let epoch: Uint8Array;
  let seqFrame: Uint8Array;
  let payload: Uint8Array;
  if (frames.length === 4 && frames[1].length === EPOCH_BYTES && frames[2].length === 8) {
    [, epoch, seqFrame, payload] = frames;
  } else if (frames.length === 3) {
    const wide = frames[1];
    if (wide.length !== EPOCH_BYTES + 8) return { ok: false, kind: 'seq_length', detail: `seq frame of ${wide.length} bytes` };
    epoch = wide.subarray(0, EPOCH_BYTES);
    seqFrame = wide.subarray(EPOCH_BYTES);
    payload = frames[2];
  } else {
    return { ok: false, kind: 'frame_count', detail: `expected 3 frames, got ${frames.length}` };
  }
  const seq = readSeqFrame(seqFrame)!;
  const hex = Buffer.from(epoch.buffer, epoch.byteOffset, epoch.length).toString('hex');
  if (payload.length === 0) return { ok: true, seq, batch: HEARTBEAT, epoch: hex, heartbeat: true };
  return { ok: true, seq, batch: decodeBatch(payload, flavor), epoch: hex };
}

export interface SourceIngestOptions {
  readonly source: SourceId;
  readonly flavor?: ZmqWire;
  readonly routerBlockSize: number;
  readonly sink: EventSink;
  readonly onReset: ResetSink;
  /** Null when the engine has no replay endpoint: every gap then resets the source. */
  readonly replay?: ReplayFn | null;
  readonly log?: LogSink;
  readonly maxHeld?: number;
  readonly catchUp?: boolean;
  readonly blind?: BlindRule;
  readonly endpoint?: string | null;
  readonly mode?: 'connect' | 'bind' | 'manual';
  /** Wall clock in ms (injected for tests). */
  readonly now?: () => number;
}

export class SourceIngest {
  readonly key: string;
  readonly source: SourceId;
  private readonly flavor: ZmqWire;
  private readonly tracker: SequenceTracker<DecodedBatch>;
  private readonly annotator: SourceAnnotator;
  private readonly log: LogSink;
  private readonly now: () => number;
  private readonly rates = { batches: new RateWindow(), events: new RateWindow() };
  private readonly startedAtMs: number;
  connected = false;
  private lastEventAtMs: number | null = null;
  private lastSeq: bigint | null = null;
  private requestsSinceLastEvent = 0;
  private probedSinceBatch = false;
  private readonly c = {
    batches: 0,
    events: 0,
    blocksStored: 0,
    blocksRemoved: 0,
    cleared: 0,
    replays: 0,
    replayFailures: 0,
    resets: 0,
    badFrames: 0,
    decodeErrors: 0,
    unknownEventTypes: 0,
    malformedEvents: 0,
    loraIdWithoutName: 0,
    badGroupFields: 0,
    badExtraKeys: 0,
    dpRankMismatch: 0,
    receiveErrors: 0,
    tailProbes: 0,
    tailProbeFailures: 0,
    wideFrames: 0,
    heartbeats: 0,
    epochChanges: 0,
  };
  private readonly frameErrors = { frame_count: 0, seq_length: 0 };
  /** Publisher lifetime id from the wide frame (null until one arrives). */
  private epoch: string | null = null;
  private readonly resetsByReason: Record<string, number> = {};
  private closed = false;

  constructor(private readonly opts: SourceIngestOptions) {
    this.source = opts.source;
    this.key = sourceKey(opts.source);
    this.flavor = opts.flavor ?? 'vllm';
    this.log = opts.log ?? consoleLog;
    this.now = opts.now ?? Date.now;
    this.startedAtMs = this.now();
    this.tracker = new SequenceTracker({ replay: !!opts.replay, maxHeld: opts.maxHeld, catchUp: opts.catchUp });
    this.annotator = new SourceAnnotator(opts.routerBlockSize, (engine, router, action) => {
      const what = {
        split: 'engine blocks are split into router blocks',
        aggregate: 'engine blocks are joined into router blocks (memory per cached engine block)',
        quarantine: 'events are quarantined (dropped): fix --block-size',
      }[action];
      this.log.error(
        { source: this.key, engineBlockSize: engine, routerBlockSize: router, action },
        `block size mismatch: engine ${engine}, router ${router} (source ${this.key}); ${what}`,
      );
    });
  }

  /** One raw ZMQ message from the live subscription. */
  onFrames(frames: readonly Uint8Array[]): void {
    const parsed = parseFrames(frames, this.flavor);
    if (!parsed.ok) {
      this.onBadFrame(parsed.kind, parsed.detail);
      return;
    }
    this.onBatch(
      parsed.seq,
      parsed.batch,
      parsed.epoch !== undefined ? { epoch: parsed.epoch, heartbeat: parsed.heartbeat === true } : undefined,
    );
  }

  /** Counts a frame the transport could not use at all. */
  onBadFrame(kind: BadFrameKind, detail: string): void {
    if (kind === 'receive_error') {
      // Not a frame: the socket's receive failed (the transport restarts its loop).
      this.c.receiveErrors++;
      this.log.error({ source: this.key, detail }, `KV event receive failed on ${this.key}`);
      return;
    }
    this.c.badFrames++;
    if (kind === 'undecodable') this.c.decodeErrors++;
    else this.frameErrors[kind]++;
    if (this.c.badFrames === 1 || this.c.badFrames % 1000 === 0) {
      this.log.warn({ source: this.key, kind, detail, badFrames: this.c.badFrames }, `bad event frame from ${this.key}`);
    }
  }

  /** One decoded live batch with its seq (an undecodable payload still advances the seq: `batch.ok` false). */
  onBatch(seq: bigint, batch: DecodedBatch, wide?: WideFrame): void {
    if (this.closed) return;
    if (wide) {
      this.c.wideFrames++;
      if (wide.heartbeat) this.c.heartbeats++;
      if (this.epoch !== null && wide.epoch !== this.epoch) {
        this.c.epochChanges++;
        this.log.warn(
          { source: this.key, from: this.epoch, to: wide.epoch },
          `publisher epoch of ${this.key} changed: a new engine process`,
        );
        this.run(this.tracker.newPublisher());
      }
      this.epoch = wide.epoch;
    }
    if (!batch.ok) this.onBadFrame('undecodable', batch.error ?? 'undecodable');
    this.run(this.tracker.live(seq, batch));
  }

  /** Seq of the batch being (or last) delivered: valid inside the sink callback, so relays can tag events with it. */
  get lastDeliveredSeq(): bigint | null {
    return this.lastSeq;
  }

  /** Connection state from the transport; a lost connection makes the next gap a reset (the engine may have restarted). */
  setConnected(connected: boolean): void {
    if (this.connected && !connected) this.tracker.disconnected();
    this.connected = connected;
  }

  /**
   * Tail probe: when the source has been quiet for `quietMs` since its last batch, ask the replay endpoint once for
   * anything newer (a dropped last batch is otherwise invisible until the engine publishes again). Returns whether a
   * probe was sent.
   */
  maybeProbeTail(quietMs: number): boolean {
    if (this.closed || !this.opts.replay || this.probedSinceBatch || this.lastEventAtMs === null) return false;
    if (this.now() - this.lastEventAtMs < quietMs) return false;
    this.probedSinceBatch = true;
    const out = this.tracker.probe();
    this.run(out);
    return out.length > 0;
  }

  /** A request was routed to this source (input of the `blind` rule). */
  noteRequestRouted(): void {
    this.requestsSinceLastEvent++;
  }

  close(): void {
    this.closed = true;
  }

  private run(outputs: TrackerOutput<DecodedBatch>[]): void {
    for (const o of outputs) {
      if (o.kind === 'deliver') this.deliver(o.seq, o.item);
      else if (o.kind === 'reset') this.reset(o.reason);
      else this.startReplay(o.fromSeq, o.untilSeq, o.ticket);
    }
  }

  private deliver(seq: bigint, batch: DecodedBatch): void {
    const now = this.now();
    this.probedSinceBatch = false;
    this.lastSeq = seq;
    this.lastEventAtMs = now;
    this.requestsSinceLastEvent = 0;
    this.c.batches++;
    this.rates.batches.add(1, now);
    if (!batch.ok) {
      // Its content is lost for good (a replay would return the same bytes): the source is cold from here.
      this.reset('undecodable_batch');
      return;
    }
    if (batch.dataParallelRank !== null && batch.dataParallelRank !== this.source.dpRank) {
      // Events still apply to this subscription's source (the port decides); a wrong port offset is worth a loud log.
      if (this.c.dpRankMismatch++ === 0) {
        this.log.error(
          { source: this.key, configuredDpRank: this.source.dpRank, batchDpRank: batch.dataParallelRank, endpoint: this.opts.endpoint },
          `dp rank mismatch on ${this.key}: batches say rank ${batch.dataParallelRank}, the subscription is rank ${this.source.dpRank} (port offset?)`,
        );
      }
    }
    this.c.unknownEventTypes += batch.counts.unknownEventTypes;
    this.c.malformedEvents += batch.counts.malformedEvents;
    this.c.loraIdWithoutName += batch.counts.loraIdWithoutName;
    this.c.badGroupFields += batch.counts.badGroupFields;
    this.c.badExtraKeys += batch.counts.badExtraKeys;
    const events = this.annotator.process(batch);
    if (events.length === 0) return;
    this.c.events += events.length;
    this.rates.events.add(events.length, now);
    for (const e of events) {
      if (e.kind === 'stored') this.c.blocksStored += e.engineIds.length;
      else if (e.kind === 'removed') this.c.blocksRemoved += e.engineIds.length;
      else this.c.cleared++;
    }
    try {
      this.opts.sink(this.key, events);
    } catch (err) {
      // A sink bug must not kill the subscription loop; it is loud, not silent.
      this.log.error({ source: this.key, err: String(err) }, 'event sink threw');
    }
  }

  private reset(reason: ResetReason): void {
    this.annotator.reset();
    this.c.resets++;
    this.resetsByReason[reason] = (this.resetsByReason[reason] ?? 0) + 1;
    this.log.warn({ source: this.key, reason }, `source ${this.key} reset (${reason}): its cache is treated as cold`);
    try {
      this.opts.onReset(this.key, reason);
    } catch (err) {
      this.log.error({ source: this.key, err: String(err) }, 'reset sink threw');
    }
  }

  private startReplay(fromSeq: bigint, untilSeq: bigint, ticket: number): void {
    const replay = this.opts.replay;
    const probe = untilSeq === fromSeq;
    if (probe) this.c.tailProbes++;
    else this.c.replays++;
    if (!replay) {
      this.run(this.tracker.replayEnded(ticket, false));
      return;
    }
    if (!probe) this.log.info({ source: this.key, fromSeq, untilSeq }, `gap on ${this.key}: replaying from ${fromSeq}`);
    const onBatch = (seq: bigint, payload: Uint8Array) => {
      if (this.closed) return;
      const batch = decodeBatch(payload, this.flavor);
      if (!batch.ok) this.onBadFrame('undecodable', `replay: ${batch.error}`);
      this.run(this.tracker.replayed(ticket, seq, batch));
    };
    // Deferred so that a replay function answering synchronously never re-enters the tracker mid-output.
    Promise.resolve()
      .then(() => replay(fromSeq, onBatch))
      .then(
        (outcome) => this.endReplay(ticket, outcome, probe),
        (err) => this.endReplay(ticket, { ok: false, reason: `replay unavailable: ${String(err)}` }, probe),
      );
  }

  private endReplay(ticket: number, outcome: ReplayOutcome, probe: boolean): void {
    if (this.closed) return;
    if (!outcome.ok && probe) {
      this.c.tailProbeFailures++;
    } else if (!outcome.ok) {
      this.c.replayFailures++;
      this.log.warn({ source: this.key, reason: outcome.reason }, `replay failed on ${this.key}`);
    }
    this.run(this.tracker.replayEnded(ticket, outcome.ok));
  }

  private decodeErrorsByCause(): Record<DecodeErrorCause, number> {
    return {
      frame_count: this.frameErrors.frame_count,
      seq_length: this.frameErrors.seq_length,
      undecodable: this.c.decodeErrors,
      malformed_event: this.c.malformedEvents,
      unknown_event_type: this.c.unknownEventTypes,
    };
  }

  health(): SourceHealth {
    const now = this.now();
    const a = this.annotator;
    const t = this.tracker.counters;
    return {
      sourceKey: this.key,
      workerId: this.source.workerId,
      dpRank: this.source.dpRank,
      endpoint: this.opts.endpoint ?? null,
      mode: this.opts.mode ?? 'manual',
      connected: this.connected,
      startedAtMs: this.startedAtMs,
      lastEventAtMs: this.lastEventAtMs,
      lastSeq: this.lastSeq === null ? null : this.lastSeq.toString(),
      batchesPerSec: this.rates.batches.rate(now),
      eventsPerSec: this.rates.events.rate(now),
      batches: this.c.batches,
      events: this.c.events,
      blocksStored: this.c.blocksStored,
      blocksRemoved: this.c.blocksRemoved,
      cleared: this.c.cleared,
      gaps: t.gaps,
      replays: this.c.replays,
      replayedBatches: t.replayedBatches,
      replayFailures: this.c.replayFailures,
      resets: this.c.resets,
      resetsByReason: { ...this.resetsByReason },
      badFrames: this.c.badFrames,
      decodeErrors: this.c.decodeErrors,
      unknownEventTypes: this.c.unknownEventTypes,
      malformedEvents: this.c.malformedEvents,
      multimodalBlocks: a.counters.multimodalBlocks,
      quarantinedBlocks: a.counters.quarantinedBlocks,
      otherGroupEvents: a.counters.otherGroupEvents,
      hybridGroupEvents: a.counters.hybridGroupEvents,
      badGroupFields: this.c.badGroupFields,
      badExtraKeys: this.c.badExtraKeys,
      offloadEvents: a.counters.offloadEvents,
      loraIdWithoutName: this.c.loraIdWithoutName,
      dpRankMismatchBatches: this.c.dpRankMismatch,
      receiveErrors: this.c.receiveErrors,
      tailProbes: this.c.tailProbes,
      tailProbeFailures: this.c.tailProbeFailures,
      wideFrames: this.c.wideFrames,
      heartbeats: this.c.heartbeats,
      epochChanges: this.c.epochChanges,
      decodeErrorsByCause: this.decodeErrorsByCause(),
      aggregation: a.aggregatorCounters(),
      engineBlockSize: a.engineBlockSize,
      routerBlockSize: this.opts.routerBlockSize,
      blockSizeMismatch: a.counters.blockSizeMismatchEvents > 0,
      blockSizeChanges: a.counters.blockSizeChanges,
      tierBlocks: a.tierBlocks(),
      heldBatches: this.tracker.heldCount,
      replaying: this.tracker.isReplaying,
      requestsSinceLastEvent: this.requestsSinceLastEvent,
      blind: isBlind(this.lastEventAtMs, this.startedAtMs, this.requestsSinceLastEvent, now, this.opts.blind ?? DEFAULT_BLIND_RULE),
    };
  }
}
