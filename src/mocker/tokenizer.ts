/**
 * Tokenizers for the mock engine.
 *
 * - `loadHfTokenizer(dir)`: the model's real tokenizer.json + tokenizer_config.json chat template, through the router's
 *   own tokenizer (src/tokenizer/): rendered as vLLM does (add_generation_prompt true, chat_template_kwargs), then
 *   tokenized WITHOUT adding special tokens.
 * - `SimpleTokenizer`: a documented deterministic stand-in when no tokenizer is given:
 *     pieces = text split as /\s*\S+|\s+/ (each word with its leading whitespace),
 *     id(piece) = 256 + fnv1a32(utf8(piece)) mod (vocabSize - 256).
 *   Decoding maps ids seen by encode back to their piece; other ids (generated tokens) decode to a synthetic word
 *   " w<base36 id>". Chat template (ChatML, as Qwen):
 *     for each message: "<|im_start|>{role}\n{content}<|im_end|>\n"; then "<|im_start|>assistant\n".
 */
import type { ChatPromptInput } from '../tokenizer/chat.ts';
import { LocalTokenizer } from '../tokenizer/local.ts';

/** A chat message as the simple tokenizer reads it (role and text content). */
interface ChatMessage {
  role: string;
  content?: string | Array<{ type: string; text?: string }> | null;
}

export interface MockTokenizer {
  readonly kind: 'hf' | 'simple';
  /** Generated token ids are drawn below this (regular, non-special tokens). */
  readonly vocabSize: number;
  encode(text: string): number[];
  decode(ids: readonly number[]): string;
  /** The prompt text of a chat request (its messages and template inputs, as src/apis/openai-request.ts parsed them). */
  renderChat(input: ChatPromptInput): string;
}

function fnv1a(s: string): number {
  const b = Buffer.from(s, 'utf8');
  let h = 0x811c9dc5;
  for (let i = 0; i < b.length; i++) h = Math.imul(h ^ b[i], 0x01000193);
  return h >>> 0;
}

function contentText(c: ChatMessage['content']): string {
  if (c == null) return '';
  if (typeof c === 'string') return c;
  return c.map((p) => (p && typeof p.text === 'string' ? p.text : '')).join('');
}

export class SimpleTokenizer implements MockTokenizer {
  readonly kind = 'simple' as const;
  /** Pieces seen by encode, for decode; bounded so a long-running mocker does not grow without end. */
  private readonly seen = new Map<number, string>();

  constructor(readonly vocabSize = 32000) {}

  encode(text: string): number[] {
    const pieces = text.match(/\s*\S+|\s+/g) ?? [];
    const out = new Array<number>(pieces.length);
    for (let i = 0; i < pieces.length; i++) {
      const id = 256 + (fnv1a(pieces[i]) % (this.vocabSize - 256));
      out[i] = id;
      if (this.seen.size >= 200_000) this.seen.clear();
      this.seen.set(id, pieces[i]);
    }
    return out;
  }

  decode(ids: readonly number[]): string {
    let s = '';
    for (const id of ids) s += this.seen.get(id) ?? ` w${id.toString(36)}`;
    return s;
  }

  renderChat(input: ChatPromptInput): string {
    let s = '';
    for (const m of input.messages as ChatMessage[]) s += `<|im_start|>${m.role}\n${contentText(m.content)}<|im_end|>\n`;
    // As vLLM: continuing the final message means no generation prompt.
    if (!input.continue_final_message && input.add_generation_prompt !== false) s += '<|im_start|>assistant\n';
    return s;
  }
}

/** The model's real tokenizer and chat template: the router's own (src/tokenizer/), so both tokenize alike. */
class HfTokenizer implements MockTokenizer {
  readonly kind = 'hf' as const;
  readonly vocabSize: number;

  constructor(private readonly local: LocalTokenizer) {
    this.vocabSize = local.regularVocabSize;
  }

  encode(text: string): number[] {
    return this.local.encodeCold(text);
  }

  decode(ids: readonly number[]): string {
    return this.local.tokenizer.decode(ids as number[], { skip_special_tokens: false });
  }

  renderChat(input: ChatPromptInput): string {
    return this.local.chat.render(input);
  }
}

/** Loads `dir/tokenizer.json` and `dir/tokenizer_config.json` (rejects with the path when unreadable). */
export async function loadHfTokenizer(dir: string): Promise<MockTokenizer> {
  return new HfTokenizer(await LocalTokenizer.load(dir));
}
