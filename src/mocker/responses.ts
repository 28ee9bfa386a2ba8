/**
 * Writes a completion or chat answer as vLLM does, from the engine's outputs: SSE chunks while streaming (a role chunk
 * first for chat, one chunk per delivered step, the usage chunk when asked for, then `[DONE]`), or one JSON body at the
 * end. One `Sink` per prompt; the rank loop feeds them.
 */
import type { ServerResponse } from 'node:http';
import { sendJson } from '../http/body.ts';
import type { Endpoint } from '../apis/openai-request.ts';
import type { Sink } from './rank-loop.ts';
import type { MockTokenizer } from './tokenizer.ts';

export interface AnswerOptions {
  readonly endpoint: Endpoint;
  readonly id: string;
  /** Unix seconds. */
  readonly created: number;
  /** The model name answered (the LoRA adapter's when one was asked for). */
  readonly model: string;
  /** Prompt token ids, one list per prompt. */
  readonly prompts: readonly (readonly number[])[];
  readonly stream: boolean;
  readonly includeUsage: boolean;
  readonly returnTokenIds: boolean;
  /** usage.prompt_tokens_details.cached_tokens (vLLM --enable-prompt-tokens-details). */
  readonly promptTokensDetails: boolean;
  /** Modelled arrival time of the request. */
  readonly arrivalMs: number;
  /** Top-level fields added to a whole (non-streamed) answer when it is complete (a vLLM prefill's kv_transfer_params). */
  readonly extra?: () => Record<string, unknown>;
  /** Fields added to the first choice of a whole answer (a TensorRT-LLM context leg's disaggregated_params). */
  readonly choiceExtra?: () => Record<string, unknown>;
  /** Called once every prompt finished, before the answer is written (a P/D leg's handoff). */
  readonly onComplete?: () => void;
  /** A whole answer's JSON text rewritten before it is sent (TensorRT-LLM's int64 ids as bare integers). */
  readonly rewrite?: (json: string) => string;
}

/** An answer in progress: its sinks (one per prompt). */
export interface Answer {
  readonly sinks: Sink[];
  /** Called when the client closes before the answer is complete; true if it was not complete. */
  clientLeft(): boolean;
}

function usageOf(prompt: number, completion: number, cached: number, details: boolean) {
  const u: Record<string, unknown> = { prompt_tokens: prompt, total_tokens: prompt + completion, completion_tokens: completion };
  if (details) u.prompt_tokens_details = { cached_tokens: cached };
  return u;
}

export function startAnswer(res: ServerResponse, tokenizer: MockTokenizer, o: AnswerOptions): Answer {
  const chat = o.endpoint === 'chat';
  const { id, created, model, prompts, stream, returnTokenIds } = o;
  const object = chat ? 'chat.completion.chunk' : 'text_completion';
  const tokens: number[][] = prompts.map(() => []);
  const cached: number[] = prompts.map(() => 0);
  const counts: number[] = prompts.map(() => 0);
  let finished = 0;
  let done = false;
  const write = (chunk: unknown) => res.write(`data: ${JSON.stringify(chunk)}\n\n`);
  const chunkHead = `data: {"id":"${id}","object":"${object}","created":${created},"model":${JSON.stringify(model)},"choices":[{"index":`;

  if (stream) {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    if (chat) {
      const first: Record<string, unknown> = {
        id,
        object,
        created,
        model,
        choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }],
      };
      if (returnTokenIds) first.prompt_token_ids = prompts[0];
      write(first);
    }
  }

  let pending = '';
  const flush = () => {
    if (pending.length === 0 || res.destroyed) return;
    res.write(pending);
    pending = '';
  };
  const finishAll = () => {
    o.onComplete?.();
    flush();
    done = true;
    let pt = 0;
    let ct = 0;
    let cc = 0;
    prompts.forEach((p, i) => {
      pt += p.length;
      ct += stream ? counts[i] : tokens[i].length;
      cc += cached[i];
    });
    const usage = usageOf(pt, ct, cc, o.promptTokensDetails);
    if (stream) {
      if (o.includeUsage) write({ id, object, created, model, choices: [], usage });
      res.end('data: [DONE]\n\n');
      return;
    }
    const choices = prompts.map((p, i) => {
      const text = tokenizer.decode(tokens[i]);
      if (chat) {
        const c: Record<string, unknown> = {
          index: i,
          message: { role: 'assistant', content: text, tool_calls: [] },
          logprobs: null,
          finish_reason: 'length',
          stop_reason: null,
        };
        if (returnTokenIds) c.token_ids = tokens[i];
        return c;
      }
      const c: Record<string, unknown> = {
        index: i,
        text,
        logprobs: null,
        finish_reason: 'length',
        stop_reason: null,
        prompt_logprobs: null,
      };
      if (returnTokenIds) {
        c.prompt_token_ids = p;
        c.token_ids = tokens[i];
      }
      return c;
    });
    const out: Record<string, unknown> = {
      id,
      object: chat ? 'chat.completion' : 'text_completion',
      created,
      model,
      choices,
      usage,
      ...o.extra?.(),
    };
    if (o.choiceExtra && choices.length > 0) Object.assign(choices[0] as Record<string, unknown>, o.choiceExtra());
    if (returnTokenIds && chat) out.prompt_token_ids = prompts[0];
    if (!o.rewrite) return sendJson(res, 200, out);
    const text = o.rewrite(JSON.stringify(out));
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  };

  const sinks = prompts.map(
    (_, i): Sink => ({
      arrivalMs: o.arrivalMs,
      flush,
      onOutput(out) {
        if (done) return;
        // Streams only need the count; whole responses need the tokens for their text.
        if (stream) counts[i] += out.newTokens.length;
        else for (const t of out.newTokens) tokens[i].push(t);
        if (out.firstToken) cached[i] = out.cachedTokens;
        if (stream) {
          // Hot path (one write per token per stream): the chunk is assembled from a prebuilt head, not stringified whole.
          const text = JSON.stringify(tokenizer.decode(out.newTokens));
          const ids = returnTokenIds ? `,"token_ids":${JSON.stringify(out.newTokens)}` : '';
          const fin = out.finishReason === null ? 'null' : `"${out.finishReason}"`;
          pending += chat
            ? `${chunkHead}${i},"delta":{"content":${text}},"logprobs":null,"finish_reason":${fin}${out.finished ? ',"stop_reason":null' : ''}${ids}}]}\n\n`
            : `${chunkHead}${i},"text":${text},"logprobs":null,"finish_reason":${fin},"stop_reason":null${ids}}]}\n\n`;
        }
        if (out.finished && ++finished === prompts.length) finishAll();
      },
      onAbort() {
        done = true;
        res.destroy();
      },
    }),
  );
  return {
    sinks,
    clientLeft() {
      if (done) return false;
      done = true;
      return true;
    },
  };
}
