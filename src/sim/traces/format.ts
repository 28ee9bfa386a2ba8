/**
 * The Mooncake trace format (FAST'25 release), one JSON object per line:
 *   {"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [one id per 512-token block]}
 * An id names a block together with everything before it (a prefix id). Mooncake's traces have no session id.
 * kvroute's generators may add optional fields for flow control: "tenant", "priority" (lower runs first),
 * "session_id" and "slo_ttft_ms"; readers ignore what they do not know and check what they do.
 */

import { parseJsonLine, type RecordHeader } from '../../core/traffic-record.ts';

/** Block size of the trace's hash ids, fixed by the format. */
export const TRACE_BLOCK_TOKENS = 512;

export interface TraceRequest {
  /** Milliseconds since the start of the trace. */
  readonly timestamp: number;
  readonly inputLength: number;
  readonly outputLength: number;
  /** ceil(inputLength / 512) prefix ids; the last block is usually partial. */
  readonly hashIds: readonly number[];
  readonly tenant?: string;
  readonly priority?: number;
  readonly sessionId?: string;
  readonly sloTtftMs?: number;
  /**
   * A recorded request (`kvroute serve --record`, src/core/traffic-record.ts): the router's own sequence hashes of its
   * full blocks at the recording's block size. They are routed on directly; `hashIds` is then empty.
   */
  readonly blockHashes?: BigUint64Array;
  /** The model a recorded request asked for. */
  readonly model?: string;
}

export type BadLineReason = 'invalid_json' | 'not_an_object' | 'bad_field' | 'hash_ids_length';

/** Counters of a read: bad lines are counted by reason, never thrown. */
export class TraceReadStats {
  /** The header of a recorded trace (src/core/traffic-record.ts); absent for a Mooncake-format trace. */
  recording?: RecordHeader;
  lines = 0;
  requests = 0;
  blankLines = 0;
  readonly bad = new Map<BadLineReason, number>();
  /** First bad line number per reason, to make a report actionable. */
  readonly firstBadLine = new Map<BadLineReason, number>();

  get badLines(): number {
    let n = 0;
    for (const v of this.bad.values()) n += v;
    return n;
  }

  countBad(reason: BadLineReason, line: number): void {
    this.bad.set(reason, (this.bad.get(reason) ?? 0) + 1);
    if (!this.firstBadLine.has(reason)) this.firstBadLine.set(reason, line);
  }
}

function isNonNegInt(v: unknown): v is number {
  return typeof v === 'number' && Number.isInteger(v) && v >= 0;
}

/** Parses one line; returns a request, null for a blank line, or the reason the line is bad. */
export function parseTraceLine(line: string): TraceRequest | null | BadLineReason {
  const o = parseJsonLine(line);
  if (o === null || typeof o === 'string') return o;
  const ts = o.timestamp;
  if (typeof ts !== 'number' || !Number.isFinite(ts) || ts < 0) return 'bad_field';
  if (!isNonNegInt(o.input_length) || o.input_length === 0) return 'bad_field';
  if (!isNonNegInt(o.output_length)) return 'bad_field';
  const ids = o.hash_ids;
  if (!Array.isArray(ids)) return 'bad_field';
  for (const id of ids) if (!isNonNegInt(id) || id > 0xffffffff) return 'bad_field';
  // The expansion relies on one id per 512 tokens; a mismatch would silently shift every block.
  if (ids.length !== Math.ceil(o.input_length / TRACE_BLOCK_TOKENS)) return 'hash_ids_length';
  const out: { -readonly [K in keyof TraceRequest]: TraceRequest[K] } = {
    timestamp: ts,
    inputLength: o.input_length,
    outputLength: o.output_length,
    hashIds: ids as number[],
  };
  if (o.tenant !== undefined) {
    if (typeof o.tenant !== 'string' || !/^[A-Za-z0-9_.-]{1,64}$/.test(o.tenant)) return 'bad_field';
    out.tenant = o.tenant;
  }
  if (o.priority !== undefined) {
    if (!Number.isInteger(o.priority)) return 'bad_field';
    out.priority = o.priority as number;
  }
  if (o.session_id !== undefined) {
    if (typeof o.session_id !== 'string' || o.session_id.length === 0 || o.session_id.length > 256) return 'bad_field';
    out.sessionId = o.session_id;
  }
  if (o.slo_ttft_ms !== undefined) {
    if (typeof o.slo_ttft_ms !== 'number' || !(o.slo_ttft_ms > 0)) return 'bad_field';
    out.sloTtftMs = o.slo_ttft_ms;
  }
  return out;
}

export function formatTraceLine(r: TraceRequest): string {
  return JSON.stringify({
    timestamp: r.timestamp,
    input_length: r.inputLength,
    output_length: r.outputLength,
    hash_ids: r.hashIds,
    ...(r.tenant !== undefined ? { tenant: r.tenant } : {}),
    ...(r.priority !== undefined ? { priority: r.priority } : {}),
    ...(r.sessionId !== undefined ? { session_id: r.sessionId } : {}),
    ...(r.sloTtftMs !== undefined ? { slo_ttft_ms: r.sloTtftMs } : {}),
  });
}

/** Parses a whole trace held in memory (tests, small files). */
export function parseTraceText(text: string, stats = new TraceReadStats()): TraceRequest[] {
  const out: TraceRequest[] = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    if (i === lines.length - 1 && lines[i] === '') break;
    stats.lines++;
    const r = parseTraceLine(lines[i]);
    if (r === null) stats.blankLines++;
    else if (typeof r === 'string') stats.countBad(r, i + 1);
    else {
      stats.requests++;
      out.push(r);
    }
  }
  return out;
}
