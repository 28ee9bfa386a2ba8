/**
 * Streaming reader of traces, plain or gzip: constant memory per line, bad lines counted in the stats. Two formats,
 * told apart by the first non-blank line: a recording of `kvroute serve --record` starts with its header (block size
 * and hash contract, src/core/traffic-record.ts; kept in `stats.recording`), anything else is Mooncake JSONL.
 */
import { createReadStream } from 'node:fs';
import { open } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { pipeline, type Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { isRecordHeaderLine, parseRecordHeader, parseRecordLine, type RecordHeader } from '../../core/traffic-record.ts';
import { type BadLineReason, parseTraceLine, TraceReadStats, type TraceRequest } from './format.ts';

/** gzip's two magic bytes: a compressed trace is recognised by its content, whatever its name. */
const GZIP_MAGIC = [0x1f, 0x8b];

async function isGzip(path: string): Promise<boolean> {
  const file = await open(path, 'r');
  try {
    const head = Buffer.alloc(2);
    const { bytesRead } = await file.read(head, 0, 2, 0);
    return bytesRead === 2 && head[0] === GZIP_MAGIC[0] && head[1] === GZIP_MAGIC[1];
  } finally {
    await file.close();
  }
}

/** The decoded text of a trace file, decompressed on the fly when it is gzip (`.jsonl.gz`). */
export async function openTraceText(path: string): Promise<Readable> {
  // Sniff first: a missing file rejects here, before any stream exists that could emit an unhandled 'error'.
  const gzip = await isGzip(path);
  const raw = createReadStream(path);
  if (!gzip) return raw.setEncoding('utf8');
  // pipeline: a read error of the file reaches the reader as an error of the decoded stream, and destroying the decoded
  // stream closes the file. Errors are seen by whoever reads the returned stream.
  return pipeline(raw, createGunzip(), () => undefined).setEncoding('utf8');
}

/**
 * Yields the requests of a trace file (JSONL, or JSONL compressed with gzip) in file order. Read errors of the file
 * itself (missing, unreadable, a corrupt gzip stream) reject.
 */
export async function* readTrace(path: string, stats: TraceReadStats = new TraceReadStats()): AsyncGenerator<TraceRequest> {
  const input = await openTraceText(path);
  const rl = createInterface({ input, crlfDelay: Infinity });
  let format: 'unknown' | 'mooncake' | 'record' = 'unknown';
  try {
    for await (const line of rl) {
      stats.lines++;
      if (format === 'unknown' && line.trim() !== '') {
        format = isRecordHeaderLine(line) ? 'record' : 'mooncake';
        if (format === 'record') {
          stats.recording = parseRecordHeader(line);
          continue;
        }
      }
      if (format === 'record') {
        const r = recordedLine(line, stats.recording!);
        if (r === 'header') continue;
        if (r === null) stats.blankLines++;
        else if (typeof r === 'string') stats.countBad(r, stats.lines);
        else {
          stats.requests++;
          yield r;
        }
        continue;
      }
      const r = parseTraceLine(line);
      if (r === null) stats.blankLines++;
      else if (typeof r === 'string') stats.countBad(r, stats.lines);
      else {
        stats.requests++;
        yield r;
      }
    }
  } finally {
    // A reader stopped early (loadTrace's limit) must not leave the file, or the gunzip stream, open.
    input.destroy();
  }
}

/**
 * One line of a recording as a trace request. A header again (rotated files joined with cat) is skipped when it names
 * the same block size; another block size throws (the hashes would not be comparable).
 */
function recordedLine(line: string, header: RecordHeader): TraceRequest | null | BadLineReason | 'header' {
  if (isRecordHeaderLine(line)) {
    const again = parseRecordHeader(line);
    if (again.blockSize !== header.blockSize) {
      throw new Error(`recording headers disagree on the block size: ${header.blockSize} then ${again.blockSize}`);
    }
    return 'header';
  }
  const r = parseRecordLine(line);
  if (r === null || typeof r === 'string') return r;
  // The chain holds the prompt's full blocks at the recorded block size, never more.
  if (r.blockHashes.length > Math.floor(r.inputLength / header.blockSize)) return 'hash_ids_length';
  return {
    timestamp: r.timestamp,
    inputLength: r.inputLength,
    outputLength: r.outputLength,
    hashIds: [],
    blockHashes: r.blockHashes,
    model: r.model,
    tenant: r.tenant,
    priority: r.priority,
    ...(r.sessionId !== undefined ? { sessionId: r.sessionId } : {}),
  };
}

/**
 * Loads a trace for replay, ordered by timestamp (stable, so equal timestamps keep file order, which is what the
 * oracle's "earlier request" means). `limit` keeps the first N requests.
 */
export async function loadTrace(
  path: string,
  options: { limit?: number } = {},
): Promise<{ requests: TraceRequest[]; stats: TraceReadStats }> {
  // stats.recording tells a recorded trace (its block size) from a Mooncake one.
  const stats = new TraceReadStats();
  const requests: TraceRequest[] = [];
  const limit = options.limit ?? Infinity;
  for await (const r of readTrace(path, stats)) {
    requests.push(r);
    if (requests.length >= limit) break;
  }
  sortByTimestamp(requests);
  return { requests, stats };
}

export function sortByTimestamp(requests: TraceRequest[]): void {
  let sorted = true;
  for (let i = 1; i < requests.length && sorted; i++) if (requests[i].timestamp < requests[i - 1].timestamp) sorted = false;
  if (!sorted) {
    // Array.prototype.sort is stable (ES2019), so ties keep file order.
    requests.sort((a, b) => a.timestamp - b.timestamp);
  }
}
