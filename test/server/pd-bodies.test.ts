/**
 * The P/D leg bodies, byte-level: raw members, appended members, vLLM's prefill and decode rules, SGLang's rooms and
 * rank fields, TensorRT-LLM's legs and ids (src/engines/NAME/handoff.ts).
 */
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { parseRequest } from '../../src/apis/openai-request.ts';
import { appendMembers, rawMember } from '../../src/engines/raw-json.ts';
import { bootstrapRoom, sglangBodies, sglangBody } from '../../src/engines/sglang/handoff.ts';
import {
  answerAsStream,
  trtllmContextBody,
  trtllmFinishedAnswer,
  trtllmGenerationBody,
  trtllmGenerationParams,
  trtllmRefusedFields,
} from '../../src/engines/trtllm/handoff.ts';
import { DisaggRequestIds, disaggMachineIdOf } from '../../src/engines/trtllm/ids.ts';
import { vllmDecodeBody, vllmPrefillBody } from '../../src/engines/vllm/handoff.ts';
import type { HandoffPair, HandoffWorker } from '../../src/engines/handoff.ts';

describe('raw JSON members', () => {
  it('finds a top-level value byte for byte, past strings with braces, quotes and nested keys of the same name', () => {
    const text =
      '{"a":"}{\\"kv_transfer_params\\":1","n":{"kv_transfer_params":2},"kv_transfer_params": {"x": 1.50, "y": 18446744073709551615} ,"z":3}';
    expect(rawMember(text, 'kv_transfer_params')).toBe('{"x": 1.50, "y": 18446744073709551615}');
    expect(rawMember(text, 'z')).toBe('3');
    expect(rawMember(text, 'missing')).toBeUndefined();
    expect(rawMember('[1,2]', 'a')).toBeUndefined();
  });

  it('agrees with JSON.parse on any object (property)', () => {
    fc.assert(
      fc.property(
        fc.dictionary(fc.string({ maxLength: 6 }), fc.jsonValue({ maxDepth: 3 }), { maxKeys: 5 }),
        fc.boolean(),
        (obj, spaced) => {
          const text = JSON.stringify(obj, null, spaced ? 1 : 0);
          for (const k of Object.keys(obj)) {
            const raw = rawMember(text, k);
            expect(JSON.parse(raw!)).toEqual(JSON.parse(JSON.stringify(obj[k])));
          }
        },
      ),
      { numRuns: 200 },
    );
  });

  it('appends members to an object, empty or not', () => {
    expect(appendMembers('{}', [['a', '1']])).toBe('{"a":1}');
    expect(
      JSON.parse(
        appendMembers('{"x": [1] }\n', [
          ['a', '"b"'],
          ['c', 'null'],
        ]),
      ),
    ).toEqual({ x: [1], a: 'b', c: null });
  });
});

describe('vLLM legs', () => {
  const client = {
    model: 'm',
    prompt: [1, 2, 3],
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: 50,
    max_completion_tokens: 40,
    min_tokens: 2,
    min_completion_tokens: 1,
    temperature: 0.2,
  };
  const text = JSON.stringify(client);
  const parsed = parseRequest('completions', JSON.parse(text));

  it('prefill: the client body with the P request, no stream, one token, no stream_options or minimums', () => {
    const p = JSON.parse(vllmPrefillBody(parsed));
    expect(p).toEqual({
      model: 'm',
      prompt: [1, 2, 3],
      stream: false,
      max_tokens: 1,
      max_completion_tokens: 1,
      temperature: 0.2,
      kv_transfer_params: {
        do_remote_decode: true,
        do_remote_prefill: false,
        remote_engine_id: null,
        remote_block_ids: null,
        remote_host: null,
        remote_port: null,
      },
    });
  });

  it('decode: the client bytes plus the params verbatim; without params, the client bytes alone', () => {
    const params = '{ "remote_block_ids": [[1, 2]], "ratio": 1.50 }';
    const d = vllmDecodeBody({ body: parsed.body, text }, params);
    expect(d.startsWith(text.slice(0, -1))).toBe(true);
    expect(rawMember(d, 'kv_transfer_params')).toBe(params);
    expect(vllmDecodeBody({ body: parsed.body, text }, undefined)).toBe(text);
  });
});

const worker = (over: Partial<HandoffWorker>): HandoffWorker => ({
  id: 'w',
  url: 'http://10.0.0.1:8000',
  ranks: 1,
  rank: 0,
  bootstrapPort: 8998,
  fields: { settings: {}, refused: new Set() },
  ...over,
});
const pairOf = (prefill: Partial<HandoffWorker>, decode: Partial<HandoffWorker>): HandoffPair => ({
  prefill: worker(prefill),
  decode: worker(decode),
  ids: new DisaggRequestIds(1),
});

