/** Streaming reader of Mooncake JSONL traces: constant memory per line, bad lines counted in the stats. */
import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';
import { parseTraceLine, TraceReadStats, type TraceRequest } from './format.ts';

/** Yields the requests of a trace file in file order. Read errors of the file itself (missing, unreadable) reject. */
export async function* readTrace(path: string, stats: TraceReadStats = new TraceReadStats()): AsyncGenerator<TraceRequest> {
  const rl = createInterface({ input: createReadStream(path, { encoding: 'utf8' }), crlfDelay: Infinity });
  for await (const line of rl) {
    stats.lines++;
    const r = parseTraceLine(line);
    if (r === null) stats.blankLines++;
    else if (typeof r === 'string') stats.countBad(r, stats.lines);
    else {
      stats.requests++;
      yield r;
    }
  }
}

/**
 * Loads a trace for replay, ordered by timestamp (stable, so equal timestamps keep file order, which is what the
 * oracle's "earlier request" means). `limit` keeps the first N requests.
 */
export async function loadTrace(
  path: string,
  options: { limit?: number } = {},
): Promise<{ requests: TraceRequest[]; stats: TraceReadStats }> {
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
