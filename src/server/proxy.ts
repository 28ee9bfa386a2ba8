/**
 * One attempt of a request on one worker, for every routed API: send the body, then either pass the whole answer
 * through (non-streaming, or an engine's own 4xx) or relay its SSE stream chunk by chunk with backpressure. Reports to
 * the lifecycle what happened: first token, finish (with delivered cached tokens, and the id of a stored answer to
 * pin), or "failed before the engine answered" so the dispatcher can retry elsewhere. From the first byte on, failures
 * are reported in-band, in the API's own stream shape: the status line is gone. The API's adapter says where the usage
 * is and how its stream ends.
 *
 * Two ways to the engine, one behaviour. An attempt on one worker (nearly every request) goes through undici's
 * `dispatch()` with a handler (DirectAttempt): the answer's chunks come to its methods, with no Readable, no promise per
 * body read and no AbortSignal listener in undici; the client leaving aborts the exchange from the response's `close`.
 * A disaggregated decode leg (its request already sent, a resend on 4xx, a leading error to catch, cached tokens to
 * rewrite) keeps `pool.request()` (requestAttempt). Either way a whole answer's usage is read from its tail
 * (answerUsage), not by parsing the whole answer.
 */
import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import type { Dispatcher as UndiciDispatcher } from 'undici';
import type { DispatchAttempt } from '../core/dispatch/dispatcher.ts';
import type { RouteDecision } from '../core/types.ts';
import type { RequestMetrics } from '../metrics/registry.ts';
import type { ApiAdapter, RoutedRequest } from '../apis/index.ts';
import type { LifecyclePort } from '../runtime/lifecycle.ts';
import { answerUsage, SseRelay, rewriteCachedTokens, type StreamUsage } from '../apis/sse.ts';
import { type AttemptTrace, NOOP_ATTEMPT, type RequestTrace } from '../runtime/tracing.ts';
import type { AttemptWorker } from '../runtime/prefill-leg.ts';
import type { AttemptOutcome as FlowOutcome } from '../runtime/request-flow.ts';

/** Hop-by-hop and length headers are the proxy's own business; everything else from the engine passes through. */
const SKIP_RESPONSE_HEADERS = new Set(['connection', 'keep-alive', 'transfer-encoding', 'content-length', 'date', 'server']);

/** How a proxied attempt ended: answered, or failed before answering (the dispatcher may retry it). */
export type AttemptOutcome = Exclude<FlowOutcome, { kind: 'prefill_failed' }>;

export interface AttemptContext {
  readonly lifecycle: LifecyclePort;
  readonly metrics: RequestMetrics;
  readonly log: { warn(o: object, m: string): void };
  /** A streaming client that reads nothing for this long is dropped (0 disables). */
  readonly clientStallTimeoutMs: number;
}

/** What an attempt reads of the parsed request (a small copy: the parsed body need not stay alive for the answer). */
export type AttemptParsed = Pick<RoutedRequest, 'stream' | 'stripUsage' | 'pinsAnswer'>;

