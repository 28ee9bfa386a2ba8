import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { isScannedIds, parseWithPromptIds } from '../../src/apis/prompt-ids.ts';
import { parseBody } from '../../src/runtime/request-flow.ts';

const scan = (s: string) => parseWithPromptIds(Buffer.from(s));

/** The scan either gives up or builds exactly JSON.parse's object, keys in the same order. */
function agrees(s: string): boolean {
  const got = scan(s);
  if (got === null) return false;
  expect(JSON.stringify(got)).toBe(JSON.stringify(JSON.parse(s)));
  expect(got).toEqual(JSON.parse(s));
  return true;
}

describe('token-id prompts read from the bytes', () => {
  it('reads the common shapes exactly as JSON.parse does', () => {
    expect(agrees('{"model":"m","prompt":[1,2,3],"max_tokens":4}')).toBe(true);
    expect(agrees(' {\n "prompt" : [ 0 , 4294967295 ,7 ] , "stream": true, "x": {"prompt": "nested"}, "y": ["]", "\\"}"]}\t')).toBe(true);
    expect(agrees('{"prompt":[5],"model":"ü😀","kvroute":{"policy":"p"},"n":null,"t":true,"f":-1.5e3}')).toBe(true);
    const body = scan('{"model":"m","prompt":[10,20]}');
    expect(isScannedIds(body?.prompt)).toBe(true);
    expect(isScannedIds([10, 20])).toBe(false);
  });

  it('grows past its scratch buffer', () => {
    const ids = Array.from({ length: 70_000 }, (_, i) => (i * 7919) % 150_000);
    expect(agrees(JSON.stringify({ model: 'm', stream: false, prompt: ids }))).toBe(true);
  });

  it('gives up on every shape it does not fully understand (JSON.parse decides those)', () => {
    for (const s of [
      '{"prompt":"text"}',
      '{"prompt":[]}',
      '{"prompt":[[1,2],[3]]}',
      '{"prompt":[1,-2]}',
      '{"prompt":[1.0]}',
      '{"prompt":[1e3]}',
      '{"prompt":[01]}',
      '{"prompt":[4294967296]}',
      '{"prompt":[12345678901]}',
      '{"prompt":[1,"2"]}',
      '{"prompt":[1,]}',
      '{"prompt":[1 2]}',
      '{"prompt":[1,2',
      '{"prompt":[1],"prompt":[2]}',
      '{"pr\\u006fmpt":[1],"prompt":[2]}',
      '{"model":"m"}',
      '{}',
      '[1,2]',
      '{"prompt":[1]} x',
      '{"prompt":[1],"model":bench}',
      '{"prompt":[1],"model":"m",}',
      '{"prompt":[1] "model":"m"}',
      '{"model" "m","prompt":[1]}',
      '',
    ]) {
      expect(scan(s), s).toBeNull();
    }
  });

  it('agrees with JSON.parse on generated bodies', () => {
    const value = fc.jsonValue({ maxDepth: 2 });
    const ids = fc.array(fc.integer({ min: 0, max: 0xffffffff }), { minLength: 1, maxLength: 50 });
    fc.assert(
      fc.property(fc.dictionary(fc.string(), value, { maxKeys: 5 }), ids, fc.nat(5), (rest, prompt, at) => {
        const entries = Object.entries(rest).filter(([k]) => k !== 'prompt');
        entries.splice(Math.min(at, entries.length), 0, ['prompt', prompt]);
        const s = JSON.stringify(Object.fromEntries(entries), null, at % 2 === 0 ? undefined : 1);
        const got = scan(s);
        // Keys with escapes in them (quotes, control characters) are left to JSON.parse.
        if (got !== null) expect(JSON.stringify(got)).toBe(JSON.stringify(JSON.parse(s)));
        else expect(entries.some(([k]) => JSON.stringify(k).includes('\\'))).toBe(true);
      }),
      { numRuns: 500 },
    );
  });

  it('parseBody: the same object and the same errors with and without the scan', () => {
    const good = Buffer.from('{"model":"m","prompt":[1,2,3]}');
    expect(parseBody(good, 32, true).body).toEqual(parseBody(good, 32, false).body);
    const bad = Buffer.from('{"model":"m","prompt":[1,2,3]');
    expect(() => parseBody(bad, 32, true)).toThrow(/request body is not valid JSON/);
    const err = (() => {
      try {
        parseBody(bad, 32, true);
      } catch (e) {
        return (e as Error).message;
      }
    })();
    expect(err).toBe(
      (() => {
        try {
          parseBody(bad, 32, false);
        } catch (e) {
          return (e as Error).message;
        }
      })(),
    );
  });
});
