/**
 * TensorRT-LLM KV-cache events (docs/engines.md): its executor's `KVCacheEvent`s as `trtllm-serve` returns them from
 * `POST /kv_cache_events` (a JSON list drained from the engine's buffer; `LLM.get_kv_cache_events()` gives the same
 * dicts), decoded into the core's normalised `KvEvent`s. The base format is NVIDIA/TensorRT-LLM tensorrt_llm/_utils.py
 * `KVCacheEventSerializer` @ed53795b33fc; `mm_keys`, per-block `cache_salt` and `lora_name` are the newer fields as
 * Dynamo's TensorRT-LLM publisher and its tests read them (below).
 *
 * One event: `{event_id, data, window_size?, attention_dp_rank?}` with `data.type`
 * - `created` `{num_blocks_per_cache_level}`: first events of an engine, one per attention window size;
 * - `stored` `{parent_hash, blocks: [{type: "stored_block", block_hash, tokens: [{type: "unique_token", token_id,
 *   token_extra_id}], lora_id, cache_level, priority, mm_keys?, cache_salt?}], lora_name?, cache_salt?}` (newer
 *   releases carry `cache_salt` per block; older ones, if at all, on the event);
 * - `removed` `{block_hashes}`;
 * - `updated` `{block_hash, cache_level: {type: "event_diff", old_value, new_value} | null, priority: ... | null}`.
 *
 * What the decoder does with them (pure, one instance per source: the window and partial-block state are per engine):
 * - `event_id` is the sequence: consecutive per attention-DP rank (a gap means the engine's buffer overflowed), lower
 *   than the last one after a restart. The shell hands each event to the sequence tracker under its id.
 * - Window size: variable-window models publish one stream per window; the largest window announced by `created`
 *   events is the global-attention layer, the one whose prefix the engine reuses. Events of other windows are dropped
 *   and counted (as Dynamo does). Events without `window_size` (older releases) are all kept.
 * - Partial blocks: TensorRT-LLM also announces the last, not yet full block of a sequence. The router indexes full
 *   blocks only: a stored event stops at its first partial block, whose id is remembered so that its later removal is
 *   not an unknown block. The engine's block size is learned from the full blocks (every block but an event's last).
 * - `cache_salt`: the first indexed block's (else the event's) salts the event, so its blocks join the salted chain,
 *   never the unsalted one (the annotator carries it to later events of the sequence through their parents). A block
 *   whose salt differs from the event's cannot be on that chain: it and the rest of the event are skipped, counted.
 * - `mm_keys` `[{type: "mm_key", hash: "<hex>", start_offset}]`: the multimodal items the block overlaps, as Dynamo's
 *   publisher reads them (ai-dynamo/dynamo components/src/dynamo/trtllm/publisher.py @0d38568995b5: the hash is the
 *   item's identity); TensorRT-LLM's start_offset is how far into the item the block starts (0 when the item starts
 *   inside the block: kvCacheManager.cpp `generateBlockHashExtraKeys`). They become the router's multimodal block keys
 *   (docs/engines.md "Multimodal block keys"): identifier `sha256:<hash>`, offset = -start_offset, and for the block
 *   where an item starts, its place in the block from the next block's start_offset (block size - that). An item that
 *   starts in a block and does not reach the next one gives no place: that block and the rest are skipped, counted
 *   as multimodal, as is a block with `token_extra_id` other than 0 (prompt-tuning identity the router cannot see).
 * - `cache_level` 0 is GPU memory, 1 the secondary (host) pool: medium "GPU" / "CPU". An `updated` event that moves a
 *   block between levels becomes a Removed on the old medium and an id-only Stored on the new one (the tier index
 *   tracks offloaded blocks by engine id). A move back to GPU leaves the block in its lower tier until it is removed
 *   (the update carries no tokens to re-index it: an underestimate, never a wrong hit). Priority changes are counted
 *   and ignored (retention hints, not content).
 * - Hashes are 64-bit: unsigned as TensorRT-LLM writes them, or signed after Dynamo's relay; JSON numbers past 2^53 are
 *   parsed losslessly (`parseJsonLossless`).
 */
