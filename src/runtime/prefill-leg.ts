/**
 * The prefill leg of a disaggregated attempt, as both front ends send it: serve before proxying the decode leg itself
 * (src/server/disagg-attempt.ts), the endpoint picker before handing the decode leg to the gateway's proxy. The
 * dispatcher chose both workers; the legs' bodies are the engine's handoff (src/engines/NAME/handoff.ts, from the
 * registry); this module sends the prefill leg, learns the optional fields a worker refuses, and reads what the
 * prefill reports (its cached tokens: the request's delivered reuse).
 *
 * sequential (vLLM, TensorRT-LLM): the prefill (context) leg is sent and its JSON answer read whole; the decode body is
 *   built from it. A leg refused with a 400 that names an optional handoff field (TensorRT-LLM's disagg_request_id,
 *   ctx_usage) is resent once without it, and the worker is remembered as refusing it.
 * bootstrap (SGLang): both legs go at once with one room; the prefill answers once its KV is sent.
 *
 * One id per pair as X-Request-Id on both legs.
 */
import type { Dispatcher as UndiciDispatcher } from 'undici';
import type { DispatchAttempt, PrefillReport } from '../core/dispatch/dispatcher.ts';
import type { HandoffClient, HandoffPair, HandoffWorker, SequentialHandoff } from '../engines/handoff.ts';
import { engineAdapter } from '../engines/index.ts';
import { answerAsStream } from '../engines/trtllm/handoff.ts';
import { DisaggRequestIds, disaggMachineIdOf } from '../engines/trtllm/ids.ts';
import type { PdMetrics } from '../metrics/disagg.ts';
import { readUsage } from '../apis/sse.ts';
import type { Worker } from './workers.ts';

/** What one attempt needs of its worker: where to send, and whether to name the data-parallel rank. */
export type AttemptWorker = Pick<Worker, 'id' | 'url' | 'pool' | 'sourceKeys'>;

/** What a P/D leg needs of its worker (SGLang's bootstrap port, TensorRT-LLM's optional fields, on top of an attempt's). */
export type PdWorker = AttemptWorker & Pick<Worker, 'bootstrapPort' | 'handoffFields'>;

/** Where a leg's warnings go. */
export interface LegLog {
  warn(o: object, m: string): void;
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
export function learnRefusal(h: SequentialHandoff, w: HandoffWorker, status: number, text: string): string[] {
  const learned = h.refusedFields(status, text).filter((f) => (w.fields.settings[f] ?? 'auto') === 'auto' && !w.fields.refused.has(f));
  for (const f of learned) w.fields.refused.add(f);
  return learned;
}

export interface PrefillAnswer {
  readonly kind: 'ok' | 'client_error' | 'failed';
  readonly status?: number;
  readonly text?: string;
  readonly headers?: UndiciDispatcher.ResponseData['headers'];
  readonly message?: string;
}

export async function readPrefill(send: () => Promise<UndiciDispatcher.ResponseData>, workerId: string): Promise<PrefillAnswer> {
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
export async function sequentialPrefill(
  h: SequentialHandoff,
  client: HandoffClient,
  pair: HandoffPair,
  send: (body: string) => () => Promise<UndiciDispatcher.ResponseData>,
  log?: LegLog,
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
export function notJson(text: string): boolean {
  try {
    JSON.parse(text);
    return false;
  } catch {
    return true;
  }
}

/** cached_tokens of a prefill answer: a JSON body, or the usage chunk of a drained stream (SGLang legs stream alike). */
export function prefillCachedTokens(text: string): number | undefined {
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

export function legHeaders(worker: PdWorker, dpRank: number, requestId: string): Record<string, string> {
  const h: Record<string, string> = { 'content-type': 'application/json', 'x-request-id': requestId };
  if (worker.sourceKeys.length > 1) h['x-data-parallel-rank'] = String(dpRank);
  return h;
}

/** One id for both legs of this pair; a retried pair gets its own (a lease of the old one may still be held). */
export function pairIdOf(attempt: DispatchAttempt): string {
  const leg = attempt.prefill!;
  return leg.attempt === 0 && attempt.attempt === 0 ? attempt.requestId : `${attempt.requestId}.${attempt.attempt}.${leg.attempt}`;
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
  ctx: { readonly pd: PdMetrics; readonly config: Parameters<typeof disaggIdsFor>[0]; readonly log?: LegLog },
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
