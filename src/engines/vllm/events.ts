/**
 * vLLM KV-cache event wire codec (docs/protocols.md §2): encode (for the mock engine and benchmarks) and decode into the
 * core's normalised `KvEvent`s.
 *
 * Decoding accepts both layouts at both levels, decided by shape: a batch is `[ts, events, dp_rank?]` or
 * `{ts, events, data_parallel_rank}`; an event is a positional array whose element 0 is the tag, or a map with `type`.
 * Every positional index is guarded (trailing defaults are omitted on the wire), unknown map keys are ignored, unknown
 * event types are counted. Decoding never throws: a payload that cannot be used at all comes back with `ok: false`.
 *
 * Engine block ids are normalised to unsigned 64-bit bigints:
 * - msgpack uint64 / positive ints as is; signed int64 (SGLang) via `BigInt.asUintN(64, x)`;
 * - byte strings (vLLM with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`, 32-byte sha256) are folded with
 *   `xxh3.xxh64(bytes, 0n)`. The fold is only an engine-id key (the router never reproduces engine hashes,
 *   docs/protocols.md §1), so a collision would at worst alias two blocks of one source: ~2^-64 per pair.
 *
 * Extra keys (one entry per block, vLLM order: lora name (an integer id in older releases), multimodal (identifier,
 * offset) pairs, cache_salt (first block only), prompt-embeds digest): a string equal to the event's lora name, or an
 * integer, is the LoRA; the last other string of the first block of a sequence (parent null) is the cache_salt; each
 * (identifier, offset) pair becomes the block's multimodal identity (`mmKeys`, docs/engines.md). Byte strings
 * (prompt embeds), bare strings (older releases' multimodal hashes without their offset) and other tuples are identity
 * the router cannot reproduce, so that block and the rest of its event are skipped and counted (a documented limit).
 *
 * Hybrid models' cache-group fields (group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window) and session_id are
 * decoded into the event; a present but unusable one drops the event, counted by cause (badGroupFields, badExtraKeys).
 */
import { Packr, Unpackr } from 'msgpackr';
import type { CacheGroupKind, EngineBlockId, KvEvent, Locality, MmBlockKey, StoredEvent } from '../../core/types.ts';
import { type DecodeCounts, type DecodedBatch, emptyCounts, normaliseEngineId, type ZmqWire } from '../common.ts';

export type WireFormat = 'array' | 'map';
export type HashType = 'u64' | 'i64' | 'bytes';
/** bigint for u64/i64 (always given as the unsigned u64 value), Uint8Array for bytes. */
export type WireBlockId = bigint | Uint8Array;

export interface WireBlockStored {
  type: 'BlockStored';
  blockHashes: WireBlockId[];
  parentBlockHash: WireBlockId | null;
  tokenIds: number[];
  blockSize: number;
  loraId?: number | null;
  medium?: string | null;
  /** vLLM main, map layout only: LOCAL / REMOTE placement of FS / OBJ copies, and their owner. */
  locality?: string;
  ownership?: string;
  loraName?: string | null;
  extraKeys?: unknown[] | null;
  groupIdx?: number;
  kvCacheSpecKind?: string;
  // hybrid groups, session (issue 18)
  kvCacheSpecSlidingWindow?: number | null;
  sessionId?: string | null;
}
export interface WireBlockRemoved {
  type: 'BlockRemoved';
  blockHashes: WireBlockId[];
  medium?: string | null;
  locality?: string;
  groupIdx?: number;
}
export interface WireAllBlocksCleared {
  type: 'AllBlocksCleared';
}
export type WireEvent = WireBlockStored | WireBlockRemoved | WireAllBlocksCleared;
export interface WireBatch {
  ts: number;
  events: WireEvent[];
  dataParallelRank: number | null;
}

export interface EncodeOptions {
  format: WireFormat;
  hashType: HashType;
  /** Outer batch layout. vLLM 0.26 still sends an array batch with map events; a map batch is *unverified*. Default 'array'. */
  batchLayout?: 'array' | 'map';
}

// ------------------------------------------------------------------------------------------------ encode

// useRecords off: msgpackr's record extension is not msgpack any other reader understands.
const packr = new Packr({ useRecords: false, variableMapSize: true });