describe('SGLang legs', () => {
  it('rooms are in [0, 2^63) and ≡ the chosen prefill rank mod its DP size', () => {
    for (let i = 0; i < 200; i++) {
      const r = bootstrapRoom(4, 3);
      expect(r >= 0n && r < 1n << 63n).toBe(true);
      expect(r % 4n).toBe(3n);
    }
    const body = sglangBody('{"model":"m"}', '[::1]', 8998, (1n << 63n) - 1n);
    expect(rawMember(body, 'bootstrap_room')).toBe('9223372036854775807');
    expect(JSON.parse(body).bootstrap_host).toBe('[::1]');
  });

  it('DP ranks go in the bodies as smg sends them: routed_dp_rank per leg, disagg_prefill_dp_rank on decode, never data_parallel_rank', () => {
    const { prefill, decode } = sglangBodies(
      '{"model":"m"}',
      pairOf({ ranks: 4, rank: 3, url: 'http://[fd00::1]:30000' }, { ranks: 2, rank: 1 }),
    );
    const p = JSON.parse(prefill) as Record<string, unknown>;
    const d = JSON.parse(decode) as Record<string, unknown>;
    expect(p).toMatchObject({ routed_dp_rank: 3, bootstrap_host: '[fd00::1]', bootstrap_port: 8998 });
    expect(d).toMatchObject({ routed_dp_rank: 1, disagg_prefill_dp_rank: 3 });
    expect(rawMember(prefill, 'bootstrap_room')).toBe(rawMember(decode, 'bootstrap_room'));
    expect(BigInt(rawMember(prefill, 'bootstrap_room')!) % 4n).toBe(3n);
    for (const b of [p, d]) expect(b.data_parallel_rank).toBeUndefined();
    expect(p.disagg_prefill_dp_rank).toBeUndefined();
    // One rank each: nothing to steer, no rank fields.
    const one = sglangBodies('{"model":"m"}', pairOf({}, {}));
    for (const b of [one.prefill, one.decode]) {
      expect(rawMember(b, 'routed_dp_rank')).toBeUndefined();
      expect(rawMember(b, 'disagg_prefill_dp_rank')).toBeUndefined();
    }
  });
});

