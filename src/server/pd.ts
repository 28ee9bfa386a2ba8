/**
 * One disaggregated attempt: a prefill leg and a decode leg, the handoff exactly as the engines document it. The
 * dispatcher chose both workers; this module only speaks the protocols and reports what happened.
 *
 * vLLM (NixlConnector, the flow of vLLM's own disaggregation proxy): one request id as X-Request-Id on both legs.
 *   prefill  the client's body + kv_transfer_params {do_remote_decode: true, do_remote_prefill: false, remote_*: null},
 *            stream false, max_tokens 1 (and max_completion_tokens 1 when present), without stream_options, min_tokens,
 *            min_completion_tokens; the whole JSON answer is read
 *   decode   the client's original body + the answer's kv_transfer_params copied verbatim (byte for byte), streamed to
 *            the client; an answer without kv_transfer_params is counted and the decode leg goes without (it recomputes)
 * SGLang (bootstrap): bootstrap_host (the prefill worker's host), bootstrap_port, a random bootstrap_room in [0, 2^63)
 *   (≡ the prefill rank mod its DP size) added to the body, identical on both legs, both sent at once; the decode answer
 *   goes to the client, the prefill answer is drained (its usage is the delivered reuse). A leg that fails before it
 *   starts aborts the other; the dispatcher retries the pair.
 *
 * TensorRT-LLM (its disaggregated server's flow): the context leg is the client's body + disaggregated_params
 *   {request_type: "context_only", disagg_request_id}, stream false, max_tokens 1 (as vLLM's prefill); disagg_request_id
 *   is a 63-bit id unique across router replicas (`DisaggRequestIds`). The answer's first choice carries
 *   disaggregated_params (older servers: the answer's top level); the generation leg is the client's body + those params
 *   copied verbatim except request_type "generation_only", plus the answer's prompt_token_ids (chat) or prompt
 *   (completions). An answer without the params is counted and the generation leg goes without them (it recomputes).
 *
 * The client's first byte waits for the prefill's answer in all flavours (for SGLang the prefill answers once its KV is
 * sent, before the decode side can produce a token), so a prefill that fails is always a clean retry.
 */
import { randomBytes } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import type { Dispatcher as UndiciDispatcher } from 'undici';
import type { DispatchAttempt, PrefillReport } from '../core/dispatch/dispatcher.ts';
import type { ApiAdapter, RoutedRequest } from './apis/index.ts';
import type { RequestTrace } from './tracing.ts';
import { appendMembers, rawFirstElement, rawMember, rawMembers } from '../openai/raw-json.ts';
import type { PdMetrics } from '../metrics/pd.ts';
import { type AttemptContext, type AttemptOutcome, type AttemptWorker, proxyAttempt } from './proxy.ts';
import { readUsage } from './sse.ts';
import type { Worker } from './workers.ts';

/** What a P/D leg needs of its worker (SGLang's bootstrap port on top of an attempt's). */
export type PdWorker = AttemptWorker & Pick<Worker, 'bootstrapPort'>;

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

/** vLLM's prefill request: what the NixlConnector's P side expects. */
export const VLLM_PREFILL_PARAMS = {
  do_remote_decode: true,
  do_remote_prefill: false,
  remote_engine_id: null,
  remote_block_ids: null,
  remote_host: null,
  remote_port: null,
} as const;

/** A client request as the legs' bodies need it: its JSON object. */
interface ClientBody {
  readonly body: Record<string, unknown>;
}

/** The client's body without kvroute's own field, as an object. */
function clientBody(parsed: ClientBody): Record<string, unknown> {
  const { kvroute: _ours, ...rest } = parsed.body;
  return rest;
}

export function vllmPrefillBody(parsed: ClientBody): string {
  const body = clientBody(parsed);
  body.kv_transfer_params = { ...VLLM_PREFILL_PARAMS };
  body.stream = false;
  body.max_tokens = 1;
  if ('max_completion_tokens' in body) body.max_completion_tokens = 1;
  delete body.stream_options;
  delete body.min_tokens;
  delete body.min_completion_tokens;
  return JSON.stringify(body);
}

