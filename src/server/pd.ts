/**
 * One disaggregated attempt: a prefill leg and a decode leg. The dispatcher chose both workers; the legs' bodies are
 * the engine's handoff (src/engines/NAME/handoff.ts, from the registry); this module sends them, waits, learns what a
 * worker refuses, and reports what happened. Two flows:
 *
 * sequential (vLLM, TensorRT-LLM)  the prefill (context) leg is sent and its JSON answer read whole; the decode
 *   (generation) body is built from it and proxied to the client. A prefill answer that already finished the request
 *   (TensorRT-LLM: its first token ended it) is the client's answer, streamed if the client asked for a stream. A leg
 *   refused with a 400 that names an optional handoff field (TensorRT-LLM's disagg_request_id, ctx_usage) is resent
 *   once without it, and the worker is remembered as refusing it.
 * bootstrap (SGLang)  both legs at once with one room; the decode answer goes to the client, the prefill answer is
 *   drained (its usage is the delivered reuse). A leg that fails before it starts aborts the other; the dispatcher
 *   retries the pair.
 *
 * One id per pair as X-Request-Id on both legs. The client's first byte waits for the prefill's answer in all flows
 * (for SGLang the prefill answers once its KV is sent, before the decode side can produce a token), so a prefill that
 * fails is always a clean retry.
 */