export interface AttemptRequest {
  readonly attempt: DispatchAttempt;
  readonly worker: AttemptWorker;
  readonly api: ApiAdapter;
  readonly parsed: AttemptParsed;
  /** The body sent upstream (the client's bytes when nothing was rewritten). */
  readonly body: string | Buffer;
  readonly path: string;
  readonly res: ServerResponse;
  readonly signal: AbortSignal;
  /** performance.now() when the request arrived (TTFT is measured from there). */
  readonly t0: number;
  readonly clientRequestId: string | null;
  readonly tokenizeS: number;
  readonly trace: RequestTrace;
  /** Upstream request headers on top of the defaults (a P/D leg's X-Request-Id). */
  readonly requestHeaders?: Readonly<Record<string, string>>;
  /** The request already sent (a P/D decode leg sent together with its prefill leg). */
  readonly upstream?: Promise<UndiciDispatcher.ResponseData>;
  /** Response headers on top of the defaults (x-kvroute-prefill-worker, the overlap of the cache that served). */
  readonly responseHeaders?: Readonly<Record<string, string>>;
  /** The decision the routing metrics count (the prefill leg of a disaggregated request); default the attempt's. */
  readonly accounted?: RouteDecision;
  /**
   * Rewrite the client's usage.prompt_tokens_details.cached_tokens to this figure (a disaggregated request: the decode
   * engine's count is the transferred KV, not a prefix hit); `null`: the prefill did not say, the field is removed.
   */
  readonly cachedTokensOverride?: number | null;
  /** A stream whose first event is an error failed before answering (a decode leg that could not load its KV). */
  readonly failOnLeadingError?: boolean;
  /** Called once at the first token (per-leg durations). */
  readonly onFirstToken?: () => void;
  /**
   * A 4xx answer the request may be resent after (a TensorRT-LLM leg refused an optional field): given its status and
   * body, the body to send once more, or null to pass the answer on.
   */
  readonly resendOn4xx?: (status: number, text: string) => string | null;
}

export function proxyAttempt(ctx: AttemptContext, a: AttemptRequest): Promise<AttemptOutcome> {
  const at = new Attempt(ctx, a);
  if (a.upstream === undefined && a.resendOn4xx === undefined && a.cachedTokensOverride === undefined && !a.failOnLeadingError) {
    return new DirectAttempt(at).run();
  }
  return requestAttempt(at);
}

/** What every attempt does around its exchange: the upstream headers, the span, and what it tells the lifecycle. */
class Attempt {
  readonly requestId: string;
  readonly decision: RouteDecision;
  /** The upstream request's headers. */
  readonly headers: Record<string, string>;
  readonly span: AttemptTrace;
  private committed = false;
  /** A relayed stream's chunks: none passed on yet, and when the last one was. */
  private firstChunk = true;
  private lastChunk = 0;

  constructor(
    readonly ctx: AttemptContext,
    readonly a: AttemptRequest,
  ) {
    const { attempt, worker } = a;
    this.requestId = attempt.requestId;
    this.decision = attempt.decision;
    const headers: Record<string, string> = {
      'content-type': 'application/json',
      'x-request-id': a.clientRequestId ?? this.requestId,
    };
    if (worker.sourceKeys.length > 1) headers['x-data-parallel-rank'] = String(this.decision.source.dpRank);
    if (a.requestHeaders) Object.assign(headers, a.requestHeaders);
    this.headers = headers;
    // The engine continues the trace under this attempt's span (its traceparent goes in the headers).
    this.span = a.trace.enabled
      ? a.trace.attempt(
          {
            'kvroute.worker': this.decision.sourceKey,
            'kvroute.attempt': attempt.attempt,
            'server.address': worker.url,
            'url.path': a.path,
          },
          headers,
        )
      : NOOP_ATTEMPT;
  }

  /**
   * The routing counts once this attempt is the request's final one (served, or given up by the client); an attempt
   * retried elsewhere never counts, in metrics as in the ledger ('retried').
   */
  commit(): void {
    if (this.committed) return;
    this.committed = true;
    this.ctx.metrics.routed(this.a.accounted ?? this.decision, { tokenize: this.a.tokenizeS });
  }

  /** The client left before an answer was under way. */
  cancelled(): AttemptOutcome {
    this.commit();
    this.ctx.lifecycle.finish(this.requestId, { outcome: 'cancelled' });
    this.span.end('client left');
    return DONE;
  }

  failed(message: string): AttemptOutcome {
    this.span.end(message);
    return { kind: 'failed', message };
  }

  firstToken(): void {
    const { a } = this;
    const now = performance.now();
    this.ctx.lifecycle.firstToken(this.requestId); // prefill load just dropped: queued requests may route now
    a.onFirstToken?.();
    this.ctx.metrics.firstToken(this.decision.sourceKey, (now - a.t0) / 1000);
    if (a.trace.enabled) {
      const at = Date.now();
      a.trace.span('first_token', at, at, { 'kvroute.ttft_s': (now - a.t0) / 1000, 'kvroute.worker': this.decision.sourceKey });
    }
  }

