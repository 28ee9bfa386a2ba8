/**
 * One ext_proc stream = one HTTP request through the gateway, as the Endpoint Picker Protocol runs it with
 * FULL_DUPLEX_STREAMED bodies:
 *
 *   request_headers            kept (path, session and tenant headers); the subset hint read from metadata_context;
 *                              the picker's own bound on its wait (--decision-timeout-ms) starts
 *   request_body chunks        gathered (within --body-limit) until end_of_stream or the trailers; nothing is
 *                              answered before
 *   end of the request body    parse (the same adapters as serve) -> tokenize -> the core dispatcher (the same
 *                              submit, queue, refusals; a P/D decision runs its prefill leg here) -> the headers
 *                              response: x-gateway-destination-endpoint (pick, then fallbacks) and the same value in
 *                              dynamic_metadata envoy.lb, then the body streamed back in chunks of at most 62,000
 *                              bytes (the body serve would send: usage asked for in streams; or the decode leg's),
 *                              then the trailers answer when the proxy sent trailers
 *                              | an immediate response (400, 413, 404, 429, 503, ...) in OpenAI's error shape
 *   response_headers           the endpoint that served (metadata_context envoy.lb); the routing is counted
 *   response_body chunks       passed back as serve passes them to its client: the usage chunk the client did not ask
 *                              for removed, a disaggregated request's cached_tokens the prefill's; watched for the
 *                              first token and the usage (SSE or JSON)
 *   end of the response        finish (delivered cached tokens to the ledger, load freed); a stream that ends
 *                              earlier finishes the request as cancelled (a queued one leaves the queue)
 *
 * Every decision is the dispatcher's; this module turns its effects into ext_proc messages (the wire answers
 * themselves: wire.ts).
 */
import type { DispatchAttempt } from '../core/dispatch/dispatcher.ts';
import { parseSourceKey, type RouteDecision } from '../core/types.ts';
import { tooLarge } from '../http/body.ts';
import { errorBody, HttpError } from '../http/errors.ts';
import type { EppMetrics, EppResult } from '../metrics/epp.ts';
import { type ApiAdapter, ROUTED_PATHS, type RoutedRequest } from '../apis/index.ts';
import { rewriteCachedTokens, SseRelay, type StreamUsage } from '../apis/sse.ts';
import type { RouterCore } from '../runtime/compose.ts';
import { prefillLeg } from '../runtime/prefill-leg.ts';
import { DROPPED_REASON_HEADER, pickerRefusalError } from '../runtime/refusals.ts';
import { type AttemptOutcome, type FlowContext, type FlowResult, runRequest, type SubmittedRequest } from '../runtime/request-flow.ts';
import type { Security } from '../runtime/security/index.ts';
import type { Worker } from '../runtime/workers.ts';
import {
  DESTINATION_HEADER,
  LB_NAMESPACE,
  metadataField,
  namespacedStrings,
  type ProcessingRequest,
  type ProcessingResponse,
  readHeaders,
  SERVED_KEY,
  SUBSET_KEY,
  SUBSET_NAMESPACE,
  setHeaders,
  valueStrings,
} from './protocol.ts';
import { bodyResponses, type Direction, trailersResponse } from './wire.ts';
/** Envoy's ProcessingMode.BodySendMode. */
const FULL_DUPLEX_STREAMED = 4;
const NONE = 0;

export interface EppContext {
  readonly core: RouterCore;
  readonly metrics: EppMetrics;
  readonly guard: Pick<Security, 'tenantOf'>;
  readonly sessionHeaders: readonly string[];
  readonly nextRequestId: () => string;
  /** Fallback endpoints listed after the pick (at most). */
  readonly fallbacks: number;
  /** Longest wait from the request headers to the picker's answer; past it, an immediate 503. */
  readonly decisionTimeoutMs: number;
}

/** A peer that broke the protocol: the stream ends with INVALID_ARGUMENT (the process goes on). */
export class ProtocolError extends Error {}