import type { ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import type { Dispatcher as UndiciDispatcher } from 'undici';
import type { DispatchAttempt, PrefillReport } from '../core/dispatch/dispatcher.ts';
import type { HandoffClient, HandoffPair, HandoffWorker, SequentialHandoff } from '../engines/handoff.ts';
import { engineAdapter } from '../engines/index.ts';
import { answerAsStream } from '../engines/trtllm/handoff.ts';
import { DisaggRequestIds, disaggMachineIdOf } from '../engines/trtllm/ids.ts';
import type { PdMetrics } from '../metrics/pd.ts';
import type { ApiAdapter, RoutedRequest } from '../apis/index.ts';
import { type AttemptContext, type AttemptOutcome, type AttemptWorker, proxyAttempt } from './proxy.ts';
import { readUsage } from '../apis/sse.ts';
import type { RequestTrace } from '../runtime/tracing.ts';
import type { Worker } from '../runtime/workers.ts';

export { DisaggRequestIds, disaggMachineIdOf };

/** What a P/D leg needs of its worker (SGLang's bootstrap port, TensorRT-LLM's optional fields, on top of an attempt's). */
export type PdWorker = AttemptWorker & Pick<Worker, 'bootstrapPort' | 'handoffFields'>;

export type PdOutcome = AttemptOutcome | { readonly kind: 'prefill_failed'; readonly message: string };

export interface PdAttemptRequest {
  readonly attempt: DispatchAttempt;
  readonly decodeWorker: PdWorker;
  readonly prefillWorker: PdWorker;
  readonly api: ApiAdapter;
  readonly parsed: RoutedRequest;
  /** The client's JSON body (the legs' bodies are built from it). */
  readonly clientJson: Record<string, unknown>;
  readonly trace: RequestTrace;
  /** The client's body as received (the decode leg of vLLM is this, byte for byte, plus kv_transfer_params). */
  readonly clientText: string;
  /** The aggregated upstream body (usage requested for streams): SGLang's legs start from it. */
  readonly upstreamBody: string;
  readonly path: string;
  readonly res: ServerResponse;
  readonly signal: AbortSignal;
  readonly t0: number;
  readonly clientRequestId: string | null;
  readonly tokenizeS: number;
}

export interface PdContext extends AttemptContext {
  readonly pd: Pick<PdMetrics, 'legDuration'>;
  /** TensorRT-LLM's disagg_request_id source (unique across replicas). */
  readonly disaggIds: DisaggRequestIds;
}

function handoffWorker(w: PdWorker, rank: number): HandoffWorker {
  return { id: w.id, url: w.url, ranks: w.sourceKeys.length, rank, bootstrapPort: w.bootstrapPort, fields: w.handoffFields };
}

/** The pair as the engine's handoff sees it. */
export function handoffPair(attempt: DispatchAttempt, prefill: PdWorker, decode: PdWorker, ids: DisaggRequestIds): HandoffPair {
  return {
    prefill: handoffWorker(prefill, attempt.prefill!.decision.source.dpRank),
    decode: handoffWorker(decode, attempt.decision.source.dpRank),
    ids,
  };
}

/** The optional fields a refusal names that the worker may learn (auto, not learned yet); learned here. */
function learnRefusal(h: SequentialHandoff, w: HandoffWorker, status: number, text: string): string[] {
  const learned = h.refusedFields(status, text).filter((f) => (w.fields.settings[f] ?? 'auto') === 'auto' && !w.fields.refused.has(f));
  for (const f of learned) w.fields.refused.add(f);
  return learned;
}

interface PrefillAnswer {
  readonly kind: 'ok' | 'client_error' | 'failed';
  readonly status?: number;
  readonly text?: string;
  readonly headers?: UndiciDispatcher.ResponseData['headers'];
  readonly message?: string;
}

async function readPrefill(send: () => Promise<UndiciDispatcher.ResponseData>, workerId: string): Promise<PrefillAnswer> {
  let up: UndiciDispatcher.ResponseData;
  try {
    up = await send();
  } catch (err) {
    return { kind: 'failed', message: `${workerId}: ${(err as Error).message}` };
  }
  let text: string;
  try {
    text = await up.body.text();
  } catch (err) {
    return { kind: 'failed', message: `${workerId}: body failed: ${(err as Error).message}` };
  }
  if (up.statusCode >= 500) return { kind: 'failed', message: `${workerId} answered ${up.statusCode}: ${text.slice(0, 200)}` };
  if (up.statusCode !== 200) return { kind: 'client_error', status: up.statusCode, text, headers: up.headers };
  return { kind: 'ok', status: 200, text, headers: up.headers };
}

/**
 * The sequential prefill leg: send, read whole; a refusal naming optional fields the worker may drop is learned and
 * the leg resent once without them. Returns the answer and the body that got it.
 */
async function sequentialPrefill(
  h: SequentialHandoff,
  client: HandoffClient,
  pair: HandoffPair,
  send: (body: string) => () => Promise<UndiciDispatcher.ResponseData>,
  log?: AttemptContext['log'],
): Promise<{ answer: PrefillAnswer; body: string }> {
  let body = h.prefillBody(client, pair);
  let answer = await readPrefill(send(body), pair.prefill.id);
  if (answer.kind === 'client_error') {
    const learned = learnRefusal(h, pair.prefill, answer.status!, answer.text!);
    if (learned.length > 0) {
      log?.warn({ worker: pair.prefill.id, fields: learned }, `${pair.prefill.id} refuses ${learned.join(', ')}: resent without`);
      body = h.prefillBody(client, pair);
      answer = await readPrefill(send(body), pair.prefill.id);
    }
  }
  return { answer, body };
}

/** A prefill answer that was JSON, checked: the sequential flows read a JSON answer. */
function notJson(text: string): boolean {
  try {
    JSON.parse(text);
    return false;
  } catch {
    return true;
  }
}

/** cached_tokens of a prefill answer: a JSON body, or the usage chunk of a drained stream (SGLang legs stream alike). */
function prefillCachedTokens(text: string): number | undefined {
  try {
    return readUsage((JSON.parse(text) as { usage?: unknown }).usage)?.cachedTokens;
  } catch {
    /* a stream: look at its events */
  }
  let cached: number | undefined;
  for (const line of text.split('\n')) {
    if (!line.startsWith('data:') || !line.includes('"usage"')) continue;
    try {
      cached = readUsage((JSON.parse(line.slice(5)) as { usage?: unknown }).usage)?.cachedTokens ?? cached;
    } catch {
      /* not JSON: skip */
    }
  }
  return cached;
}

function legHeaders(worker: PdWorker, dpRank: number, requestId: string): Record<string, string> {
  const h: Record<string, string> = { 'content-type': 'application/json', 'x-request-id': requestId };
  if (worker.sourceKeys.length > 1) h['x-data-parallel-rank'] = String(dpRank);
  return h;
}

/** One id for both legs of this pair; a retried pair gets its own (a lease of the old one may still be held). */
function pairIdOf(attempt: DispatchAttempt): string {
  const leg = attempt.prefill!;
  return leg.attempt === 0 && attempt.attempt === 0 ? attempt.requestId : `${attempt.requestId}.${attempt.attempt}.${leg.attempt}`;
}

/** An answer the router already holds, in the shape of an engine response, so the proxy path accounts it as one. */
function heldResponse(text: string, contentType: string): UndiciDispatcher.ResponseData {
  const bytes = Buffer.from(text, 'utf8');
  const body = Object.assign(Readable.from([bytes]), {
    text: async () => text,
    json: async () => JSON.parse(text) as unknown,
    arrayBuffer: async () => bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength),
    dump: async () => {},
  });
  return { statusCode: 200, headers: { 'content-type': contentType }, body, trailers: {}, opaque: null, context: {} } as never;
}

