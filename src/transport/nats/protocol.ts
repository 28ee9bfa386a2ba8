/**
 * kvroute's NATS event plane: names, subjects and the msgpack codecs shared by relays and replicas.
 *
 *   stream  KVROUTE_EVENTS   subjects kvroute.events.<worker>.<dp>   one message = ordered items of one source:
 *                                                                    engine batches (seq + events) and reset markers
 *   KV      kvroute-workers  key <worker>                            registry entry (URL, model, block size, ranks, heartbeat)
 *   KV      kvroute-lease    key snapshot                            who writes snapshots, until when
 *   object  kvroute-snapshots name index                             latest index snapshot + the stream seq it covers
 *                                                                    (its byte format: snapshot-format.ts)
 *   core    kvroute.load                                             request lifecycle of every replica (not persisted)
 *
 * Encoding is msgpack (msgpackr, which keeps bigints); 64-bit ids and hashes travel as little-endian byte strings of
 * BigUint64Array (8 bytes each, no per-element tags), token ids as Uint32Array bytes. Every decoder returns null
 * for input it cannot use instead of throwing.
 */
import { Packr, Unpackr } from 'msgpackr';
import type { CacheGroupKind, KvEvent, MmBlockKey, StoredEvent } from '../../core/types.ts';
import { type EngineName, isEngineName } from '../../engines/index.ts';

export const STREAM = 'KVROUTE_EVENTS';
export const SUBJECT_PREFIX = 'kvroute.events';
export const REGISTRY_BUCKET = 'kvroute-workers';
export const LEASE_BUCKET = 'kvroute-lease';
export const LEASE_KEY = 'snapshot';
export const SNAPSHOT_BUCKET = 'kvroute-snapshots';
export const SNAPSHOT_NAME = 'index';
export const LOAD_SUBJECT = 'kvroute.load';
/**
 * Core NATS, `kvroute.resync.<worker>`: a replica whose view of a worker is incomplete (events lost, not replayed; the
 * worker removed and back) asks its relay to rebuild it: the relay publishes a reset and the engine's replay from its
 * first batch, for every replica. Payload: JSON { replica, reason }.
 */
export const RESYNC_PREFIX = 'kvroute.resync';

export function resyncSubject(workerId: string): string {
  return `${RESYNC_PREFIX}.${workerId}`;
}

/** Worker ids become subject tokens and KV keys: keep them to a safe alphabet. */
const WORKER_ID = /^[A-Za-z0-9_-]{1,128}$/;

export function checkWorkerId(id: string): string | null {
  return WORKER_ID.test(id) ? null : `worker id "${id}" must match ${WORKER_ID} (it names a NATS subject token and a KV key)`;
}

export function eventSubject(workerId: string, dpRank: number): string {
  return `${SUBJECT_PREFIX}.${workerId}.${dpRank}`;
}

/** Source key of an event subject (kvroute.events.<worker>.<dp>), or null. */
export function subjectSource(subject: string): { workerId: string; dpRank: number } | null {
  const parts = subject.split('.');
  if (parts.length !== 4 || `${parts[0]}.${parts[1]}` !== SUBJECT_PREFIX) return null;
  const dp = Number(parts[3]);
  if (!Number.isInteger(dp) || dp < 0) return null;
  return { workerId: parts[2], dpRank: dp };
}

// useRecords off: plain msgpack that other readers understand. Bigints (engine seqs, parent ids) as 64-bit ints.
const packr = new Packr({ useRecords: false });
const unpackr = new Unpackr({ useRecords: false, int64AsType: 'bigint' } as ConstructorParameters<typeof Unpackr>[0]);

export function u64Bytes(a: BigUint64Array | readonly bigint[]): Uint8Array {
  const arr = a instanceof BigUint64Array ? a : BigUint64Array.from(a);
  return new Uint8Array(arr.buffer, arr.byteOffset, arr.byteLength);
}

/** Copies (msgpack bins are not 8-byte aligned) into a fresh BigUint64Array; null when the length is not a multiple of 8. */
export function bytesU64(b: unknown): BigUint64Array | null {
  if (!(b instanceof Uint8Array) || b.byteLength % 8 !== 0) return null;
  const out = new BigUint64Array(b.byteLength / 8);
  new Uint8Array(out.buffer).set(b);
  return out;
}