/** The decode leg: the client's own body (its stream, stream_options, max_tokens, min_tokens) + kv_transfer_params. */
export function vllmDecodeBody(parsed: ClientBody, clientText: string, transferParams: string | undefined): string {
  const untouched = !('kvroute' in parsed.body) && !('kv_transfer_params' in parsed.body);
  const { kv_transfer_params: _theirs, ...rest } = clientBody(parsed);
  const base = untouched ? clientText : JSON.stringify(rest);
  return transferParams === undefined ? base : appendMembers(base, [['kv_transfer_params', transferParams]]);
}

/**
 * TensorRT-LLM's disagg_request_id: an int64 the context and generation servers pair the legs by, so it must be unique
 * across router replicas. Layout (Snowflake, as TensorRT-LLM's own ids and other gateways use): 41 bits of ms since
 * 2023-01-01, 10 bits of machine id (one per replica: --disagg-machine-id), 12 bits of counter; 63 bits, positive. The
 * timestamp never goes back (a clock step back reuses the last one) and a counter overflow borrows the next ms, so one
 * replica never repeats an id.
 */
export class DisaggRequestIds {
  static readonly EPOCH_MS = Date.UTC(2023, 0, 1);
  private lastMs = -1;
  private counter = 0;

  constructor(
    private readonly machineId: number,
    private readonly now: () => number = Date.now,
  ) {
    if (!Number.isInteger(machineId) || machineId < 0 || machineId > 1023)
      throw new RangeError(`machine id must be in [0, 1023], got ${machineId}`);
  }

  next(): bigint {
    let ms = Math.max(0, Math.floor(this.now() - DisaggRequestIds.EPOCH_MS));
    if (ms <= this.lastMs) {
      ms = this.lastMs;
      if (++this.counter > 4095) {
        ms++;
        this.counter = 0;
      }
    } else this.counter = 0;
    this.lastMs = ms;
    return (BigInt(ms) << 22n) | (BigInt(this.machineId) << 12n) | BigInt(this.counter);
  }
}

/** A replica's machine id from its --replica-id (FNV-1a, 10 bits), or a random one without it. */
export function disaggMachineIdOf(replicaId: string | undefined): number {
  if (replicaId === undefined) return randomBytes(2).readUInt16BE() & 1023;
  let h = 0x811c9dc5;
  for (let i = 0; i < replicaId.length; i++) h = Math.imul(h ^ replicaId.charCodeAt(i), 0x01000193);
  return (h >>> 0) & 1023;
}

/** TensorRT-LLM's context leg: the client's body + disaggregated_params, one token, not streamed. */
export function trtllmContextBody(parsed: ClientBody, disaggRequestId: bigint): string {
  const body = clientBody(parsed);
  delete body.disaggregated_params;
  body.stream = false;
  body.max_tokens = 1;
  if ('max_completion_tokens' in body) body.max_completion_tokens = 1;
  delete body.stream_options;
  delete body.min_tokens;
  delete body.min_completion_tokens;
  // The id goes in as a bare integer: JSON.stringify cannot write a bigint.
  return appendMembers(JSON.stringify(body), [
    ['disaggregated_params', `{"request_type":"context_only","disagg_request_id":${disaggRequestId.toString()}}`],
  ]);
}

/**
 * The context answer's disaggregated_params with request_type set to generation_only, as raw JSON (its int64 ids are
 * copied digit for digit), or undefined when the answer has none.
 */
export function trtllmGenerationParams(answer: string): string | undefined {
  let raw: string | undefined;
  const choices = rawMember(answer, 'choices');
  const first = choices === undefined ? undefined : rawFirstElement(choices);
  if (first?.startsWith('{')) raw = rawMember(first, 'disaggregated_params');
  if (raw === undefined || raw === 'null') raw = rawMember(answer, 'disaggregated_params');
  if (raw === undefined || !raw.startsWith('{')) return undefined;
  // Member by member from their raw texts, so the int64 ids keep every digit.
  const members = (rawMembers(raw) ?? []).filter(([k]) => k !== 'request_type');
  members.push(['request_type', '"generation_only"']);
  return appendMembers('{}', members);
}