function wireId(id: WireBlockId, hashType: HashType): bigint | Uint8Array {
  if (id instanceof Uint8Array) return id;
  const u = BigInt.asUintN(64, id);
  if (hashType === 'i64') return BigInt.asIntN(64, u);
  if (hashType === 'bytes') {
    const b = Buffer.alloc(8);
    b.writeBigUInt64BE(u);
    return b;
  }
  // u64: msgpackr writes bigints >= 2^63 as uint64 (0xcf) and smaller ones as int64 (0xd3): same integer value for
  // every msgpack reader (Python's msgpack/msgspec return the same int).
  return u;
}

function encodeEvent(ev: WireEvent, format: WireFormat, hashType: HashType): unknown {
  switch (ev.type) {
    case 'BlockStored': {
      const hashes = ev.blockHashes.map((h) => wireId(h, hashType));
      const parent = ev.parentBlockHash === null ? null : wireId(ev.parentBlockHash, hashType);
      if (format === 'map') {
        const m: Record<string, unknown> = {
          type: 'BlockStored',
          block_hashes: hashes,
          parent_block_hash: parent,
          token_ids: ev.tokenIds,
          block_size: ev.blockSize,
        };
        if (ev.loraId !== undefined) m.lora_id = ev.loraId;
        if (ev.medium !== undefined) m.medium = ev.medium;
        if (ev.locality !== undefined) m.locality = ev.locality;
        if (ev.ownership !== undefined) m.ownership = ev.ownership;
        if (ev.loraName !== undefined) m.lora_name = ev.loraName;
        if (ev.extraKeys !== undefined) m.extra_keys = ev.extraKeys;
        if (ev.groupIdx !== undefined) m.group_idx = ev.groupIdx;
        if (ev.kvCacheSpecKind !== undefined) m.kv_cache_spec_kind = ev.kvCacheSpecKind;
        if (ev.kvCacheSpecSlidingWindow !== undefined) m.kv_cache_spec_sliding_window = ev.kvCacheSpecSlidingWindow;
        if (ev.sessionId !== undefined) m.session_id = ev.sessionId;
        return m;
      }
      const a: unknown[] = [
        'BlockStored',
        hashes,
        parent,
        ev.tokenIds,
        ev.blockSize,
        ev.loraId ?? null,
        ev.medium ?? null,
        ev.loraName ?? null,
        ev.extraKeys ?? null,
        ev.groupIdx ?? 0,
        ev.kvCacheSpecKind ?? null,
        // 11 kv_cache_spec_sliding_window; 12 locality and 13 ownership (not written here); 14 session_id
        ev.kvCacheSpecSlidingWindow ?? null,
        null,
        null,
        ev.sessionId ?? null,
      ];
      // kv_cache_spec_kind defaults to None in vLLM: a kind given is always written.
      const defaults: unknown[] = [null, null, null, null, 0, null, null, null, null, null];
      // Trailing defaults are omitted, as msgspec's omit_defaults does: arrays of varying length (5 fields minimum).
      while (a.length > 5 && a[a.length - 1] === defaults[a.length - 6]) a.pop();
      return a;
    }
    case 'BlockRemoved': {
      const hashes = ev.blockHashes.map((h) => wireId(h, hashType));
      if (format === 'map') {
        const m: Record<string, unknown> = { type: 'BlockRemoved', block_hashes: hashes };
        if (ev.medium !== undefined) m.medium = ev.medium;
        if (ev.locality !== undefined) m.locality = ev.locality;
        if (ev.groupIdx !== undefined) m.group_idx = ev.groupIdx;
        return m;
      }
      const a: unknown[] = ['BlockRemoved', hashes, ev.medium ?? null, ev.groupIdx ?? 0];
      const defaults: unknown[] = [null, 0];
      while (a.length > 2 && a[a.length - 1] === defaults[a.length - 3]) a.pop();
      return a;
    }
    case 'AllBlocksCleared':
      return format === 'map' ? { type: 'AllBlocksCleared' } : ['AllBlocksCleared'];
  }
}

/** One msgpack payload (the third ZMQ frame) for a batch. */
export function encodeVllmBatch(batch: WireBatch, opts: EncodeOptions): Buffer {
  const events = batch.events.map((e) => encodeEvent(e, opts.format, opts.hashType));
  if (opts.batchLayout === 'map') {
    return packr.pack({ ts: batch.ts, events, data_parallel_rank: batch.dataParallelRank });
  }
  return packr.pack(batch.dataParallelRank === null ? [batch.ts, events] : [batch.ts, events, batch.dataParallelRank]);
}