/** `host:port` of a worker, as a gateway names its endpoints. */
export function endpointOf(w: Pick<Worker, 'url'>): string {
  const u = new URL(w.url);
  const port = u.port || (u.protocol === 'https:' ? '443' : '80');
  return `${u.hostname}:${port}`.toLowerCase();
}

/** The request in flight after the pick: what the response path needs. */
interface Flight {
  requestId: string;
  attempt: DispatchAttempt;
  /** The decision the routing metrics count (a disaggregated request's prefill leg). */
  accounted: RouteDecision;
  endpoint: string;
  api: ApiAdapter;
  /** The answer's id names state the engine stores (a stored response): pinned to the worker that served. */
  pinsAnswer: boolean;
  stream: boolean;
  /** The router asked for the usage chunk, the client did not: it is removed from the answer (as serve does). */
  stripUsage: boolean;
  /**
   * A disaggregated request: the client's cached_tokens become the prefill's figure (null: the prefill did not say,
   * the field is removed), as serve reports them; undefined for an aggregated request.
   */
  cachedOverride?: { value: number | null };
  /** The answer is held whole to be rewritten (a disaggregated JSON answer): the response headers wait for it. */
  holdAnswer: boolean;
  t0: number;
  tokenizeS: number;
  /** Tracked by the dispatcher until finished (false once finished, or when the proxy served it where it cannot be counted). */
  tracked: boolean;
  committed: boolean;
  sawServed: boolean;
  status?: number;
  relay?: SseRelay;
  json?: Buffer[];
  jsonBytes: number;
  firstAt?: number;
  lastAt: number;
}

type Phase = 'request_headers' | 'request_body' | 'routing' | 'answered' | 'response' | 'done';

