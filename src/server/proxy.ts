/**
 * One attempt of a request on one worker, for every routed API: send the body, then either pass the whole answer
 * through (non-streaming, or an engine's own 4xx) or relay its SSE stream chunk by chunk with backpressure. Reports to
 * the lifecycle what happened: first token, finish (with delivered cached tokens, and the id of a stored answer to
 * pin), or "failed before the engine answered" so the dispatcher can retry elsewhere. From the first byte on, failures
 * are reported in-band, in the API's own stream shape: the status line is gone. The API's adapter says where the usage
 * is and how its stream ends.
 */
import type { ServerResponse } from 'node:http';
import type { Dispatcher as UndiciDispatcher } from 'undici';
import type { DispatchAttempt } from '../core/dispatch/dispatcher.ts';
import type { RouteDecision } from '../core/types.ts';
import type { RequestMetrics } from '../metrics/registry.ts';
import type { ApiAdapter, RoutedRequest } from '../apis/index.ts';
import type { LifecyclePort } from '../runtime/lifecycle.ts';
import { rewriteCachedTokens, SseRelay, type StreamUsage } from '../apis/sse.ts';
import { NOOP_ATTEMPT, type RequestTrace } from '../runtime/tracing.ts';
import type { AttemptWorker } from '../runtime/prefill-leg.ts';
import type { AttemptOutcome as FlowOutcome } from '../runtime/request-flow.ts';

/** Hop-by-hop and length headers are the proxy's own business; everything else from the engine passes through. */
const SKIP_RESPONSE_HEADERS = new Set(['connection', 'keep-alive', 'transfer-encoding', 'content-length', 'date', 'server']);

function copyHeaders(
  upstream: UndiciDispatcher.ResponseData['headers'],
  ours: Readonly<Record<string, string>>,
  extra: Readonly<Record<string, string>> | undefined,
  key: string,
  value: string,
): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const k in upstream) {
    const v = upstream[k];
    if (v === undefined || SKIP_RESPONSE_HEADERS.has(k)) continue;
    out[k] = v;
  }
  for (const k in ours) out[k] = ours[k];
  if (extra) for (const k in extra) out[k] = extra[k];
  out[key] = value;
  return out;
}

/** How a proxied attempt ended: answered, or failed before answering (the dispatcher may retry it). */
export type AttemptOutcome = Exclude<FlowOutcome, { kind: 'prefill_failed' }>;

export interface AttemptContext {
  readonly lifecycle: LifecyclePort;
  readonly metrics: RequestMetrics;
  readonly log: { warn(o: object, m: string): void };
  /** A streaming client that reads nothing for this long is dropped (0 disables). */
  readonly clientStallTimeoutMs: number;
}

export interface AttemptRequest {
  readonly attempt: DispatchAttempt;
  readonly worker: AttemptWorker;
  readonly api: ApiAdapter;
  readonly parsed: RoutedRequest;
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

export async function proxyAttempt(ctx: AttemptContext, a: AttemptRequest): Promise<AttemptOutcome> {
  const { attempt, worker, api, parsed, res, signal, trace } = a;
  const { decision } = attempt;
  const requestId = attempt.requestId;
  const { lifecycle, metrics } = ctx;
  // The routing counts once this attempt is the request's final one (served, or given up by the client); an attempt
  // retried elsewhere never counts, in metrics as in the ledger ('retried').
  let committed = false;
  const commit = () => {
    if (committed) return;
    committed = true;
    metrics.routed(a.accounted ?? decision, { tokenize: a.tokenizeS });
  };
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    'x-request-id': a.clientRequestId ?? requestId,
  };
  if (worker.sourceKeys.length > 1) headers['x-data-parallel-rank'] = String(decision.source.dpRank);
  Object.assign(headers, a.requestHeaders);
  // The engine continues the trace under this attempt's span (its traceparent goes in the headers).
  const span = trace.enabled
    ? trace.attempt(
        { 'kvroute.worker': decision.sourceKey, 'kvroute.attempt': attempt.attempt, 'server.address': worker.url, 'url.path': a.path },
        headers,
      )
    : NOOP_ATTEMPT;
  const cancelled = (): AttemptOutcome => {
    commit();
    lifecycle.finish(requestId, { outcome: 'cancelled' });
    span.end('client left');
    return { kind: 'done' };
  };
  const failed = (message: string): AttemptOutcome => {
    span.end(message);
    return { kind: 'failed', message };
  };
  const pinKey = (u: StreamUsage | undefined) => (parsed.pinsAnswer ? u?.responseId : undefined);
  const firstToken = () => {
    const now = performance.now();
    lifecycle.firstToken(requestId); // prefill load just dropped: queued requests may route now
    a.onFirstToken?.();
    metrics.firstToken(decision.sourceKey, (now - a.t0) / 1000);
    if (trace.enabled) {
      const at = Date.now();
      trace.span('first_token', at, at, { 'kvroute.ttft_s': (now - a.t0) / 1000, 'kvroute.worker': decision.sourceKey });
    }
  };
  const ours: Record<string, string> = {
    'x-kvroute-worker': decision.sourceKey,
    'x-kvroute-overlap-blocks': String(decision.overlapBlocks),
    'x-kvroute-isl-blocks': String(decision.islBlocks),
    'x-kvroute-request-id': requestId,
    'x-request-id': a.clientRequestId ?? requestId,
  };
  const override = a.cachedTokensOverride;
  let upstream: UndiciDispatcher.ResponseData;
  // A 4xx read to decide on a resend is passed on from here instead of from the (consumed) body.
  let preread: Buffer | undefined;
  try {
    upstream = await (a.upstream ?? worker.pool.request({ method: 'POST', path: a.path, headers, body: a.body, signal }));
    if (a.resendOn4xx && upstream.statusCode >= 400 && upstream.statusCode < 500) {
      preread = Buffer.from(await upstream.body.arrayBuffer());
      const again = a.resendOn4xx(upstream.statusCode, preread.toString('utf8'));
      if (again !== null) {
        preread = undefined;
        upstream = await worker.pool.request({ method: 'POST', path: a.path, headers, body: again, signal });
      }
    }
  } catch (err) {
    return signal.aborted ? cancelled() : failed(`${worker.id}: ${(err as Error).message}`);
  }
  span.set({ 'http.response.status_code': upstream.statusCode });

