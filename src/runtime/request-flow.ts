/**
 * The request flow of every routed API, written once for both front ends (serve's HTTP listener, src/server/; the
 * endpoint picker's ext_proc stream, src/epp/):
 *
 *   parse      the body (nesting depth, JSON) by the API's adapter (src/apis/); kvroute.policy checked
 *   identity   tenant, priority, session and deadline from the headers and the body
 *   precheck   an unknown model or a dead fleet, answered before spending time on tokenization
 *   tokenize   routing tokens: as given | the local tokenizer (multimodal placeholders included) | the engine's
 *              render endpoints or /tokenize | none (routed without prefix affinity)
 *   submit     the core dispatcher routes, queues or refuses (src/runtime/lifecycle.ts carries its effects out)
 *   attempts   each attempt goes to the front end's port, "send this attempt": serve proxies it, the picker names the
 *              endpoint to the gateway; one that failed before answering goes back to the dispatcher, which picks
 *              the next best worker or refuses
 *
 * What stays the front end's: taking the bytes in (size limit, timeouts), sending an attempt on its wire, and turning
 * a refusal into its own answer. Every decision is the dispatcher's.
 */
import type { DispatchAttempt, DispatchRefusal } from '../core/dispatch/dispatcher.ts';
import { isSelectablePolicy, unknownPolicyMessage } from '../core/scheduling/registry.ts';
import { badRequest } from '../http/errors.ts';
import type { RequestMetrics } from '../metrics/registry.ts';
import type { RemoteTokenizer } from '../tokenizer/remote.ts';
import type { ChatMediaIds, TokenizerService } from '../tokenizer/service.ts';
import type { ServeConfig } from '../config/serve.ts';
import { parseJsonBody } from '../apis/openai-request.ts';
import type { ApiAdapter, RoutedRequest } from '../apis/index.ts';
import { type RequestHeaders, requestIdentity } from './identity.ts';
import type { LifecyclePort } from './lifecycle.ts';
import { checkJsonDepth, type Security } from './security/index.ts';
import { NO_TRACE, type RequestTrace } from './tracing.ts';

/** Where the flow's notes go (a pino logger). */
export interface FlowLog {
  debug(o: object, m: string): void;
  warn(o: object, m: string): void;
}

/** What the flow needs of the composition (src/runtime/compose.ts), or of a `--processes` shell's proxy of it. */
export interface FlowContext<W> {
  readonly config: Pick<ServeConfig, 'maxJsonDepth' | 'mmPlaceholderTokens' | 'mmPlaceholderTokenId'>;
  readonly log: FlowLog;
  /** An unknown model or a dead fleet (null: go on); a shell without a dispatcher leaves it to the submission. */
  readonly precheck: (model: string) => Refusal | null;
  readonly tokenizer: TokenizerService | null;
  /** The engine tokenizes (render endpoints or /tokenize), when there is no local tokenizer or the mode says so. */
  readonly remote: RemoteTokenizer | null;
  /** The worker that tokenizes for the engines (remote and render modes), as the dispatcher names it. */
  readonly tokenizingWorker: (model: string) => Promise<{ readonly url: string } | undefined>;
  readonly lifecycle: LifecyclePort;
  readonly workers: { get(id: string): W | undefined };
  readonly metrics: Pick<RequestMetrics, 'refused' | 'outcome'>;
  readonly guard: Pick<Security, 'tenantOf'>;
  /** Session headers to read, in order. */
  readonly sessionHeaders: readonly string[];
  readonly nextRequestId: () => string;
}

/** One request as the front end took it in. */
export interface FlowRequest {
  readonly api: ApiAdapter;
  /** The whole body, within the front end's size limit. */
  readonly body: Buffer;
  readonly headers: RequestHeaders['headers'];
  /** Aborted when the client leaves: a queued request leaves the queue, an attempt in flight is given up. */
  readonly signal: AbortSignal;
  readonly trace?: RequestTrace;
  /** Only these sources may serve it (a gateway's subset hint). */
  readonly subset?: ReadonlySet<string>;
}

/** The request as parsed and submitted: what a front end needs to send one of its attempts. */
export interface SubmittedRequest {
  readonly requestId: string;
  readonly api: ApiAdapter;
  readonly parsed: RoutedRequest;
  /** The client's JSON body (every adapter has checked it is an object) and its text as received. */
  readonly json: Record<string, unknown>;
  readonly text: string;
  /** The body's bytes as received (forwarded as they are when nothing in them needs rewriting). */
  readonly raw: Buffer;
  /** The client's own x-request-id, if it is a short printable token. */
  readonly clientRequestId: string | null;
  readonly tokenizeS: number;
  /** Epoch ms of the submission. */
  readonly submittedAt: number;
  /**
   * The front end has taken what its attempts need (serve: the upstream bytes): the parsed body and its text are let
   * go, so a request whose answer is under way holds no copy of its prompt (the body's text, a 2,048-id array) for the
   * garbage collector to copy and promote. A later read of `parsed`, `json` or `text` parses `raw` again (same bytes,
   * same result).
   */
  release(): void;
}

