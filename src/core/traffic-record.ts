/**
 * The recorded-traffic format (`kvroute serve --record FILE`, replayed by `kvroute sim --trace FILE`): JSON lines
 * that hold no text. The first line of every file is a header naming the hash contract (docs/protocols.md §1), so a
 * replay routes on the recorded hashes at the recorded block size; every other line is one request:
 *
 *   {"kvroute_record":1,"block_size":16,"hash":"xxh3_64","hash_seed":1337,"started_at":"2026-12-06T06:00:00.000Z","source":"serve"}
 *   {"timestamp":12.5,"input_length":300,"output_length":20,"block_hashes":["9f1c...",...],"model":"m","tenant":"default",
 *    "priority":0,"session_id":"s1","outcome":"ok"}
 *
 * `timestamp` is ms from the recording's start (the same origin across rotated files); `block_hashes` is the router's
 * own sequence-hash chain of the prompt's full blocks (16 hex digits each: a JSON number cannot hold 64 bits), LoRA
 * and cache_salt already mixed in. Pure: encoding and decoding only (the writer is src/runtime/recorder.ts, the
 * reader src/sim/traces/reader.ts).
 */
import { BASE_SEED } from './hashing.ts';

/** Version of the format; a reader refuses another. */
export const RECORD_VERSION = 1;
/** The header's marker key: a file whose first line carries it is a recording. */
export const RECORD_MARKER = 'kvroute_record';

export interface RecordHeader {
  readonly version: number;
  readonly blockSize: number;
  /** The hash function of the chain (docs/protocols.md §1). */
  readonly hash: string;
  readonly hashSeed: bigint;
  /** Wall-clock start of the recording (ISO 8601): timestamps count from it. */
  readonly startedAt: string;
  /** The front end that recorded: serve or epp. */
  readonly source: string;
}

export interface RecordedRequest {
  readonly timestamp: number;
  readonly inputLength: number;
  /** Generated tokens from the finished request's usage; 0 when the engine did not say. */
  readonly outputLength: number;
  readonly blockHashes: BigUint64Array;
  readonly model: string;
  readonly tenant: string;
  readonly priority: number;
  readonly sessionId?: string;
  /** How the request ended: ok, error or cancelled. */
  readonly outcome: string;
}

export function formatRecordHeader(h: Omit<RecordHeader, 'version' | 'hash' | 'hashSeed'>): string {
  return JSON.stringify({
    [RECORD_MARKER]: RECORD_VERSION,
    block_size: h.blockSize,
    hash: 'xxh3_64',
    hash_seed: Number(BASE_SEED),
    started_at: h.startedAt,
    source: h.source,
  });
}

const HEX = '0123456789abcdef';

/** 16 lowercase hex digits, zero-padded (no BigInt#toString per hash: this runs once per block of every request). */
function hex64(v: bigint): string {
  let hi = Number(v >> 32n);
  let lo = Number(v & 0xffffffffn);
  let s = '';
  for (let i = 0; i < 8; i++) {
    s = HEX[lo & 15] + s;
    lo >>>= 4;
  }
  for (let i = 0; i < 8; i++) {
    s = HEX[hi & 15] + s;
    hi >>>= 4;
  }
  return s;
}

export function formatRecordLine(r: RecordedRequest): string {
  const hashes = new Array<string>(r.blockHashes.length);
  for (let i = 0; i < hashes.length; i++) hashes[i] = hex64(r.blockHashes[i]);
  return JSON.stringify({
    timestamp: Math.round(r.timestamp * 1000) / 1000,
    input_length: r.inputLength,
    output_length: r.outputLength,
    block_hashes: hashes,
    model: r.model,
    tenant: r.tenant,
    priority: r.priority,
    ...(r.sessionId !== undefined ? { session_id: r.sessionId } : {}),
    outcome: r.outcome,
  });
}

