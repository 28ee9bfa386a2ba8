/**
 * SGLang KV-cache events (docs/protocols.md §2): same sockets, framing and replay protocol as vLLM, but
 * - the batch is `[ts, events, attn_dp_rank]`;
 * - positional `BlockStored` is `[tag, hashes, parent, token_ids, block_size, lora_id, medium, metadata]`: index 7 is
 *   `metadata` (vLLM's `lora_name`), so positional decoding is engine-specific;
 * - newer versions send tagged maps with `medium` and `metadata {cache_salt}`;
 * - hashes are signed int64 (normalised with BigInt.asUintN(64, x) like every other id form).
 */
import { Packr } from 'msgpackr';
import type { DecodedBatch } from '../common.ts';
import { decodeBatch, type WireFormat } from '../vllm/events.ts';

export interface SglangBlockStored {
  type: 'BlockStored';
  /** Unsigned u64 values; written as signed int64 like SGLang does. */
  blockHashes: bigint[];
  parentBlockHash: bigint | null;
  tokenIds: number[];
  blockSize: number;
  loraId?: number | null;
  medium?: string | null;
  cacheSalt?: string | null;
}
export interface SglangBlockRemoved {
  type: 'BlockRemoved';
  blockHashes: bigint[];
  medium?: string | null;
}
export type SglangEvent = SglangBlockStored | SglangBlockRemoved | { type: 'AllBlocksCleared' };
export interface SglangBatch {
  ts: number;
  events: SglangEvent[];
  attnDpRank: number | null;
}

const packr = new Packr({ useRecords: false, variableMapSize: true });
const signed = (h: bigint) => BigInt.asIntN(64, h);

function encodeEvent(ev: SglangEvent, format: WireFormat): unknown {
  if (ev.type === 'AllBlocksCleared') return format === 'map' ? { type: ev.type } : [ev.type];
  if (ev.type === 'BlockRemoved') {
    const hashes = ev.blockHashes.map(signed);
    if (format === 'map') return { type: ev.type, block_hashes: hashes, medium: ev.medium ?? null };
    return ev.medium ? [ev.type, hashes, ev.medium] : [ev.type, hashes];
  }
  const hashes = ev.blockHashes.map(signed);
  const parent = ev.parentBlockHash === null ? null : signed(ev.parentBlockHash);
  const metadata = ev.cacheSalt ? { cache_salt: ev.cacheSalt } : null;
  if (format === 'map') {
    return {
      type: ev.type,
      block_hashes: hashes,
      parent_block_hash: parent,
      token_ids: ev.tokenIds,
      block_size: ev.blockSize,
      lora_id: ev.loraId ?? null,
      medium: ev.medium ?? null,
      metadata,
    };
  }
  const a: unknown[] = [ev.type, hashes, parent, ev.tokenIds, ev.blockSize, ev.loraId ?? null, ev.medium ?? null, metadata];
  while (a.length > 5 && a[a.length - 1] === null) a.pop();
  return a;
}

/** SGLang payload (for tests and the mock engine). */
export function encodeSglangBatch(batch: SglangBatch, format: WireFormat): Buffer {
  const events = batch.events.map((e) => encodeEvent(e, format));
  return packr.pack(batch.attnDpRank === null ? [batch.ts, events] : [batch.ts, events, batch.attnDpRank]);
}

/** Decodes one SGLang payload into normalised events. Never throws. */
export function decodeSglangBatch(payload: Uint8Array): DecodedBatch {
  return decodeBatch(payload, 'sglang');
}