function bytesU32(b: unknown): Uint32Array | null {
  if (!(b instanceof Uint8Array) || b.byteLength % 4 !== 0) return null;
  const out = new Uint32Array(b.byteLength / 4);
  new Uint8Array(out.buffer).set(b);
  return out;
}

function tokenBytes(tokens: ArrayLike<number>): Uint8Array {
  const t = tokens instanceof Uint32Array ? tokens : Uint32Array.from(tokens as ArrayLike<number>);
  return new Uint8Array(t.buffer, t.byteOffset, t.byteLength);
}

// ------------------------------------------------------------------------------------------ event messages

/** One item of an event message: an engine batch (its seq, fingerprint and normalised events) or a reset marker. */
export type EventItem =
  | { readonly kind: 'batch'; readonly seq: bigint; readonly fp: number; readonly events: readonly KvEvent[] }
  | { readonly kind: 'reset'; readonly reason: string };

type WireEvent = unknown[];

function encodeEvent(e: KvEvent): WireEvent {
  switch (e.kind) {
    case 'stored':
      return [
        0,
        e.parent,
        u64Bytes(e.engineIds as readonly bigint[]),
        e.tokens ? tokenBytes(e.tokens) : null,
        e.blockSize,
        e.seqHashes ? u64Bytes(e.seqHashes) : null,
        e.loraName ?? null,
        e.cacheSalt ?? null,
        e.medium ?? null,
        e.groupIdx ?? null,
        // hybrid groups and multimodal keys (docs/engines.md): trailing, so older replicas ignore them
        e.groupKind ?? null,
        e.slidingWindow ?? null,
        e.mmKeys ?? null,
      ];
    case 'removed':
      return [1, u64Bytes(e.engineIds as readonly bigint[]), e.medium ?? null, e.groupIdx ?? null];
    default:
      return [2];
  }
}

function optStr(v: unknown): string | undefined | false {
  if (v === null || v === undefined) return undefined;
  return typeof v === 'string' ? v : false;
}

function optInt(v: unknown): number | undefined | false {
  if (v === null || v === undefined) return undefined;
  return typeof v === 'number' && Number.isInteger(v) ? v : false;
}

function decodeEvent(w: unknown): KvEvent | null {
  if (!Array.isArray(w)) return null;
  if (w[0] === 2) return { kind: 'cleared' };
  if (w[0] === 1) {
    const ids = bytesU64(w[1]);
    const medium = optStr(w[2]);
    const groupIdx = optInt(w[3]);
    if (!ids || medium === false || groupIdx === false) return null;
    const ev: { kind: 'removed'; engineIds: bigint[]; medium?: string; groupIdx?: number } = {
      kind: 'removed',
      engineIds: Array.from(ids),
    };
    if (medium !== undefined) ev.medium = medium;
    if (groupIdx !== undefined) ev.groupIdx = groupIdx;
    return ev;
  }
  if (w[0] !== 0) return null;
  const parent =
    w[1] === null
      ? null
      : typeof w[1] === 'bigint'
        ? BigInt.asUintN(64, w[1])
        : typeof w[1] === 'number' && Number.isSafeInteger(w[1]) && w[1] >= 0
          ? BigInt(w[1])
          : undefined;
  const ids = bytesU64(w[2]);
  const tokens = w[3] === null ? null : bytesU32(w[3]);
  const blockSize = w[4];
  const seqHashes = w[5] === null ? undefined : bytesU64(w[5]);
  const loraName = optStr(w[6]);
  const cacheSalt = optStr(w[7]);
  const medium = optStr(w[8]);
  const groupIdx = optInt(w[9]);
  if (parent === undefined || !ids || (w[3] !== null && !tokens) || seqHashes === null) return null;
  if (typeof blockSize !== 'number' || !Number.isInteger(blockSize) || blockSize <= 0) return null;
  if (loraName === false || cacheSalt === false || medium === false || groupIdx === false) return null;
  const ev: { -readonly [K in keyof StoredEvent]: StoredEvent[K] } = {
    kind: 'stored',
    parent,
    engineIds: Array.from(ids),
    tokens,
    blockSize,
  };
  if (seqHashes) ev.seqHashes = seqHashes;
  if (loraName !== undefined) ev.loraName = loraName;
  if (cacheSalt !== undefined) ev.cacheSalt = cacheSalt;
  if (medium !== undefined) ev.medium = medium;
  if (groupIdx !== undefined) ev.groupIdx = groupIdx;
  const group = groupFieldsOf(w[10], w[11], w[12]);
  if (group === null) return null;
  if (group.kind !== undefined) ev.groupKind = group.kind;
  if (group.window !== undefined) ev.slidingWindow = group.window;
  if (group.mmKeys !== undefined) ev.mmKeys = group.mmKeys;
  return ev;
}

