/** The P/D leg bodies, byte-level: raw members, appended members, vLLM's prefill and decode rules, SGLang's rooms. */
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { parseRequest } from '../../src/openai/request.ts';
import { appendMembers, rawMember } from '../../src/openai/raw-json.ts';
import { bootstrapRoom, sglangBody, vllmDecodeBody, vllmPrefillBody } from '../../src/server/pd.ts';

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
