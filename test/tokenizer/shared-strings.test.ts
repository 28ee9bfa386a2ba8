import { describe, expect, it } from 'vitest';
import type { ChatPromptInput } from '../../src/tokenizer/chat.ts';
import { KnownStrings, SentStrings, SHARED_MAX_CHARS, SHARED_MIN_CHARS } from '../../src/tokenizer/shared-strings.ts';

const text = (seed: number, n = SHARED_MIN_CHARS + 10) => `${seed}:`.padEnd(n, String.fromCharCode(97 + (seed % 26)));

/** What the thread gets: a structured clone, as postMessage makes it. */
const wire = <T>(x: T): T => structuredClone(x);

describe('long message contents sent to the tokenizer thread once, then by reference', () => {
  it('gives the thread the input the server had, a long content sent whole only the first time', () => {
    const sent = new SentStrings();
    const known = new KnownStrings();
    const system = text(1);
    const inputs: ChatPromptInput[] = [0, 1, 2].map((n) => ({
      messages: [
        { role: 'system', content: system, name: 'sys' },
        { role: 'user', content: `short ${n}` },
        { role: 'user', content: [{ type: 'text', text: system }] },
      ],
      add_generation_prompt: true,
    }));
    const packed = inputs.map((i) => wire(sent.pack(i)));
    expect(JSON.stringify(packed[0]).length).toBeGreaterThan(system.length);
    expect(JSON.stringify(packed[1].input.messages[0]).length).toBeLessThan(100); // by reference
    expect(JSON.stringify(packed[1]).length).toBeLessThan(system.length + 500); // (a list content is not shared)
    for (let n = 0; n < 3; n++) expect(known.unpack(packed[n])).toEqual(inputs[n]);
    expect(inputs[0].messages[0]).toEqual({ role: 'system', content: system, name: 'sys' }); // the caller's input unchanged
  });

  it('leaves short contents and inputs without long ones as they are', () => {
    const sent = new SentStrings();
    const input: ChatPromptInput = { messages: [{ role: 'user', content: 'x'.repeat(SHARED_MIN_CHARS - 1) }, null, 'odd'] };
    expect(sent.pack(input)).toEqual({ input });
  });

  it('keeps both tables within their bound and in step while contents come and go', () => {
    const sent = new SentStrings();
    const known = new KnownStrings();
    const big = Math.floor(SHARED_MAX_CHARS / 5);
    // 40 calls over 12 distinct large contents, revisited: the table evicts the oldest and re-sends what it dropped.
    for (let k = 0; k < 40; k++) {
      const a = text((k * 7) % 12, big);
      const b = text((k * 5 + 1) % 12, big);
      const input: ChatPromptInput = {
        messages: [
          { role: 'system', content: a },
          { role: 'user', content: b },
        ],
      };
      expect(known.unpack(wire(sent.pack(input)))).toEqual(input);
      expect(known.size).toBeLessThanOrEqual(Math.ceil(SHARED_MAX_CHARS / big) + 1);
    }
  });

  it('refuses a reference the thread does not know (the tables out of step) instead of tokenizing something else', () => {
    const sent = new SentStrings();
    sent.pack({ messages: [{ role: 'system', content: text(3) }] });
    const second = sent.pack({ messages: [{ role: 'system', content: text(3) }] });
    expect(() => new KnownStrings().unpack(wire(second))).toThrow(/unknown/);
  });

  it('applies the removals a call carries even when one of its references fails', () => {
    const known = new KnownStrings();
    known.unpack({ input: { messages: [] }, defs: [[7, text(7)]] });
    expect(known.size).toBe(1);
    const call = { input: { messages: [{ role: 'user', content: { kvrouteShared: 99 } }] }, drops: [7] } as unknown as Parameters<
      KnownStrings['unpack']
    >[0];
    expect(() => known.unpack(call)).toThrow(/unknown/);
    expect(known.size).toBe(0);
  });
});