import type { EngineBlockId, KvEvent, MmBlockKey } from '../../core/types.ts';
import { type DecodedBatch, emptyCounts, normaliseEngineId } from '../common.ts';

/** One TensorRT-LLM `KVCacheEvent` as a test or the mock engine builds it (hashes as unsigned u64 bigints). */
export interface TrtllmEvent {
  readonly eventId: number;
  readonly windowSize?: number;
  readonly attentionDpRank?: number;
  readonly data:
    | { readonly type: 'created'; readonly numBlocksPerCacheLevel: readonly number[] }
    | {
        readonly type: 'stored';
        readonly parentHash: bigint | null;
        readonly blocks: readonly TrtllmStoredBlock[];
        readonly loraName?: string | null;
        readonly cacheSalt?: string | null;
      }
    | { readonly type: 'removed'; readonly blockHashes: readonly bigint[] }
    | {
        readonly type: 'updated';
        readonly blockHash: bigint;
        readonly cacheLevel?: { readonly oldValue: number; readonly newValue: number } | null;
        readonly priority?: { readonly oldValue: number; readonly newValue: number } | null;
      };
}

export interface TrtllmStoredBlock {
  readonly blockHash: bigint;
  readonly tokens: readonly number[];
  /** Per token; absent = all 0. */
  readonly tokenExtraIds?: readonly number[];
  readonly loraId?: number | null;
  readonly cacheLevel?: number;
  readonly priority?: number;
  /** `[{type: "mm_key", hash, start_offset}]` as TensorRT-LLM writes them (written as given). */
  readonly mmKeys?: readonly unknown[];
  /** Newer releases' per-block salt. */
  readonly cacheSalt?: string | null;
}

// ------------------------------------------------------------------------------------------------ JSON, lossless

/**
 * JSON.parse with integers of 16 digits or more kept exact: they come back as decimal strings (Node 20's JSON.parse
 * has no access to a number's source text). The scan skips string literals, so digits inside strings are untouched.
 * Throws SyntaxError like JSON.parse.
 */
const isDigit = (c: number) => c >= 0x30 && c <= 0x39;

export function parseJsonLossless(text: string): unknown {
  let out = '';
  let last = 0;
  const n = text.length;
  let i = 0;
  while (i < n) {
    const c = text.charCodeAt(i);
    if (c === 0x22 /* " */) {
      i++;
      while (i < n) {
        const d = text.charCodeAt(i);
        if (d === 0x5c /* \ */) i += 2;
        else if (d === 0x22) break;
        else i++;
      }
      i++;
      continue;
    }
    if (c === 0x2d /* - */ || (c >= 0x30 && c <= 0x39)) {
      // A whole number token: sign, integer digits, then any fraction and exponent (consumed so their digits are
      // never mistaken for an integer of their own).
      const start = i;
      if (c === 0x2d) i++;
      const digitsStart = i;
      while (i < n && isDigit(text.charCodeAt(i))) i++;
      const intEnd = i;
      let integer = true;
      if (i < n && text.charCodeAt(i) === 0x2e /* . */) {
        integer = false;
        i++;
        while (i < n && isDigit(text.charCodeAt(i))) i++;
      }
      if (i < n && (text.charCodeAt(i) | 0x20) === 0x65 /* e */) {
        integer = false;
        i++;
        if (i < n && (text.charCodeAt(i) === 0x2b || text.charCodeAt(i) === 0x2d)) i++;
        while (i < n && isDigit(text.charCodeAt(i))) i++;
      }
      if (integer && intEnd - digitsStart >= 16) {
        out += `${text.slice(last, start)}"${text.slice(start, intEnd)}"`;
        last = intEnd;
      }
      continue;
    }
    i++;
  }
  return JSON.parse(last === 0 ? text : out + text.slice(last));
}

