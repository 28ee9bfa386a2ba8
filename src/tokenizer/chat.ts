/**
 * Chat template rendering the way vLLM does it before tokenizing a chat request: the model's Jinja template with
 * `messages`, `tools`, `add_generation_prompt`, `chat_template_kwargs`, `bos_token` and `eos_token`.
 */
import { createHash } from 'node:crypto';
import { Template } from '@huggingface/jinja';
import { FAST_TEMPLATES, type FastRenderer } from './fast-templates.ts';

/** The parts of a chat request that change its rendered prompt. */
export interface ChatPromptInput {
  readonly messages: readonly unknown[];
  readonly tools?: readonly unknown[] | null;
  readonly add_generation_prompt?: boolean;
  readonly continue_final_message?: boolean;
  readonly chat_template_kwargs?: Record<string, unknown> | null;
  readonly documents?: readonly unknown[] | null;
  /** Request-level template override (vLLM extra). */
  readonly chat_template?: string | null;
}

/** Plain-text view of a message content: vLLM joins the text parts of a list content with newlines. */
function flattenContent(content: unknown): unknown {
  if (!Array.isArray(content)) return content;
  const texts: string[] = [];
  for (const part of content) {
    if (typeof part === 'string') texts.push(part);
    else if (part && typeof part === 'object' && typeof (part as { text?: unknown }).text === 'string') {
      texts.push((part as { text: string }).text);
    }
  }
  return texts.join('\n');
}

/**
 * Messages as templates expect them: list contents flattened, tool call arguments given as JSON strings parsed into
 * objects (vLLM does the same so templates can `| tojson` them).
 */
export function normaliseMessages(messages: readonly unknown[]): unknown[] {
  return messages.map((m) => {
    if (!m || typeof m !== 'object') return m;
    const msg = { ...(m as Record<string, unknown>) };
    if ('content' in msg) msg.content = flattenContent(msg.content);
    if (Array.isArray(msg.tool_calls)) {
      msg.tool_calls = msg.tool_calls.map((tc: unknown) => {
        if (!tc || typeof tc !== 'object') return tc;
        const call = tc as { function?: { arguments?: unknown } };
        if (call.function && typeof call.function.arguments === 'string') {
          try {
            return { ...call, function: { ...call.function, arguments: JSON.parse(call.function.arguments) } };
          } catch {
            return tc;
          }
        }
        return tc;
      });
    }
    return msg;
  });
}

function tokenString(v: unknown): string {
  if (typeof v === 'string') return v;
  if (v && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string') {
    return (v as { content: string }).content;
  }
  return '';
}

export class ChatTemplate {
  private readonly defaultTemplate: Template | null;
  /** Request-level overrides compiled once each (bounded: a client could send a new template every time). */
  private readonly overrides = new Map<string, Template>();
  readonly bosToken: string;
  readonly eosToken: string;
  /** Native renderer of this exact template, if known (see fast-templates.ts); null after a verified mismatch. */
  private fast: { name: string; render: FastRenderer } | null = null;
  /** Every this many fast renders, the Jinja template renders too and the two must agree. */
  readonly verifyEvery: number;
  private fastRenders = 0;
  /** Fast-path results checked against Jinja, and the mismatch that switched it off (if any). */
  fastVerified = 0;
  fastMismatch: string | null = null;

  constructor(config: Record<string, unknown>, options: { fastPath?: boolean; verifyEvery?: number } = {}) {
    this.verifyEvery = Math.max(1, options.verifyEvery ?? 64);
    let source = config.chat_template;
    // Some configs carry a list of named templates; vLLM uses the one named "default".
    if (Array.isArray(source)) {
      const def = source.find((t) => t && typeof t === 'object' && (t as { name?: string }).name === 'default');
      source = (def as { template?: string } | undefined)?.template;
    }
    this.defaultTemplate = typeof source === 'string' ? new Template(source) : null;
    if (typeof source === 'string' && options.fastPath !== false) {
      this.fast = FAST_TEMPLATES.get(createHash('sha256').update(source).digest('hex')) ?? null;
    }
    this.bosToken = tokenString(config.bos_token);
    this.eosToken = tokenString(config.eos_token);
  }

  get hasTemplate(): boolean {
    return this.defaultTemplate !== null;
  }

  /** Name of the native renderer in use, or null (Jinja only). */
  get fastPath(): string | null {
    return this.fast?.name ?? null;
  }

  private template(override?: string | null): Template {
    if (override) {
      let t = this.overrides.get(override);
      if (!t) {
        t = new Template(override);
        if (this.overrides.size >= 16) this.overrides.delete(this.overrides.keys().next().value!);
        this.overrides.set(override, t);
      }
      return t;
    }
    if (!this.defaultTemplate) throw new Error('the tokenizer config has no chat_template');
    return this.defaultTemplate;
  }

  /** Renders the prompt text. Throws on template errors (raise_exception, malformed messages). */
  render(input: ChatPromptInput): string {
    const kwargs = input.chat_template_kwargs ?? {};
    const addGenerationPrompt = input.continue_final_message ? false : (input.add_generation_prompt ?? true);
    const context: Record<string, unknown> = {
      ...kwargs,
      messages: normaliseMessages(input.messages),
      add_generation_prompt: addGenerationPrompt,
      continue_final_message: input.continue_final_message ?? false,
      bos_token: this.bosToken,
      eos_token: this.eosToken,
    };
    if (input.tools && input.tools.length > 0) context.tools = input.tools;
    if (input.documents) context.documents = input.documents;
    let text: string | null = null;
    if (this.fast && !input.chat_template) {
      text = this.fast.render({
        messages: context.messages as unknown[],
        tools: (context.tools as unknown[] | undefined) ?? null,
        addGenerationPrompt,
        kwargs,
      });
      if (text !== null && this.fastRenders++ % this.verifyEvery === 0) {
        const reference = this.template(null).render(context);
        this.fastVerified++;
        if (reference !== text) {
          // Switch the fast path off for good: from here on every request renders with Jinja.
          this.fastMismatch = `native ${this.fast.name} renderer differs from the Jinja template`;
          this.fast = null;
          text = reference;
        }
      }
    }
    text ??= this.template(input.chat_template).render(context);
    if (input.continue_final_message) {
      // vLLM cuts the rendered prompt right after the final message's content so the model continues it.
      const last = input.messages[input.messages.length - 1] as { content?: unknown } | undefined;
      const content = flattenContent(last?.content);
      if (typeof content === 'string' && content.length > 0) {
        const at = text.lastIndexOf(content);
        if (at >= 0) text = text.slice(0, at + content.length);
      }
    }
    return text;
  }
}
