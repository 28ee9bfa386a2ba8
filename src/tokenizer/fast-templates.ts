/**
 * Native renderers for well-known chat templates, picked by the SHA-256 of the template text.
 *
 * Why: @huggingface/jinja interprets templates at 20–35 µs per message, so a 300-message conversation spends ~8 ms in
 * the template alone, every turn, more than tokenizing the turn's new text with the segment cache. A native function
 * renders the same conversation in well under a millisecond. Safety: a renderer returns null for any input it does
 * not model exactly (the Jinja template then renders it), ChatTemplate re-renders a sample of requests with Jinja and
 * switches the fast path off at the first difference, and a property test pins equality. A difference would only
 * cost cache affinity (routing tokens), never correctness: the engine renders its own prompt.
 */

export interface FastRenderInput {
  readonly messages: readonly unknown[];
  readonly tools?: readonly unknown[] | null;
  readonly addGenerationPrompt: boolean;
  readonly kwargs: Record<string, unknown>;
}

export type FastRenderer = (input: FastRenderInput) => string | null;

/** JSON as @huggingface/jinja's `tojson` writes it (Python's json.dumps separators ", " and ": "). */
export function jinjaToJson(v: unknown): string | null {
  if (v === null) return 'null';
  switch (typeof v) {
    case 'string':
    case 'number':
    case 'boolean':
      return JSON.stringify(v);
    case 'object': {
      if (Array.isArray(v)) {
        const parts: string[] = [];
        for (const x of v) {
          const s = jinjaToJson(x);
          if (s === null) return null;
          parts.push(s);
        }
        return `[${parts.join(', ')}]`;
      }
      const parts: string[] = [];
      for (const [k, x] of Object.entries(v as Record<string, unknown>)) {
        const s = jinjaToJson(x);
        if (s === null) return null;
        parts.push(`${JSON.stringify(k)}: ${s}`);
      }
      return `{${parts.join(', ')}}`;
    }
    default:
      return null; // undefined, functions: not modelled
  }
}

// The template says strip('\n'); @huggingface/jinja's strip/lstrip/rstrip ignore the argument and trim all
// whitespace (Python's jinja2, hence vLLM, trims newlines only). We match the library we verify against; the two differ
// only for reasoning text with spaces at its edges.
const stripNl = (s: string) => s.trim();
const lstripNl = (s: string) => s.trimStart();
const rstripNl = (s: string) => s.trimEnd();

interface Msg {
  role: string;
  content: string;
  reasoning_content?: unknown;
  tool_calls?: unknown;
}

/** Qwen3's chat template (tools, tool calls and responses, reasoning, enable_thinking). */
export const qwen3: FastRenderer = (input) => {
  const msgs = input.messages as Msg[];
  for (const m of msgs) {
    if (!m || typeof m !== 'object' || typeof m.role !== 'string' || typeof m.content !== 'string') return null;
  }
  if (msgs.length === 0) return null;
  const out: string[] = [];
  const tools = input.tools && input.tools.length > 0 ? input.tools : null;
  if (tools) {
    out.push('<|im_start|>system\n');
    if (msgs[0].role === 'system') out.push(`${msgs[0].content}\n\n`);
    out.push(
      '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>',
    );
    for (const t of tools) {
      const j = jinjaToJson(t);
      if (j === null) return null;
      out.push('\n', j);
    }
    out.push(
      '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n',
    );
  } else if (msgs[0].role === 'system') {
    out.push(`<|im_start|>system\n${msgs[0].content}<|im_end|>\n`);
  }
  let lastQuery = msgs.length - 1;
  for (let i = msgs.length - 1; i >= 0; i--) {
    const m = msgs[i];
    if (m.role === 'user' && !(m.content.startsWith('<tool_response>') && m.content.endsWith('</tool_response>'))) {
      lastQuery = i;
      break;
    }
  }
  for (let i = 0; i < msgs.length; i++) {
    const m = msgs[i];
    const last = i === msgs.length - 1;
    if (m.role === 'user' || (m.role === 'system' && i > 0)) {
      out.push(`<|im_start|>${m.role}\n${m.content}<|im_end|>\n`);
    } else if (m.role === 'assistant') {
      let content = m.content;
      let reasoning = '';
      if (m.reasoning_content !== undefined && m.reasoning_content !== null) {
        if (typeof m.reasoning_content !== 'string') return null;
        reasoning = m.reasoning_content;
      } else if (m.content.includes('</think>')) {
        const parts = m.content.split('</think>');
        content = lstripNl(parts[parts.length - 1]);
        const before = rstripNl(parts[0]).split('<think>');
        reasoning = lstripNl(before[before.length - 1]);
      }
      if (i > lastQuery && (last || reasoning)) {
        out.push(`<|im_start|>${m.role}\n<think>\n${stripNl(reasoning)}\n</think>\n\n${lstripNl(content)}`);
      } else {
        out.push(`<|im_start|>${m.role}\n${content}`);
      }
      const calls = m.tool_calls;
      if (calls !== undefined && calls !== null) {
        if (!Array.isArray(calls)) return null;
        for (let k = 0; k < calls.length; k++) {
          if ((k === 0 && content) || k > 0) out.push('\n');
          let call = calls[k] as Record<string, unknown>;
          if (!call || typeof call !== 'object') return null;
          if (call.function) call = call.function as Record<string, unknown>;
          if (!call || typeof call !== 'object' || typeof call.name !== 'string') return null;
          const args = typeof call.arguments === 'string' ? call.arguments : jinjaToJson(call.arguments);
          if (args === null) return null;
          out.push('<tool_call>\n{"name": "', call.name, '", "arguments": ', args, '}\n</tool_call>');
        }
      }
      out.push('<|im_end|>\n');
    } else if (m.role === 'tool') {
      if (i === 0 || msgs[i - 1].role !== 'tool') out.push('<|im_start|>user');
      out.push('\n<tool_response>\n', m.content, '\n</tool_response>');
      if (last || msgs[i + 1].role !== 'tool') out.push('<|im_end|>\n');
    }
  }
  if (input.addGenerationPrompt) {
    out.push('<|im_start|>assistant\n');
    if (input.kwargs.enable_thinking === false) out.push('<think>\n\n</think>\n\n');
  }
  return out.join('');
};

/** SHA-256 of the template text -> renderer. */
export const FAST_TEMPLATES: ReadonlyMap<string, { name: string; render: FastRenderer }> = new Map([
  ['87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5', { name: 'qwen3', render: qwen3 }],
]);
