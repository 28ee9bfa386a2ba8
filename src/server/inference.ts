/**
 * Every routed API (chat, completions, responses, messages, embeddings, pooling, score, rerank), one path: body ->
 * the API's adapter parses it -> routing tokens (as given | local tokenizer | the engine's render endpoints | its
 * /tokenize) -> the core dispatcher (eligibility incl. pins, route, queue) -> one attempt after another until one
 * answers or the dispatcher gives up. Every decision is the dispatcher's; this module turns its effects into HTTP.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { DispatchAttempt, Dispatcher } from '../core/dispatch/dispatcher.ts';
import { POLICY_NAMES } from '../core/scheduling/policies.ts';
import { readBody } from '../http/body.ts';
import { badRequest } from '../http/errors.ts';
import type { RequestMetrics } from '../metrics/registry.ts';
import type { RemoteTokenizer } from '../tokenizer/remote.ts';
import type { ChatMediaIds, TokenizerService } from '../tokenizer/service.ts';
import type { ServeConfig } from '../config/serve.ts';
import type { LifecyclePort } from '../runtime/lifecycle.ts';
import { parseJsonBody } from '../apis/openai-request.ts';
import type { ApiAdapter, RoutedRequest } from '../apis/index.ts';
import type { PdMetrics } from '../metrics/pd.ts';
import { type DisaggRequestIds, pdAttempt, type PdOutcome, type PdWorker } from './pd.ts';
import { proxyAttempt } from './proxy.ts';
import type { RequestTrace } from '../runtime/tracing.ts';
import { refusalError } from '../runtime/refusals.ts';
import { requestIdentity } from '../runtime/identity.ts';
import { checkJsonDepth, type Security } from '../runtime/security/index.ts';

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

export interface InferenceContext {
  readonly config: ServeConfig;
  readonly log: Logger;
  /**
   * An unknown model or a dead fleet, answered before tokenizing (the real decision comes later); a shell of
   * `--processes` has no dispatcher to ask and leaves it to the submission.
   */
  readonly precheck: (model: string) => ReturnType<Dispatcher['precheck']>;
  /** The worker that tokenizes for the engines (remote and render modes), as the dispatcher names it. */
  readonly tokenizingWorker: (model: string) => Promise<PdWorker | undefined>;
  readonly lifecycle: LifecyclePort;
  readonly workers: { get(id: string): PdWorker | undefined };
  readonly metrics: RequestMetrics;
  readonly tokenizer: TokenizerService | null;
  /** The engine tokenizes (render endpoints or /tokenize), when there is no local tokenizer or the mode says so. */
  readonly remote: RemoteTokenizer | null;
  /** A request was routed (event-stream blindness accounting by its source; the recent decisions of /debug/state). */
  readonly noteRouted: (decision: RecentDecision) => void;
  readonly nextRequestId: () => string;
  readonly guard: Security;
  /** Session headers to read, in order. */
  readonly sessionHeaders: readonly string[];
  readonly pd: Pick<PdMetrics, 'legDuration'>;
  readonly disaggIds: DisaggRequestIds;
}

/** A client's x-request-id, if it is a short printable token; anything else is ignored rather than echoed. */
export function sanitizeRequestId(value: string | string[] | undefined): string | null {
  if (typeof value !== 'string') return null;
  return /^[\x21-\x7e]{1,128}$/.test(value) ? value : null;
}

/** What tokenization needs of a context (the router's, or the endpoint picker's). */
export type TokenizeContext = Pick<InferenceContext, 'tokenizer' | 'remote' | 'tokenizingWorker' | 'log'>;

/**
 * A chat request with image / audio parts, when `--mm-placeholder-tokens` says how the engine expands them and the
 * router tokenizes locally: the ids with the placeholders and the items keying them; null otherwise (text only).
 */
export async function mediaTokensFor(
  ctx: Pick<InferenceContext, 'tokenizer' | 'config' | 'log'>,
  req: RoutedRequest,
): Promise<ChatMediaIds | null> {
  const p = req.prompt;
  if (p.kind !== 'chat' || !ctx.tokenizer || ctx.config.mmPlaceholderTokens <= 0) return null;
  try {
    return await ctx.tokenizer.encodeChatMedia(p.chat, ctx.config.mmPlaceholderTokens, ctx.config.mmPlaceholderTokenId);
  } catch (err) {
    ctx.log.debug({ err: (err as Error).message }, 'multimodal tokenization failed: routing on the text');
    return null;
  }
}