describe('TensorRT-LLM legs (openai_disagg_service.py @00bb903d965f, openai_protocol.py @0076e9390e1e)', () => {
  const client = {
    model: 'm',
    messages: [{ role: 'user', content: 'hi' }],
    stream: true,
    stream_options: { include_usage: true },
    max_completion_tokens: 50,
  };

  it('the context leg: the client body with its own max-tokens spelling only, not streamed, disaggregated_params, the int64 id exact', () => {
    const id = (1n << 62n) + 12345n; // past 2^53: JSON.parse would round it
    const text = trtllmContextBody({ body: { ...client, kvroute: { policy: 'kv' } } }, id);
    const body = JSON.parse(text) as Record<string, unknown>;
    expect(body).toMatchObject({
      model: 'm',
      stream: false,
      max_completion_tokens: 50,
      disaggregated_params: { request_type: 'context_only' },
    });
    // max_completion_tokens has validation_alias max_tokens under extra="forbid": a second spelling is a 400.
    expect('max_tokens' in body).toBe(false);
    expect(body.stream_options).toBeUndefined();
    expect(body.kvroute).toBeUndefined();
    expect(rawMember(rawMember(text, 'disaggregated_params')!, 'disagg_request_id')).toBe(id.toString());
    const old = JSON.parse(trtllmContextBody({ body: { model: 'm', prompt: 'x', max_tokens: 3 } }, null)) as Record<string, unknown>;
    expect(old).toEqual({ model: 'm', prompt: 'x', max_tokens: 3, stream: false, disaggregated_params: { request_type: 'context_only' } });
  });

  const answer =
    '{"id":"x","choices":[{"index":0,"message":{"content":"a"},"finish_reason":"not_finished","disaggregated_params":{"request_type":"context_only",' +
    '"first_gen_tokens":[7],"ctx_request_id":9007199254740993,"disagg_request_id":4611686018427400249,"encoded_opaque_state":"b3BhcXVl"}}],' +
    '"prompt_token_ids":[1,2,3],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":2}}}';

  it('the generation leg: params from the first choice, generation_only, ids digit for digit, ctx_usage = the answer usage', () => {
    const params = trtllmGenerationParams(answer)!;
    expect(rawMember(params, 'ctx_request_id')).toBe('9007199254740993');
    expect(rawMember(params, 'disagg_request_id')).toBe('4611686018427400249');
    expect(rawMember(params, 'request_type')).toBe('"generation_only"');
    expect(rawMember(params, 'encoded_opaque_state')).toBe('"b3BhcXVl"');
    expect(rawMember(params, 'ctx_usage')).toBe(rawMember(answer, 'usage'));
    const chat = JSON.parse(trtllmGenerationBody({ body: client }, answer, params, true)) as Record<string, unknown>;
    expect(chat).toMatchObject({ stream: true, max_completion_tokens: 50, prompt_token_ids: [1, 2, 3] });
    expect((chat.disaggregated_params as Record<string, unknown>).request_type).toBe('generation_only');
    const completion = JSON.parse(trtllmGenerationBody({ body: { model: 'm', prompt: 'hello' } }, answer, params, false)) as Record<
      string,
      unknown
    >;
    expect(completion.prompt).toEqual([1, 2, 3]);
    // The optional fields follow the decode worker's settings and refusals.
    const basic = trtllmGenerationParams(answer, () => false)!;
    expect(rawMember(basic, 'disagg_request_id')).toBeUndefined();
    expect(rawMember(basic, 'ctx_usage')).toBeUndefined();
    // The id sent on the context leg travels on when the answer did not echo it.
    const noEcho = answer.replace(',"disagg_request_id":4611686018427400249', '');
    expect(rawMember(trtllmGenerationParams(noEcho, () => true, 77n)!, 'disagg_request_id')).toBe('77');
  });

  it('no params at the answer top level are read: no TensorRT-LLM release puts them there', () => {
    expect(trtllmGenerationParams('{"disaggregated_params":{"request_type":"context_only","x":1}}')).toBeUndefined();
  });

  it('an answer without params (a broken handoff): none, and the generation leg goes without them', () => {
    for (const a of ['{"choices":[{"index":0}]}', '{"choices":[]}', '{"choices":[{"disaggregated_params":null}]}', '{}']) {
      expect(trtllmGenerationParams(a)).toBeUndefined();
    }
    const body = JSON.parse(trtllmGenerationBody({ body: client }, '{}', undefined, true)) as Record<string, unknown>;
    expect(body.disaggregated_params).toBeUndefined();
    expect(body.messages).toEqual(client.messages);
  });

  it('a context answer that finished (finish_reason not length / not_finished) is the answer, without its params', () => {
    expect(trtllmFinishedAnswer(answer)).toBeUndefined();
    expect(trtllmFinishedAnswer(answer.replace('"not_finished"', '"length"'))).toBeUndefined();
    const done = trtllmFinishedAnswer(answer.replace('"not_finished"', '"stop"'))!;
    const parsed = JSON.parse(done) as { choices: Record<string, unknown>[] };
    expect(parsed.choices[0].finish_reason).toBe('stop');
    expect(parsed.choices[0].disaggregated_params).toBeUndefined();
    const sse = answerAsStream(done, true);
    const events = sse
      .split('\n\n')
      .filter((e) => e.startsWith('data: '))
      .map((e) => e.slice(6));
    expect(events.at(-1)).toBe('[DONE]');
    expect(JSON.parse(events[0])).toMatchObject({
      object: 'chat.completion.chunk',
      choices: [{ delta: { content: 'a' }, finish_reason: 'stop' }],
    });
    expect(JSON.parse(events[1]).usage.prompt_tokens).toBe(3);
  });

  it('a refusal names the optional fields: pydantic extra_forbidden at (body, disaggregated_params, FIELD)', () => {
    const refusal = `{"error":"[{'type': 'extra_forbidden', 'loc': ('body', 'disaggregated_params', 'disagg_request_id'), 'msg': 'Extra inputs are not permitted', 'input': 12}]"}`;
    expect(trtllmRefusedFields(400, refusal)).toEqual(['disagg_request_id']);
    expect(trtllmRefusedFields(400, refusal.replace('disagg_request_id', 'ctx_usage'))).toEqual(['ctx_usage']);
    expect(trtllmRefusedFields(400, refusal.replace("'disaggregated_params', ", ''))).toEqual([]);
    expect(trtllmRefusedFields(422, refusal)).toEqual([]);
    expect(trtllmRefusedFields(400, '{"error":"max_tokens must be positive"}')).toEqual([]);
  });

  it('disagg_request_id: unique and increasing within a replica even when the clock stalls, steps back or 4,096 ids share a ms; the machine id in bits 12-21', () => {
    let now = Date.UTC(2026, 11, 1);
    const ids = new DisaggRequestIds(700, () => now);
    const seen = new Set<bigint>();
    let last = -1n;
    for (let i = 0; i < 10_000; i++) {
      if (i === 5000) now -= 60_000; // the clock steps back a minute
      if (i % 3000 === 0) now += 1;
      const id = ids.next();
      expect(id > last).toBe(true);
      expect((id >> 12n) & 1023n).toBe(700n);
      expect(id < 1n << 63n).toBe(true);
      last = id;
      seen.add(id);
    }
    expect(seen.size).toBe(10_000);
    // Two replicas with different machine ids never collide, even on the same clock.
    const other = new DisaggRequestIds(701, () => now);
    const a = new DisaggRequestIds(700, () => now + 1e6);
    const b = new DisaggRequestIds(701, () => now + 1e6);
    for (let i = 0; i < 100; i++) expect(a.next()).not.toBe(b.next());
    expect(other.next()).not.toBe(ids.next());
    expect(() => new DisaggRequestIds(1024)).toThrow(RangeError);
    expect(disaggMachineIdOf('replica-a')).toBe(disaggMachineIdOf('replica-a'));
    expect(disaggMachineIdOf('replica-a')).toBeLessThan(1024);
  });
});