  /** A relayed stream's chunk is about to go to the client: the first token, or the time since the previous chunk. */
  chunkOut(): void {
    const now = performance.now();
    if (this.firstChunk) {
      this.firstChunk = false;
      this.firstToken();
    } else {
      this.ctx.metrics.token(this.decision.sourceKey, (now - this.lastChunk) / 1000);
    }
    this.lastChunk = now;
  }

  /** A whole answer (or an engine's 4xx) is in: counted, finished, and passed on with its length. */
  answerWhole(status: number, upstreamHeaders: IncomingHttpHeaders, body: Buffer): AttemptOutcome {
    const { a } = this;
    this.commit();
    const ok = status === 200;
    let usage: StreamUsage | undefined;
    let buf = body;
    if (ok) {
      ({ usage, body: buf } = answerUsage(a.api, body, a.cachedTokensOverride));
      // Non-streaming answers arrive whole: the first token is not observable apart from the end.
      this.firstToken();
    }
    // A 4xx is the request's fault, not the worker's: the breaker counts it as an answer.
    this.ctx.lifecycle.finish(
      this.requestId,
      { outcome: ok ? 'ok' : 'error', cachedTokens: usage?.cachedTokens, pinKey: this.pinKey(usage) },
      usage?.completionTokens,
    );
    this.span.end(ok ? undefined : `engine answered ${status}`);
    if (!a.res.destroyed) {
      a.res.writeHead(status, this.responseHeaders(upstreamHeaders, 'content-length', String(buf.length)));
      a.res.end(buf);
    }
    return DONE;
  }

  /** How a relayed stream ended: the client left, the engine failed mid-way (in-band error), or it ended. */
  streamEnded(relay: SseRelay, failure: string | null): AttemptOutcome {
    const { a, ctx, requestId } = this;
    if (a.signal.aborted || a.res.destroyed) {
      // The client went away: the upstream was aborted with it; free the load.
      this.commit();
      ctx.lifecycle.finish(requestId, { outcome: 'cancelled', cachedTokens: relay.usage?.cachedTokens });
      this.span.end('client left');
      return DONE;
    }
    if (failure) {
      ctx.log.warn({ requestId, worker: a.worker.id, error: failure }, 'stream failed mid-way');
      ctx.lifecycle.finish(requestId, { outcome: 'error', workerFault: true, cachedTokens: relay.usage?.cachedTokens });
      a.res.end(a.api.streamError(failure));
      this.span.end(failure);
      return DONE;
    }
    const outcome = relay.sawError ? 'error' : 'ok';
    ctx.lifecycle.finish(
      requestId,
      { outcome, cachedTokens: relay.usage?.cachedTokens, pinKey: outcome === 'ok' ? this.pinKey(relay.usage) : undefined },
      relay.usage?.completionTokens,
    );
    a.res.end();
    this.span.end(relay.sawError ? 'the engine reported an error in the stream' : undefined);
    return DONE;
  }

  /**
   * The stream's head: counted from here on, sent in this turn of the event loop. It goes out in one write with
   * whatever else this turn writes (the events and the end that came in the same upstream read): see batchWrites.
   */
  sendStreamHead(upstreamHeaders: IncomingHttpHeaders): void {
    this.commit();
    const { res } = this.a;
    res.writeHead(200, this.responseHeaders(upstreamHeaders, 'cache-control', 'no-cache'));
    batchWrites(res);
    res.flushHeaders();
  }

  /** A new relay of this attempt's stream. */
  relay(): SseRelay {
    const { a } = this;
    const override = a.cachedTokensOverride;
    return new SseRelay(
      a.parsed.stripUsage,
      a.api.dialect,
      override === undefined ? undefined : (usage) => rewriteCachedTokens(usage, override),
    );
  }