/** A JSON list of events as trtllm-serve writes it (hashes as plain JSON integers, which Python writes exactly). */
export function encodeTrtllmEvents(events: readonly TrtllmEvent[]): string {
  const BIG = '\u0000big:';
  const toJson = (e: TrtllmEvent): Record<string, unknown> => {
    const big = (h: bigint) => `${BIG}${BigInt.asUintN(64, h)}`;
    let data: Record<string, unknown>;
    const d = e.data;
    switch (d.type) {
      case 'created':
        data = { type: 'created', num_blocks_per_cache_level: d.numBlocksPerCacheLevel };
        break;
      case 'stored':
        data = {
          type: 'stored',
          parent_hash: d.parentHash === null ? null : big(d.parentHash),
          blocks: d.blocks.map((b) => {
            const o: Record<string, unknown> = {
              type: 'stored_block',
              block_hash: big(b.blockHash),
              tokens: b.tokens.map((t, k) => ({ type: 'unique_token', token_id: t, token_extra_id: b.tokenExtraIds?.[k] ?? 0 })),
              lora_id: b.loraId ?? null,
              cache_level: b.cacheLevel ?? 0,
              priority: b.priority ?? 35,
            };
            if (b.mmKeys !== undefined) o.mm_keys = b.mmKeys;
            if (b.cacheSalt !== undefined) o.cache_salt = b.cacheSalt;
            return o;
          }),
        };
        if (d.loraName !== undefined) data.lora_name = d.loraName;
        if (d.cacheSalt !== undefined) data.cache_salt = d.cacheSalt;
        break;
      case 'removed':
        data = { type: 'removed', block_hashes: d.blockHashes.map(big) };
        break;
      case 'updated': {
        const diff = (x: { oldValue: number; newValue: number } | null | undefined) =>
          x ? { type: 'event_diff', new_value: x.newValue, old_value: x.oldValue } : null;
        data = { type: 'updated', block_hash: big(d.blockHash), cache_level: diff(d.cacheLevel), priority: diff(d.priority) };
        break;
      }
    }
    const o: Record<string, unknown> = { event_id: e.eventId, data };
    if (e.windowSize !== undefined) o.window_size = e.windowSize;
    if (e.attentionDpRank !== undefined) o.attention_dp_rank = e.attentionDpRank;
    return o;
  };
  // Hashes are written as bare integers (as Python's json does), not as strings: replace the marked strings.
  return JSON.stringify(events.map(toJson)).replace(/"\\u0000big:(\d+)"/g, '$1');
}

// ------------------------------------------------------------------------------------------------ decode

/** One `mm_key` of a block: the item's hash (lower-case hex) and how far into the item the block starts (null: absent). */
interface MmKey {
  readonly hash: string;
  readonly start: number | null;
}

/** A block's mm_keys, null without any, 'bad' when one is not `{type: "mm_key", hash: hex, start_offset?: int >= 0}`. */
function mmKeysOf(v: unknown): MmKey[] | null | 'bad' {
  if (v === undefined || v === null) return null;
  if (!Array.isArray(v)) return 'bad';
  if (v.length === 0) return null;
  const out: MmKey[] = [];
  for (const k of v) {
    if (!isRecord(k) || (k.type !== undefined && k.type !== 'mm_key') || typeof k.hash !== 'string' || !/^[0-9a-fA-F]+$/.test(k.hash))
      return 'bad';
    const start = k.start_offset === undefined || k.start_offset === null ? null : intOf(k.start_offset);
    if (start !== null && start < 0) return 'bad';
    if (k.start_offset !== undefined && k.start_offset !== null && start === null) return 'bad';
    out.push({ hash: k.hash.toLowerCase(), start });
  }
  return out;
}

/** One raw event of a drained list, with its sequence (event id) and attention-DP rank. */
export interface TrtllmRawEvent {
  readonly eventId: bigint;
  readonly rank: number;
  readonly raw: Record<string, unknown>;
}

