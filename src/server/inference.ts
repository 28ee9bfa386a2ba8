/**
 * serve's front end of the request flow (src/runtime/request-flow.ts) for every routed API (chat, completions,
 * responses, messages, embeddings, pooling, score, rerank): it reads the body within the limits, hands the flow its
 * port, and answers a refusal in HTTP. Sending an attempt is proxying it: to one worker (proxy.ts), or as a prefill
 * leg and a decode leg (disagg-attempt.ts). Every decision is the dispatcher's.
 */
import { isUtf8 } from 'node:buffer';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { DispatchAttempt } from '../core/dispatch/dispatcher.ts';
import type { DisaggRequestIds } from '../engines/trtllm/ids.ts';
import { readBody } from '../http/body.ts';
import type { RequestMetrics } from '../metrics/registry.ts';
import type { ServeConfig } from '../config/serve.ts';
import type { ApiAdapter } from '../apis/index.ts';
import type { PdMetrics } from '../metrics/disagg.ts';
import type { PdWorker } from '../runtime/prefill-leg.ts';
import { ClientCancel } from '../runtime/cancel.ts';
import { refusalError } from '../runtime/refusals.ts';
import { type AttemptOutcome, type AttemptPort, type FlowContext, runRequest, type SubmittedRequest } from '../runtime/request-flow.ts';
import type { RequestTrace } from '../runtime/tracing.ts';
import { type PdContext, pdAttempt } from './disagg-attempt.ts';
import { type AttemptParsed, proxyAttempt } from './proxy.ts';

export interface RecentDecision {
  requestId: string;
  api: string;
  at: number;
  model: string;
  /** The source key routed to. */
  worker: string;
  policy: string;
  promptTokens: number;
  islBlocks: number;
  overlapBlocks: number;
  bestOverlapBlocks: number;
  attempt: number;
  queuedMs: number;
}

/** Decisions /debug/state lists, newest last. */
export const RECENT_MAX = 64;

/** The note of an attempt handed out (one process's handler, or the --processes primary as it sends the step). */
export function recentDecisionOf(a: DispatchAttempt, api: string, at: number): RecentDecision {
  const d = a.decision;
  return {
    requestId: a.requestId,
    api,
    at,
    model: a.model,
    worker: d.sourceKey,
    policy: d.policy,
    promptTokens: d.promptTokens,
    islBlocks: d.islBlocks,
    overlapBlocks: d.overlapBlocks,
    bestOverlapBlocks: d.bestOverlapBlocks,
    attempt: a.attempt,
    queuedMs: a.queuedMs,
  };
}

export interface InferenceContext extends FlowContext<PdWorker> {
  readonly config: ServeConfig;
  readonly log: Logger;
  readonly metrics: RequestMetrics;
  readonly tokenizingWorker: (model: string) => Promise<PdWorker | undefined>;
  /** A request was routed (event-stream blindness accounting by its source; the recent decisions of /debug/state). */
  readonly noteRouted: (decision: RecentDecision) => void;
  readonly pd: Pick<PdMetrics, 'legDuration'>;
  readonly disaggIds: DisaggRequestIds;
}

/**
 * One HTTP request's side of the flow: the port its attempts go through (one object per request, its methods on the
 * prototype, instead of closures and an exchange record), aborted when the client leaves.
 */
class Exchange implements AttemptPort<PdWorker> {
  /** A client that leaves (while queued, tokenized or answered) aborts its request; a finished answer is not a leaving. */
  readonly abort = new ClientCancel();
  /** What an attempt on one worker sends, the same for every attempt (the first one's, kept for retries). */
  private direct: DirectRequest | null = null;

  constructor(
    private readonly ctx: InferenceContext,
    private readonly path: string,
    readonly res: ServerResponse,
    /** performance.now() when the request arrived (TTFT is measured from there). */
    private readonly t0: number,
    private readonly trace: RequestTrace,
  ) {
    res.on('close', this.closed);
  }

  private readonly closed = (): void => {
    if (!this.res.writableFinished) this.abort.abort();
  };

  dispatched(attempt: DispatchAttempt, request: SubmittedRequest): void {
    dispatched(this.ctx, attempt, request, this.trace);
  }

