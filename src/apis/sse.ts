/**
 * Relays an upstream SSE body to the client event by event, without re-encoding the common case.
 *
 * Complete events (up to the last blank line of what has arrived) are forwarded as soon as they arrive; only a
 * trailing partial event is held until its end comes. Events are parsed only when they mention "usage" (or, for the
 * named-event dialects, their terminal event): the usage is where the engine reports delivered cached tokens. In the
 * OpenAI dialect the usage chunk is removed when the router (not the client) asked for it, so the client sees exactly
 * the stream it asked for.
 *
 * Dialects: how a stream ends, fails and carries usage.
 *   openai      chat/completions chunks; ends with `data: [DONE]`; usage in a chunk (prompt_tokens_details.cached_tokens)
 *   responses   `event: response.*`; ends with response.completed|incomplete|failed; usage in that event's response
 *               (input_tokens_details.cached_tokens); the response id is what a later previous_response_id names
 *   anthropic   `event: message_*`; ends with message_stop; usage in message_start (cache_read_input_tokens) and
 *               message_delta (output_tokens)
 */

export interface StreamUsage {
  promptTokens?: number;
  completionTokens?: number;
  cachedTokens?: number;
  /** The id of the answer the engine produced (a Responses API response id), when the API has one. */
  responseId?: string;
}

export type SseDialect = 'openai' | 'responses' | 'anthropic';

const USAGE = Buffer.from('"usage"');
const DONE = Buffer.from('[DONE]');
const ERROR = Buffer.from('{"error"');
const EMPTY = Buffer.alloc(0);

/** How far from a whole answer's end its usage is looked for (vLLM writes it after the choices, before a few short fields). */
const ANSWER_TAIL_BYTES = 4096;

/** What answerUsage needs of an API's adapter (ApiAdapter in types.ts has both; named here so sse.ts imports nothing of it). */
export interface AnswerReader {
  readAnswer(json: unknown): StreamUsage | undefined;
  readonly answerNeedsWhole?: boolean;
}

/**
 * The usage of a whole JSON answer (as the API's adapter reads it) and the bytes to pass on. An OpenAI-style answer
 * carries its `usage` object near its end: the last `"usage":` key of the answer's last 4 kB is found, its object
 * delimited (strings and nesting honoured) and parsed alone, so reading the usage costs the same for an answer of any
 * size. (The key's quotes cannot come from inside a JSON string, where a quote is escaped.) A disaggregated request's
 * cached tokens (`override`) are rewritten in that object alone: it is serialised again and put back in its place, every
 * other byte of the answer as the engine wrote it. The whole answer is parsed (and, with `override`, serialised again)
 * instead when the adapter needs more than the usage (answerNeedsWhole) or no usage object is in the tail. Not JSON: no
 * usage, the bytes as they are.
 */
export function answerUsage(api: AnswerReader, body: Buffer, override?: number | null): { usage: StreamUsage | undefined; body: Buffer } {
  if (!api.answerNeedsWhole) {
    const tail = tailUsageAt(body);
    if (tail !== undefined) {
      const usage = api.readAnswer({ usage: tail.value });
      if (override === undefined) return { usage, body };
      // An object: its bytes start with `{`.
      rewriteCachedTokens(tail.value as Record<string, unknown>, override);
      const rewritten = Buffer.from(JSON.stringify(tail.value));
      return { usage, body: Buffer.concat([body.subarray(0, tail.start), rewritten, body.subarray(tail.end)]) };
    }
  }
  let usage: StreamUsage | undefined;
  try {
    const answer = JSON.parse(body.toString('utf8')) as { usage?: unknown };
    usage = api.readAnswer(answer);
    if (override !== undefined && answer.usage && typeof answer.usage === 'object') {
      rewriteCachedTokens(answer.usage as Record<string, unknown>, override);
      return { usage, body: Buffer.from(JSON.stringify(answer)) };
    }
  } catch {
    /* not JSON: nothing to learn, still forward it */
  }
  return { usage, body };
}