/** The 3 ZMQ frames of one message: [topic utf-8, seq u64 big-endian, payload]. */
export function vllmFrames(topic: string, seq: bigint, payload: Buffer): [Buffer, Buffer, Buffer] {
  const s = Buffer.alloc(8);
  s.writeBigUInt64BE(BigInt.asUintN(64, seq));
  return [Buffer.from(topic, 'utf8'), s, payload];
}

// ------------------------------------------------------------------------------------------------ decode

// int64AsType bigint: uint64 >= 2^53 must not be rounded (the trap of @msgpack/msgpack). useRecords off: a
// positive fixint 0x40..0x7f is a token id, never a record reference.
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'bigint' });

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof Uint8Array);
}

function optString(v: unknown): string | null {
  return typeof v === 'string' && v.length > 0 ? v : null;
}

function optInt(v: unknown): number | null {
  if (typeof v === 'number' && Number.isSafeInteger(v)) return v;
  if (typeof v === 'bigint' && v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER)) return Number(v);
  return null;
}

function idList(v: unknown): EngineBlockId[] | null {
  if (!Array.isArray(v)) return null;
  const out: EngineBlockId[] = new Array(v.length);
  for (let i = 0; i < v.length; i++) {
    const id = normaliseEngineId(v[i]);
    if (id === undefined) return null;
    out[i] = id;
  }
  return out;
}

/** Token ids must be u32; anything else would hash as garbage, so the event is malformed. */
function tokenList(v: unknown): number[] | null {
  if (!Array.isArray(v)) return null;
  for (let i = 0; i < v.length; i++) {
    const t = v[i];
    if (t >>> 0 !== t) return null;
  }
  return v as number[];
}

interface StoredFields {
  hashes: unknown;
  parent: unknown;
  tokens: unknown;
  blockSize: unknown;
  loraId: unknown;
  medium: unknown;
  loraName: unknown;
  extraKeys: unknown;
  metadata: unknown;
  groupIdx: unknown;
  groupKind?: unknown;
  slidingWindow?: unknown;
  sessionId?: unknown;
  /** vLLM main (map layout only): FS / OBJ placement. */
  locality?: unknown;
  ownership?: unknown;
}

interface Sink {
  events: KvEvent[];
  counts: DecodeCounts;
  skippedIds: EngineBlockId[];
}

/** Where the extra keys put the identity: a cache_salt, multimodal keys, and the first block not hashable from them. */
interface ExtraKeys {
  salt: string | null;
  /** Per block, its (identifier, offset) pairs; null when no block has any. */
  mm: (MmBlockKey[] | null)[] | null;
  firstUnhashable: number;
  /** A multimodal pair of the wrong types: the whole event is unusable. */
  bad: boolean;
}

/** An (identifier, offset) pair as vLLM writes it (a 2-tuple: msgpack array); undefined for anything else. */
function mmPair(k: unknown[]): MmBlockKey | null | undefined {
  if (k.length !== 2) return undefined;
  const id = k[0];
  const off = optInt(k[1]);
  if (typeof id === 'string' && id.length > 0 && off !== null) return [id, off];
  if (id instanceof Uint8Array && id.length > 0 && off !== null) return [Buffer.from(id).toString('hex'), off];
  return null;
}

