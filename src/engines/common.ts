/**
 * What every engine's event decoder shares (docs/engines.md): the normalised batch a decoder hands the ingest layer,
 * its counters, the engine-id normalisation, and the ZMQ framing vLLM and SGLang (and TensorRT-LLM's ZMQ publisher)
 * have in common: `[topic, seq u64 big-endian, payload]`, with a replay stream ended by seq 2^64-1.
 */
import { xxh3 } from '@node-rs/xxhash';
import type { EngineBlockId, KvEvent } from '../core/types.ts';

/** The payload layout of a ZMQ event stream: vLLM's (also TensorRT-LLM's ZMQ publisher) or SGLang's. */
export type ZmqWire = 'vllm' | 'sglang';

export const U64_MAX = (1n << 64n) - 1n;

/** Counters of one decoded payload; the ingest layer sums them per source. */
export interface DecodeCounts {
  /** Events with a tag this decoder does not know (newer engines); skipped. */
  unknownEventTypes: number;
  /** Events whose shape or fields were unusable (wrong types, bad hashes, bad tokens); skipped. */
  malformedEvents: number;
  /** Blocks skipped because their extra keys carry identity the router cannot reproduce (prompt embeds, offset-less multimodal hashes). */
  multimodalBlocks: number;
  /** Stored events with a lora_id but no lora_name: isolated under a synthetic name `lora-id:<n>`. */
  loraIdWithoutName: number;
  /** Events skipped for unusable group fields (group_idx not a non-negative integer, a window that is not one). */
  badGroupFields: number;
  /** Events skipped for unusable multimodal extra keys (an (identifier, offset) pair of the wrong types). */
  badExtraKeys: number;
}

export interface DecodedBatch {
  /** False when the payload as a whole is unusable (not msgpack, not a batch); `error` says why. */
  readonly ok: boolean;
  readonly error?: string;
  readonly ts: number;
  readonly dataParallelRank: number | null;
  readonly events: KvEvent[];
  readonly counts: DecodeCounts;
  /** Engine ids of blocks skipped as multimodal: their descendants cannot be hashed either. */
  readonly skippedIds: EngineBlockId[];
}

/** Decode counts at zero (every decoder starts a batch from these). */
export function emptyCounts(): DecodeCounts {
  return { unknownEventTypes: 0, malformedEvents: 0, multimodalBlocks: 0, loraIdWithoutName: 0, badGroupFields: 0, badExtraKeys: 0 };
}

/** Normalises a wire block id to an unsigned u64; undefined when unusable. */
export function normaliseEngineId(v: unknown): EngineBlockId | undefined {
  if (typeof v === 'bigint') return v >= 0n && v <= U64_MAX ? v : BigInt.asUintN(64, v);
  if (typeof v === 'number') return Number.isSafeInteger(v) ? BigInt.asUintN(64, BigInt(v)) : undefined;
  if (v instanceof Uint8Array) return v.length > 0 ? xxh3.xxh64(v, 0n) : undefined;
  return undefined;
}

/** The seq frame's value, or null when it is not exactly 8 bytes. */
export function readSeqFrame(frame: Uint8Array): bigint | null {
  if (frame.length !== 8) return null;
  return new DataView(frame.buffer, frame.byteOffset, 8).getBigUint64(0, false);
}

/** Marker that ends a replay stream (docs/protocols.md §2). */
export const REPLAY_END_SEQ = U64_MAX;