export async function pdAttempt(ctx: PdContext, a: PdAttemptRequest): Promise<PdOutcome> {
  const { attempt, prefillWorker, decodeWorker, parsed, signal } = a;
  const handoff = engineAdapter(attempt.engine).pd;
  const client: HandoffClient = { body: a.clientJson, text: a.clientText, upstreamBody: a.upstreamBody, chat: a.path.includes('/chat/') };
  const pair = handoffPair(attempt, prefillWorker, decodeWorker, ctx.disaggIds);
  const pdec = attempt.prefill!.decision;
  const pairId = pairIdOf(attempt);
  const pHeaders = legHeaders(prefillWorker, pdec.source.dpRank, pairId);
  const dHeaders = legHeaders(decodeWorker, attempt.decision.source.dpRank, pairId);
  const responseHeaders = {
    'x-kvroute-prefill-worker': pdec.sourceKey,
    'x-kvroute-overlap-blocks': String(pdec.overlapBlocks),
  };
  const legAbort = new AbortController();
  const onAbort = () => legAbort.abort();
  signal.addEventListener('abort', onAbort, { once: true });
  const t0 = performance.now();
  const sendTo = (w: PdWorker, headers: Record<string, string>) => (body: string) => () =>
    w.pool.request({ method: 'POST', path: a.path, headers, body, signal: legAbort.signal });
  try {
    let decodeUpstream: Promise<UndiciDispatcher.ResponseData> | undefined;
    let decodeBody: string | undefined;
    let prefill: PrefillAnswer;
    let sentPrefill = '';
    if (handoff.flow === 'bootstrap') {
      const bodies = handoff.bodies(client, pair);
      decodeBody = bodies.decode;
      // Both legs at once: the prefill side's bootstrap server waits for the decode side.
      decodeUpstream = sendTo(decodeWorker, dHeaders)(decodeBody)();
      decodeUpstream.catch(() => undefined); // observed below; never an unhandled rejection
      const prefillSent = sendTo(prefillWorker, pHeaders)(bodies.prefill)();
      // A decode side that fails before it starts must not leave us waiting on a prefill that waits for it.
      const decodeFailed = decodeUpstream.then(
        async (up) => (up.statusCode >= 500 ? `${decodeWorker.id} answered ${up.statusCode}` : new Promise<never>(() => {})),
        (err: Error) => `${decodeWorker.id}: ${err.message}`,
      );
      const r = await Promise.race([readPrefill(() => prefillSent, prefillWorker.id), decodeFailed]);
      if (typeof r === 'string') {
        legAbort.abort();
        if (signal.aborted) return cancelled(ctx, attempt.requestId);
        return { kind: 'failed', message: r };
      }
      prefill = r;
    } else {
      const p = await sequentialPrefill(handoff, client, pair, sendTo(prefillWorker, pHeaders), ctx.log);
      prefill = p.answer;
      sentPrefill = p.body;
    }
    ctx.pd.legDuration('prefill', (performance.now() - t0) / 1000);

    if (signal.aborted) {
      legAbort.abort();
      return cancelled(ctx, attempt.requestId);
    }
    if (prefill.kind === 'failed') {
      legAbort.abort(); // SGLang: the decode side would wait for a bootstrap that never comes
      return { kind: 'prefill_failed', message: prefill.message! };
    }
    if (prefill.kind === 'client_error') {
      // The engine refused the request itself (the decode side would too): its answer is the client's.
      legAbort.abort();
      ctx.metrics.routed(pdec, { tokenize: a.tokenizeS });
      ctx.lifecycle.finish(attempt.requestId, { outcome: 'error' });
      if (!a.res.destroyed) {
        a.res.writeHead(prefill.status!, {
          'content-type': 'application/json',
          'x-kvroute-worker': attempt.decision.sourceKey,
          ...responseHeaders,
          'x-kvroute-request-id': attempt.requestId,
        });
        a.res.end(prefill.text);
      }
      return { kind: 'done' };
    }
    if (handoff.flow === 'sequential' && notJson(prefill.text!)) {
      // A 200 that is not the JSON answer the engine writes: the prefill worker failed, another may not.
      legAbort.abort();
      return { kind: 'prefill_failed', message: `${prefillWorker.id}: the prefill answer is not JSON: ${prefill.text!.slice(0, 100)}` };
    }
    const cachedTokens = prefillCachedTokens(prefill.text!);
    let resendDecode: ((status: number, text: string) => string | null) | undefined;
    if (handoff.flow === 'sequential') {
      const after = handoff.afterPrefill(client, prefill.text!, pair, sentPrefill);
      ctx.lifecycle.prefillDone(attempt.requestId, { cachedTokens, transferParams: after.kind === 'decode' && after.transferParams });
      if (after.kind === 'finished') {
        // The prefill answer is the whole answer: it goes to the client through the proxy path, no decode leg.
        decodeUpstream = Promise.resolve(
          parsed.stream
            ? heldResponse(answerAsStream(after.answer, client.chat), 'text/event-stream')
            : heldResponse(after.answer, 'application/json'),
        );
      } else {
        decodeBody = after.body;
        resendDecode = (status, text) => {
          if (learnRefusal(handoff, pair.decode, status, text).length === 0) return null;
          ctx.log?.warn(
            { worker: decodeWorker.id, fields: [...pair.decode.fields.refused] },
            `${decodeWorker.id} refuses a handoff field: resent without`,
          );
          const again = handoff.afterPrefill(client, prefill.text!, pair, sentPrefill);
          return again.kind === 'decode' ? again.body : null;
        };
      }
    } else ctx.lifecycle.prefillDone(attempt.requestId, { cachedTokens });

    const tDecode = performance.now();
    const outcome = await proxyAttempt(ctx, {
      attempt,
      worker: decodeWorker,
      api: a.api,
      parsed,
      trace: a.trace,
      body: decodeBody ?? '',
      path: a.path,
      res: a.res,
      signal,
      t0: a.t0,
      clientRequestId: a.clientRequestId,
      tokenizeS: a.tokenizeS,
      requestHeaders: { 'x-request-id': pairId },
      upstream: decodeUpstream,
      responseHeaders,
      accounted: pdec,
      cachedTokensOverride: cachedTokens ?? null,
      failOnLeadingError: true,
      resendOn4xx: resendDecode,
      onFirstToken: () => ctx.pd.legDuration('decode_first_token', (performance.now() - tDecode) / 1000),
    });
    if (outcome.kind === 'done') ctx.pd.legDuration('decode', (performance.now() - tDecode) / 1000);
    return outcome;
  } finally {
    signal.removeEventListener('abort', onAbort);
  }
}

