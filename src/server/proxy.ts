/**
 * One attempt of a request on one worker: send the body, then either pass the whole answer through (non-streaming, or
 * an engine's own 4xx) or relay its SSE stream chunk by chunk with backpressure. Reports to the lifecycle what happened:
 * first token, finish (with delivered cached tokens), or "failed before the engine answered" so the dispatcher can
 * retry elsewhere. From the first byte on, failures are reported in-band: the status line is gone.
 */
import type { ServerResponse } from 'node:http';
import type { Dispatcher as UndiciDispatcher } from 'undici';
import type { DispatchAttempt } from '../core/dispatch/dispatcher.ts';
import { sseErrorFrame } from '../http/errors.ts';
import type { RouterMetrics } from '../metrics/registry.ts';
import type { Lifecycle } from './lifecycle.ts';
import type { ParsedRequest } from '../openai/request.ts';
import { readUsage, SseRelay } from './sse.ts';
import type { Worker } from './workers.ts';

/** Hop-by-hop and length headers are the proxy's own business; everything else from the engine passes through. */
const SKIP_RESPONSE_HEADERS = new Set(['connection', 'keep-alive', 'transfer-encoding', 'content-length', 'date', 'server']);

function copyHeaders(upstream: UndiciDispatcher.ResponseData['headers'], extra: Record<string, string>): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(upstream)) {
    if (v === undefined || SKIP_RESPONSE_HEADERS.has(k)) continue;
    out[k] = v;
  }
  return { ...out, ...extra };
}

export type AttemptOutcome = { readonly kind: 'done' } | { readonly kind: 'failed'; readonly message: string };

export interface AttemptContext {
  readonly lifecycle: Lifecycle;
  readonly metrics: RouterMetrics;
  readonly log: { warn(o: object, m: string): void };
  /** A streaming client that reads nothing for this long is dropped (0 disables). */
  readonly clientStallTimeoutMs: number;
}

export interface AttemptRequest {
  readonly attempt: DispatchAttempt;
  readonly worker: Worker;
  readonly parsed: ParsedRequest;
  readonly body: string;
  readonly path: string;
  readonly res: ServerResponse;
  readonly signal: AbortSignal;
  /** performance.now() when the request arrived (TTFT is measured from there). */
  readonly t0: number;
  readonly clientRequestId: string | null;
  readonly tokenizeS: number;
}