  private pinKey(u: StreamUsage | undefined): string | undefined {
    return this.a.parsed.pinsAnswer ? u?.responseId : undefined;
  }

  /** The engine's headers (hop-by-hop ones left out), the routing headers, the caller's extra ones, and one more. */
  private responseHeaders(upstream: IncomingHttpHeaders, key: string, value: string): Record<string, string | string[]> {
    const out: Record<string, string | string[]> = {};
    for (const k in upstream) {
      const v = upstream[k];
      if (v === undefined || SKIP_RESPONSE_HEADERS.has(k)) continue;
      out[k] = v;
    }
    const d = this.decision;
    out['x-kvroute-worker'] = d.sourceKey;
    out['x-kvroute-overlap-blocks'] = String(d.overlapBlocks);
    out['x-kvroute-isl-blocks'] = String(d.islBlocks);
    out['x-kvroute-request-id'] = this.requestId;
    out['x-request-id'] = this.a.clientRequestId ?? this.requestId;
    const extra = this.a.responseHeaders;
    if (extra) for (const k in extra) out[k] = extra[k];
    out[key] = value;
    return out;
  }
}

const DONE: AttemptOutcome = { kind: 'done' };

/**
 * Holds a response's writes until the current callback (the upstream read that brought the head, and the events and
 * end that came with it) has run, then sends them in one write: a stream's head no longer costs a syscall of its own
 * when its first events came with it. node:http already does this for the writes after the head (res.write corks the
 * socket until process.nextTick, res.end flushes); the head flushed alone was the exception. Nothing waits past this
 * turn of the event loop.
 */
function batchWrites(res: ServerResponse): void {
  if (res.writableCorked > 0 || res.destroyed) return;
  res.cork();
  process.nextTick(uncork, res);
}

function uncork(res: ServerResponse): void {
  res.uncork();
}

/** Text kept of an engine's 5xx answer for the failure message. */
const ERROR_TEXT_BYTES = 1024;

/**
 * One attempt through undici's `dispatch()`: this object is the exchange's handler. The answer's head decides its
 * path: a 5xx is read for its message and fails the attempt (retried elsewhere); a whole answer or a 4xx is gathered,
 * then passed on with its length (a failure while reading it is still "failed before answering"); a 200 stream is
 * relayed chunk by chunk, pausing the engine's socket while the client's is full.
 */
class DirectAttempt implements UndiciDispatcher.DispatchHandler {
  private controller: UndiciDispatcher.DispatchController | null = null;
  /** The client left before the answer was finished. */
  private gone = false;
  private settled = false;
  private status = 0;
  private upstreamHeaders: IncomingHttpHeaders = {};
  /** A whole answer's chunks (or a 5xx's first ones). */
  private chunks: Buffer[] = [];
  private size = 0;
  private stream: SseRelay | null = null;
  private stall: NodeJS.Timeout | undefined;
  private resolve: (o: AttemptOutcome) => void = () => {};
  private reject: (err: unknown) => void = () => {};

  constructor(private readonly at: Attempt) {}

  run(): Promise<AttemptOutcome> {
    const { a } = this.at;
    if (a.signal.aborted) return Promise.resolve(this.at.cancelled());
    return new Promise<AttemptOutcome>((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
      a.res.once('close', this.clientClosed);
      a.worker.pool.dispatch({ method: 'POST', path: a.path, headers: this.at.headers, body: a.body }, this);
    });
  }

  /** The client's response closed: unless the answer was finished, the client left and the exchange is aborted. */
  private readonly clientClosed = (): void => {
    clearTimeout(this.stall);
    if (this.settled || this.at.a.res.writableFinished) return;
    this.gone = true;
    this.controller?.abort(new Error('the client left'));
  };

  /** The client's socket took what was buffered: the engine's is read again. */
  private readonly drained = (): void => {
    clearTimeout(this.stall);
    this.controller?.resume();
  };

  onRequestStart(controller: UndiciDispatcher.DispatchController): void {
    this.controller = controller;
    if (this.gone) controller.abort(new Error('the client left'));
  }