const GROUP_KINDS: readonly string[] = ['full_attention', 'sliding_window', 'mamba', 'unknown'];

/** The hybrid-group and multimodal fields of a relayed Stored event; null when present but malformed. */
function groupFieldsOf(
  kind: unknown,
  window: unknown,
  mm: unknown,
): { kind?: CacheGroupKind; window?: number; mmKeys?: (MmBlockKey[] | null)[] } | null {
  const out: { kind?: CacheGroupKind; window?: number; mmKeys?: (MmBlockKey[] | null)[] } = {};
  if (kind !== null && kind !== undefined) {
    if (typeof kind !== 'string' || !GROUP_KINDS.includes(kind)) return null;
    out.kind = kind as CacheGroupKind;
  }
  const w = optInt(window);
  if (w === false || (w !== undefined && w < 1)) return null;
  if (w !== undefined) out.window = w;
  if (mm !== null && mm !== undefined) {
    if (!Array.isArray(mm)) return null;
    const keys: (MmBlockKey[] | null)[] = [];
    for (const block of mm) {
      if (block === null) {
        keys.push(null);
        continue;
      }
      if (!Array.isArray(block)) return null;
      const list: MmBlockKey[] = [];
      for (const k of block) {
        if (!Array.isArray(k) || typeof k[0] !== 'string' || typeof k[1] !== 'number' || !Number.isInteger(k[1])) return null;
        list.push([k[0], k[1]]);
      }
      keys.push(list);
    }
    out.mmKeys = keys;
  }
  return out;
}

/** Wire: [1, [[0, seq, fp, [events...]] | [1, reason], ...]]. */
export function encodeEventMessage(items: readonly EventItem[]): Uint8Array {
  return packr.pack([1, items.map((it) => (it.kind === 'batch' ? [0, it.seq, it.fp, it.events.map(encodeEvent)] : [1, it.reason]))]);
}

export interface DecodedEventMessage {
  readonly items: EventItem[];
  /** Events that could not be decoded (dropped, counted by the caller). */
  readonly badEvents: number;
}

export function decodeEventMessage(data: Uint8Array): DecodedEventMessage | null {
  let w: unknown;
  try {
    w = unpackr.unpack(data);
  } catch {
    return null;
  }
  if (!Array.isArray(w) || w[0] !== 1 || !Array.isArray(w[1])) return null;
  const items: EventItem[] = [];
  let badEvents = 0;
  for (const it of w[1] as unknown[]) {
    if (!Array.isArray(it)) return null;
    if (it[0] === 1 && typeof it[1] === 'string') {
      items.push({ kind: 'reset', reason: it[1] });
      continue;
    }
    if (it[0] !== 0 || !Array.isArray(it[3])) return null;
    const seq = typeof it[1] === 'bigint' ? it[1] : typeof it[1] === 'number' && Number.isSafeInteger(it[1]) ? BigInt(it[1]) : null;
    if (seq === null || typeof it[2] !== 'number') return null;
    const events: KvEvent[] = [];
    for (const e of it[3] as unknown[]) {
      const ev = decodeEvent(e);
      if (ev) events.push(ev);
      else badEvents++;
    }
    items.push({ kind: 'batch', seq, fp: it[2], events });
  }
  return { items, badEvents };
}

