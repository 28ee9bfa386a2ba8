/**
 * Tokenization by the engine itself, exact by construction, at the price of a round trip, so answers are cached (an
 * LRU keyed by the request, bounded in tokens) in front of the engine:
 *
 *   tokenize  `POST /tokenize` (vLLM: `prompt` or `messages`; answers `{count, max_model_len, tokens}`)
 *   render    vLLM's render endpoints, which return the token ids the engine itself would run:
 *             `POST /v1/chat/completions/render` (the chat request; answers `{token_ids, ...}`) and
 *             `POST /v1/completions/render` (answers a list `[{token_ids, ...}]`, one per prompt)
 */
import { request } from 'undici';
import type { ChatPromptInput } from './chat.ts';
import { type LruInfo, ownKey, WeightedLru } from './lru.ts';

/** Heap bytes of one cached answer beyond its key's characters and its ids: Map slot, entry record, array header. */
export const ANSWER_OVERHEAD_BYTES = 160;

export interface RemoteTokenizerOptions {
  /**
   * Answer cache budget in estimated bytes (the request's JSON key, 8 bytes per cached token id in a JS array, and
   * ANSWER_OVERHEAD_BYTES per entry). Default 64 MiB; 0 turns it off.
   */
  readonly cacheBytes?: number;
  /** Per-call timeout. Default 2 s: tokenization only buys affinity, it must not hold a request long. */
  readonly timeoutMs?: number;
  /** Which engine endpoints answer. Default tokenize. */
  readonly mode?: 'tokenize' | 'render';
}

export class RemoteTokenizer {
  private readonly cache: WeightedLru<string, readonly number[]>;
  private readonly timeoutMs: number;
  readonly mode: 'tokenize' | 'render';
  failures = 0;
  calls = 0;

  constructor(options: RemoteTokenizerOptions = {}) {
    this.cache = new WeightedLru(options.cacheBytes ?? 64 * 1024 * 1024);
    this.timeoutMs = options.timeoutMs ?? 2000;
    this.mode = options.mode ?? 'tokenize';
  }

  get cacheInfo(): LruInfo {
    return this.cache.info();
  }

  /** Token ids of a chat request from `workerUrl`, or null when the worker could not tokenize it. */
  chat(workerUrl: string, model: string, input: ChatPromptInput): Promise<readonly number[] | null> {
    const body: Record<string, unknown> = {
      model,
      messages: input.messages,
      add_generation_prompt: input.continue_final_message ? false : (input.add_generation_prompt ?? true),
    };
    // /tokenize adds the tokenizer's special tokens unless told; a chat prompt has them in its template already.
    if (this.mode === 'tokenize') body.add_special_tokens = false;
    if (input.continue_final_message) body.continue_final_message = true;
    if (input.tools) body.tools = input.tools;
    if (input.chat_template_kwargs) body.chat_template_kwargs = input.chat_template_kwargs;
    if (input.chat_template) body.chat_template = input.chat_template;
    if (input.documents) body.documents = input.documents;
    return this.call(workerUrl, body, this.mode === 'render' ? '/v1/chat/completions/render' : '/tokenize');
  }

  /** Token ids of a completion prompt string. */
  prompt(workerUrl: string, model: string, prompt: string): Promise<readonly number[] | null> {
    return this.call(workerUrl, { model, prompt }, this.mode === 'render' ? '/v1/completions/render' : '/tokenize');
  }

  private async call(workerUrl: string, body: Record<string, unknown>, path: string): Promise<readonly number[] | null> {
    const json = JSON.stringify(body);
    // The model is part of the key: two models tokenize the same text differently. The worker is not.
    const hit = this.cache.get(json);
    if (hit) return hit;
    this.calls++;
    try {
      const res = await request(new URL(path, workerUrl), {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: json,
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      if (res.statusCode !== 200) {
        await res.body.dump();
        this.failures++;
        return null;
      }
      const tokens = idsOf(await res.body.json());
      if (!Array.isArray(tokens) || !tokens.every((t) => Number.isInteger(t) && t >= 0)) {
        this.failures++;
        return null;
      }
      const { key, bytes } = ownKey(json);
      this.cache.set(key, tokens as number[], ANSWER_OVERHEAD_BYTES + bytes + 8 * tokens.length);
      return tokens as number[];
    } catch {
      this.failures++;
      return null;
    }
  }
}

/** The ids of an answer: /tokenize's `tokens`, chat render's `token_ids`, completion render's first `[{token_ids}]`. */
function idsOf(answer: unknown): unknown {
  const one = Array.isArray(answer) ? answer[0] : answer;
  if (!one || typeof one !== 'object') return undefined;
  const o = one as { tokens?: unknown; token_ids?: unknown; prompt_token_ids?: unknown };
  return o.token_ids ?? o.tokens ?? o.prompt_token_ids;
}