/** Is this (first non-blank) line a recording's header? Decided by its marker key alone, before any validation. */
export function isRecordHeaderLine(line: string): boolean {
  const t = line.trimStart();
  return t.startsWith('{') && t.includes(`"${RECORD_MARKER}"`);
}

/** Parses a header line; throws an Error saying what is wrong (a replay at the wrong block size would be silently wrong). */
export function parseRecordHeader(line: string): RecordHeader {
  let o: Record<string, unknown>;
  try {
    o = JSON.parse(line) as Record<string, unknown>;
  } catch {
    throw new Error('recording header is not JSON');
  }
  if (o[RECORD_MARKER] !== RECORD_VERSION)
    throw new Error(`recording format version ${String(o[RECORD_MARKER])} (this kvroute reads ${RECORD_VERSION})`);
  const bs = o.block_size;
  if (typeof bs !== 'number' || !Number.isInteger(bs) || bs < 1) throw new Error(`recording header: bad block_size ${String(bs)}`);
  if (o.hash !== 'xxh3_64') throw new Error(`recording header: unknown hash ${String(o.hash)}`);
  if (o.hash_seed !== Number(BASE_SEED))
    throw new Error(`recording header: hash_seed ${String(o.hash_seed)} (the router's is ${BASE_SEED})`);
  return {
    version: RECORD_VERSION,
    blockSize: bs,
    hash: 'xxh3_64',
    hashSeed: BASE_SEED,
    startedAt: typeof o.started_at === 'string' ? o.started_at : '',
    source: typeof o.source === 'string' ? o.source : '',
  };
}

const HASH_RE = /^[0-9a-f]{16}$/;

/**
 * One line of a JSON-lines trace (a recording here, a Mooncake trace in src/sim/traces/format.ts): its object, null for
 * a blank line, or why it is not an object (for the reader to count, never thrown).
 */
export function parseJsonLine(line: string): Record<string, unknown> | null | 'invalid_json' | 'not_an_object' {
  const text = line.trim();
  if (text === '') return null;
  let obj: unknown;
  try {
    obj = JSON.parse(text);
  } catch {
    return 'invalid_json';
  }
  if (typeof obj !== 'object' || obj === null || Array.isArray(obj)) return 'not_an_object';
  return obj as Record<string, unknown>;
}

/** Parses one request line; null for a blank line, a reason string for a bad line (counted by the reader, never thrown). */
export function parseRecordLine(line: string): RecordedRequest | null | 'invalid_json' | 'not_an_object' | 'bad_field' | 'hash_ids_length' {
  const o = parseJsonLine(line);
  if (o === null || typeof o === 'string') return o;
  const ts = o.timestamp;
  if (typeof ts !== 'number' || !Number.isFinite(ts) || ts < 0) return 'bad_field';
  const n = o.input_length;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 1) return 'bad_field';
  const out = o.output_length;
  if (typeof out !== 'number' || !Number.isInteger(out) || out < 0) return 'bad_field';
  const hs = o.block_hashes;
  if (!Array.isArray(hs)) return 'bad_field';
  const hashes = new BigUint64Array(hs.length);
  for (let i = 0; i < hs.length; i++) {
    const h = hs[i];
    if (typeof h !== 'string' || !HASH_RE.test(h)) return 'bad_field';
    hashes[i] = BigInt(`0x${h}`);
  }
  if (typeof o.model !== 'string' || typeof o.tenant !== 'string' || o.tenant === '') return 'bad_field';
  if (typeof o.priority !== 'number' || !Number.isInteger(o.priority)) return 'bad_field';
  if (o.session_id !== undefined && (typeof o.session_id !== 'string' || o.session_id === '')) return 'bad_field';
  return {
    timestamp: ts,
    inputLength: n,
    outputLength: out,
    blockHashes: hashes,
    model: o.model,
    tenant: o.tenant,
    priority: o.priority,
    ...(typeof o.session_id === 'string' ? { sessionId: o.session_id } : {}),
    outcome: typeof o.outcome === 'string' ? o.outcome : 'ok',
  };
}