export type TrtllmParse = { ok: true; events: TrtllmRawEvent[]; malformed: number } | { ok: false; error: string };

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** An integer in any JSON form (number, or the decimal string of a large one); null when not an integer. */
function bigOf(v: unknown): bigint | null {
  if (typeof v === 'number') return Number.isSafeInteger(v) ? BigInt(v) : null;
  if (typeof v === 'string' && /^-?\d{1,20}$/.test(v)) return BigInt(v);
  if (typeof v === 'bigint') return v;
  return null;
}

function intOf(v: unknown): number | null {
  const b = bigOf(v);
  return b !== null && b >= BigInt(Number.MIN_SAFE_INTEGER) && b <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(b) : null;
}

/** A 64-bit engine id from an unsigned or signed integer; undefined when unusable. */
function idOf(v: unknown): EngineBlockId | undefined {
  const b = bigOf(v);
  if (b === null || b < -(1n << 63n) || b >= 1n << 64n) return undefined;
  return normaliseEngineId(b);
}

/** Splits a `/kv_cache_events` body into events. Never throws; an event without an integer `event_id` is malformed. */
export function parseTrtllmEvents(body: string | Uint8Array): TrtllmParse {
  let root: unknown;
  try {
    root = parseJsonLossless(typeof body === 'string' ? body : Buffer.from(body.buffer, body.byteOffset, body.length).toString('utf8'));
  } catch (err) {
    return { ok: false, error: `json: ${(err as Error).message}` };
  }
  if (!Array.isArray(root)) return { ok: false, error: 'the body is not a JSON list of events' };
  const events: TrtllmRawEvent[] = [];
  let malformed = 0;
  for (const e of root) {
    const id = isRecord(e) ? bigOf(e.event_id) : null;
    if (!isRecord(e) || id === null || id < 0n || !isRecord(e.data)) {
      malformed++;
      continue;
    }
    const rank = e.attention_dp_rank === undefined || e.attention_dp_rank === null ? 0 : intOf(e.attention_dp_rank);
    if (rank === null || rank < 0) {
      malformed++;
      continue;
    }
    events.push({ eventId: id, rank, raw: e });
  }
  return { ok: true, events, malformed };
}

/** Counters of one source's TensorRT-LLM stream, beyond the ones every decoded batch carries. */
export interface TrtllmCounters {
  createdEvents: number;
  /** Events of an attention window other than the largest (sliding-window layers): dropped. */
  otherWindowEvents: number;
  /** Partial (not yet full) blocks announced: not indexed. */
  partialBlocks: number;
  /** `updated` events that moved a block between cache levels (GPU <-> host). */
  levelMoves: number;
  /** `updated` events that changed a block's retention priority only: ignored. */
  priorityUpdates: number;
  /** Stored events cut where a block's cache_salt differs from the event's (the rest skipped). */
  saltChanges: number;
}

const MEDIUM_OF_LEVEL = ['GPU', 'CPU'] as const;
/** Partial-block ids remembered per source (one per sequence in flight is the normal case). */
const MAX_PARTIAL = 65_536;

/** The medium of a TensorRT-LLM cache level: 0 GPU, 1 the host pool; other levels are reported as is (LEVEL<n>). */
export function mediumOfLevel(level: number): string {
  return MEDIUM_OF_LEVEL[level] ?? `LEVEL${level}`;
}

export interface TrtllmDecoderOptions {
  /** Block size to assume until full blocks have shown the engine's (the router's block size). */
  readonly blockSize: number;
}

/**
 * Per-source decoder: one raw event in, one `DecodedBatch` out (the shell delivers it under the event id). Pure; state
 * is the largest window seen, the learned block size and the ids of partial blocks.
 */
export class TrtllmDecoder {
  readonly counters: TrtllmCounters = {
    createdEvents: 0,
    otherWindowEvents: 0,
    partialBlocks: 0,
    levelMoves: 0,
    priorityUpdates: 0,
    saltChanges: 0,
  };
  private maxWindow: number | null = null;
  private blockSize: number;
  private learned = false;
  private readonly partial = new Set<EngineBlockId>();
  /** Medium each known block is on (GPU unless an update moved it), so removals go to the right tier. */
  private readonly lowerTier = new Map<EngineBlockId, string>();