/** The object after the last `"usage":` key in a buffer's last ANSWER_TAIL_BYTES, parsed; undefined when there is none. */
export function tailUsage(buf: Buffer): unknown {
  return tailUsageAt(buf)?.value;
}

/** tailUsage's object and where its bytes are in the buffer (`start` its `{`, `end` just past its `}`). */
export function tailUsageAt(buf: Buffer): { value: unknown; start: number; end: number } | undefined {
  const at = buf.lastIndexOf(USAGE);
  if (at < 0 || at < buf.length - ANSWER_TAIL_BYTES) return undefined;
  let i = skipSpace(buf, at + USAGE.length);
  if (buf[i] !== 0x3a /* : */) return undefined;
  i = skipSpace(buf, i + 1);
  if (buf[i] !== 0x7b /* { */) return undefined;
  const end = valueEnd(buf, i);
  if (end < 0) return undefined;
  try {
    return { value: JSON.parse(buf.toString('utf8', i, end)), start: i, end };
  } catch {
    return undefined;
  }
}

function skipSpace(buf: Buffer, i: number): number {
  while (i < buf.length && (buf[i] === 0x20 || buf[i] === 0x0a || buf[i] === 0x0d || buf[i] === 0x09)) i++;
  return i;
}

/** The end (exclusive) of the object or array starting at `start`, strings skipped; -1 when it does not close. */
function valueEnd(buf: Buffer, start: number): number {
  let depth = 0;
  for (let i = start; i < buf.length; i++) {
    const c = buf[i];
    if (c === 0x22 /* " */) {
      for (i++; i < buf.length && buf[i] !== 0x22; i++) if (buf[i] === 0x5c /* \ */) i++;
    } else if (c === 0x7b || c === 0x5b) depth++;
    else if (c === 0x7d || c === 0x5d) {
      depth--;
      if (depth === 0) return i + 1;
    }
  }
  return -1;
}

function lastBoundary(buf: Buffer): number {
  // End of the last complete event: after "\n\n" or "\n\r\n" (CRLF streams). -1 when none.
  const a = buf.lastIndexOf('\n\n');
  const b = buf.lastIndexOf('\n\r\n');
  return Math.max(a < 0 ? -1 : a + 2, b < 0 ? -1 : b + 3);
}

/**
 * Sets or removes usage.prompt_tokens_details.cached_tokens in place: a disaggregated request's client is told the
 * prefill's figure (the decode engine's count is the transferred KV, not a prefix hit); null removes it.
 */
export function rewriteCachedTokens(usage: Record<string, unknown>, cached: number | null): void {
  const details = usage.prompt_tokens_details;
  if (cached === null) {
    if (details && typeof details === 'object') delete (details as Record<string, unknown>).cached_tokens;
    return;
  }
  usage.prompt_tokens_details = { ...(details && typeof details === 'object' ? details : {}), cached_tokens: cached };
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

const num = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : undefined);
const obj = (v: unknown) => (v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined);

/** Responses API usage: input_tokens, output_tokens, input_tokens_details.cached_tokens (absent = unknown). */
export function readResponsesUsage(usage: unknown): StreamUsage | undefined {
  const u = obj(usage);
  if (!u) return undefined;
  const details = obj(u.input_tokens_details);
  return {
    promptTokens: num(u.input_tokens),
    completionTokens: num(u.output_tokens),
    cachedTokens: details ? num(details.cached_tokens) : undefined,
  };
}

/**
 * Anthropic usage: input_tokens counts only what was not read from or written to the cache, so the prompt is the sum of
 * the three; cache_read_input_tokens is the delivered reuse (absent = unknown).
 */
export function readAnthropicUsage(usage: unknown): StreamUsage | undefined {
  const u = obj(usage);
  if (!u) return undefined;
  const input = num(u.input_tokens);
  const read = num(u.cache_read_input_tokens);
  const created = num(u.cache_creation_input_tokens);
  return {
    promptTokens: input === undefined ? undefined : input + (read ?? 0) + (created ?? 0),
    completionTokens: num(u.output_tokens),
    cachedTokens: read,
  };
}

