/**
 * TensorRT-LLM's request models as the mock enforces them (src/engines/trtllm/protocol.ts, written from
 * NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py @0076e9390e1ed11515f149eec356f5a03f4a00d8: extra="forbid",
 * max_completion_tokens with validation_alias max_tokens, DisaggregatedParams, UsageInfo), checked on the bodies
 * kvroute sends now and on the ones it sent before (the context leg with both max-tokens spellings, the endpoint
 * picker's vLLM prefill body): the old ones are refused as trtllm-serve refuses them.
 */
import { describe, expect, it } from 'vitest';
import { DisaggRequestIds } from '../../src/engines/trtllm/ids.ts';
import { trtllmContextBody, trtllmGenerationBody, trtllmGenerationParams, trtllmRefusedFields } from '../../src/engines/trtllm/handoff.ts';
import { trtllmErrorBody, trtllmRequestErrors } from '../../src/engines/trtllm/protocol.ts';
import { vllmPrefillBody } from '../../src/engines/vllm/handoff.ts';

const chat = {
  model: 'm',
  messages: [{ role: 'user', content: 'hi' }],
  max_completion_tokens: 9,
  stream: true,
  stream_options: { include_usage: true },
};
const extras = (raw: string, endpoint: 'chat' | 'completions' = 'chat', release?: 'basic' | 'current') =>
  trtllmRequestErrors(raw, endpoint, release).map((e) => `${e.type}:${e.loc.join('.')}`);

describe('TensorRT-LLM request models (strict mock)', () => {
  it("refuses the context leg kvroute sent before: both max-tokens spellings (the alias max_tokens wins, the field's own name is extra)", () => {
    const before = JSON.stringify({
      model: 'm',
      messages: chat.messages,
      stream: false,
      max_completion_tokens: 1,
      max_tokens: 1,
      disaggregated_params: { request_type: 'context_only', disagg_request_id: 7 },
    });
    expect(extras(before)).toEqual(['extra_forbidden:body.max_completion_tokens']);
    const now = trtllmContextBody({ body: chat }, new DisaggRequestIds(3).next());
    expect(extras(now)).toEqual([]);
    expect(extras(now.replace('"max_completion_tokens":9', '"max_tokens":9'))).toEqual([]);
  });

  it("refuses the endpoint picker's old TensorRT-LLM prefill body: vLLM's kv_transfer_params is no field of TensorRT-LLM's", () => {
    expect(extras(vllmPrefillBody({ body: { model: 'm', prompt: 'x', max_tokens: 4 } }), 'completions')).toEqual([
      'extra_forbidden:body.kv_transfer_params',
    ]);
  });

  it('an older DisaggregatedParams (five fields) refuses disagg_request_id and ctx_usage; the refusal names them', () => {
    const ctx = trtllmContextBody({ body: chat }, 123n);
    const errors = trtllmRequestErrors(ctx, 'chat', 'basic');
    expect(errors.map((e) => e.loc.join('.'))).toEqual(['body.disaggregated_params.disagg_request_id']);
    expect(trtllmRefusedFields(400, trtllmErrorBody(errors))).toEqual(['disagg_request_id']);
    expect(extras(trtllmContextBody({ body: chat }, null), 'chat', 'basic')).toEqual([]);
    const answer =
      '{"choices":[{"index":0,"finish_reason":"not_finished","disaggregated_params":{"request_type":"context_only","ctx_request_id":1152921504606846977,"encoded_opaque_state":"eA=="}}],' +
      '"prompt_token_ids":[1,2],"usage":{"prompt_tokens":2,"total_tokens":3,"completion_tokens":1}}';
    const gen = trtllmGenerationBody({ body: chat }, answer, trtllmGenerationParams(answer), true);
    expect(extras(gen, 'chat', 'current')).toEqual([]);
    const old = trtllmRequestErrors(gen, 'chat', 'basic');
    expect(old.map((e) => e.loc.join('.'))).toEqual(['body.disaggregated_params.ctx_usage']);
    expect(trtllmRefusedFields(400, trtllmErrorBody(old))).toEqual(['ctx_usage']);
  });

  it('refuses what pydantic refuses: unknown fields, duplicates, a non-integer id, a bad ctx_usage, stream_options without stream, a suffix', () => {
    expect(extras('{"model":"m","messages":[],"enable_thinking":false}')).toEqual(['extra_forbidden:body.enable_thinking']);
    expect(extras('{"model":"m","messages":[],"n":1,"n":2}')).toEqual(['json_duplicate_key:body.n']);
    expect(extras('{"model":"m","messages":[],"disaggregated_params":{"request_type":"context_only","disagg_request_id":1.5e18}}')).toEqual(
      ['int_parsing:body.disaggregated_params.disagg_request_id'],
    );
    expect(extras('{"model":"m","messages":[],"disaggregated_params":{"ctx_request_id":1}}')).toEqual([
      'missing:body.disaggregated_params.request_type',
    ]);
    expect(
      extras(
        '{"model":"m","messages":[],"disaggregated_params":{"request_type":"generation_only","ctx_usage":{"prompt_tokens":1,"cached":2}}}',
      ),
    ).toEqual(['extra_forbidden:body.disaggregated_params.ctx_usage.cached']);
    expect(extras('{"model":"m","messages":[],"stream":false,"stream_options":{"include_usage":true}}')).toEqual(['value_error:body']);
    expect(extras('{"model":"m","prompt":"x","suffix":"y"}', 'completions')).toEqual(['value_error:body']);
    // Completions have no max_completion_tokens at all.
    expect(extras('{"model":"m","prompt":"x","max_completion_tokens":3}', 'completions')).toEqual([
      'extra_forbidden:body.max_completion_tokens',
    ]);
    expect(extras(JSON.stringify(chat))).toEqual([]);
  });

  it('writes the refusal as trtllm-serve does: 400 {"error": str(errors)} with pydantic\'s loc tuples', () => {
    const body = JSON.parse(trtllmErrorBody(trtllmRequestErrors('{"model":"m","messages":[],"x":1}', 'chat'))) as { error: string };
    expect(body.error).toBe("[{'type': 'extra_forbidden', 'loc': ('body', 'x'), 'msg': 'Extra inputs are not permitted', 'input': 1}]");
  });
});
