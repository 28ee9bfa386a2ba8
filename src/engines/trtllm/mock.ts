/**
 * TensorRT-LLM's disaggregated handoff, engine side, for the mock engine, as strict as trtllm-serve: every leg is first
 * checked against TensorRT-LLM's request models (./protocol.ts, from tensorrt_llm/serve/openai_protocol.py
 * @0076e9390e1e; extra="forbid": an unknown or second-spelled field is a 400), for the DisaggregatedParams of the release
 * modelled (`--pd-trtllm-params`).
 *
 * context     a request with disaggregated_params.request_type "context_only" prefills (one token) and keeps its
 *             blocks for a lease; its answer's first choice carries disaggregated_params {request_type, first_gen_tokens,
 *             ctx_request_id (past 2^53, written as a bare integer), encoded_opaque_state (where to pull the KV from),
 *             draft_tokens, disagg_request_id (echoed digit for digit, newer releases)}, finish_reason "not_finished"
 *             ("stop" when the first token ends the request: no lease then), and the answer its prompt_token_ids
 * generation  a request with request_type "generation_only" must name the lease's ctx_request_id exactly and, for chat,
 *             the prompt's prompt_token_ids; it pulls that KV (a missing or stale handoff fails or recomputes, as the
 *             load-failure policy says). Its disaggregated_params are kept (stats) for tests of what the router sent.
 */
import { rawMember, rawMembers } from '../raw-json.ts';
import type { MockHandoff, PdPlan } from '../mock-handoff.ts';
import { trtllmErrorBody, trtllmRequestErrors } from './protocol.ts';

const BIG = '\u0000big:';
/** JSON text with the marked strings written as bare integers (JSON.stringify cannot write a bigint). */
const bareIntegers = (json: string) => json.replace(/"\\u0000big:(-?\d+)"/g, '$1');

export const trtllmMock: MockHandoff = {
  name: 'trtllm',
  async plan(host, leg): Promise<PdPlan | null> {
    const errors = trtllmRequestErrors(leg.raw, leg.endpoint, host.options.trtllmDisaggParams ?? 'current');
    if (errors.length > 0) {
      host.stats.refusedLegs++;
      return { refusal: { status: 400, body: trtllmErrorBody(errors) } };
    }
    const dpRaw = rawMember(leg.raw, 'disaggregated_params');
    if (dpRaw === undefined || dpRaw === 'null') return null;
    const dp = new Map(rawMembers(dpRaw) ?? []);
    const requestType = JSON.parse(dp.get('request_type') ?? 'null') as unknown;
    if (leg.role === 'prefill' && requestType === 'context_only') {
      const idText = dp.get('disagg_request_id');
      if (idText !== undefined && idText !== 'null') {
        host.stats.disaggRequestIds.push(idText);
        if (host.stats.disaggRequestIds.length > 1000) host.stats.disaggRequestIds.shift();
      }
      const seq = host.nextSeq();
      // Past 2^53: a router that reads it as a Number rounds it, and the generation leg names no lease.
      const ctxRequestId = ((1n << 60n) + BigInt(seq)).toString();
      const leaseId = `${host.engineId}-ctx-${seq}`;
      const params = (finish: string) => ({
        finish_reason: finish,
        disaggregated_params: {
          request_type: 'context_only',
          first_gen_tokens: [],
          ctx_request_id: `${BIG}${ctxRequestId}`,
          encoded_opaque_state: Buffer.from(
            JSON.stringify({ host: host.host, port: host.httpPort(), lease: leaseId, ctx: ctxRequestId }),
          ).toString('base64'),
          draft_tokens: null,
          ...(idText !== undefined && idText !== 'null' ? { disagg_request_id: `${BIG}${idText}` } : {}),
        },
      });
      const common = { maxTokens: 1, extra: () => ({ prompt_token_ids: leg.prompt }), rewrite: bareIntegers };
      // The first token ended the request: the context answer is the whole answer; nothing is held for a pull.
      if (leg.eosFirstToken) return { ...common, choiceExtra: () => params('stop') };
      return { ...host.lease(leg.prompt, leaseId), ...common, choiceExtra: () => params('not_finished') };
    }
    if (leg.role === 'decode' && requestType === 'generation_only') {
      host.stats.generationParams.push(dpRaw);
      if (host.stats.generationParams.length > 100) host.stats.generationParams.shift();
      let where: Record<string, unknown> = {};
      try {
        where = JSON.parse(Buffer.from(JSON.parse(dp.get('encoded_opaque_state') ?? '""') as string, 'base64').toString('utf8')) as Record<
          string,
          unknown
        >;
      } catch {
        /* a handoff without our opaque state: the pull below fails */
      }
      const named = dp.get('ctx_request_id');
      if (named !== String(where.ctx)) {
        return {
          failure: `KV transfer failed: ctx_request_id ${named ?? '(none)'} names no context request (expected ${String(where.ctx)})`,
        };
      }
      const ids = leg.endpoint === 'chat' ? rawMember(leg.raw, 'prompt_token_ids') : undefined;
      if (ids !== undefined && ids !== 'null' && ids !== JSON.stringify(leg.prompt)) {
        return { refusal: { status: 400, body: JSON.stringify({ error: 'prompt_token_ids do not match the prompt' }) } };
      }
      const local = leg.localHitTokens();
      const got = await host.pull({ host: where.host, port: where.port, leaseId: where.lease });
      if ('error' in got) {
        if (host.loadFailurePolicy === 'fail') return { failure: `KV transfer failed: ${got.error}` };
        return {};
      }
      await host.transfer(Math.max(0, leg.prompt.length - local));
      return { preloadedTokens: leg.prompt.length };
    }
    return null;
  },
};