function merge(a: StreamUsage | undefined, b: StreamUsage | undefined): StreamUsage | undefined {
  if (!b) return a;
  if (!a) return b;
  return {
    promptTokens: b.promptTokens ?? a.promptTokens,
    completionTokens: b.completionTokens ?? a.completionTokens,
    cachedTokens: b.cachedTokens ?? a.cachedTokens,
    responseId: b.responseId ?? a.responseId,
  };
}

const RESPONSE_END = new Set(['response.completed', 'response.incomplete', 'response.failed']);
const MARKERS: Record<Exclude<SseDialect, 'openai'>, Buffer[]> = {
  responses: ['"usage"', 'response.created', 'response.completed', 'response.incomplete', 'response.failed', '"error"'].map((m) =>
    Buffer.from(m),
  ),
  anthropic: ['"usage"', 'message_stop', '"error"'].map((m) => Buffer.from(m)),
};

export class SseRelay {
  private pending: Buffer = EMPTY;
  usage: StreamUsage | undefined;
  sawDone = false;
  sawError = false;
  /** Data events forwarded (not counting [DONE]). */
  events = 0;

  /**
   * @param stripUsage remove usage chunks (the client did not ask for them; OpenAI dialect only).
   * @param dialect how the stream ends and carries usage.
   * @param rewriteUsage changes a usage object the client gets, in place (a disaggregated request's cached tokens).
   */
  constructor(
    private readonly stripUsage: boolean,
    private readonly dialect: SseDialect = 'openai',
    private readonly rewriteUsage?: (usage: Record<string, unknown>) => void,
  ) {}