function cancelled(ctx: PdContext, requestId: string): AttemptOutcome {
  ctx.lifecycle.finish(requestId, { outcome: 'cancelled' });
  return { kind: 'done' };
}

/** The prefill leg of a shell that does not carry the decode leg itself (the endpoint picker: the gateway's proxy does). */
export interface PrefillLegRequest {
  readonly attempt: DispatchAttempt;
  readonly prefillWorker: PdWorker;
  readonly decodeWorker: PdWorker;
  readonly clientJson: Record<string, unknown>;
  /** The client's body as received. */
  readonly clientText: string;
  readonly path: string;
  /** The client asked for a stream (a prefill answer that finished the request is then sent as one). */
  readonly stream: boolean;
  readonly signal: AbortSignal;
}

export type PrefillLegOutcome =
  /**
   * The body the decode leg must carry. Sequential engines: the prefill answered (`report` as the dispatcher's
   * prefillDone wants it). SGLang: the prefill leg is under way, `answered` settles when it answers (it waits for the
   * decode side's bootstrap connection, so the decode leg must be sent first).
   */
  | {
      readonly kind: 'ok';
      readonly decodeBody: string;
      /** The X-Request-Id both legs carry. */
      readonly pairId: string;
      readonly report?: PrefillReport;
      readonly answered?: Promise<PrefillReport | { readonly failed: string }>;
    }
  /** The prefill answer already finished the request: it is the client's answer (no decode leg). */
  | { readonly kind: 'finished'; readonly body: string; readonly contentType: string; readonly report: PrefillReport }
  | { readonly kind: 'client_error'; readonly status: number; readonly text: string }
  | { readonly kind: 'failed'; readonly message: string };