function readExtraKeys(extra: unknown, loraName: string | null, firstOfSequence: boolean, blocks: number): ExtraKeys {
  const out: ExtraKeys = { salt: null, mm: null, firstUnhashable: blocks, bad: false };
  if (!Array.isArray(extra)) return out;
  const n = Math.min(extra.length, blocks);
  for (let j = 0; j < n; j++) {
    const keys = extra[j];
    if (keys === null || keys === undefined) continue;
    const list = Array.isArray(keys) ? keys : [keys];
    let strings = 0;
    let last: string | null = null;
    let mm: MmBlockKey[] | null = null;
    for (const k of list) {
      if (typeof k === 'string') {
        if (k === loraName) continue;
        strings++;
        last = k;
      } else if (k === null || k === undefined || typeof k === 'number' || typeof k === 'bigint') {
        // Older vLLM put the LoRA's integer id here (lora_int_id); the adapter is already in lora_id / lora_name.
      } else if (Array.isArray(k)) {
        const pair = mmPair(k);
        if (pair === null) {
          out.bad = true;
          return out;
        }
        if (pair === undefined) {
          out.firstUnhashable = j;
          return out;
        }
        mm ??= [];
        mm.push(pair);
      } else {
        // Prompt-embeds digests (bytes), anything else: not hashable from tokens.
        out.firstUnhashable = j;
        return out;
      }
    }
    if (mm) {
      out.mm ??= new Array<MmBlockKey[] | null>(blocks).fill(null);
      out.mm[j] = mm;
    }
    if (strings === 0) continue;
    if (j === 0 && firstOfSequence && strings === 1) {
      out.salt = last;
      continue;
    }
    // A bare string beside the LoRA and the salt: an older release's multimodal hash without its offset (ambiguous).
    out.firstUnhashable = j;
    return out;
  }
  return out;
}

/** vLLM's kv_cache_spec_kind, normalised; undefined when absent, null when not a string. */
export function groupKindOf(v: unknown): CacheGroupKind | undefined | null {
  if (v === null || v === undefined) return undefined;
  if (typeof v !== 'string') return null;
  switch (v) {
    case 'full_attention':
    case 'mla_attention':
    case 'sink_full_attention':
      return 'full_attention';
    case 'sliding_window':
    case 'sliding_window_mla':
      return 'sliding_window';
    case 'mamba':
      return 'mamba';
    default:
      return 'unknown';
  }
}

function pushStored(f: StoredFields, flavor: ZmqWire, sink: Sink): void {
  const engineIds = idList(f.hashes);
  const blockSize = optInt(f.blockSize);
  const tokens = f.tokens === null || f.tokens === undefined ? [] : tokenList(f.tokens);
  let parent: EngineBlockId | null = null;
  if (f.parent !== null && f.parent !== undefined) {
    const p = normaliseEngineId(f.parent);
    if (p === undefined) {
      sink.counts.malformedEvents++;
      return;
    }
    parent = p;
  }
  if (!engineIds || tokens === null || blockSize === null) {
    sink.counts.malformedEvents++;
    return;
  }
  let loraName = optString(f.loraName);
  const loraId = optInt(f.loraId);
  if (loraName === null && loraId !== null && loraId > 0 && Array.isArray(f.extraKeys)) {
    // Releases without the lora_name field still put the adapter's name first in every block's extra keys.
    const first: unknown = f.extraKeys[0];
    if (Array.isArray(first) && typeof first[0] === 'string' && first[0].length > 0) loraName = first[0];
  }
  if (loraName === null && loraId !== null && loraId > 0) {
    // Without the name the request-side seed cannot be reproduced; a synthetic name keeps these blocks isolated
    // from base-model requests instead of crediting them wrongly.
    loraName = `lora-id:${loraId}`;
    sink.counts.loraIdWithoutName++;
  }
  let cacheSalt: string | null = null;
  if (flavor === 'sglang' && isRecord(f.metadata)) cacheSalt = optString(f.metadata.cache_salt);
  const extra = readExtraKeys(f.extraKeys, loraName, parent === null, engineIds.length);
  if (extra.bad) {
    sink.counts.badExtraKeys++;
    return;
  }
  const { salt, firstUnhashable } = extra;
  if (salt !== null) cacheSalt = salt;
  const medium = optString(f.medium);
  const group = groupFields(f);
  if (!group) {
    sink.counts.badGroupFields++;
    return;
  }
  const groupIdx = group.idx;
  let ids = engineIds;
  let toks: number[] = tokens;
  if (firstUnhashable < engineIds.length) {
    sink.counts.multimodalBlocks += engineIds.length - firstUnhashable;
    for (let j = firstUnhashable; j < engineIds.length; j++) sink.skippedIds.push(engineIds[j]);
    if (firstUnhashable === 0) return;
    ids = engineIds.slice(0, firstUnhashable);
    if (tokens.length === engineIds.length * blockSize) toks = tokens.slice(0, firstUnhashable * blockSize);
  }
  // Built in one shape (no spreads): these objects are made per event on the hot path.
  const ev: StoredEvent =
    medium !== null
      ? { kind: 'stored', parent, engineIds: ids, tokens: toks, blockSize, loraName, cacheSalt, medium, groupIdx }
      : { kind: 'stored', parent, engineIds: ids, tokens: toks, blockSize, loraName, cacheSalt, groupIdx };
  if (group.kind !== undefined || extra.mm !== null || group.sessionId !== undefined) {
    // Hybrid groups, multimodal keys, session: the rarer fields, added only when present.
    const more = ev as { -readonly [K in keyof StoredEvent]: StoredEvent[K] };
    if (group.kind !== undefined) more.groupKind = group.kind;
    if (group.window !== undefined) more.slidingWindow = group.window;
    if (extra.mm !== null) more.mmKeys = ids.length === engineIds.length ? extra.mm : extra.mm.slice(0, ids.length);
    if (group.sessionId !== undefined) more.sessionId = group.sessionId;
  }
  pushPlaced(ev, f.locality, f.ownership, sink);
}