/** The generation leg: the client's body + the handoff params + the prompt's token ids from the context answer. */
export function trtllmGenerationBody(parsed: ClientBody, answer: string, params: string | undefined, chat: boolean): string {
  const { disaggregated_params: _theirs, ...rest } = clientBody(parsed);
  const members: [string, string][] = [];
  if (params !== undefined) members.push(['disaggregated_params', params]);
  const ids = rawMember(answer, 'prompt_token_ids');
  if (ids?.startsWith('[')) {
    if (chat) members.push(['prompt_token_ids', ids]);
    else {
      delete rest.prompt;
      members.push(['prompt', ids]);
    }
  }
  return appendMembers(JSON.stringify(rest), members);
}

const ROOM_MASK = (1n << 63n) - 1n;

/** A random bootstrap room in [0, 2^63) whose residue mod the prefill's DP size is the chosen rank. */
export function bootstrapRoom(dpSize: number, rank: number): bigint {
  let room = randomBytes(8).readBigUInt64BE() & ROOM_MASK;
  if (dpSize > 1) {
    const dp = BigInt(dpSize);
    room = room - (room % dp) + BigInt(rank);
    if (room > ROOM_MASK) room -= dp;
  }
  return room;
}

export function sglangBody(upstreamBody: string, host: string, port: number, room: bigint): string {
  return appendMembers(upstreamBody, [
    ['bootstrap_host', JSON.stringify(host)],
    ['bootstrap_port', String(port)],
    ['bootstrap_room', room.toString()],
  ]);
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

export async function pdAttempt(ctx: PdContext, a: PdAttemptRequest): Promise<PdOutcome> {
  const { attempt, prefillWorker, decodeWorker, parsed, signal } = a;
  const client: ClientBody = { body: a.clientJson };
  const leg = attempt.prefill!;
  const pdec = leg.decision;
  // One id for both legs of this pair; a retried pair gets its own (a lease of the old one may still be held).
  const pairId = leg.attempt === 0 && attempt.attempt === 0 ? attempt.requestId : `${attempt.requestId}.${attempt.attempt}.${leg.attempt}`;
  const pHeaders = legHeaders(prefillWorker, pdec.source.dpRank, pairId);
  const responseHeaders = {
    'x-kvroute-prefill-worker': pdec.sourceKey,
    'x-kvroute-overlap-blocks': String(pdec.overlapBlocks),
  };
  const legAbort = new AbortController();
  const onAbort = () => legAbort.abort();
  signal.addEventListener('abort', onAbort, { once: true });
  const t0 = performance.now();
  try {
    let prefillBody: string;
    let decodeUpstream: Promise<UndiciDispatcher.ResponseData> | undefined;
    let decodeBody: string | undefined;
    const sglang = attempt.engine === 'sglang';
    const trtllm = attempt.engine === 'trtllm';
    if (sglang) {
      const host = new URL(prefillWorker.url).hostname;
      const room = bootstrapRoom(prefillWorker.sourceKeys.length, pdec.source.dpRank);
      prefillBody = sglangBody(a.upstreamBody, host, prefillWorker.bootstrapPort, room);
      decodeBody = prefillBody;
      // Both legs at once: the prefill side's bootstrap server waits for the decode side.
      decodeUpstream = decodeWorker.pool.request({
        method: 'POST',
        path: a.path,
        headers: legHeaders(decodeWorker, attempt.decision.source.dpRank, pairId),
        body: decodeBody,
        signal: legAbort.signal,
      });
      decodeUpstream.catch(() => undefined); // observed below; never an unhandled rejection
    } else prefillBody = trtllm ? trtllmContextBody(client, ctx.disaggIds.next()) : vllmPrefillBody(client);

    const prefillSent = prefillWorker.pool.request({
      method: 'POST',
      path: a.path,
      headers: pHeaders,
      body: prefillBody,
      signal: legAbort.signal,
    });
    let prefill: PrefillAnswer;
    if (decodeUpstream) {
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
    } else prefill = await readPrefill(() => prefillSent, prefillWorker.id);
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
    if (!sglang) {
      try {
        JSON.parse(prefill.text!);
      } catch {
        // A 200 that is not the JSON answer vLLM writes: the prefill worker failed, another may not.
        legAbort.abort();
        return { kind: 'prefill_failed', message: `${prefillWorker.id}: the prefill answer is not JSON: ${prefill.text!.slice(0, 100)}` };
      }
    }
    const cachedTokens = prefillCachedTokens(prefill.text!);
    let transferParams: string | undefined;
    if (trtllm) transferParams = trtllmGenerationParams(prefill.text!);
    else if (!sglang) {
      transferParams = rawMember(prefill.text!, 'kv_transfer_params');
      if (transferParams === 'null' || (transferParams !== undefined && !transferParams.startsWith('{'))) transferParams = undefined;
    }
    ctx.lifecycle.prefillDone(attempt.requestId, { cachedTokens, ...(sglang ? {} : { transferParams: transferParams !== undefined }) });

    const tDecode = performance.now();
    const outcome = await proxyAttempt(ctx, {
      attempt,
      worker: decodeWorker,
      api: a.api,
      parsed,
      trace: a.trace,
      body:
        decodeBody ??
        (trtllm
          ? trtllmGenerationBody(client, prefill.text!, transferParams, a.path.includes('/chat/'))
          : vllmDecodeBody(client, a.clientText, transferParams)),
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
  readonly prefillWorker: Worker;
  readonly clientJson: Record<string, unknown>;
  /** The client's body as received. */
  readonly clientText: string;
  readonly path: string;
  readonly signal: AbortSignal;
}

export type PrefillLegOutcome =
  /**
   * The body the decode leg must carry. vLLM: the prefill answered (`cachedTokens`, `transferParams` as the dispatcher's
   * prefillDone wants them). SGLang: the prefill leg is under way, `answered` settles when it answers (it waits for the
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
  | { readonly kind: 'client_error'; readonly status: number; readonly text: string }
  | { readonly kind: 'failed'; readonly message: string };

/**
 * The same handoff as pdAttempt, with the decode leg left to the caller: vLLM's prefill request (read whole, its
 * kv_transfer_params copied verbatim into the decode body), or SGLang's bootstrap fields added to the client's body,
 * identical on both legs.
 */
export async function prefillLeg(ctx: { readonly pd: PdMetrics }, a: PrefillLegRequest): Promise<PrefillLegOutcome> {
  const { attempt, prefillWorker } = a;
  const client: ClientBody = { body: a.clientJson };
  const leg = attempt.prefill!;
  const pairId = leg.attempt === 0 && attempt.attempt === 0 ? attempt.requestId : `${attempt.requestId}.${attempt.attempt}.${leg.attempt}`;
  const headers = legHeaders(prefillWorker, leg.decision.source.dpRank, pairId);
  const t0 = performance.now();
  const send = (body: string) => () => prefillWorker.pool.request({ method: 'POST', path: a.path, headers, body, signal: a.signal });
  if (attempt.engine === 'sglang') {
    const host = new URL(prefillWorker.url).hostname;
    const room = bootstrapRoom(prefillWorker.sourceKeys.length, leg.decision.source.dpRank);
    const { kvroute: _ours, ...rest } = a.clientJson;
    const base = 'kvroute' in a.clientJson ? JSON.stringify(rest) : a.clientText;
    const body = sglangBody(base, host, prefillWorker.bootstrapPort, room);
    const answered = readPrefill(send(body), prefillWorker.id).then((p) => {
      ctx.pd.legDuration('prefill', (performance.now() - t0) / 1000);
      if (p.kind !== 'ok') return { failed: p.message ?? `${prefillWorker.id} answered ${p.status}` };
      return { cachedTokens: prefillCachedTokens(p.text!) };
    });
    return { kind: 'ok', decodeBody: body, pairId, answered };
  }
  const p = await readPrefill(send(vllmPrefillBody(client)), prefillWorker.id);
  ctx.pd.legDuration('prefill', (performance.now() - t0) / 1000);
  if (p.kind === 'failed') return { kind: 'failed', message: p.message! };
  if (p.kind === 'client_error') return { kind: 'client_error', status: p.status!, text: p.text! };
  try {
    JSON.parse(p.text!);
  } catch {
    return { kind: 'failed', message: `${prefillWorker.id}: the prefill answer is not JSON: ${p.text!.slice(0, 100)}` };
  }
  let transferParams = rawMember(p.text!, 'kv_transfer_params');
  if (transferParams === 'null' || (transferParams !== undefined && !transferParams.startsWith('{'))) transferParams = undefined;
  return {
    kind: 'ok',
    decodeBody: vllmDecodeBody(client, a.clientText, transferParams),
    pairId,
    report: { cachedTokens: prefillCachedTokens(p.text!), transferParams: transferParams !== undefined },
  };
}