  /** One attempt as serve sends it: proxied to its worker, or its prefill leg and then its decode leg. */
  send(attempt: DispatchAttempt, worker: PdWorker, prefillWorker: PdWorker | undefined, r: SubmittedRequest): Promise<AttemptOutcome> {
    const { ctx } = this;
    const attemptCtx: PdContext = {
      lifecycle: ctx.lifecycle,
      metrics: ctx.metrics,
      log: ctx.log,
      clientStallTimeoutMs: ctx.config.clientStallTimeoutMs,
      pd: ctx.pd,
      disaggIds: ctx.disaggIds,
    };
    if (prefillWorker) {
      return pdAttempt(attemptCtx, {
        attempt,
        api: r.api,
        parsed: r.parsed,
        path: this.path,
        res: this.res,
        // The legs' undici requests take the signal: a real one.
        signal: this.abort.signal,
        t0: this.t0,
        clientRequestId: r.clientRequestId,
        tokenizeS: r.tokenizeS,
        trace: this.trace,
        decodeWorker: worker,
        prefillWorker,
        clientJson: r.json,
        clientText: r.text,
        upstreamBody: r.parsed.upstreamBody(r.text),
      });
    }
    if (this.direct === null) this.direct = directRequest(r);
    const { direct } = this;
    // Every attempt on one worker sends these bytes: the parsed body is let go while the answer is under way.
    r.release();
    return proxyAttempt(attemptCtx, {
      attempt,
      worker,
      api: r.api,
      parsed: direct.parsed,
      body: direct.body,
      path: this.path,
      res: this.res,
      // An attempt on one worker goes through undici's dispatch() (proxy.ts DirectAttempt), which reads `aborted` only
      // (none of the fields that would take it through pool.request() is set here).
      signal: this.abort.flowSignal,
      t0: this.t0,
      clientRequestId: r.clientRequestId,
      tokenizeS: r.tokenizeS,
      trace: this.trace,
    });
  }
}

/** An attempt on one worker: the upstream body, and what the proxy reads of the parsed request. */
interface DirectRequest {
  readonly body: string | Buffer;
  readonly parsed: AttemptParsed;
}

function directRequest(r: SubmittedRequest): DirectRequest {
  const { parsed } = r;
  // Built from the client's bytes where the adapter can (no second UTF-8 encoding of the body); the client's bytes
  // unchanged when the adapter left the text as it was. Bytes that are not valid UTF-8 go as their decoded text
  // (invalid sequences replaced), as they always did.
  const utf8 = isUtf8(r.raw);
  let body: string | Buffer | null = utf8 ? (parsed.upstreamBytes?.(r.raw) ?? null) : null;
  if (body === null) {
    const text = parsed.upstreamBody(r.text);
    body = utf8 && text === r.text ? r.raw : text;
  }
  return { body, parsed: { stream: parsed.stream, stripUsage: parsed.stripUsage, pinsAnswer: parsed.pinsAnswer } };
}

export async function handleInference(
  ctx: InferenceContext,
  api: ApiAdapter,
  path: string,
  req: IncomingMessage,
  res: ServerResponse,
  t0: number,
  trace: RequestTrace,
): Promise<void> {
  const raw = await readBody(req, ctx.config.bodyLimitBytes);
  const x = new Exchange(ctx, path, res, t0, trace);
  const result = await runRequest(ctx, { api, body: raw, headers: req.headers, signal: x.abort.flowSignal, trace }, x);
  if (result.kind === 'refused') throw refusalError(result.refusal, ctx.config);
}

/** An attempt handed out: logged, traced (queue wait, the decision), and noted for /debug/state. */
function dispatched(ctx: InferenceContext, a: DispatchAttempt, r: SubmittedRequest, trace: RequestTrace): void {
  const d = a.decision;
  const routedAt = Date.now();
  const note = recentDecisionOf(a, r.api.name, routedAt);
  ctx.noteRouted(note);
  // Nothing more per request is built for a level or a tracer that is off.
  if (ctx.log.isLevelEnabled('debug')) ctx.log.debug({ ...note, clientRequestId: r.clientRequestId, trial: a.trial }, 'routed');
  if (!trace.enabled) return;
  if (a.queuedMs > 0) trace.span('queue', routedAt - a.queuedMs, routedAt, { 'kvroute.queued_ms': a.queuedMs });
  const routeMs = d.timingsMs ? d.timingsMs.hash + d.timingsMs.find + d.timingsMs.select : 0;
  trace.span('route', a.attempt === 0 && a.queuedMs === 0 ? r.submittedAt : routedAt - routeMs, routedAt, {
    'kvroute.worker': d.sourceKey,
    'kvroute.overlap_blocks': d.overlapBlocks,
    'kvroute.isl_blocks': d.islBlocks,
    'kvroute.best_overlap_blocks': d.bestOverlapBlocks,
    'kvroute.policy': d.policy,
    'kvroute.attempt': a.attempt,
    'kvroute.pinned': a.pinned,
  });
}