/** group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window, session_id; null when a present field is unusable. */
function groupFields(
  f: Pick<StoredFields, 'groupIdx' | 'groupKind' | 'slidingWindow' | 'sessionId'>,
): { idx: number; kind?: CacheGroupKind; window?: number; sessionId?: string } | null {
  let idx = 0;
  if (f.groupIdx !== null && f.groupIdx !== undefined) {
    const g = optInt(f.groupIdx);
    if (g === null || g < 0) return null;
    idx = g;
  }
  const kind = groupKindOf(f.groupKind);
  if (kind === null) return null;
  let window: number | undefined;
  if (f.slidingWindow !== null && f.slidingWindow !== undefined) {
    const w = optInt(f.slidingWindow);
    if (w === null || w < 1) return null;
    window = w;
  }
  // A sliding-window group without its window cannot be reasoned about.
  const k: CacheGroupKind | undefined = kind === 'sliding_window' && window === undefined ? 'unknown' : kind;
  const sessionId = optString(f.sessionId) ?? undefined;
  const out: { idx: number; kind?: CacheGroupKind; window?: number; sessionId?: string } = { idx };
  if (k !== undefined) out.kind = k;
  if (window !== undefined && k === 'sliding_window') out.window = window;
  if (sessionId !== undefined) out.sessionId = sessionId;
  return out;
}

/** Locality and ownership (vLLM main): kept on the event when present; an unknown locality value is malformed. */
function placement(locality: unknown, ownership: unknown): { locality?: Locality; ownership?: string } | null {
  const out: { locality?: Locality; ownership?: string } = {};
  if (locality !== undefined && locality !== null) {
    const l = typeof locality === 'string' ? locality.toUpperCase() : null;
    if (l !== 'LOCAL' && l !== 'REMOTE') return null;
    out.locality = l;
  }
  if (typeof ownership === 'string' && ownership.length > 0) out.ownership = ownership;
  return out;
}

function pushPlaced(ev: KvEvent, locality: unknown, ownership: unknown, sink: Sink): void {
  if ((locality === undefined || locality === null) && (ownership === undefined || ownership === null)) {
    sink.events.push(ev);
    return;
  }
  const p = placement(locality, ownership);
  if (p === null) {
    sink.counts.malformedEvents++;
    return;
  }
  sink.events.push({ ...ev, ...p } as KvEvent);
}

function pushRemoved(hashes: unknown, medium: unknown, groupIdx: unknown, sink: Sink, locality?: unknown): void {
  const engineIds = idList(hashes);
  if (!engineIds) {
    sink.counts.malformedEvents++;
    return;
  }
  const m = optString(medium);
  const g = optInt(groupIdx) ?? 0;
  pushPlaced(
    m !== null ? { kind: 'removed', engineIds, medium: m, groupIdx: g } : { kind: 'removed', engineIds, groupIdx: g },
    locality,
    undefined,
    sink,
  );
}