/** Routing tokens of a request: as given, from the local tokenizer, or from an engine; [] when it cannot be known. */
export async function tokensFor(ctx: TokenizeContext, req: RoutedRequest): Promise<ArrayLike<number>> {
  const p = req.prompt;
  if (p.kind === 'ids') return p.ids;
  if (p.kind === 'none') return [];
  try {
    if (ctx.tokenizer) return p.kind === 'text' ? await ctx.tokenizer.encodePrompt(p.text) : await ctx.tokenizer.encodeChat(p.chat);
    if (ctx.remote) {
      // A worker serving the model tokenizes exactly as the engines do; the dispatcher says which one may be asked.
      const worker = await ctx.tokenizingWorker(req.model);
      if (worker) {
        const ids =
          p.kind === 'text' ? await ctx.remote.prompt(worker.url, req.model, p.text) : await ctx.remote.chat(worker.url, req.model, p.chat);
        if (ids) return ids;
      }
    }
  } catch (err) {
    // A template that rejects these messages will be rejected by the engine too; route without affinity.
    ctx.log.debug({ err: (err as Error).message }, 'tokenization failed: routing without prefix affinity');
  }
  return [];
}

/** Reads a JSON body within the limits (size, nesting depth). */
export async function readJsonBody(req: IncomingMessage, config: ServeConfig): Promise<{ text: string; body: unknown }> {
  const raw = await readBody(req, config.bodyLimitBytes);
  // Deep nesting would overflow the stack in JSON.stringify or the template; refuse it before parsing.
  const tooDeep = checkJsonDepth(raw, config.maxJsonDepth);
  if (tooDeep) throw tooDeep;
  const text = raw.toString('utf8');
  return { text, body: parseJsonBody(text) };
}

/**
 * Sequences a request asks for (n × prompts): more than one cannot share one P/D handoff. Only chat and completions
 * are handed over between a prefill and a decode worker; every other API is served by one worker.
 */