  constructor(opts: TrtllmDecoderOptions) {
    this.blockSize = opts.blockSize;
  }

  /** Forgets the engine's state (its event ids went backwards: a restart). */
  reset(): void {
    this.maxWindow = null;
    this.forgetBlocks();
  }

  /**
   * Forgets what it knew of the engine's blocks (partial blocks, blocks on lower tiers) but not its attention window:
   * events were lost (a gap in the ids), the source is cleared and relearnt from the events that follow, and the
   * engine, the same process, still has the same window sizes.
   */
  forgetBlocks(): void {
    this.partial.clear();
    this.lowerTier.clear();
  }

  decode(ev: TrtllmRawEvent): DecodedBatch {
    const counts = emptyCounts();
    const events: KvEvent[] = [];
    const skippedIds: EngineBlockId[] = [];
    const batch = (): DecodedBatch => ({ ok: true, ts: NaN, dataParallelRank: ev.rank, events, counts, skippedIds });
    const data = ev.raw.data as Record<string, unknown>;
    const window = ev.raw.window_size === undefined || ev.raw.window_size === null ? null : intOf(ev.raw.window_size);
    if (ev.raw.window_size !== undefined && ev.raw.window_size !== null && window === null) {
      counts.malformedEvents++;
      return batch();
    }
    const type = data.type;
    if (type === 'created') {
      this.counters.createdEvents++;
      if (window !== null && (this.maxWindow === null || window > this.maxWindow)) this.maxWindow = window;
      return batch();
    }
    if (window !== null) {
      // Without created events (the router started late) the largest window seen so far stands in.
      if (this.maxWindow === null || window > this.maxWindow) this.maxWindow = window;
      if (window !== this.maxWindow) {
        this.counters.otherWindowEvents++;
        return batch();
      }
    }
    switch (type) {
      case 'stored':
        this.stored(data, events, counts, skippedIds);
        break;
      case 'removed':
        this.removed(data, events, counts);
        break;
      case 'updated':
        this.updated(data, events, counts);
        break;
      default:
        counts.unknownEventTypes++;
    }
    return batch();
  }

