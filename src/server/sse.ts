/**
 * Relays an upstream SSE body to the client event by event, without re-encoding the common case.
 *
 * Complete events (up to the last blank line of what has arrived) are forwarded as soon as they arrive; only a
 * trailing partial event is held until its end comes. Events are parsed only when they mention "usage": the final
 * usage chunk is where the engine reports delivered cached tokens, and it is removed when the router (not the client)
 * asked for it, so the client sees exactly the stream it asked for.
 */

export interface StreamUsage {
  promptTokens?: number;
  completionTokens?: number;
  cachedTokens?: number;
}

const USAGE = Buffer.from('"usage"');
const DONE = Buffer.from('[DONE]');
const ERROR = Buffer.from('{"error"');
const EMPTY = Buffer.alloc(0);

function lastBoundary(buf: Buffer): number {
  // End of the last complete event: after "\n\n" or "\n\r\n" (CRLF streams). -1 when none.
  const a = buf.lastIndexOf('\n\n');
  const b = buf.lastIndexOf('\n\r\n');
  return Math.max(a < 0 ? -1 : a + 2, b < 0 ? -1 : b + 3);
}

export function readUsage(usage: unknown): StreamUsage | undefined {
  if (!usage || typeof usage !== 'object') return undefined;
  const u = usage as Record<string, unknown>;
  const details = u.prompt_tokens_details as Record<string, unknown> | null | undefined;
  const num = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : undefined);
  return {
    promptTokens: num(u.prompt_tokens),
    completionTokens: num(u.completion_tokens),
    cachedTokens: details ? num(details.cached_tokens) : undefined,
  };
}

export class SseRelay {
  private pending: Buffer = EMPTY;
  usage: StreamUsage | undefined;
  sawDone = false;
  sawError = false;
  /** Data events forwarded (not counting [DONE]). */
  events = 0;

  /**
   * @param stripUsage remove usage chunks (the client did not ask for them).
   * @param rewriteUsage changes a usage object the client gets, in place (a disaggregated request's cached tokens).
   */
  constructor(
    private readonly stripUsage: boolean,
    private readonly rewriteUsage?: (usage: Record<string, unknown>) => void,
  ) {}

  /** Feeds one upstream chunk; returns the bytes to forward now (possibly empty). */
  push(chunk: Buffer): Buffer {
    const buf = this.pending.length > 0 ? Buffer.concat([this.pending, chunk]) : chunk;
    const end = lastBoundary(buf);
    if (end < 0) {
      this.pending = buf;
      return EMPTY;
    }
    this.pending = end < buf.length ? buf.subarray(end) : EMPTY;
    const complete = end < buf.length ? buf.subarray(0, end) : buf;
    if (complete.includes(DONE)) this.sawDone = true;
    if (complete.includes(ERROR)) this.sawError = true;
    if (!complete.includes(USAGE)) {
      this.events += countEvents(complete);
      return complete;
    }
    return this.rewrite(complete);
  }

  /** What is left when the upstream ends (an unterminated last event), forwarded as is. */
  flush(): Buffer {
    const rest = this.pending;
    this.pending = EMPTY;
    return rest;
  }

  private rewrite(complete: Buffer): Buffer {
    const text = complete.toString('utf8');
    const parts = text.split(/\r?\n\r?\n/);
    const out: string[] = [];
    for (const ev of parts) {
      if (ev.length === 0) continue;
      if (!ev.includes('"usage"')) {
        out.push(ev);
        if (!ev.includes('[DONE]')) this.events++;
        continue;
      }
      const dataAt = ev.indexOf('data:');
      let parsed: Record<string, unknown> | undefined;
      try {
        parsed = dataAt >= 0 ? JSON.parse(ev.slice(dataAt + 5)) : undefined;
      } catch {
        parsed = undefined;
      }
      if (!parsed || typeof parsed !== 'object' || !parsed.usage) {
        out.push(ev);
        this.events++;
        continue;
      }
      this.usage = readUsage(parsed.usage) ?? this.usage;
      if (!this.stripUsage) {
        if (this.rewriteUsage && typeof parsed.usage === 'object') {
          this.rewriteUsage(parsed.usage as Record<string, unknown>);
          out.push(`data: ${JSON.stringify(parsed)}`);
        } else out.push(ev);
        if (Array.isArray(parsed.choices) && parsed.choices.length > 0) this.events++;
        continue;
      }
      // The router's own usage request: drop the usage-only chunk, or the usage field of a chunk with content.
      if (Array.isArray(parsed.choices) && parsed.choices.length === 0) continue;
      delete parsed.usage;
      out.push(`data: ${JSON.stringify(parsed)}`);
      this.events++;
    }
    return out.length === 0 ? EMPTY : Buffer.from(`${out.join('\n\n')}\n\n`);
  }
}

function countEvents(buf: Buffer): number {
  let n = 0;
  let i = buf.indexOf('data:');
  while (i >= 0) {
    n++;
    i = buf.indexOf('data:', i + 5);
  }
  return buf.includes(DONE) ? n - 1 : n;
}