/**
 * Fingerprint of an engine batch's decoded events (kinds and engine ids, FNV-1a over 32-bit halves). A restarted
 * relay compares the batch the engine replays at its last published seq with this, to tell "same engine process,
 * resume after it" from "the engine restarted meanwhile and reused the seq".
 */
export function batchFingerprint(events: readonly KvEvent[]): number {
  let h = 0x811c9dc5;
  const mix = (x: number) => {
    h = Math.imul(h ^ (x >>> 0), 0x01000193);
  };
  for (const e of events) {
    mix(e.kind === 'stored' ? 1 : e.kind === 'removed' ? 2 : 3);
    if (e.kind === 'cleared') continue;
    for (const id of e.engineIds) {
      mix(Number(id & 0xffffffffn));
      mix(Number(id >> 32n));
    }
  }
  return h >>> 0;
}

// ------------------------------------------------------------------------------------------ registry

export interface WorkerEntry {
  readonly workerId: string;
  /** Engine's OpenAI base URL (for the server's proxy), or null when unknown. */
  readonly url: string | null;
  readonly model: string | null;
  readonly blockSize: number;
  readonly dpRanks: readonly number[];
  readonly relayId: string;
  /** Wall-clock ms of the relay's last heartbeat. */
  readonly heartbeatAt: number;
  /** Per dp rank, the last engine batch the relay published (seq as a decimal string, fingerprint). */
  readonly resume?: Readonly<Record<string, { readonly seq: string; readonly fp: number }>>;
  /** Disaggregated serving (absent in entries of older relays: aggregated, vllm). */
  readonly role?: 'prefill' | 'decode' | 'both';
  readonly engine?: EngineName;
  /** SGLang prefill workers' bootstrap port. */
  readonly bootstrapPort?: number;
}

function parseResume(v: unknown): Record<string, { seq: string; fp: number }> | undefined {
  if (typeof v !== 'object' || v === null) return undefined;
  const out: Record<string, { seq: string; fp: number }> = {};
  for (const [k, r] of Object.entries(v as Record<string, unknown>)) {
    const x = r as { seq?: unknown; fp?: unknown } | null;
    if (x && typeof x.seq === 'string' && /^\d+$/.test(x.seq) && typeof x.fp === 'number') out[k] = { seq: x.seq, fp: x.fp };
  }
  return out;
}

export function encodeWorkerEntry(e: WorkerEntry): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(e));
}

export function decodeWorkerEntry(data: Uint8Array): WorkerEntry | null {
  let v: unknown;
  try {
    v = JSON.parse(new TextDecoder().decode(data));
  } catch {
    return null;
  }
  if (typeof v !== 'object' || v === null) return null;
  const o = v as Record<string, unknown>;
  if (typeof o.workerId !== 'string' || checkWorkerId(o.workerId) !== null) return null;
  if (typeof o.blockSize !== 'number' || !Number.isInteger(o.blockSize) || o.blockSize <= 0) return null;
  if (!Array.isArray(o.dpRanks) || !o.dpRanks.every((r) => Number.isInteger(r) && r >= 0)) return null;
  if (typeof o.heartbeatAt !== 'number') return null;
  return {
    workerId: o.workerId,
    url: typeof o.url === 'string' ? o.url : null,
    model: typeof o.model === 'string' ? o.model : null,
    blockSize: o.blockSize,
    dpRanks: o.dpRanks as number[],
    relayId: typeof o.relayId === 'string' ? o.relayId : '',
    heartbeatAt: o.heartbeatAt,
    resume: parseResume(o.resume),
    // Optional P/D fields: an unknown value is dropped (the worker is then aggregated), never a reason to drop the entry.
    ...(o.role === 'prefill' || o.role === 'decode' || o.role === 'both' ? { role: o.role } : {}),
    ...(isEngineName(o.engine) ? { engine: o.engine } : {}),
    ...(Number.isInteger(o.bootstrapPort) && (o.bootstrapPort as number) > 0 && (o.bootstrapPort as number) < 65536
      ? { bootstrapPort: o.bootstrapPort as number }
      : {}),
  };
}

// ------------------------------------------------------------------------------------------ lifecycle