  onResponseStart(_c: UndiciDispatcher.DispatchController, statusCode: number, headers: IncomingHttpHeaders): void {
    if (statusCode < 200) return;
    this.status = statusCode;
    this.upstreamHeaders = headers;
    this.at.span.set({ 'http.response.status_code': statusCode });
    if (statusCode === 200 && this.at.a.parsed.stream) {
      // Streaming: headers go out at once; from there on failures are reported in-band.
      this.stream = this.at.relay();
      this.at.sendStreamHead(headers);
    }
  }

  onResponseData(controller: UndiciDispatcher.DispatchController, chunk: Buffer): void {
    const relay = this.stream;
    if (relay === null) {
      if (this.status < 500 || this.size < ERROR_TEXT_BYTES) {
        this.chunks.push(chunk);
        this.size += chunk.length;
      }
      return;
    }
    const out = relay.push(chunk);
    if (out.length === 0) return;
    const at = this.at;
    at.chunkOut();
    const { res } = at.a;
    if (!res.write(out)) {
      // Backpressure: a slow client slows the upstream read instead of growing a buffer here. A client that stops
      // reading altogether would pin the request in the worker's active load: past the stall timeout it is dropped
      // like a disconnect (cancelled, the worker not blamed).
      controller.pause();
      const ms = at.ctx.clientStallTimeoutMs;
      if (ms > 0) this.stall = setTimeout(() => res.destroy(), ms);
      res.once('drain', this.drained);
    }
  }

  onResponseEnd(): void {
    this.settle(() => {
      const { at } = this;
      const relay = this.stream;
      if (relay !== null) {
        const rest = relay.flush();
        const { res } = at.a;
        if (rest.length > 0 && !res.destroyed) res.write(rest);
        const gone = at.a.signal.aborted;
        return at.streamEnded(relay, relay.sawDone || gone ? null : `${at.a.worker.id} closed the stream before its end event`);
      }
      const body = this.chunks.length === 1 ? this.chunks[0] : Buffer.concat(this.chunks, this.size);
      if (this.status >= 500) {
        return at.a.signal.aborted
          ? at.cancelled()
          : at.failed(`${at.a.worker.id} answered ${this.status}: ${body.toString('utf8').slice(0, 200)}`);
      }
      return at.answerWhole(this.status, this.upstreamHeaders, body);
    });
  }

  onResponseError(_c: UndiciDispatcher.DispatchController, err: Error): void {
    this.settle(() => {
      const { at } = this;
      const left = this.gone || at.a.signal.aborted;
      const relay = this.stream;
      if (relay !== null) return at.streamEnded(relay, left ? null : `${at.a.worker.id}: stream failed: ${err.message}`);
      if (left) return at.cancelled();
      if (this.status >= 500) {
        // The 5xx's body failed: its status alone is the message, as an unreadable body gave before.
        return at.failed(`${at.a.worker.id} answered ${this.status}: `);
      }
      return at.failed(this.status > 0 ? `${at.a.worker.id}: body failed: ${err.message}` : `${at.a.worker.id}: ${err.message}`);
    });
  }

  /** Ends the attempt once, with what `end` returns (a throw rejects it: the router's bug, answered as a 500). */
  private settle(end: () => AttemptOutcome): void {
    if (this.settled) return;
    this.settled = true;
    clearTimeout(this.stall);
    // A retried request adds the next attempt's listener: this one's goes.
    this.at.a.res.removeListener('close', this.clientClosed);
    try {
      this.resolve(end());
    } catch (err) {
      this.reject(err);
    }
  }
}

