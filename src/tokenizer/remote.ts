/**
 * Fallback tokenization through an engine's own `POST /tokenize` (vLLM: accepts `prompt` or `messages`, returns
 * `{count, max_model_len, tokens}`): exact by construction, at the price of a round trip, so answers are cached.
 */
import { request } from 'undici';
import type { ChatPromptInput } from './chat.ts';
import { WeightedLru } from './lru.ts';

export interface RemoteTokenizerOptions {
  /** Cached token budget. Default 16 M tokens. */
  readonly cacheTokens?: number;
  /** Per-call timeout. Default 2 s: tokenization only buys affinity, it must not hold a request long. */
  readonly timeoutMs?: number;
}

export class RemoteTokenizer {
  private readonly cache: WeightedLru<string, readonly number[]>;
  private readonly timeoutMs: number;
  failures = 0;
  calls = 0;

  constructor(options: RemoteTokenizerOptions = {}) {
    this.cache = new WeightedLru(options.cacheTokens ?? 16 * 1024 * 1024);
    this.timeoutMs = options.timeoutMs ?? 2000;
  }

  /** Token ids of a chat request from `workerUrl`, or null when the worker could not tokenize it. */
  chat(workerUrl: string, model: string, input: ChatPromptInput): Promise<readonly number[] | null> {
    const body: Record<string, unknown> = {
      model,
      messages: input.messages,
      add_generation_prompt: input.continue_final_message ? false : (input.add_generation_prompt ?? true),
      add_special_tokens: false,
    };
    if (input.continue_final_message) body.continue_final_message = true;
    if (input.tools) body.tools = input.tools;
    if (input.chat_template_kwargs) body.chat_template_kwargs = input.chat_template_kwargs;
    if (input.chat_template) body.chat_template = input.chat_template;
    return this.call(workerUrl, body);
  }

  /** Token ids of a completion prompt string. */
  prompt(workerUrl: string, model: string, prompt: string): Promise<readonly number[] | null> {
    return this.call(workerUrl, { model, prompt });
  }

  private async call(workerUrl: string, body: Record<string, unknown>): Promise<readonly number[] | null> {
    const json = JSON.stringify(body);
    // The model is part of the key: two models tokenize the same text differently. The worker is not.
    const hit = this.cache.get(json);
    if (hit) return hit;
    this.calls++;
    try {
      const res = await request(new URL('/tokenize', workerUrl), {
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
      const parsed = (await res.body.json()) as { tokens?: unknown };
      const tokens = parsed.tokens;
      if (!Array.isArray(tokens) || !tokens.every((t) => Number.isInteger(t) && t >= 0)) {
        this.failures++;
        return null;
      }
      this.cache.set(json, tokens as number[], tokens.length + 1);
      return tokens as number[];
    } catch {
      this.failures++;
      return null;
    }
  }
}