function decodeEvent(raw: unknown, flavor: ZmqWire, sink: Sink): void {
  if (Array.isArray(raw)) {
    const tag = raw[0];
    if (typeof tag !== 'string') {
      sink.counts.malformedEvents++;
      return;
    }
    switch (tag) {
      case 'BlockStored':
        // vLLM: [tag, hashes, parent, tokens, block_size, lora_id, medium, lora_name, extra_keys, group_idx, kind]
        // SGLang: [tag, hashes, parent, tokens, block_size, lora_id, medium, metadata]
        pushStored(
          {
            hashes: raw[1],
            parent: raw[2],
            tokens: raw[3],
            blockSize: raw[4],
            loraId: raw[5],
            medium: raw[6],
            loraName: flavor === 'vllm' ? raw[7] : undefined,
            metadata: flavor === 'sglang' ? raw[7] : undefined,
            extraKeys: flavor === 'vllm' ? raw[8] : undefined,
            groupIdx: flavor === 'vllm' ? raw[9] : undefined,
            groupKind: flavor === 'vllm' ? raw[10] : undefined,
            slidingWindow: flavor === 'vllm' ? raw[11] : undefined,
            sessionId: flavor === 'vllm' ? raw[14] : undefined,
          },
          flavor,
          sink,
        );
        return;
      case 'BlockRemoved':
        pushRemoved(raw[1], raw[2], raw[3], sink);
        return;
      case 'AllBlocksCleared':
        sink.events.push({ kind: 'cleared' });
        return;
      default:
        sink.counts.unknownEventTypes++;
        return;
    }
  }
  if (isRecord(raw)) {
    const tag = raw.type;
    if (typeof tag !== 'string') {
      sink.counts.malformedEvents++;
      return;
    }
    switch (tag) {
      case 'BlockStored':
        pushStored(
          {
            hashes: raw.block_hashes,
            parent: raw.parent_block_hash,
            tokens: raw.token_ids,
            blockSize: raw.block_size,
            loraId: raw.lora_id,
            medium: raw.medium,
            loraName: raw.lora_name,
            metadata: raw.metadata,
            extraKeys: raw.extra_keys,
            groupIdx: raw.group_idx,
            groupKind: raw.kv_cache_spec_kind,
            slidingWindow: raw.kv_cache_spec_sliding_window,
            sessionId: raw.session_id,
            locality: raw.locality,
            ownership: raw.ownership,
          },
          flavor,
          sink,
        );
        return;
      case 'BlockRemoved':
        pushRemoved(raw.block_hashes, raw.medium, raw.group_idx, sink, raw.locality);
        return;
      case 'AllBlocksCleared':
        sink.events.push({ kind: 'cleared' });
        return;
      default:
        sink.counts.unknownEventTypes++;
        return;
    }
  }
  sink.counts.malformedEvents++;
}

function failed(error: string): DecodedBatch {
  return { ok: false, error, ts: NaN, dataParallelRank: null, events: [], counts: emptyCounts(), skippedIds: [] };
}

/** Decodes one payload of either engine flavour (positional index 7 differs). Never throws. */
export function decodeBatch(payload: Uint8Array, flavor: ZmqWire): DecodedBatch {
  let root: unknown;
  try {
    root = unpackr.unpack(payload);
  } catch (err) {
    return failed(`msgpack: ${(err as Error)?.message ?? String(err)}`);
  }
  let ts: unknown;
  let rawEvents: unknown;
  let rank: unknown;
  if (Array.isArray(root)) {
    [ts, rawEvents, rank] = root;
  } else if (isRecord(root)) {
    ts = root.ts;
    rawEvents = root.events;
    rank = root.data_parallel_rank ?? root.attn_dp_rank;
  } else {
    return failed('batch is neither an array nor a map');
  }
  if (!Array.isArray(rawEvents)) return failed('batch has no event list');
  const sink: Sink = { events: [], counts: emptyCounts(), skippedIds: [] };
  try {
    for (const raw of rawEvents) decodeEvent(raw, flavor, sink);
  } catch (err) {
    // Defensive: exotic msgpack extension values (getters, proxies) must not escape; treat the batch as unusable.
    return failed(`event: ${(err as Error)?.message ?? String(err)}`);
  }
  const tsNum = typeof ts === 'number' ? ts : typeof ts === 'bigint' ? Number(ts) : NaN;
  const dp = optInt(rank);
  return { ok: true, ts: tsNum, dataParallelRank: dp, events: sink.events, counts: sink.counts, skippedIds: sink.skippedIds };
}

/** Decodes one vLLM payload (either layout, any field generation, any hash type). Never throws. */
export function decodeVllmBatch(payload: Uint8Array): DecodedBatch {
  return decodeBatch(payload, 'vllm');
}