/** SubmittedRequest: the parsed body kept until released, parsed again from the bytes if read after that. */
class Submitted implements SubmittedRequest {
  private body: ReadBody | null;

  constructor(
    readonly requestId: string,
    readonly api: ApiAdapter,
    readonly raw: Buffer,
    readonly clientRequestId: string | null,
    readonly tokenizeS: number,
    readonly submittedAt: number,
    body: ReadBody,
    private readonly maxJsonDepth: number,
  ) {
    this.body = body;
  }

  get parsed(): RoutedRequest {
    return this.parsedBody().parsed;
  }

  get json(): Record<string, unknown> {
    return this.parsedBody().json;
  }

  get text(): string {
    return this.parsedBody().text;
  }

  release(): void {
    this.body = null;
  }

  private parsedBody(): ReadBody {
    if (this.body === null) this.body = readBody(this.api, this.raw, this.maxJsonDepth);
    return this.body;
  }
}

/** How one attempt ended: answered (whatever the answer), or failed before answering and may be retried. */
export type AttemptOutcome =
  | { readonly kind: 'done' }
  | { readonly kind: 'failed'; readonly message: string }
  | { readonly kind: 'prefill_failed'; readonly message: string };

/** The front end's side of the flow. */
export interface AttemptPort<W> {
  /** Every attempt the dispatcher hands out, before it is sent (logs, traces, the recent decisions). */
  dispatched?(attempt: DispatchAttempt, request: SubmittedRequest): void;
  /** Send this attempt on the worker(s) the dispatcher chose; resolves once it answered or failed. */
  send(attempt: DispatchAttempt, worker: W, prefillWorker: W | undefined, request: SubmittedRequest): Promise<AttemptOutcome>;
}

/** How the request ended: an attempt answered, the client left, or the dispatcher refused it (counted already). */
export type FlowResult =
  | { readonly kind: 'answered' }
  | { readonly kind: 'cancelled' }
  | { readonly kind: 'refused'; readonly refusal: Refusal };

/** A refusal as a front end answers it (src/runtime/refusals.ts). */
export type Refusal = Pick<DispatchRefusal, 'code' | 'message' | 'retryAfterMs'>;

/** A client's x-request-id, if it is a short printable token; anything else is ignored rather than echoed. */
export function sanitizeRequestId(value: string | string[] | undefined): string | null {
  if (typeof value !== 'string') return null;
  return /^[\x21-\x7e]{1,128}$/.test(value) ? value : null;
}

/** What tokenization needs of a context. */
export type TokenizeContext = Pick<FlowContext<unknown>, 'tokenizer' | 'remote' | 'tokenizingWorker' | 'log'>;

/**
 * A chat request with image / audio parts, when `--mm-placeholder-tokens` says how the engine expands them and the
 * router tokenizes locally: the ids with the placeholders and the items keying them; null otherwise (text only).
 */