export async function proxyAttempt(ctx: AttemptContext, a: AttemptRequest): Promise<AttemptOutcome> {
  const { attempt, worker, parsed, res, signal } = a;
  const { decision } = attempt;
  const requestId = attempt.requestId;
  const { lifecycle, metrics } = ctx;
  // The routing counts once this attempt is the request's final one (served, or given up by the client); an attempt
  // retried elsewhere never counts, in metrics as in the ledger ('retried').
  let committed = false;
  const commit = () => {
    if (committed) return;
    committed = true;
    metrics.routed(decision, { tokenize: a.tokenizeS });
  };
  const cancelled = (): AttemptOutcome => {
    commit();
    lifecycle.finish(requestId, { outcome: 'cancelled' });
    return { kind: 'done' };
  };
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    'x-request-id': a.clientRequestId ?? requestId,
  };
  if (worker.sourceKeys.length > 1) headers['x-data-parallel-rank'] = String(decision.source.dpRank);
  const ours = {
    'x-kvroute-worker': decision.sourceKey,
    'x-kvroute-overlap-blocks': String(decision.overlapBlocks),
    'x-kvroute-isl-blocks': String(decision.islBlocks),
    'x-kvroute-request-id': requestId,
    'x-request-id': a.clientRequestId ?? requestId,
  };
  let upstream: UndiciDispatcher.ResponseData;
  try {
    upstream = await worker.pool.request({ method: 'POST', path: a.path, headers, body: a.body, signal });
  } catch (err) {
    return signal.aborted ? cancelled() : { kind: 'failed', message: `${worker.id}: ${(err as Error).message}` };
  }

  if (upstream.statusCode >= 500) {
    const text = await upstream.body.text().catch(() => '');
    return signal.aborted
      ? cancelled()
      : { kind: 'failed', message: `${worker.id} answered ${upstream.statusCode}: ${text.slice(0, 200)}` };
  }

  if (upstream.statusCode !== 200 || !parsed.stream) {
    // Non-streaming (or an engine error like 400): the answer comes whole; pass it through as is.
    let buf: Buffer;
    try {
      buf = Buffer.from(await upstream.body.arrayBuffer());
    } catch (err) {
      return signal.aborted ? cancelled() : { kind: 'failed', message: `${worker.id}: body failed: ${(err as Error).message}` };
    }
    commit();
    let cachedTokens: number | undefined;
    let outputTokens: number | undefined;
    const ok = upstream.statusCode === 200;
    if (ok) {
      try {
        const usage = readUsage((JSON.parse(buf.toString('utf8')) as { usage?: unknown }).usage);
        cachedTokens = usage?.cachedTokens;
        outputTokens = usage?.completionTokens;
      } catch {
        /* not JSON: nothing to learn, still forward it */
      }
      // Non-streaming answers arrive whole: the first token is not observable apart from the end.
      lifecycle.firstToken(requestId);
      metrics.firstToken(decision.sourceKey, (performance.now() - a.t0) / 1000);
    }
    // A 4xx is the request's fault, not the worker's: the breaker counts it as an answer.
    lifecycle.finish(requestId, { outcome: ok ? 'ok' : 'error', cachedTokens }, outputTokens);
    if (!res.destroyed) {
      res.writeHead(upstream.statusCode, copyHeaders(upstream.headers, { ...ours, 'content-length': String(buf.length) }));
      res.end(buf);
    }
    return { kind: 'done' };
  }

  // Streaming: headers go out now; from here on failures are reported in-band.
  commit();
  res.writeHead(200, copyHeaders(upstream.headers, { ...ours, 'cache-control': 'no-cache' }));
  res.flushHeaders();
  const relay = new SseRelay(!parsed.clientWantsUsage);
  let first = true;
  let last = 0;
  let failure: string | null = null;
  // 'data' events rather than an async iterator: one promise less per chunk on the hottest path of the proxy.
  await new Promise<void>((resolve) => {
    const body = upstream.body;
    body.on('data', (chunk: Buffer) => {
      const out = relay.push(chunk);
      if (out.length === 0) return;
      const tNow = performance.now();
      if (first) {
        first = false;
        lifecycle.firstToken(requestId); // prefill load just dropped: queued requests may route now
        metrics.firstToken(decision.sourceKey, (tNow - a.t0) / 1000);
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
      const rest = relay.flush();
      if (rest.length > 0 && !res.destroyed) res.write(rest);
      if (!relay.sawDone && !signal.aborted) failure = `${worker.id} closed the stream before [DONE]`;
      resolve();
    });
    body.once('error', (err: Error) => {
      if (!signal.aborted) failure = `${worker.id}: stream failed: ${err.message}`;
      resolve();
    });
  });
  if (signal.aborted || res.destroyed) {
    // The client went away: the upstream was aborted with it; free the load.
    if (!upstream.body.destroyed) upstream.body.destroy();
    lifecycle.finish(requestId, { outcome: 'cancelled', cachedTokens: relay.usage?.cachedTokens });
    return { kind: 'done' };
  }
  if (failure) {
    ctx.log.warn({ requestId, worker: worker.id, error: failure }, 'stream failed mid-way');
    lifecycle.finish(requestId, { outcome: 'error', workerFault: true, cachedTokens: relay.usage?.cachedTokens });
    res.end(sseErrorFrame(failure, 'stream_failed'));
    return { kind: 'done' };
  }
  lifecycle.finish(
    requestId,
    { outcome: relay.sawError ? 'error' : 'ok', cachedTokens: relay.usage?.cachedTokens },
    relay.usage?.completionTokens,
  );
  res.end();
  return { kind: 'done' };
}