/** An attempt through `pool.request()`: a decode leg already sent, resent after a 4xx, or watched for a leading error. */
async function requestAttempt(at: Attempt): Promise<AttemptOutcome> {
  const { a, ctx } = at;
  const { worker, res, signal } = a;
  let upstream: UndiciDispatcher.ResponseData;
  // A 4xx read to decide on a resend is passed on from here instead of from the (consumed) body.
  let preread: Buffer | undefined;
  try {
    upstream = await (a.upstream ?? worker.pool.request({ method: 'POST', path: a.path, headers: at.headers, body: a.body, signal }));
    if (a.resendOn4xx && upstream.statusCode >= 400 && upstream.statusCode < 500) {
      preread = Buffer.from(await upstream.body.arrayBuffer());
      const again = a.resendOn4xx(upstream.statusCode, preread.toString('utf8'));
      if (again !== null) {
        preread = undefined;
        upstream = await worker.pool.request({ method: 'POST', path: a.path, headers: at.headers, body: again, signal });
      }
    }
  } catch (err) {
    return signal.aborted ? at.cancelled() : at.failed(`${worker.id}: ${(err as Error).message}`);
  }
  at.span.set({ 'http.response.status_code': upstream.statusCode });

  if (upstream.statusCode >= 500) {
    const text = await upstream.body.text().catch(() => '');
    return signal.aborted ? at.cancelled() : at.failed(`${worker.id} answered ${upstream.statusCode}: ${text.slice(0, 200)}`);
  }

  if (upstream.statusCode !== 200 || !a.parsed.stream) {
    // Non-streaming (or an engine error like 400): the answer comes whole; pass it through as is.
    let buf: Buffer;
    try {
      buf = preread ?? Buffer.from(await upstream.body.arrayBuffer());
    } catch (err) {
      return signal.aborted ? at.cancelled() : at.failed(`${worker.id}: body failed: ${(err as Error).message}`);
    }
    return at.answerWhole(upstream.statusCode, upstream.headers, buf);
  }

  // Streaming: headers go out with the first event (at once, unless a leading error event must be caught first); from
  // there on failures are reported in-band.
  const relay = at.relay();
  let headSent = false;
  const sendHead = () => {
    if (headSent) return;
    headSent = true;
    at.sendStreamHead(upstream.headers);
  };
  if (!a.failOnLeadingError) sendHead();
  let failure: string | null = null;
  let leadingError: string | null = null;
  await new Promise<void>((resolve) => {
    const body = upstream.body;
    body.on('data', (chunk: Buffer) => {
      const out = relay.push(chunk);
      if (out.length === 0) return;
      if (!headSent) {
        if (relay.sawError && relay.events <= 1) {
          // Nothing reached the client: the leg failed before answering, and the dispatcher may retry it.
          leadingError = `${worker.id}: error before the first token: ${out.toString('utf8').slice(0, 200)}`;
          body.destroy();
          resolve();
          return;
        }
        sendHead();
      }
      at.chunkOut();
      if (!res.write(out)) {
        // Backpressure, and the stall timeout: as DirectAttempt.
        body.pause();
        const stall = ctx.clientStallTimeoutMs > 0 ? setTimeout(() => res.destroy(), ctx.clientStallTimeoutMs) : undefined;
        res.once('drain', () => {
          clearTimeout(stall);
          body.resume();
        });
        res.once('close', () => clearTimeout(stall));
      }
    });
    body.once('end', () => {
      if (leadingError) return;
      if (!headSent && !signal.aborted) {
        leadingError = `${worker.id} closed the stream before its first event`;
        resolve();
        return;
      }
      const rest = relay.flush();
      if (rest.length > 0 && !res.destroyed) res.write(rest);
      if (!relay.sawDone && !signal.aborted) failure = `${worker.id} closed the stream before its end event`;
      resolve();
    });
    body.once('error', (err: Error) => {
      if (leadingError) return;
      if (!headSent && !signal.aborted) leadingError = `${worker.id}: stream failed before its first event: ${err.message}`;
      else if (!signal.aborted) failure = `${worker.id}: stream failed: ${err.message}`;
      resolve();
    });
  });
  if (leadingError && !signal.aborted) return at.failed(leadingError);
  if ((signal.aborted || res.destroyed) && !upstream.body.destroyed) upstream.body.destroy();
  return at.streamEnded(relay, failure);
}