/** The disagg_request_id source of a front end whose settings are `config` (one per configuration object). */
const idsByConfig = new WeakMap<object, DisaggRequestIds>();
export function disaggIdsFor(config: { readonly disaggMachineId?: number; readonly replicaId?: string }): DisaggRequestIds {
  let ids = idsByConfig.get(config);
  if (!ids) {
    ids = new DisaggRequestIds(config.disaggMachineId ?? disaggMachineIdOf(config.replicaId));
    idsByConfig.set(config, ids);
  }
  return ids;
}

/**
 * The same handoff as pdAttempt, with the decode leg left to the caller: a sequential engine's prefill leg (read
 * whole, the decode body built from its answer), or SGLang's bodies, the prefill leg under way.
 */
export async function prefillLeg(
  ctx: { readonly pd: PdMetrics; readonly config: Parameters<typeof disaggIdsFor>[0]; readonly log?: AttemptContext['log'] },
  a: PrefillLegRequest,
): Promise<PrefillLegOutcome> {
  const { attempt, prefillWorker } = a;
  const handoff = engineAdapter(attempt.engine).pd;
  const leg = attempt.prefill!;
  const pairId = pairIdOf(attempt);
  const headers = legHeaders(prefillWorker, leg.decision.source.dpRank, pairId);
  const t0 = performance.now();
  const send = (body: string) => () => prefillWorker.pool.request({ method: 'POST', path: a.path, headers, body, signal: a.signal });
  const { kvroute: _ours, ...rest } = a.clientJson;
  const upstreamBody = 'kvroute' in a.clientJson ? JSON.stringify(rest) : a.clientText;
  const client: HandoffClient = { body: a.clientJson, text: a.clientText, upstreamBody, chat: a.path.includes('/chat/') };
  const pair = handoffPair(attempt, prefillWorker, a.decodeWorker, disaggIdsFor(ctx.config));
  if (handoff.flow === 'bootstrap') {
    const bodies = handoff.bodies(client, pair);
    const answered = readPrefill(send(bodies.prefill), prefillWorker.id).then((p) => {
      ctx.pd.legDuration('prefill', (performance.now() - t0) / 1000);
      if (p.kind !== 'ok') return { failed: p.message ?? `${prefillWorker.id} answered ${p.status}` };
      return { cachedTokens: prefillCachedTokens(p.text!) };
    });
    return { kind: 'ok', decodeBody: bodies.decode, pairId, answered };
  }
  const { answer: p, body: sent } = await sequentialPrefill(handoff, client, pair, send, ctx.log);
  ctx.pd.legDuration('prefill', (performance.now() - t0) / 1000);
  if (p.kind === 'failed') return { kind: 'failed', message: p.message! };
  if (p.kind === 'client_error') return { kind: 'client_error', status: p.status!, text: p.text! };
  if (notJson(p.text!)) return { kind: 'failed', message: `${prefillWorker.id}: the prefill answer is not JSON: ${p.text!.slice(0, 100)}` };
  const cachedTokens = prefillCachedTokens(p.text!);
  const after = handoff.afterPrefill(client, p.text!, pair, sent);
  if (after.kind === 'finished') {
    return {
      kind: 'finished',
      body: a.stream ? answerAsStream(after.answer, client.chat) : after.answer,
      contentType: a.stream ? 'text/event-stream' : 'application/json',
      report: { cachedTokens, transferParams: false },
    };
  }
  return { kind: 'ok', decodeBody: after.body, pairId, report: { cachedTokens, transferParams: after.transferParams } };
}