export type LoadMessage =
  | {
      readonly kind: 'added';
      readonly replica: string;
      readonly requestId: string;
      readonly sourceKey: string;
      readonly seqHashes: BigUint64Array;
      readonly promptTokens: number;
      readonly overlapBlocks: number;
    }
  | { readonly kind: 'first_token' | 'finished'; readonly replica: string; readonly requestId: string }
  /** Liveness; `hello` also asks peers to re-announce their requests in flight (a replica just started). */
  | { readonly kind: 'heartbeat' | 'hello' | 'bye'; readonly replica: string }
  /** A session now pinned to a source until `expiresAt` (ms since the epoch): replicas keep one session table. */
  | {
      readonly kind: 'session';
      readonly replica: string;
      readonly sessionId: string;
      readonly sourceKey: string;
      readonly expiresAt: number;
    };

/**
 * The load protocol this build speaks. 1: one message per lifecycle step (`encodeLoad`). 2: a turn's steps in one
 * frame (`encodeLoadFrame`), and heartbeat / hello / bye say the sender's version as a trailing element (protocol 1
 * decoders ignore it). A replica sends frames only while every live peer has said version 2: a protocol-1 replica drops
 * a frame (its decoder answers null for the unknown kind) and would not see that replica's load.
 */
export const LOAD_PROTOCOL = 2;

/** The lifecycle steps a frame carries (heartbeat, hello and bye stay single messages). */
export type LoadStep = Extract<LoadMessage, { kind: 'added' | 'first_token' | 'finished' | 'session' }>;

export function encodeLoad(m: LoadMessage): Uint8Array {
  switch (m.kind) {
    case 'added':
      return packr.pack(['a', m.replica, m.requestId, m.sourceKey, u64Bytes(m.seqHashes), m.promptTokens, m.overlapBlocks]);
    case 'first_token':
      return packr.pack(['t', m.replica, m.requestId]);
    case 'finished':
      return packr.pack(['f', m.replica, m.requestId]);
    case 'session':
      return packr.pack(['s', m.replica, m.sessionId, m.sourceKey, m.expiresAt]);
    default:
      return packr.pack([m.kind === 'heartbeat' ? 'h' : m.kind === 'hello' ? 'hi' : 'bye', m.replica, LOAD_PROTOCOL]);
  }
}

/**
 * Wire: ['B', replica, 2, steps] with steps the msgpack of one flat array, step after step:
 *   0, requestId, sourceKey, seqHashes (u64 bytes), promptTokens, overlapBlocks     added
 *   1, requestId                                                                     first token
 *   2, requestId                                                                     finished
 *   3, sessionId, sourceKey, expiresAt                                               session
 * The steps are a nested byte string so that a replica reading its own frame (NATS echoes it) stops at the sender.
 * Protocol 1 decoders answer null for the unknown kind 'B' (dropped, never thrown).
 */
export function encodeLoadFrame(replica: string, steps: readonly LoadStep[]): Uint8Array {
  const flat: unknown[] = [];
  for (const m of steps) {
    switch (m.kind) {
      case 'added':
        flat.push(0, m.requestId, m.sourceKey, u64Bytes(m.seqHashes), m.promptTokens, m.overlapBlocks);
        break;
      case 'first_token':
        flat.push(1, m.requestId);
        break;
      case 'finished':
        flat.push(2, m.requestId);
        break;
      case 'session':
        flat.push(3, m.sessionId, m.sourceKey, m.expiresAt);
        break;
    }
  }
  return packr.pack(['B', replica, LOAD_PROTOCOL, packr.pack(flat)]);
}

/** Bytes a step adds to a frame, roughly (frames are split to stay well under NATS's max payload). */
export function loadStepBytes(m: LoadStep): number {
  return m.kind === 'added' ? m.seqHashes.byteLength + m.requestId.length + m.sourceKey.length + 32 : 64;
}

export type DecodedLoad =
  | { readonly kind: 'single'; readonly message: LoadMessage; readonly version: number }
  | { readonly kind: 'frame'; readonly replica: string; readonly steps: LoadStep[] | null };

/**
 * A message of the load subject: a single message (protocol 1's, or a heartbeat / hello / bye with its version) or a
 * frame of steps. A frame's steps are decoded only when `self` is not its sender; `steps` is null when they cannot be
 * used (malformed, truncated, another frame version): the whole frame is dropped, counted by the caller. Null: not a
 * load message at all.
 */