  if (upstream.statusCode >= 500) {
    const text = await upstream.body.text().catch(() => '');
    return signal.aborted ? cancelled() : failed(`${worker.id} answered ${upstream.statusCode}: ${text.slice(0, 200)}`);
  }

  if (upstream.statusCode !== 200 || !parsed.stream) {
    // Non-streaming (or an engine error like 400): the answer comes whole; pass it through as is.
    let buf: Buffer;
    try {
      buf = preread ?? Buffer.from(await upstream.body.arrayBuffer());
    } catch (err) {
      return signal.aborted ? cancelled() : failed(`${worker.id}: body failed: ${(err as Error).message}`);
    }
    commit();
    let usage: StreamUsage | undefined;
    const ok = upstream.statusCode === 200;
    if (ok) {
      try {
        const answer = JSON.parse(buf.toString('utf8')) as { usage?: unknown };
        usage = api.readAnswer(answer);
        if (override !== undefined && answer.usage && typeof answer.usage === 'object') {
          rewriteCachedTokens(answer.usage as Record<string, unknown>, override);
          buf = Buffer.from(JSON.stringify(answer));
        }
      } catch {
        /* not JSON: nothing to learn, still forward it */
      }
      // Non-streaming answers arrive whole: the first token is not observable apart from the end.
      firstToken();
    }
    // A 4xx is the request's fault, not the worker's: the breaker counts it as an answer.
    lifecycle.finish(
      requestId,
      { outcome: ok ? 'ok' : 'error', cachedTokens: usage?.cachedTokens, pinKey: pinKey(usage) },
      usage?.completionTokens,
    );
    span.end(ok ? undefined : `engine answered ${upstream.statusCode}`);
    if (!res.destroyed) {
      res.writeHead(upstream.statusCode, copyHeaders(upstream.headers, ours, a.responseHeaders, 'content-length', String(buf.length)));
      res.end(buf);
    }
    return { kind: 'done' };
  }

  // Streaming: headers go out with the first event (at once, unless a leading error event must be caught first); from
  // there on failures are reported in-band.
  const relay = new SseRelay(
    parsed.stripUsage,
    api.dialect,
    override === undefined ? undefined : (usage) => rewriteCachedTokens(usage, override),
  );
  let headSent = false;
  const sendHead = () => {
    if (headSent) return;
    headSent = true;
    commit();
    res.writeHead(200, copyHeaders(upstream.headers, ours, a.responseHeaders, 'cache-control', 'no-cache'));
    res.flushHeaders();
  };
  if (!a.failOnLeadingError) sendHead();
  let first = true;
  let last = 0;
  let failure: string | null = null;
  let leadingError: string | null = null;
  // 'data' events rather than an async iterator: one promise less per chunk on the hottest path of the proxy.
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
      const tNow = performance.now();
      if (first) {
        first = false;
        firstToken();
      } else {
        metrics.token(decision.sourceKey, (tNow - last) / 1000);
      }
      last = tNow;
      if (!res.write(out)) {
        // Backpressure: a slow client slows the upstream read instead of growing a buffer here. A client that stops
        // reading altogether would pin the request in the worker's active load: past the stall timeout it is dropped
        // like a disconnect (cancelled, the worker not blamed).
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
  if (leadingError && !signal.aborted) return failed(leadingError);
  if (signal.aborted || res.destroyed) {
    // The client went away: the upstream was aborted with it; free the load.
    commit();
    if (!upstream.body.destroyed) upstream.body.destroy();
    lifecycle.finish(requestId, { outcome: 'cancelled', cachedTokens: relay.usage?.cachedTokens });
    span.end('client left');
    return { kind: 'done' };
  }
  if (failure) {
    ctx.log.warn({ requestId, worker: worker.id, error: failure }, 'stream failed mid-way');
    lifecycle.finish(requestId, { outcome: 'error', workerFault: true, cachedTokens: relay.usage?.cachedTokens });
    res.end(api.streamError(failure));
    span.end(failure);
    return { kind: 'done' };
  }
  const outcome = relay.sawError ? 'error' : 'ok';
  lifecycle.finish(
    requestId,
    { outcome, cachedTokens: relay.usage?.cachedTokens, pinKey: outcome === 'ok' ? pinKey(relay.usage) : undefined },
    relay.usage?.completionTokens,
  );
  res.end();
  span.end(relay.sawError ? 'the engine reported an error in the stream' : undefined);
  return { kind: 'done' };
}