export class Exchange {
  private phase: Phase = 'request_headers';
  private headers = new Map<string, string>();
  private readonly chunks: Buffer[] = [];
  private bytes = 0;
  private subset: Set<string> | undefined;
  private readonly abort = new AbortController();
  private flight: Flight | null = null;
  private requestBodyMode: number | undefined;
  private responseBodyMode: number | undefined;
  private result: EppResult | null = null;
  /** The proxy streams the request body (the headers did not end the request): it waits for the body back. */
  private bodyStreamed = false;
  /** The request body ended with trailers: the last chunk back does not end the stream, a trailers answer does. */
  private requestTrailers = false;
  /** The picker's bound on its wait for a decision (from the request headers to the answer). */
  private decisionTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly ctx: EppContext,
    private readonly send: (msg: ProcessingResponse) => void,
    /** Ends the stream from our side (after an immediate response). */
    private readonly end: () => void,
  ) {}

  /** One message from the proxy. Throws ProtocolError when it makes no sense at this point of the exchange. */
  async handle(msg: ProcessingRequest): Promise<void> {
    if (!msg || typeof msg !== 'object') throw new ProtocolError('empty ProcessingRequest');
    const cfg = (msg as { protocol_config?: { request_body_mode?: number; response_body_mode?: number } }).protocol_config;
    if (cfg) {
      this.requestBodyMode = cfg.request_body_mode ?? NONE;
      this.responseBodyMode = cfg.response_body_mode ?? NONE;
      for (const [what, mode] of [
        ['request', this.requestBodyMode],
        ['response', this.responseBodyMode],
      ] as const) {
        if (mode !== NONE && mode !== FULL_DUPLEX_STREAMED) {
          throw new ProtocolError(`${what} bodies in mode ${mode}: the endpoint picker needs FULL_DUPLEX_STREAMED (4) or NONE (0)`);
        }
      }
    }
    switch (msg.request) {
      case 'request_headers':
        return this.onRequestHeaders(msg);
      case 'request_body':
        return this.onRequestBody(msg);
      case 'request_trailers':
        if (this.phase !== 'request_body') throw new ProtocolError('request trailers before the headers or after the end of the body');
        this.requestTrailers = true;
        return this.route(); // trailers end the request body
      case 'response_headers':
        return this.onResponseHeaders(msg);
      case 'response_body':
        return this.onResponseBody(msg);
      case 'response_trailers':
        return this.onResponseTrailers();
      default:
        throw new ProtocolError('a ProcessingRequest without any of request_headers, request_body, response_headers, ...');
    }
  }

  /** The stream is over (ended, cancelled or broken): nothing may stay counted as in flight. */
  close(): void {
    this.stopDecisionTimer();
    this.abort.abort();
    const f = this.flight;
    if (f?.tracked) {
      this.commit(f);
      f.tracked = false;
      this.ctx.core.lifecycle.finish(f.requestId, { outcome: 'cancelled', cachedTokens: f.relay?.usage?.cachedTokens });
    }
    if (this.result === null) this.count('cancelled');
    this.phase = 'done';
  }

  /** The stream broke the protocol: counted, then closed like any other. */
  protocolError(): void {
    if (this.result === null) this.count('protocol_error');
    this.close();
  }

  // ---------------------------------------------------------------------------------------------- request path

  private onRequestHeaders(msg: ProcessingRequest): Promise<void> | undefined {
    if (this.phase !== 'request_headers') throw new ProtocolError('request headers twice');
    const h = msg.request_headers ?? {};
    this.headers = readHeaders(h.headers);
    const hint = valueStrings(metadataField(msg.metadata_context, SUBSET_NAMESPACE, SUBSET_KEY));
    if (hint !== undefined) this.subset = new Set(hint.map((e) => e.toLowerCase()));
    this.phase = 'request_body';
    this.startDecisionTimer();
    // No body follows: the request ended with its headers, or the proxy was configured to send none.
    if (h.end_of_stream || this.requestBodyMode === NONE) return this.route();
    this.bodyStreamed = true;
    return undefined;
  }

  /**
   * Envoy fails a request whose ext_proc answer takes longer than its message_timeout; the picker answers first, with
   * a clear 503, and gives the request up (it leaves the queue, a prefill leg is aborted).
   */
  private startDecisionTimer(): void {
    const ms = this.ctx.decisionTimeoutMs;
    this.decisionTimer = setTimeout(() => {
      this.decisionTimer = undefined;
      if (this.phase !== 'request_body' && this.phase !== 'routing') return;
      this.abort.abort();
      this.ctx.core.log.warn({ decisionTimeoutMs: ms }, 'no decision within --decision-timeout-ms: answered 503');
      const err = new HttpError(
        503,
        `the endpoint picker could not decide within ${ms} ms (--decision-timeout-ms)`,
        'service_unavailable',
        'request_timeout',
        null,
        { 'retry-after': '1', [DROPPED_REASON_HEADER]: 'rejected-ttl-expired' },
      );
      this.immediate(err, 'timed_out');
    }, ms);
    this.decisionTimer.unref();
  }

  private stopDecisionTimer(): void {
    if (this.decisionTimer) clearTimeout(this.decisionTimer);
    this.decisionTimer = undefined;
  }

  private onRequestBody(msg: ProcessingRequest): Promise<void> | undefined {
    if (this.phase !== 'request_body')
      throw new ProtocolError(
        `a request body chunk ${this.phase === 'request_headers' ? 'before the headers' : 'after the end of the body'}`,
      );
    const b = msg.request_body ?? {};
    const chunk = b.body ?? Buffer.alloc(0);
    this.bytes += chunk.length;
    if (this.bytes > this.ctx.core.config.bodyLimitBytes) {
      this.phase = 'done';
      this.immediate(tooLarge(this.ctx.core.config.bodyLimitBytes), 'bad_request');
      return undefined;
    }
    if (chunk.length > 0) this.chunks.push(chunk);
    if (b.end_of_stream) return this.route();
    return undefined;
  }

  private async route(): Promise<void> {
    this.phase = 'routing';
    const { core } = this.ctx;
    const path = (this.headers.get(':path') ?? '/').split('?')[0];
    const method = (this.headers.get(':method') ?? 'POST').toUpperCase();
    const api = method === 'POST' ? ROUTED_PATHS.get(path) : undefined;
    const body = Buffer.concat(this.chunks);
    if (!api) return this.passthrough(body);
    core.metrics.apiRequest(api.name);
    let result: FlowResult;
    try {
      result = await runRequest(
        this.flowContext(),
        {
          api,
          body,
          headers: Object.fromEntries(this.headers),
          signal: this.abort.signal,
          ...(this.subset ? { subset: this.sourcesOf(this.subset) } : {}),
        },
        { send: (attempt, worker, prefillWorker, request) => this.sendAttempt(attempt, worker, prefillWorker, request, path, body) },
      );
    } catch (err) {
      if (err instanceof HttpError) return this.immediate(err, 'bad_request');
      throw err;
    }
    if (result.kind === 'refused') this.immediate(pickerRefusalError(result.refusal, core.config), 'refused');
  }

  /** The composition as the request flow sees it: the same core, tokenizer and lifecycle as serve's. */
  private flowContext(): FlowContext<Worker> {
    const { core } = this.ctx;
    return {
      config: core.config,
      log: core.log,
      precheck: (model) => core.dispatcher.precheck(model, Date.now()),
      tokenizer: core.tokenizer,
      remote: core.remote,
      tokenizingWorker: core.tokenizingWorker,
      lifecycle: core.lifecycle,
      workers: core.workers,
      metrics: core.metrics,
      guard: this.ctx.guard,
      sessionHeaders: this.ctx.sessionHeaders,
      nextRequestId: this.ctx.nextRequestId,
    };
  }

  /**
   * The picker's "send this attempt": name the endpoint to the gateway (its proxy sends the body there). A disaggregated
   * attempt's prefill leg is sent from here first; the decode leg is the body the gateway sends.
   */
  private async sendAttempt(
    attempt: DispatchAttempt,
    worker: Worker,
    prefillWorker: Worker | undefined,
    r: SubmittedRequest,
    path: string,
    body: Buffer,
  ): Promise<AttemptOutcome> {
    const { core } = this.ctx;
    const { requestId, tokenizeS } = r;
    if (this.abort.signal.aborted) {
      // The stream ended between the dispatcher's decision and now: the attempt is given up, as serve gives up one
      // whose client left (counted where it was routed, finished as cancelled).
      core.metrics.routed(attempt.prefill?.decision ?? attempt.decision, { tokenize: tokenizeS });
      core.lifecycle.finish(requestId, { outcome: 'cancelled' });
      return { kind: 'done' };
    }
    // The body serve would send (the usage asked for in a stream, kvroute's own field removed): the same ledger.
    // (Only where the picker sees the answer: a proxy that sends no response body gets the client's own.)
    const aggregated = this.responseBodyMode === NONE ? r.text : r.parsed.upstreamBody(r.text);
    let upstream = aggregated === r.text ? body : Buffer.from(aggregated, 'utf8');
    let extra: Record<string, string> = {};
    let accounted = attempt.decision;
    let cachedOverride: { value: number | null } | undefined;
    if (attempt.prefill && prefillWorker) {
      const leg = await prefillLeg(core, {
        attempt,
        prefillWorker,
        decodeWorker: worker,
        clientJson: r.json,
        clientText: r.text,
        path,
        stream: r.parsed.stream,
        signal: this.abort.signal,
      });
      if (this.abort.signal.aborted) {
        core.metrics.routed(attempt.prefill.decision, { tokenize: tokenizeS });
        core.lifecycle.finish(requestId, { outcome: 'cancelled' });
        return { kind: 'done' };
      }
      if (leg.kind === 'failed') return { kind: 'prefill_failed', message: leg.message };
      accounted = attempt.prefill.decision;
      if (leg.kind === 'client_error') {
        // The engine refused the request itself (the decode side would too): its answer is the client's.
        core.metrics.routed(accounted, { tokenize: tokenizeS });
        core.lifecycle.finish(requestId, { outcome: 'error' });
        this.immediateRaw(leg.status, leg.text, 'routed');
        return { kind: 'done' };
      }
      if (leg.kind === 'finished') {
        // The prefill answer already finished the request (TensorRT-LLM: its first token ended it): no decode leg.
        core.metrics.routed(accounted, { tokenize: tokenizeS });
        core.lifecycle.prefillDone(requestId, leg.report);
        core.lifecycle.finish(requestId, { outcome: 'ok', cachedTokens: leg.report.cachedTokens });
        this.sendImmediate(200, leg.body, { 'content-type': leg.contentType }, 'prefill_finished', 'routed');
        return { kind: 'done' };
      }
      if (leg.report) core.lifecycle.prefillDone(requestId, leg.report);
      // The client is told the prefill's cached tokens, as serve tells it (known once the prefill answered).
      const override = { value: leg.report?.cachedTokens ?? null };
      cachedOverride = override;
      leg.answered?.then((a) => {
        if ('failed' in a) core.log.warn({ requestId, worker: prefillWorker.id, error: a.failed }, 'SGLang prefill leg failed');
        else {
          override.value = a.cachedTokens ?? null;
          core.lifecycle.prefillDone(requestId, a);
        }
      });
      upstream = Buffer.from(leg.decodeBody, 'utf8');
      extra = { 'x-request-id': leg.pairId, 'x-kvroute-prefill-worker': attempt.prefill.decision.sourceKey };
    }
    this.answer(attempt, worker, accounted, r.api, r.parsed, upstream, upstream !== body, extra, tokenizeS, cachedOverride);
    return { kind: 'done' };
  }

  /** Paths that are not routed (GET /v1/models, /tokenize, ...): the fewest requests in flight, nothing counted. */
  private passthrough(body: Buffer): void {
    const { core } = this.ctx;
    const target = core.dispatcher.passthroughTarget(null, Date.now(), this.subset ? this.sourcesOf(this.subset) : undefined);
    if ('code' in target) {
      this.immediate(pickerRefusalError(target, core.config), 'refused');
      return;
    }
    const worker = core.workers.get(target.workerId)!;
    this.sendPick([endpointOf(worker)], {}, body, false);
    this.count('passthrough');
    this.phase = 'answered';
  }

  private answer(
    attempt: DispatchAttempt,
    worker: Worker,
    accounted: RouteDecision,
    api: ApiAdapter,
    parsed: RoutedRequest,
    body: Buffer,
    changed: boolean,
    extra: Record<string, string>,
    tokenizeS: number,
    cachedOverride: { value: number | null } | undefined,
  ): void {
    const { core } = this.ctx;
    const d = attempt.decision;
    const endpoint = endpointOf(worker);
    const endpoints = [endpoint, ...this.fallbacks(d, endpoint)];
    const headers: Record<string, string> = {
      'x-kvroute-worker': d.sourceKey,
      'x-kvroute-request-id': attempt.requestId,
      'x-kvroute-overlap-blocks': String(accounted.overlapBlocks),
      'x-kvroute-isl-blocks': String(d.islBlocks),
      ...extra,
    };
    if (worker.sourceKeys.length > 1) headers['x-data-parallel-rank'] = String(d.source.dpRank);
    if (changed) headers['content-length'] = String(body.length);
    this.flight = {
      requestId: attempt.requestId,
      attempt,
      accounted,
      endpoint,
      api,
      pinsAnswer: parsed.pinsAnswer,
      stream: parsed.stream,
      stripUsage: parsed.stripUsage,
      cachedOverride,
      holdAnswer: false,
      t0: performance.now(),
      tokenizeS,
      tracked: true,
      committed: false,
      sawServed: false,
      jsonBytes: 0,
      lastAt: 0,
    };
    core.events.routed(d.sourceKey);
    core.log.debug(
      { requestId: attempt.requestId, worker: d.sourceKey, endpoints, overlapBlocks: d.overlapBlocks, islBlocks: d.islBlocks },
      'picked',
    );
    this.sendPick(endpoints, headers, body, changed);
    this.count('routed');
    this.phase = 'answered';
  }

  /**
   * The headers response naming the endpoints (header and envoy.lb metadata, one value), then the body streamed back
   * (whenever the proxy streamed one, even empty: it waits for the body's end), then the trailers answer.
   */
  private sendPick(endpoints: readonly string[], headers: Record<string, string>, body: Buffer, changed: boolean): void {
    this.stopDecisionTimer();
    const value = endpoints.join(',');
    this.send({
      request_headers: {
        response: { header_mutation: setHeaders({ [DESTINATION_HEADER]: value, ...headers }), clear_route_cache: true },
      },
      dynamic_metadata: namespacedStrings(LB_NAMESPACE, { [DESTINATION_HEADER]: value }),
    });
    // No body: the request ended with its headers, or the proxy sends none (protocol_config said so).
    const streamed = changed || (this.bodyStreamed && this.requestBodyMode !== NONE);
    // Trailers straight after the headers: there was no body message to answer.
    const noBodyMessage = this.requestTrailers && this.bytes === 0 && !changed;
    if (streamed && !noBodyMessage) for (const m of bodyResponses('request', body, !this.requestTrailers)) this.send(m);
    if (this.requestTrailers) this.send(trailersResponse('request'));
  }

  /** Endpoints after the pick, best first (the policy's order of the other candidates), one per worker. */
  private fallbacks(d: RouteDecision, primary: string): string[] {
    const { core } = this.ctx;
    const out: string[] = [];
    const seen = new Set([primary]);
    for (const c of d.candidates) {
      if (out.length >= this.ctx.fallbacks) break;
      const w = core.workers.get(parseSourceKey(c.source).workerId);
      if (!w) continue;
      const e = endpointOf(w);
      if (seen.has(e)) continue;
      seen.add(e);
      out.push(e);
    }
    return out;
  }

  /** The source keys of the workers behind the given endpoints. */
  private sourcesOf(endpoints: ReadonlySet<string>): Set<string> {
    const keys = new Set<string>();
    for (const w of this.ctx.core.workers.list()) if (endpoints.has(endpointOf(w))) for (const k of w.sourceKeys) keys.add(k);
    return keys;
  }

  private immediate(err: HttpError, result: EppResult): void {
    const body = errorBody(err.message, err.type, err.code, err.param);
    this.sendImmediate(err.status, body, { ...err.headers }, String(err.code), result);
  }

  private immediateRaw(status: number, body: string, result: EppResult): void {
    this.sendImmediate(status, body, {}, 'engine_error', result);
  }

  private sendImmediate(status: number, body: string, headers: Record<string, string>, details: string, result: EppResult): void {
    this.stopDecisionTimer();
    this.ctx.metrics.immediateResponse(status);
    this.count(result);
    this.phase = 'done';
    this.send({
      immediate_response: {
        status: { code: status },
        headers: setHeaders({ 'content-type': 'application/json', ...headers }),
        body: Buffer.from(body, 'utf8'),
        details,
      },
    });
    this.end();
  }

  private count(result: EppResult): void {
    if (this.result !== null) return;
    this.result = result;
    this.ctx.metrics.request(result);
  }

  // ---------------------------------------------------------------------------------------------- response path

  private onResponseHeaders(msg: ProcessingRequest): void {
    if (this.phase !== 'answered') throw new ProtocolError('response headers before the request was answered');
    this.phase = 'response';
    const f = this.flight;
    const eos = msg.response_headers?.end_of_stream ?? false;
    if (!f) {
      // A pass-through: nothing to count; the rest of the response is passed back unchanged.
      this.send({ response_headers: { response: {} } });
      if (eos) this.complete();
      return;
    }
    const h = readHeaders(msg.response_headers?.headers);
    f.status = Number(h.get(':status') ?? '200');
    this.readServed(f, msg);
    this.commit(f);
    const bodies = !eos && this.responseBodyMode !== NONE;
    const override = f.cachedOverride;
    f.stream = f.status === 200 && (h.get('content-type') ?? '').includes('text/event-stream');
    if (f.stream) {
      f.relay = new SseRelay(f.stripUsage, f.api.dialect, override ? (u) => rewriteCachedTokens(u, override.value) : undefined);
      // The stream's bytes change (a usage chunk removed or rewritten): a length the engine gave would no longer hold.
      const mutates = f.stripUsage || override !== undefined;
      this.send({ response_headers: { response: mutates ? { header_mutation: { remove_headers: ['content-length'] } } : {} } });
    } else {
      f.json = [];
      // A disaggregated JSON answer is rewritten whole: its headers (and length) are answered once it has arrived.
      f.holdAnswer = bodies && f.status === 200 && override !== undefined;
      if (!f.holdAnswer) this.send({ response_headers: { response: {} } });
    }
    if (!bodies) this.finish(f);
  }

  private onResponseBody(msg: ProcessingRequest): void {
    if (this.phase !== 'response') throw new ProtocolError('a response body chunk before the response headers');
    const b = msg.response_body ?? {};
    const chunk = b.body ?? Buffer.alloc(0);
    const eos = b.end_of_stream ?? false;
    const f = this.flight;
    if (!f) {
      this.sendBody('response', chunk, eos);
      if (eos) this.complete();
      return;
    }
    this.readServed(f, msg);
    if (f.relay) {
      // The client gets what serve's client gets: the relay's output (complete events, the router's usage removed).
      let out = f.relay.push(chunk);
      if (f.tracked && out.length > 0) this.observeStream(f);
      if (eos) {
        const rest = f.relay.flush();
        if (rest.length > 0) out = Buffer.concat([out, rest]);
      }
      if (out.length > 0 || eos) this.sendBody('response', out, eos);
    } else {
      this.collectJson(f, chunk);
      if (f.holdAnswer) {
        if (eos) this.releaseHeld(f, true);
      } else this.sendBody('response', chunk, eos);
    }
    if (eos) this.finish(f);
  }

  private onResponseTrailers(): void {
    if (this.phase !== 'response') throw new ProtocolError('response trailers before the response headers');
    const f = this.flight;
    if (f?.relay) {
      const rest = f.relay.flush();
      if (rest.length > 0) this.sendBody('response', rest, false);
    } else if (f?.holdAnswer) this.releaseHeld(f, false);
    this.send(trailersResponse('response'));
    if (f) this.finish(f);
    else this.complete();
  }

  private sendBody(direction: Direction, body: Buffer, endOfStream: boolean): void {
    for (const m of bodyResponses(direction, body, endOfStream)) this.send(m);
  }

  /** The first token and the gaps between tokens, as serve's proxy sees them. */
  private observeStream(f: Flight): void {
    const { core } = this.ctx;
    const now = performance.now();
    if (f.firstAt === undefined) {
      f.firstAt = now;
      core.lifecycle.firstToken(f.requestId);
      core.metrics.firstToken(f.attempt.decision.sourceKey, (now - f.t0) / 1000);
    } else core.metrics.token(f.attempt.decision.sourceKey, (now - f.lastAt) / 1000);
    f.lastAt = now;
  }

  /** A JSON answer is kept (within --body-limit) to read its usage, and to rewrite a held one. */
  private collectJson(f: Flight, chunk: Buffer): void {
    if (chunk.length === 0 || !f.json) return;
    if (f.jsonBytes + chunk.length <= this.ctx.core.config.bodyLimitBytes) {
      f.json.push(chunk);
      f.jsonBytes += chunk.length;
      return;
    }
    // Too large to read: passed back as it is, its usage unknown.
    if (f.holdAnswer) {
      f.holdAnswer = false;
      this.send({ response_headers: { response: {} } });
      this.sendBody('response', Buffer.concat(f.json), false);
    }
    f.json = undefined;
  }

  /** The held answer, its cached_tokens the prefill's: the response headers (with its new length), then the body. */
  private releaseHeld(f: Flight, endOfStream: boolean): void {
    f.holdAnswer = false;
    let body = Buffer.concat(f.json ?? []);
    try {
      const answer = JSON.parse(body.toString('utf8')) as { usage?: unknown };
      if (f.cachedOverride && answer.usage && typeof answer.usage === 'object') {
        rewriteCachedTokens(answer.usage as Record<string, unknown>, f.cachedOverride.value);
        body = Buffer.from(JSON.stringify(answer), 'utf8');
      }
    } catch {
      /* not JSON: passed back as it came */
    }
    this.send({ response_headers: { response: { header_mutation: setHeaders({ 'content-length': String(body.length) }) } } });
    this.sendBody('response', body, endOfStream);
  }

  /** The proxy's report of the endpoint that served; another than the pick moves the accounting there. */
  private readServed(f: Flight, msg: ProcessingRequest): void {
    if (f.sawServed) return;
    const served = valueStrings(metadataField(msg.metadata_context, LB_NAMESPACE, SERVED_KEY))?.[0]?.toLowerCase();
    if (served === undefined) return;
    f.sawServed = true;
    if (served === f.endpoint || !f.tracked) return;
    const { core } = this.ctx;
    const w = core.workers.list().find((x) => endpointOf(x) === served);
    if (!w) {
      this.ctx.metrics.servedElsewhere('unknown');
      core.log.warn(
        { requestId: f.requestId, picked: f.endpoint, served },
        'the proxy served the request on an endpoint that is not a worker',
      );
      return;
    }
    const next = core.lifecycle.servedElsewhere(f.requestId, w.id, `the proxy fell back from ${f.endpoint} to ${served}`);
    if (next === null) return; // nothing to move (a P/D fleet's attempt)
    if (next.kind === 'dispatch') {
      this.ctx.metrics.servedElsewhere('moved');
      f.attempt = next;
      f.accounted = next.decision;
      f.endpoint = served;
      core.events.routed(next.decision.sourceKey);
    } else {
      this.ctx.metrics.servedElsewhere('untracked');
      f.tracked = false;
      f.committed = true; // nothing of it is counted: it is no longer the router's request
    }
  }

  /** The routing counts once the attempt is final (answered, or given up by the client), as in serve. */
  private commit(f: Flight): void {
    if (f.committed) return;
    f.committed = true;
    this.ctx.core.metrics.routed(f.accounted, { tokenize: f.tokenizeS });
  }

  private finish(f: Flight): void {
    this.complete();
    if (!f.tracked) return;
    f.tracked = false;
    this.commit(f);
    const { core } = this.ctx;
    const ok = f.status === 200;
    let usage: StreamUsage | undefined;
    if (f.relay) {
      f.relay.flush();
      usage = f.relay.usage;
    } else if (ok && f.json) {
      try {
        usage = f.api.readAnswer(JSON.parse(Buffer.concat(f.json).toString('utf8')));
      } catch {
        /* not JSON: nothing to learn */
      }
      // A whole answer: the first token is not observable apart from the end.
      core.lifecycle.firstToken(f.requestId);
      core.metrics.firstToken(f.attempt.decision.sourceKey, (performance.now() - f.t0) / 1000);
    }
    const outcome = !ok || f.relay?.sawError ? 'error' : 'ok';
    // A 5xx is the worker's fault (the proxy already sent it there: no retry is possible from here); a 4xx the request's.
    core.lifecycle.finish(
      f.requestId,
      {
        outcome,
        cachedTokens: usage?.cachedTokens,
        ...((f.status ?? 200) >= 500 ? { workerFault: true } : {}),
        pinKey: outcome === 'ok' && f.pinsAnswer ? usage?.responseId : undefined,
      },
      usage?.completionTokens,
    );
  }

  private complete(): void {
    this.phase = 'done';
  }
}