export function decodeLoadMessage(data: Uint8Array, self: string): DecodedLoad | null {
  let w: unknown;
  try {
    w = unpackr.unpack(data);
  } catch {
    return null;
  }
  if (!Array.isArray(w) || typeof w[1] !== 'string') return null;
  if (w[0] !== 'B') {
    const message = loadOf(w);
    if (!message) return null;
    return { kind: 'single', message, version: Number.isInteger(w[2]) && (w[2] as number) > 1 ? (w[2] as number) : 1 };
  }
  const replica = w[1];
  if (replica === self) return { kind: 'frame', replica, steps: [] };
  if (w[2] !== 2 || !(w[3] instanceof Uint8Array)) return { kind: 'frame', replica, steps: null };
  return { kind: 'frame', replica, steps: stepsOf(replica, w[3]) };
}

function stepsOf(replica: string, data: Uint8Array): LoadStep[] | null {
  let f: unknown;
  try {
    f = unpackr.unpack(data);
  } catch {
    return null;
  }
  if (!Array.isArray(f)) return null;
  const steps: LoadStep[] = [];
  let i = 0;
  while (i < f.length) {
    const kind = f[i];
    const id = f[i + 1];
    if (typeof id !== 'string') return null;
    if (kind === 0) {
      const sourceKey = f[i + 2];
      const seqHashes = bytesU64(f[i + 3]);
      const promptTokens = f[i + 4];
      const overlapBlocks = f[i + 5];
      if (typeof sourceKey !== 'string' || !seqHashes || typeof promptTokens !== 'number' || typeof overlapBlocks !== 'number') return null;
      if (!(promptTokens >= 0) || !(overlapBlocks >= 0)) return null;
      steps.push({ kind: 'added', replica, requestId: id, sourceKey, seqHashes, promptTokens, overlapBlocks });
      i += 6;
    } else if (kind === 1 || kind === 2) {
      steps.push({ kind: kind === 1 ? 'first_token' : 'finished', replica, requestId: id });
      i += 2;
    } else if (kind === 3) {
      const sourceKey = f[i + 2];
      const expiresAt = f[i + 3];
      if (typeof sourceKey !== 'string' || typeof expiresAt !== 'number' || !Number.isFinite(expiresAt)) return null;
      steps.push({ kind: 'session', replica, sessionId: id, sourceKey, expiresAt });
      i += 4;
    } else return null;
  }
  return steps;
}

/** A single (protocol 1) message; null for anything else, frames included. */
export function decodeLoad(data: Uint8Array): LoadMessage | null {
  let w: unknown;
  try {
    w = unpackr.unpack(data);
  } catch {
    return null;
  }
  return Array.isArray(w) ? loadOf(w) : null;
}

function loadOf(w: unknown[]): LoadMessage | null {
  if (typeof w[1] !== 'string') return null;
  const replica = w[1];
  switch (w[0]) {
    case 'a': {
      const seqHashes = bytesU64(w[4]);
      if (typeof w[2] !== 'string' || typeof w[3] !== 'string' || !seqHashes) return null;
      if (typeof w[5] !== 'number' || typeof w[6] !== 'number' || !(w[5] >= 0) || !(w[6] >= 0)) return null;
      return { kind: 'added', replica, requestId: w[2], sourceKey: w[3], seqHashes, promptTokens: w[5], overlapBlocks: w[6] };
    }
    case 't':
    case 'f':
      return typeof w[2] === 'string' ? { kind: w[0] === 't' ? 'first_token' : 'finished', replica, requestId: w[2] } : null;
    case 's':
      if (typeof w[2] !== 'string' || typeof w[3] !== 'string' || typeof w[4] !== 'number' || !Number.isFinite(w[4])) return null;
      return { kind: 'session', replica, sessionId: w[2], sourceKey: w[3], expiresAt: w[4] };
    case 'h':
      return { kind: 'heartbeat', replica };
    case 'hi':
      return { kind: 'hello', replica };
    case 'bye':
      return { kind: 'bye', replica };
    default:
      return null;
  }
}