export function handoffOf(api: ApiAdapter, body: Record<string, unknown>): { sequences: number } | { noHandoff: string } {
  if (api.name !== 'chat' && api.name !== 'completions') return { noHandoff: 'api' };
  const n = typeof body.n === 'number' && Number.isInteger(body.n) && body.n > 1 ? body.n : 1;
  const p = body.prompt;
  const prompts = Array.isArray(p) && p.length > 0 && (typeof p[0] === 'string' || Array.isArray(p[0])) ? p.length : 1;
  return { sequences: n * prompts };
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
  const { config, lifecycle, metrics } = ctx;
  const { text, body: json } = await readJsonBody(req, config);
  const parsed = api.parse(json);
  trace.set({ 'gen_ai.request.model': parsed.model, 'kvroute.stream': parsed.stream });
  if (parsed.policy && !(POLICY_NAMES as readonly string[]).includes(parsed.policy)) {
    throw badRequest(`unknown policy "${parsed.policy}"; known: ${POLICY_NAMES.join(', ')}`, 'kvroute.policy');
  }
  // Every adapter has checked the body is a JSON object.
  const identity = requestIdentity(req, json as Record<string, unknown>, ctx.guard, ctx.sessionHeaders);
  // Answer an unknown model or a dead fleet before spending time on tokenization; the real decision comes later.
  const pre = ctx.precheck(parsed.model);
  if (pre) {
    metrics.refused(pre.code);
    throw refusalError(pre, config);
  }

  const tTok = performance.now();
  const tokStartMs = Date.now();
  const media = await mediaTokensFor(ctx, parsed);
  const tokens = media?.ids ?? (await tokensFor(ctx, parsed));
  const tokenizeS = (performance.now() - tTok) / 1000;
  trace.span('tokenize', tokStartMs, Date.now(), {
    'kvroute.tokenizer.mode': parsed.prompt.kind === 'ids' ? 'given' : ctx.tokenizer ? 'local' : (ctx.remote?.mode ?? 'none'),
    'kvroute.prompt_tokens': tokens.length,
  });

  const abort = new AbortController();
  res.on('close', () => {
    if (!res.writableFinished) abort.abort();
  });
  const requestId = ctx.nextRequestId();
  // The client's own id, if any, travels upstream and back for tracing; the router keys its state by its own id,
  // which is unique even when clients reuse theirs.
  const clientRequestId = sanitizeRequestId(req.headers['x-request-id']);
  const body = parsed.upstreamBody(text);

  const submittedAt = Date.now();
  let step = await lifecycle.submit(
    {
      requestId,
      model: parsed.model,
      tokens,
      ...(media ? { mmItems: media.items } : {}),
      cacheSalt: parsed.cacheSalt,
      policy: parsed.policy,
      knobs: parsed.knobs,
      pinKey: parsed.pinKey,
      ...handoffOf(api, json as Record<string, unknown>),
      ...identity,
    },
    abort.signal,
  );
  for (;;) {
    if (step.kind === 'aborted') {
      metrics.outcome('cancelled');
      return;
    }
    if (step.kind === 'reject') {
      metrics.refused(step.code);
      if (step.code === 'upstream_failed') metrics.outcome('error');
      throw refusalError(step, config);
    }
    const attempt: DispatchAttempt = step;
    note(ctx, attempt, api.name, parsed.model, clientRequestId);
    const routedAt = Date.now();
    if (attempt.queuedMs > 0) trace.span('queue', routedAt - attempt.queuedMs, routedAt, { 'kvroute.queued_ms': attempt.queuedMs });
    const d = attempt.decision;
    const routeMs = d.timingsMs ? d.timingsMs.hash + d.timingsMs.find + d.timingsMs.select : 0;
    trace.span('route', attempt.attempt === 0 && attempt.queuedMs === 0 ? submittedAt : routedAt - routeMs, routedAt, {
      'kvroute.worker': d.sourceKey,
      'kvroute.overlap_blocks': d.overlapBlocks,
      'kvroute.isl_blocks': d.islBlocks,
      'kvroute.best_overlap_blocks': d.bestOverlapBlocks,
      'kvroute.policy': d.policy,
      'kvroute.attempt': attempt.attempt,
      'kvroute.pinned': attempt.pinned,
    });
    const worker = ctx.workers.get(attempt.workerId);
    const prefillWorker = attempt.prefill ? ctx.workers.get(attempt.prefill.workerId) : undefined;
    const attemptCtx = {
      lifecycle,
      metrics,
      log: ctx.log,
      clientStallTimeoutMs: config.clientStallTimeoutMs,
      pd: ctx.pd,
      disaggIds: ctx.disaggIds,
    };
    let outcome: PdOutcome;
    if (!worker) outcome = { kind: 'failed', message: `${attempt.workerId}: removed` };
    else if (attempt.prefill && !prefillWorker) outcome = { kind: 'prefill_failed', message: `${attempt.prefill.workerId}: removed` };
    else if (attempt.prefill && prefillWorker) {
      outcome = await pdAttempt(attemptCtx, {
        attempt,
        decodeWorker: worker,
        prefillWorker,
        api,
        parsed,
        clientJson: json as Record<string, unknown>,
        clientText: text,
        upstreamBody: body,
        path,
        res,
        signal: abort.signal,
        t0,
        clientRequestId,
        tokenizeS,
        trace,
      });
    } else {
      outcome = await proxyAttempt(attemptCtx, {
        attempt,
        worker,
        api,
        parsed,
        body,
        path,
        res,
        signal: abort.signal,
        t0,
        clientRequestId,
        tokenizeS,
        trace,
      });
    }
    if (outcome.kind === 'done') return;
    if (outcome.kind === 'prefill_failed') {
      ctx.log.warn(
        { requestId, worker: attempt.prefill?.workerId, attempt: attempt.prefill?.attempt, error: outcome.message },
        'prefill leg failed before answering',
      );
      step = await lifecycle.prefillFailed(requestId, outcome.message, abort.signal);
      continue;
    }
    // Failed before the first byte: the dispatcher takes the attempt back and picks the next best without this worker.
    ctx.log.warn(
      { requestId, worker: attempt.workerId, attempt: attempt.attempt, error: outcome.message },
      'upstream failed before the first byte',
    );
    step = await lifecycle.failed(requestId, outcome.message, abort.signal);
  }
}

function note(ctx: InferenceContext, a: DispatchAttempt, api: string, model: string, clientRequestId: string | null): void {
  const d = a.decision;
  ctx.log.debug(
    {
      requestId: a.requestId,
      api,
      clientRequestId,
      worker: d.sourceKey,
      policy: d.policy,
      promptTokens: d.promptTokens,
      islBlocks: d.islBlocks,
      overlapBlocks: d.overlapBlocks,
      bestOverlapBlocks: d.bestOverlapBlocks,
      attempt: a.attempt,
      queuedMs: a.queuedMs,
      trial: a.trial,
    },
    'routed',
  );
  ctx.noteRouted({
    requestId: a.requestId,
    api,
    at: Date.now(),
    model,
    worker: d.sourceKey,
    policy: d.policy,
    promptTokens: d.promptTokens,
    islBlocks: d.islBlocks,
    overlapBlocks: d.overlapBlocks,
    bestOverlapBlocks: d.bestOverlapBlocks,
    attempt: a.attempt,
    queuedMs: a.queuedMs,
  });
}