export async function mediaTokensFor(
  ctx: Pick<FlowContext<unknown>, 'tokenizer' | 'config' | 'log'>,
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

/**
 * A body's text and JSON, refused (400) when it nests deeper than the limit: deep nesting would overflow the stack.
 * (A hand-written byte scan of a token-id prompt was measured slower than V8's JSON.parse on 2,048 ids: bench/RESULTS.md,
 * issue 29.)
 */
export function parseBody(raw: Buffer, maxJsonDepth: number): { text: string; body: unknown } {
  const tooDeep = checkJsonDepth(raw, maxJsonDepth);
  if (tooDeep) throw tooDeep;
  const text = raw.toString('utf8');
  return { text, body: parseJsonBody(text) };
}

/** A client's body as the flow reads it: its text, its JSON object and the adapter's parse. */
interface ReadBody {
  readonly text: string;
  readonly json: Record<string, unknown>;
  readonly parsed: RoutedRequest;
}

/** Reads a client's body (parseBody, then the adapter's parse, which checks it is a JSON object); bad input: a 400. */
function readBody(api: ApiAdapter, raw: Buffer, maxJsonDepth: number): ReadBody {
  const { text, body } = parseBody(raw, maxJsonDepth);
  const parsed = api.parse(body);
  return { text, json: body as Record<string, unknown>, parsed };
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

/**
 * One request, parse to answer. Bad input throws an HttpError (400) before anything is counted or submitted; every
 * other end is the result, refusals counted.
 *
 * Two frames: `admit` parses, tokenizes and submits; `attempts` waits for the dispatcher and sends. An async function's
 * suspended frame keeps every local it ever set, used again or not (V8 saves the whole register file at an await), so
 * the client's text, its parsed body and the token ids live in `admit`'s frame alone, which ends at the submission: a
 * request waiting for its answer holds none of them for the young-generation collector to copy and promote
 * (bench/RESULTS.md, "a request's frame").
 */
export async function runRequest<W>(ctx: FlowContext<W>, req: FlowRequest, port: AttemptPort<W>): Promise<FlowResult> {
  const admitted = await admit(ctx, req);
  return admitted.kind === 'refused' ? admitted : attempts(ctx, admitted.request, admitted.step, req.signal, port);
}

type Step = Awaited<ReturnType<LifecyclePort['submit']>>;

/** Parse, tokenize, submit: the request and its first step (a promise: not awaited here), or the precheck's refusal. */
async function admit<W>(
  ctx: FlowContext<W>,
  req: FlowRequest,
): Promise<{ kind: 'admitted'; request: SubmittedRequest; step: Promise<Step> } | (FlowResult & { kind: 'refused' })> {
  const { api, signal } = req;
  const trace = req.trace ?? NO_TRACE;
  const { lifecycle, metrics } = ctx;
  const read = readBody(api, req.body, ctx.config.maxJsonDepth);
  const { parsed, json } = read;
  if (trace.enabled) trace.set({ 'gen_ai.request.model': parsed.model, 'kvroute.stream': parsed.stream });
  if (parsed.policy && !isSelectablePolicy(parsed.policy)) {
    throw badRequest(unknownPolicyMessage(parsed.policy), 'kvroute.policy');
  }
  const identity = requestIdentity({ headers: req.headers }, json, ctx.guard, ctx.sessionHeaders);
  const pre = ctx.precheck(parsed.model);
  if (pre) {
    metrics.refused(pre.code);
    return { kind: 'refused', refusal: pre };
  }

  const tTok = performance.now();
  const tokStartMs = trace.enabled ? Date.now() : 0;
  // Token ids given by the client are the routing tokens as they are: no tokenizer, and no promise to wait for.
  const given = parsed.prompt.kind === 'ids' ? parsed.prompt.ids : null;
  const media = given === null ? await mediaTokensFor(ctx, parsed) : null;
  const tokens = given ?? media?.ids ?? (await tokensFor(ctx, parsed));
  const tokenizeS = (performance.now() - tTok) / 1000;
  if (trace.enabled) {
    trace.span('tokenize', tokStartMs, Date.now(), {
      'kvroute.tokenizer.mode': parsed.prompt.kind === 'ids' ? 'given' : ctx.tokenizer ? 'local' : (ctx.remote?.mode ?? 'none'),
      'kvroute.prompt_tokens': tokens.length,
    });
  }

  const request: SubmittedRequest = new Submitted(
    ctx.nextRequestId(),
    api,
    req.body,
    // The client's own id, if any, travels upstream and back for tracing; the router keys its state by its own id,
    // which is unique even when clients reuse theirs.
    sanitizeRequestId(req.headers['x-request-id']),
    tokenizeS,
    Date.now(),
    read,
    ctx.config.maxJsonDepth,
  );
  const step = lifecycle.submit(
    {
      requestId: request.requestId,
      model: parsed.model,
      tokens,
      ...(media ? { mmItems: media.items } : {}),
      cacheSalt: parsed.cacheSalt,
      policy: parsed.policy,
      knobs: parsed.knobs,
      pinKey: parsed.pinKey,
      ...handoffOf(api, json),
      ...identity,
      ...(req.subset ? { subset: req.subset } : {}),
    },
    signal,
  );
  return { kind: 'admitted', request, step };
}

/** The dispatcher's steps for a submitted request: each attempt sent, retried or refused, until one answers. */
async function attempts<W>(
  ctx: FlowContext<W>,
  request: SubmittedRequest,
  first: Promise<Step>,
  signal: AbortSignal,
  port: AttemptPort<W>,
): Promise<FlowResult> {
  const { lifecycle, metrics } = ctx;
  const { requestId } = request;
  let step = await first;
  for (;;) {
    if (step.kind === 'aborted') {
      metrics.outcome('cancelled');
      return { kind: 'cancelled' };
    }
    if (step.kind === 'reject') {
      metrics.refused(step.code);
      if (step.code === 'upstream_failed') metrics.outcome('error');
      return { kind: 'refused', refusal: step };
    }
    const attempt: DispatchAttempt = step;
    port.dispatched?.(attempt, request);
    const worker = ctx.workers.get(attempt.workerId);
    const prefillWorker = attempt.prefill ? ctx.workers.get(attempt.prefill.workerId) : undefined;
    let outcome: AttemptOutcome;
    if (!worker) outcome = { kind: 'failed', message: `${attempt.workerId}: removed` };
    else if (attempt.prefill && !prefillWorker) outcome = { kind: 'prefill_failed', message: `${attempt.prefill.workerId}: removed` };
    else outcome = await port.send(attempt, worker, prefillWorker, request);
    if (outcome.kind === 'done') return { kind: 'answered' };
    if (outcome.kind === 'prefill_failed') {
      ctx.log.warn(
        { requestId, worker: attempt.prefill?.workerId, attempt: attempt.prefill?.attempt, error: outcome.message },
        'prefill leg failed before answering',
      );
      step = await lifecycle.prefillFailed(requestId, outcome.message, signal);
      continue;
    }
    // Failed before the first byte: the dispatcher takes the attempt back and picks the next best without this worker.
    ctx.log.warn(
      { requestId, worker: attempt.workerId, attempt: attempt.attempt, error: outcome.message },
      'upstream failed before the first byte',
    );
    step = await lifecycle.failed(requestId, outcome.message, signal);
  }
}