  private stored(data: Record<string, unknown>, events: KvEvent[], counts: DecodedBatch['counts'], skipped: EngineBlockId[]): void {
    const blocks = data.blocks;
    let parent: EngineBlockId | null = null;
    if (data.parent_hash !== null && data.parent_hash !== undefined) {
      const p = idOf(data.parent_hash);
      if (p === undefined) {
        counts.malformedEvents++;
        return;
      }
      parent = p;
    }
    if (!Array.isArray(blocks)) {
      counts.malformedEvents++;
      return;
    }
    // Every block but the last is full: their length is the engine's block size.
    for (let j = 0; j + 1 < blocks.length; j++) {
      const t = isRecord(blocks[j]) ? (blocks[j] as Record<string, unknown>).tokens : null;
      if (Array.isArray(t) && t.length > 0) {
        this.blockSize = t.length;
        this.learned = true;
        break;
      }
    }
    const mm = blocks.map((b) => mmKeysOf(isRecord(b) ? b.mm_keys : undefined));
    if (mm.some((k) => k === 'bad')) {
      counts.badExtraKeys++;
      return;
    }
    const saltOf = (b: Record<string, unknown>) => (typeof b.cache_salt === 'string' && b.cache_salt.length > 0 ? b.cache_salt : null);
    const first = blocks[0];
    const cacheSalt =
      (isRecord(first) ? saltOf(first) : null) ??
      (typeof data.cache_salt === 'string' && data.cache_salt.length > 0 ? data.cache_salt : null);
    const ids: EngineBlockId[] = [];
    const tokens: number[] = [];
    const levels: number[] = [];
    const mmKeys: (MmBlockKey[] | null)[] = [];
    let loraId: number | null = null;
    let stop: 'partial' | 'multimodal' | null = null;
    for (let j = 0; j < blocks.length; j++) {
      const b = blocks[j];
      if (!isRecord(b)) {
        counts.malformedEvents++;
        return;
      }
      const id = idOf(b.block_hash);
      const toks = b.tokens;
      const level = b.cache_level === undefined || b.cache_level === null ? 0 : intOf(b.cache_level);
      if (id === undefined || !Array.isArray(toks) || level === null) {
        counts.malformedEvents++;
        return;
      }
      if (stop !== null) {
        if (stop === 'multimodal') skipped.push(id);
        continue;
      }
      if (toks.length > this.blockSize) {
        if (this.learned && j + 1 < blocks.length) {
          counts.malformedEvents++;
          return;
        }
        // A single full block larger than assumed: the engine's block size is larger.
        this.blockSize = toks.length;
        this.learned = true;
      }
      let extra = false;
      const start = tokens.length;
      for (const t of toks) {
        const id32 = isRecord(t) ? t.token_id : t;
        if (typeof id32 !== 'number' || id32 >>> 0 !== id32) {
          counts.malformedEvents++;
          return;
        }
        if (isRecord(t) && t.token_extra_id !== undefined && t.token_extra_id !== null && t.token_extra_id !== 0) extra = true;
        tokens.push(id32);
      }
      const salt = saltOf(b);
      if (salt !== null && salt !== cacheSalt) {
        // Another salt mid-event: not the chain this event is on, nor one the router can start here.
        tokens.length = start;
        stop = 'multimodal';
        this.counters.saltChanges++;
        skipped.push(id);
        continue;
      }
      const keys = toks.length === this.blockSize ? this.routerMmKeys(mm[j] as MmKey[] | null, mm[j + 1]) : null;
      if (extra || keys === 'unknown') {
        tokens.length = start;
        stop = 'multimodal';
        counts.multimodalBlocks += blocks.length - j;
        skipped.push(id);
        continue;
      }
      if (toks.length < this.blockSize) {
        tokens.length = start;
        // Bounded: an engine that never removes its partial blocks must not grow this without end.
        if (this.partial.size >= MAX_PARTIAL) this.partial.clear();
        this.partial.add(id);
        this.counters.partialBlocks++;
        stop = 'partial';
        continue;
      }
      const l = intOf(b.lora_id);
      if (l !== null && l > 0) loraId = l;
      ids.push(id);
      levels.push(level);
      mmKeys.push(keys);
    }
    if (ids.length === 0) return;
    let loraName = typeof data.lora_name === 'string' && data.lora_name.length > 0 ? data.lora_name : null;
    if (loraName === null && loraId !== null) {
      loraName = `lora-id:${loraId}`;
      counts.loraIdWithoutName++;
    }
    const level0 = levels[0];
    const withMm = mmKeys.some((k) => k !== null);
    if (levels.every((l) => l === level0) && level0 === 0) {
      events.push({
        kind: 'stored',
        parent,
        engineIds: ids,
        tokens,
        blockSize: this.blockSize,
        loraName,
        cacheSalt,
        groupIdx: 0,
        ...(withMm ? { mmKeys } : {}),
      });
      return;
    }
    // Blocks stored straight into a lower level: the GPU part (if any) with tokens, the rest by id on its medium.
    const gpu = levels.indexOf(0) === 0 ? levels.findIndex((l) => l !== 0) : 0;
    if (gpu > 0) {
      events.push({
        kind: 'stored',
        parent,
        engineIds: ids.slice(0, gpu),
        tokens: tokens.slice(0, gpu * this.blockSize),
        blockSize: this.blockSize,
        loraName,
        cacheSalt,
        groupIdx: 0,
        ...(mmKeys.slice(0, gpu).some((k) => k !== null) ? { mmKeys: mmKeys.slice(0, gpu) } : {}),
      });
    }
    for (let j = gpu; j < ids.length; j++) {
      const medium = mediumOfLevel(levels[j]);
      // A GPU block after a lower-level one cannot be chained (its parent has no GPU copy): left out.
      if (medium === 'GPU') continue;
      this.lowerTier.set(ids[j], medium);
      events.push({ kind: 'stored', parent: null, engineIds: [ids[j]], tokens: [], blockSize: this.blockSize, medium, groupIdx: 0 });
    }
  }

