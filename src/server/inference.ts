/**
 * POST /v1/chat/completions and /v1/completions: body -> validate -> token ids (as given | local tokenizer | the worker's
 * /tokenize) -> the core dispatcher (eligibility, route, queue) -> one attempt after another until one answers or the
 * dispatcher gives up. Every decision is the dispatcher's; this module turns its effects into HTTP.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { DispatchAttempt, Dispatcher } from '../core/dispatch/dispatcher.ts';
import { POLICY_NAMES } from '../core/scheduling/policies.ts';
import { readBody } from '../http/body.ts';
import { badRequest } from '../http/errors.ts';
import type { RouterMetrics } from '../metrics/registry.ts';
import type { RemoteTokenizer } from '../tokenizer/remote.ts';
import type { TokenizerService } from '../tokenizer/service.ts';
import type { ServeConfig } from '../config/serve.ts';
import type { Lifecycle } from './lifecycle.ts';
import { type Endpoint, type ParsedRequest, parseJsonBody, parseRequest, upstreamBody } from '../openai/request.ts';
import type { PdMetrics } from '../metrics/pd.ts';
import { pdAttempt, type PdOutcome } from './pd.ts';
import { proxyAttempt } from './proxy.ts';
import { refusalError } from './refusals.ts';
import { requestIdentity } from './identity.ts';
import { checkJsonDepth, type Security } from './security/index.ts';
import type { WorkerSet } from './workers.ts';

export interface RecentDecision {
  requestId: string;
  at: number;
  model: string;
  worker: string;
  prefillWorker?: string;
  prefillOverlapBlocks?: number;
  path: string;
  policy: string;
  promptTokens: number;
  islBlocks: number;
  overlapBlocks: number;
  bestOverlapBlocks: number;
  attempt: number;
  queuedMs: number;
}

const RECENT_MAX = 64;

export interface InferenceContext {
  readonly config: ServeConfig;
  readonly log: Logger;
  readonly dispatcher: Dispatcher;
  readonly lifecycle: Lifecycle;
  readonly workers: WorkerSet;
  readonly metrics: RouterMetrics;
  readonly tokenizer: TokenizerService | null;
  readonly remote: RemoteTokenizer | null;
  /** A request was routed to this source (event-stream blindness accounting). */
  readonly noteRouted: (sourceKey: string) => void;
  readonly nextRequestId: () => string;
  readonly recent: RecentDecision[];
  readonly guard: Security;
  /** Session headers to read, in order. */
  readonly sessionHeaders: readonly string[];
  readonly pd: PdMetrics;
}

/** Sequences a request asks for (n × prompts): more than one cannot share one P/D handoff. */
function sequencesOf(parsed: ParsedRequest): number {
  const n = typeof parsed.body.n === 'number' && Number.isInteger(parsed.body.n) && parsed.body.n > 1 ? parsed.body.n : 1;
  const p = parsed.body.prompt;
  const prompts = Array.isArray(p) && p.length > 0 && (typeof p[0] === 'string' || Array.isArray(p[0])) ? p.length : 1;
  return n * prompts;
}

/** A client's x-request-id, if it is a short printable token; anything else is ignored rather than echoed. */
export function sanitizeRequestId(value: string | string[] | undefined): string | null {
  if (typeof value !== 'string') return null;
  return /^[\x21-\x7e]{1,128}$/.test(value) ? value : null;
}

async function tokensFor(ctx: InferenceContext, req: ParsedRequest): Promise<ArrayLike<number>> {
  if (req.promptIds) return req.promptIds;
  try {
    if (ctx.tokenizer) {
      if (req.promptText !== null) return await ctx.tokenizer.encodePrompt(req.promptText);
      if (req.chat) return await ctx.tokenizer.encodeChat(req.chat);
    }
    if (ctx.remote) {
      // Any healthy worker serving the model renders exactly as the engines do.
      const worker = ctx.workers.list().find((w) => w.healthy && ctx.dispatcher.worker(w.id)?.serves(req.model));
      if (worker) {
        const ids =
          req.promptText !== null
            ? await ctx.remote.prompt(worker.url, req.model, req.promptText)
            : req.chat
              ? await ctx.remote.chat(worker.url, req.model, req.chat)
              : null;
        if (ids) return ids;
      }
    }
  } catch (err) {
    // A template that rejects these messages will be rejected by the engine too; route without affinity.
    ctx.log.debug({ err: (err as Error).message }, 'tokenization failed: routing without prefix affinity');
  }
  return [];
}

