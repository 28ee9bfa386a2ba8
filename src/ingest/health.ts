/**
 * Source health: is this engine's event stream alive, ordered and understood? Pure (time is passed in).
 *
 * `blind`: the source is configured for events, its worker keeps receiving routed requests, and no event batch has
 * arrived for a while. Every request with a full prompt block (or a generated block) makes a vLLM engine announce a
 * BlockStored within a step, so traffic without events means the router's view of that cache is frozen: KV routing to it
 * has silently become guesswork (the most common failure of KV routers in the field).
 */

export interface BlindRule {
  /** Routed requests since the last event batch before a silent source counts as blind. Default 3. */
  readonly minRequests: number;
  /** Silence (ms since the last batch, or since the source started) before it counts as blind. Default 10,000. */
  readonly silenceMs: number;
}

export const DEFAULT_BLIND_RULE: BlindRule = { minRequests: 3, silenceMs: 10_000 };

/** Plain, JSON-able health of one event source (bigints as decimal strings). */
export interface SourceHealth {
  readonly sourceKey: string;
  readonly workerId: string;
  readonly dpRank: number;
  readonly endpoint: string | null;
  readonly mode: 'connect' | 'bind' | 'manual';
  readonly connected: boolean;
  readonly startedAtMs: number;
  readonly lastEventAtMs: number | null;
  /** Last seq delivered in order (decimal), null before the first. */
  readonly lastSeq: string | null;
  /** Event batches and events delivered per second over the last 10 s. */
  readonly batchesPerSec: number;
  readonly eventsPerSec: number;
  readonly batches: number;
  readonly events: number;
  readonly blocksStored: number;
  readonly blocksRemoved: number;
  readonly cleared: number;
  readonly gaps: number;
  readonly replays: number;
  readonly replayedBatches: number;
  readonly replayFailures: number;
  readonly resets: number;
  readonly resetsByReason: Record<string, number>;
  /** Frames that could not be used at all: wrong frame count, seq not 8 bytes, payload not a batch. */
  readonly badFrames: number;
  readonly decodeErrors: number;
  readonly unknownEventTypes: number;
  readonly malformedEvents: number;
  readonly multimodalBlocks: number;
  readonly quarantinedBlocks: number;
  /** Events of cache groups that could not be indexed (unknown kind, a block size unlike group 0's, joined blocks). */
  readonly otherGroupEvents: number;
  /** Events of hybrid cache groups other than group 0, passed to the index (docs/engines.md, cache groups). */
  readonly hybridGroupEvents: number;
  /** Events skipped for unusable group fields / multimodal extra keys (decode errors by cause). */
  readonly badGroupFields: number;
  readonly badExtraKeys: number;
  readonly offloadEvents: number;
  readonly loraIdWithoutName: number;
  /** Batches whose data_parallel_rank differs from the subscription's rank (wrong port offset). */
  readonly dpRankMismatchBatches: number;
  /** Socket receive failures (the subscription loop restarted after each). */
  readonly receiveErrors: number;
  /** Replay requests sent after a quiet period to catch a lost last batch, and how many of them failed. */
  readonly tailProbes: number;
  readonly tailProbeFailures: number;
  /** Messages in the wider frame (publisher epoch), heartbeats among them, and epoch changes (each reset the source). */
  readonly wideFrames: number;
  readonly heartbeats: number;
  readonly epochChanges: number;
  /**
   * Everything that could not be decoded, by cause: frame_count, seq_length, undecodable (payload not a batch),
   * malformed_event, unknown_event_type. The metric router_kv_event_decode_errors_total{cause} follows it.
   */
  readonly decodeErrorsByCause: Record<DecodeErrorCause, number>;
  /** TensorRT-LLM sources (polled): the decoder's and the poll's counters (docs/engines.md). */
  readonly trtllm?: {
    readonly createdEvents: number;
    readonly otherWindowEvents: number;
    readonly partialBlocks: number;
    readonly levelMoves: number;
    readonly priorityUpdates: number;
    readonly polls: number;
    readonly pollFailures: number;
    readonly unknownRankEvents: number;
  };
  /** When engine blocks are smaller than the router's: router blocks completed, orphans, engine blocks remembered. */
  readonly aggregation: { orphanBlocks: number; routerBlocks: number; engineBlocksHeld: number } | null;
  readonly engineBlockSize: number | null;
  readonly routerBlockSize: number;
  readonly blockSizeMismatch: boolean;
  /** Block size changes within one engine life (each cleared the source). */
  readonly blockSizeChanges: number;
  /** Blocks per lower tier (medium other than GPU) the engine announced. */
  readonly tierBlocks: Record<string, number>;
  readonly heldBatches: number;
  readonly replaying: boolean;
  readonly requestsSinceLastEvent: number;
  readonly blind: boolean;
}

export const DECODE_ERROR_CAUSES = ['frame_count', 'seq_length', 'undecodable', 'malformed_event', 'unknown_event_type'] as const;
export type DecodeErrorCause = (typeof DECODE_ERROR_CAUSES)[number];

export function isBlind(
  lastEventAtMs: number | null,
  startedAtMs: number,
  requestsSinceLastEvent: number,
  now: number,
  rule: BlindRule = DEFAULT_BLIND_RULE,
): boolean {
  if (requestsSinceLastEvent < rule.minRequests) return false;
  return now - (lastEventAtMs ?? startedAtMs) >= rule.silenceMs;
}

/** Counts over a sliding window of one-second buckets. */
export class RateWindow {
  private readonly counts: Float64Array;
  private readonly stamps: Float64Array;

  constructor(private readonly seconds = 10) {
    this.counts = new Float64Array(seconds);
    this.stamps = new Float64Array(seconds).fill(-1);
  }

  add(n: number, nowMs: number): void {
    const sec = Math.floor(nowMs / 1000);
    const i = sec % this.seconds;
    if (this.stamps[i] !== sec) {
      this.stamps[i] = sec;
      this.counts[i] = 0;
    }
    this.counts[i] += n;
  }

  /** Per-second rate over the window (buckets older than the window ignored). */
  rate(nowMs: number): number {
    const sec = Math.floor(nowMs / 1000);
    let sum = 0;
    for (let i = 0; i < this.seconds; i++) if (this.stamps[i] > sec - this.seconds && this.stamps[i] <= sec) sum += this.counts[i];
    return sum / this.seconds;
  }
}