  /**
   * A full block's TensorRT-LLM mm_keys as the router's (identifier, offset) keys: null for none, 'unknown' when an
   * item starts inside the block and `next` (the next block's keys) does not show where.
   */
  private routerMmKeys(keys: MmKey[] | null, next: MmKey[] | null | 'bad' | undefined): MmBlockKey[] | null | 'unknown' {
    if (keys === null || keys.length === 0) return null;
    const out: MmBlockKey[] = [];
    for (const k of keys) {
      if (k.start === null) return 'unknown';
      if (k.start > 0) {
        out.push([`sha256:${k.hash}`, -k.start]);
        continue;
      }
      // The item starts in this block: the next block begins `s` tokens into it, so it starts blockSize - s in here.
      const cont = Array.isArray(next)
        ? next.find((n) => n.hash === k.hash && n.start !== null && n.start > 0 && n.start <= this.blockSize)
        : undefined;
      if (!cont) return 'unknown';
      out.push([`sha256:${k.hash}`, this.blockSize - cont.start!]);
    }
    return out;
  }

  private removed(data: Record<string, unknown>, events: KvEvent[], counts: DecodedBatch['counts']): void {
    const hashes = data.block_hashes;
    if (!Array.isArray(hashes)) {
      counts.malformedEvents++;
      return;
    }
    const gpu: EngineBlockId[] = [];
    const byMedium = new Map<string, EngineBlockId[]>();
    for (const h of hashes) {
      const id = idOf(h);
      if (id === undefined) {
        counts.malformedEvents++;
        return;
      }
      if (this.partial.delete(id)) continue;
      const medium = this.lowerTier.get(id);
      if (medium === undefined) {
        gpu.push(id);
        continue;
      }
      this.lowerTier.delete(id);
      const list = byMedium.get(medium) ?? [];
      list.push(id);
      byMedium.set(medium, list);
    }
    if (gpu.length > 0) events.push({ kind: 'removed', engineIds: gpu, groupIdx: 0 });
    for (const [medium, ids] of byMedium) events.push({ kind: 'removed', engineIds: ids, medium, groupIdx: 0 });
  }

  private updated(data: Record<string, unknown>, events: KvEvent[], counts: DecodedBatch['counts']): void {
    const id = idOf(data.block_hash);
    if (id === undefined) {
      counts.malformedEvents++;
      return;
    }
    const level = data.cache_level;
    if (isRecord(level)) {
      const from = intOf(level.old_value);
      const to = intOf(level.new_value);
      if (from === null || to === null) {
        counts.malformedEvents++;
        return;
      }
      if (from !== to && !this.partial.has(id)) {
        this.counters.levelMoves++;
        const oldMedium = this.lowerTier.get(id) ?? mediumOfLevel(from);
        const newMedium = mediumOfLevel(to);
        if (newMedium === 'GPU') {
          // Onboarded back to GPU memory: the router cannot re-index it (the update has no tokens), so it stays in
          // its lower tier (credited as such, an underestimate, never a wrong hit) until the engine removes it.
          return;
        }
        // The router hash of an offloaded block is known from its GPU announcement (the tier index resolves it), so
        // the Stored on the new medium goes first, then the Removed on the old one.
        events.push({
          kind: 'stored',
          parent: null,
          engineIds: [id],
          tokens: [],
          blockSize: this.blockSize,
          medium: newMedium,
          groupIdx: 0,
        });
        events.push(
          oldMedium === 'GPU'
            ? { kind: 'removed', engineIds: [id], groupIdx: 0 }
            : { kind: 'removed', engineIds: [id], medium: oldMedium, groupIdx: 0 },
        );
        this.lowerTier.set(id, newMedium);
      }
      return;
    }
    if (isRecord(data.priority)) this.counters.priorityUpdates++;
  }
}
