/**
 * One disaggregated attempt in serve: the prefill leg (src/runtime/prefill-leg.ts, as the endpoint picker sends it),
 * then the decode leg proxied to the client (proxy.ts). The dispatcher chose both workers; the legs' bodies are the
 * engine's handoff (src/engines/NAME/handoff.ts, from the registry). Two flows:
 *
 * sequential (vLLM, TensorRT-LLM)  the prefill (context) leg is sent and its JSON answer read whole; the decode
 *   (generation) body is built from it and proxied to the client. A prefill answer that already finished the request
 *   (TensorRT-LLM: its first token ended it) is the client's answer, streamed if the client asked for a stream. A
 *   decode leg refused with a 400 that names an optional handoff field is resent once without it.
 * bootstrap (SGLang)  both legs at once with one room; the decode answer goes to the client, the prefill answer is
 *   drained (its usage is the delivered reuse). A leg that fails before it starts aborts the other; the dispatcher
 *   retries the pair.
 *
 * The client's first byte waits for the prefill's answer in all flows (for SGLang the prefill answers once its KV is
 * sent, before the decode side can produce a token), so a prefill that fails is always a clean retry.
 */
import type { ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import type { Dispatcher as UndiciDispatcher } from 'undici';
import type { DispatchAttempt } from '../core/dispatch/dispatcher.ts';
import type { HandoffClient } from '../engines/handoff.ts';
import { engineAdapter } from '../engines/index.ts';
import { answerAsStream } from '../engines/trtllm/handoff.ts';
import type { DisaggRequestIds } from '../engines/trtllm/ids.ts';
import type { PdMetrics } from '../metrics/disagg.ts';
import type { ApiAdapter, RoutedRequest } from '../apis/index.ts';
import type { AttemptOutcome } from '../runtime/request-flow.ts';
import {
  handoffPair,
  learnRefusal,
  legHeaders,
  notJson,
  pairIdOf,
  type PdWorker,
  type PrefillAnswer,
  prefillCachedTokens,
  readPrefill,
  sequentialPrefill,
} from '../runtime/prefill-leg.ts';
import type { RequestTrace } from '../runtime/tracing.ts';
import { type AttemptContext, proxyAttempt } from './proxy.ts';

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

export async function pdAttempt(ctx: PdContext, a: PdAttemptRequest): Promise<AttemptOutcome> {
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
