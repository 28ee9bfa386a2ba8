/**
 * The Mooncake trace format (FAST'25 release), one JSON object per line:
 *   {"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [one id per 512-token block]}
 * An id names a block together with everything before it (a prefix id). There is no session id.
 */

/** Block size of the trace's hash ids, fixed by the format. */
export const TRACE_BLOCK_TOKENS = 512;

export interface TraceRequest {
  /** Milliseconds since the start of the trace. */
  readonly timestamp: number;
  readonly inputLength: number;
  readonly outputLength: number;
  /** ceil(inputLength / 512) prefix ids; the last block is usually partial. */
  readonly hashIds: readonly number[];
}

export type BadLineReason = 'invalid_json' | 'not_an_object' | 'bad_field' | 'hash_ids_length';

/** Counters of a read: bad lines are counted by reason, never thrown. */
export class TraceReadStats {
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
  const text = line.trim();
  if (text === '') return null;
  let obj: unknown;
  try {
    obj = JSON.parse(text);
  } catch {
    return 'invalid_json';
  }
  if (typeof obj !== 'object' || obj === null || Array.isArray(obj)) return 'not_an_object';
  const o = obj as Record<string, unknown>;
  const ts = o.timestamp;
  if (typeof ts !== 'number' || !Number.isFinite(ts) || ts < 0) return 'bad_field';
  if (!isNonNegInt(o.input_length) || o.input_length === 0) return 'bad_field';
  if (!isNonNegInt(o.output_length)) return 'bad_field';
  const ids = o.hash_ids;
  if (!Array.isArray(ids)) return 'bad_field';
  for (const id of ids) if (!isNonNegInt(id) || id > 0xffffffff) return 'bad_field';
  // The expansion relies on one id per 512 tokens; a mismatch would silently shift every block.
  if (ids.length !== Math.ceil(o.input_length / TRACE_BLOCK_TOKENS)) return 'hash_ids_length';
  return { timestamp: ts, inputLength: o.input_length, outputLength: o.output_length, hashIds: ids as number[] };
}

export function formatTraceLine(r: TraceRequest): string {
  return JSON.stringify({
    timestamp: r.timestamp,
    input_length: r.inputLength,
    output_length: r.outputLength,
    hash_ids: r.hashIds,
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