  /** Feeds one upstream chunk; returns the bytes to forward now (possibly empty). */
  push(chunk: Buffer): Buffer {
    if (this.dialect !== 'openai') return this.pushNamed(chunk);
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

  /** Named-event dialects: forwarded unchanged; events that may carry usage, an id or the end are read. */
  private pushNamed(chunk: Buffer): Buffer {
    const buf = this.pending.length > 0 ? Buffer.concat([this.pending, chunk]) : chunk;
    const end = lastBoundary(buf);
    if (end < 0) {
      this.pending = buf;
      return EMPTY;
    }
    this.pending = end < buf.length ? buf.subarray(end) : EMPTY;
    const complete = end < buf.length ? buf.subarray(0, end) : buf;
    this.events += countEvents(complete);
    const markers = MARKERS[this.dialect as Exclude<SseDialect, 'openai'>];
    if (markers.some((m) => complete.includes(m))) {
      for (const ev of complete.toString('utf8').split(/\r?\n\r?\n/)) if (ev.length > 0) this.readNamed(ev);
    }
    return complete;
  }

  private readNamed(ev: string): void {
    let type: string | undefined;
    let data = '';
    for (const line of ev.split(/\r?\n/)) {
      if (line.startsWith('event:')) type = line.slice(6).trim();
      else if (line.startsWith('data:')) data += line.slice(5);
    }
    let parsed: Record<string, unknown> | undefined;
    try {
      parsed = obj(JSON.parse(data));
    } catch {
      return;
    }
    if (!parsed) return;
    type ??= typeof parsed.type === 'string' ? parsed.type : undefined;
    if (type === 'error') this.sawError = true;
    if (this.dialect === 'responses') {
      const response = obj(parsed.response);
      if (response) {
        const id = typeof response.id === 'string' ? response.id : undefined;
        this.usage = merge(this.usage, { ...readResponsesUsage(response.usage), responseId: id });
      }
      if (type && RESPONSE_END.has(type)) this.sawDone = true;
      if (type === 'response.failed') this.sawError = true;
      return;
    }
    const message = obj(parsed.message);
    if (type === 'message_start' && message) this.usage = merge(this.usage, readAnthropicUsage(message.usage));
    else if (parsed.usage) {
      // message_delta's usage is cumulative output (and may repeat the input counts); fields it lacks keep theirs.
      this.usage = merge(this.usage, readAnthropicUsage(parsed.usage));
    }
    if (type === 'message_stop') this.sawDone = true;
  }

  /** What is left when the upstream ends (an unterminated last event), forwarded as is. */
  flush(): Buffer {
    const rest = this.pending;
    this.pending = EMPTY;
    return rest;
  }

  /**
   * Complete events of which one or more mention "usage": only those are decoded and parsed; the bytes around them
   * are forwarded as they came. A usage event is kept, rewritten (the client's cached tokens), or stripped (the
   * router's own usage request: the usage-only chunk dropped, a usage field riding on a content chunk removed).
   */
  private rewrite(complete: Buffer): Buffer {
    let parts: Buffer[] | null = null;
    let kept = 0;
    let start = 0;
    let usageAt = complete.indexOf(USAGE);
    while (start < complete.length) {
      const [contentEnd, end] = eventEnd(complete, start);
      if (usageAt < 0 || usageAt >= end) {
        if (contentEnd > start && indexIn(complete, DONE, start, contentEnd) < 0) this.events++;
        start = end;
        continue;
      }
      const replaced = this.usageEvent(complete.toString('utf8', start, contentEnd));
      if (replaced !== null) {
        parts ??= [];
        if (start > kept) parts.push(complete.subarray(kept, start));
        if (replaced.length > 0) parts.push(Buffer.from(replaced));
        kept = end;
      }
      start = end;
      usageAt = complete.indexOf(USAGE, end);
    }
    if (parts === null) return complete;
    if (kept < complete.length) parts.push(complete.subarray(kept));
    return parts.length === 1 ? parts[0] : Buffer.concat(parts);
  }

  /** One event mentioning "usage": its usage read; null to forward it as it came, or its replacement ('' drops it). */
  private usageEvent(ev: string): string | null {
    const dataAt = ev.indexOf('data:');
    let parsed: Record<string, unknown> | undefined;
    try {
      parsed = dataAt >= 0 ? JSON.parse(ev.slice(dataAt + 5)) : undefined;
    } catch {
      parsed = undefined;
    }
    if (!parsed || typeof parsed !== 'object' || !parsed.usage) {
      this.events++;
      return null;
    }
    this.usage = readUsage(parsed.usage) ?? this.usage;
    const withChoices = Array.isArray(parsed.choices) && parsed.choices.length > 0;
    if (!this.stripUsage) {
      if (withChoices) this.events++;
      if (this.rewriteUsage && typeof parsed.usage === 'object') {
        this.rewriteUsage(parsed.usage as Record<string, unknown>);
        return `data: ${JSON.stringify(parsed)}\n\n`;
      }
      return null;
    }
    // The router's own usage request: drop the usage-only chunk, or the usage field of a chunk with content.
    if (Array.isArray(parsed.choices) && parsed.choices.length === 0) return '';
    delete parsed.usage;
    this.events++;
    return `data: ${JSON.stringify(parsed)}\n\n`;
  }
}

/** Where the event starting at `start` ends: [end of its content, end of its blank line]; the buffer's end if none. */
function eventEnd(buf: Buffer, start: number): [number, number] {
  let i = buf.indexOf(0x0a, start);
  while (i >= 0) {
    if (buf[i + 1] === 0x0a) return [i, i + 2];
    if (buf[i + 1] === 0x0d && buf[i + 2] === 0x0a) return [i, i + 3];
    i = buf.indexOf(0x0a, i + 1);
  }
  return [buf.length, buf.length];
}

function indexIn(buf: Buffer, needle: Buffer, from: number, to: number): number {
  const i = buf.indexOf(needle, from);
  return i >= 0 && i + needle.length <= to ? i : -1;
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
