/** The P/D leg bodies, byte-level: raw members, appended members, vLLM's prefill and decode rules, SGLang's rooms, TensorRT-LLM's legs and ids. */
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { parseRequest } from '../../src/openai/request.ts';
import { appendMembers, rawMember } from '../../src/openai/raw-json.ts';
import {
  bootstrapRoom,
  DisaggRequestIds,
  disaggMachineIdOf,
  sglangBody,
  trtllmContextBody,
  trtllmGenerationBody,
  trtllmGenerationParams,
  vllmDecodeBody,
  vllmPrefillBody,
} from '../../src/server/pd.ts';

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
    const d = vllmDecodeBody(parsed, text, params);
    expect(d.startsWith(text.slice(0, -1))).toBe(true);
    expect(rawMember(d, 'kv_transfer_params')).toBe(params);
    expect(vllmDecodeBody(parsed, text, undefined)).toBe(text);
  });
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
});

describe('TensorRT-LLM legs', () => {
  const client = {
    model: 'm',
    messages: [{ role: 'user', content: 'hi' }],
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: 50,
  };

  it('the context leg: the client body, one token, not streamed, disaggregated_params with the int64 id written exactly', () => {
    const id = (1n << 62n) + 12345n; // past 2^53: JSON.parse would round it
    const text = trtllmContextBody({ body: { ...client, kvroute: { policy: 'kv' } } }, id);
    const body = JSON.parse(text) as Record<string, unknown>;
    expect(body).toMatchObject({ model: 'm', stream: false, max_tokens: 1, disaggregated_params: { request_type: 'context_only' } });
    expect(body.stream_options).toBeUndefined();
    expect(body.kvroute).toBeUndefined();
    expect(rawMember(rawMember(text, 'disaggregated_params')!, 'disagg_request_id')).toBe(id.toString());
  });

  it('the generation leg: params from the first choice, request_type generation_only, ids copied digit for digit', () => {
    const answer =
      '{"id":"x","choices":[{"index":0,"message":{"content":"a"},"disaggregated_params":{"request_type":"context_only",' +
      '"first_gen_tokens":[7],"ctx_request_id":9007199254740993,"disagg_request_id":4611686018427400249,"opaque_state":"b3BhcXVl"}}],' +
      '"prompt_token_ids":[1,2,3],"usage":{"prompt_tokens":3}}';
    const params = trtllmGenerationParams(answer)!;
    expect(rawMember(params, 'ctx_request_id')).toBe('9007199254740993');
    expect(rawMember(params, 'disagg_request_id')).toBe('4611686018427400249');
    expect(rawMember(params, 'request_type')).toBe('"generation_only"');
    expect(rawMember(params, 'opaque_state')).toBe('"b3BhcXVl"');
    const chat = JSON.parse(trtllmGenerationBody({ body: client }, answer, params, true)) as Record<string, unknown>;
    expect(chat).toMatchObject({ stream: true, max_tokens: 50, prompt_token_ids: [1, 2, 3] });
    expect((chat.disaggregated_params as Record<string, unknown>).request_type).toBe('generation_only');
    const completion = JSON.parse(trtllmGenerationBody({ body: { model: 'm', prompt: 'hello' } }, answer, params, false)) as Record<
      string,
      unknown
    >;
    expect(completion.prompt).toEqual([1, 2, 3]);
    // Older servers put the params at the answer's top level.
    expect(rawMember(trtllmGenerationParams('{"disaggregated_params":{"request_type":"context_only","x":1}}')!, 'x')).toBe('1');
  });

  it('an answer without params (a broken handoff): none, and the generation leg goes without them', () => {
    for (const a of ['{"choices":[{"index":0}]}', '{"choices":[]}', '{"choices":[{"disaggregated_params":null}]}', '{}']) {
      expect(trtllmGenerationParams(a)).toBeUndefined();
    }
    const body = JSON.parse(trtllmGenerationBody({ body: client }, '{}', undefined, true)) as Record<string, unknown>;
    expect(body.disaggregated_params).toBeUndefined();
    expect(body.messages).toEqual(client.messages);
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
