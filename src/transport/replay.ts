/**
 * Replay client for an engine's KV-event replay endpoint (docs/protocols.md §2). The engine binds a ROUTER; we use a
 * DEALER (a REQ socket breaks after the first reply with EFSM): send [empty, start_seq u64 BE], then read
 * [empty, seq u64 BE, payload] for every buffered batch with seq >= start_seq until [empty, 0xFFFFFFFFFFFFFFFF, empty].
 * A silent endpoint (not configured, engine gone) is "replay unavailable" after `timeoutMs` without a frame.
 */
import { Dealer } from 'zeromq';
import { REPLAY_END_SEQ, readSeqFrame } from '../engines/common.ts';
import type { ReplayFn, ReplayOutcome } from '../ingest/source-ingest.ts';

export interface ReplayOptions {
  /** Max wait for each frame of the reply (the engine answers from memory, so the first frame is quick). Default 1000. */
  readonly timeoutMs?: number;
  /** Upper bound on batches accepted from one replay (the engine keeps `buffer_steps`, default 10,000). */
  readonly maxBatches?: number;
}

export interface ReplayResult extends ReplayOutcome {
  readonly batches: number;
  /** Reply messages with the wrong shape (skipped). */
  readonly badFrames: number;
}

/** Asks `endpoint` for every buffered batch with seq >= fromSeq. Never throws; failures come back as `ok: false`. */
export async function requestReplay(
  endpoint: string,
  fromSeq: bigint,
  onBatch: (seq: bigint, payload: Uint8Array) => void,
  options: ReplayOptions = {},
): Promise<ReplayResult> {
  const timeoutMs = options.timeoutMs ?? 1000;
  const maxBatches = options.maxBatches ?? 100_000;
  // The engine's ROUTER (vLLM's replay socket, default options) drops, silently, what does not fit its pipe to us:
  // our side's queue takes the whole reply (no receive high-water mark; the reply is bounded by the engine's buffer,
  // vLLM buffer_steps 10,000 by default, and by maxBatches below), so only the engine's own send pipe can overflow.
  const dealer = new Dealer({ linger: 0, receiveTimeout: timeoutMs, sendTimeout: timeoutMs, immediate: false, receiveHighWaterMark: 0 });
  let batches = 0;
  let badFrames = 0;
  try {
    dealer.connect(endpoint);
    const start = Buffer.alloc(8);
    start.writeBigUInt64BE(BigInt.asUintN(64, fromSeq));
    await dealer.send([Buffer.alloc(0), start]);
    for (;;) {
      let msg: Buffer[];
      try {
        msg = await dealer.receive();
      } catch (err) {
        const e = err as { code?: string; message?: string };
        const why = e.code === 'EAGAIN' ? `timeout after ${timeoutMs} ms` : (e.message ?? String(err));
        return { ok: false, reason: `replay unavailable: ${why}`, batches, badFrames };
      }
      // [empty, seq, payload]; tolerate a missing empty delimiter (a ROUTER that does not echo it).
      const frames = msg.length === 3 && msg[0].length === 0 ? msg.slice(1) : msg.length === 2 ? msg : null;
      const seq = frames ? readSeqFrame(frames[0]) : null;
      if (!frames || seq === null) {
        badFrames++;
        continue;
      }
      if (seq === REPLAY_END_SEQ && frames[1].length === 0) return { ok: true, batches, badFrames };
      batches++;
      onBatch(seq, frames[1]);
      if (batches >= maxBatches) return { ok: false, reason: `replay too long (over ${maxBatches} batches)`, batches, badFrames };
    }
  } catch (err) {
    return { ok: false, reason: `replay unavailable: ${(err as Error)?.message ?? String(err)}`, batches, badFrames };
  } finally {
    dealer.close();
  }
}

/** A `ReplayFn` bound to one endpoint, for `SourceIngest`. */
export function replayClient(endpoint: string, options: ReplayOptions = {}): ReplayFn {
  return (fromSeq, onBatch) => requestReplay(endpoint, fromSeq, onBatch, options);
}