export async function handleInference(
  ctx: InferenceContext,
  endpoint: Endpoint,
  req: IncomingMessage,
  res: ServerResponse,
  t0: number,
): Promise<void> {
  const { config, dispatcher, lifecycle, metrics } = ctx;
  const raw = await readBody(req, config.bodyLimitBytes);
  // Deep nesting would overflow the stack in JSON.stringify or the template; refuse it before parsing.
  const tooDeep = checkJsonDepth(raw, config.maxJsonDepth);
  if (tooDeep) throw tooDeep;
  const text = raw.toString('utf8');
  const parsed = parseRequest(endpoint, parseJsonBody(text));
  if (parsed.policy && !(POLICY_NAMES as readonly string[]).includes(parsed.policy)) {
    throw badRequest(`unknown policy "${parsed.policy}"; known: ${POLICY_NAMES.join(', ')}`, 'kvroute.policy');
  }
  const identity = requestIdentity(req, parsed.body, ctx.guard, ctx.sessionHeaders);
  // Answer an unknown model or a dead fleet before spending time on tokenization; the real decision comes later.
  const pre = dispatcher.precheck(parsed.model, Date.now());
  if (pre) {
    metrics.refused(pre.code);
    throw refusalError(pre, config);
  }

  const tTok = performance.now();
  const tokens = await tokensFor(ctx, parsed);
  const tokenizeS = (performance.now() - tTok) / 1000;

  const abort = new AbortController();
  res.on('close', () => {
    if (!res.writableFinished) abort.abort();
  });
  const requestId = ctx.nextRequestId();
  // The client's own id, if any, travels upstream and back for tracing; the router keys its state by its own id,
  // which is unique even when clients reuse theirs.
  const clientRequestId = sanitizeRequestId(req.headers['x-request-id']);
  const body = upstreamBody(parsed, text);
  const path = endpoint === 'chat' ? '/v1/chat/completions' : '/v1/completions';

  let step = await lifecycle.submit(
    {
      requestId,
      model: parsed.model,
      tokens,
      cacheSalt: parsed.cacheSalt,
      policy: parsed.policy,
      knobs: parsed.knobs,
      sequences: sequencesOf(parsed),
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
    note(ctx, attempt, parsed.model, clientRequestId);
    const worker = ctx.workers.get(attempt.workerId);
    const prefillWorker = attempt.prefill ? ctx.workers.get(attempt.prefill.workerId) : undefined;
    const attemptCtx = { lifecycle, metrics, log: ctx.log, clientStallTimeoutMs: config.clientStallTimeoutMs, pd: ctx.pd };
    let outcome: PdOutcome;
    if (!worker) outcome = { kind: 'failed', message: `${attempt.workerId}: removed` };
    else if (attempt.prefill && !prefillWorker) outcome = { kind: 'prefill_failed', message: `${attempt.prefill.workerId}: removed` };
    else if (attempt.prefill && prefillWorker) {
      outcome = await pdAttempt(attemptCtx, {
        attempt,
        decodeWorker: worker,
        prefillWorker,
        parsed,
        clientText: text,
        upstreamBody: body,
        path,
        res,
        signal: abort.signal,
        t0,
        clientRequestId,
        tokenizeS,
      });
    } else {
      outcome = await proxyAttempt(attemptCtx, {
        attempt,
        worker,
        parsed,
        body,
        path,
        res,
        signal: abort.signal,
        t0,
        clientRequestId,
        tokenizeS,
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

function note(ctx: InferenceContext, a: DispatchAttempt, model: string, clientRequestId: string | null): void {
  const d = a.decision;
  ctx.log.debug(
    {
      requestId: a.requestId,
      clientRequestId,
      worker: d.sourceKey,
      prefillWorker: a.prefill?.decision.sourceKey,
      path: a.path,
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
  ctx.noteRouted(d.sourceKey);
  ctx.recent.push({
    requestId: a.requestId,
    at: Date.now(),
    model,
    worker: d.sourceKey,
    ...(a.prefill ? { prefillWorker: a.prefill.decision.sourceKey, prefillOverlapBlocks: a.prefill.decision.overlapBlocks } : {}),
    path: a.path,
    policy: d.policy,
    promptTokens: d.promptTokens,
    islBlocks: d.islBlocks,
    overlapBlocks: d.overlapBlocks,
    bestOverlapBlocks: d.bestOverlapBlocks,
    attempt: a.attempt,
    queuedMs: a.queuedMs,
  });
  if (ctx.recent.length > RECENT_MAX) ctx.recent.shift();
}
