/**
 * vLLM's pooling APIs, parsed once for the router and the mock engine: `/v1/embeddings` (OpenAI's), `/pooling`,
 * `/score` and `/rerank` (vLLM's, also under /v1). Each names its inputs differently; what both sides need is the list
 * of prompts the engine encodes and, for routing, the prompt whose prefix repeats across requests:
 *
 *   embeddings, pooling   input: "text" | ["text", ...] | [ids] | [[ids], ...]   (or chat `messages`)   -> the first input
 *   score                 text_1: "q" | ["q", ...], text_2: "d" | ["d", ...]  (pairs q+d)              -> text_1
 *   rerank                query: "q", documents: ["d" | {text}, ...]           (pairs q+d)              -> the query
 */
import { badRequest } from '../http/errors.ts';
import type { ChatPromptInput } from '../tokenizer/chat.ts';
import { parseChatInput } from './openai-request.ts';

export type PoolingApi = 'embeddings' | 'pooling' | 'score' | 'rerank';

/** One prompt the engine encodes: text, token ids, or a query/document pair (encoded as query then document). */
export type PoolingInput = string | readonly number[] | { readonly query: string; readonly document: string };

export interface PoolingRequest {
  readonly api: PoolingApi;
  readonly body: Record<string, unknown>;
  readonly model: string | null;
  readonly inputs: readonly PoolingInput[];
  /** Chat input (embeddings and pooling of `messages`). */
  readonly chat: ChatPromptInput | null;
  /** The prompt to route on (its prefix is what repeats across requests). */
  readonly routing: string | readonly number[] | null;
}

function isTokenArray(v: unknown): v is number[] {
  return Array.isArray(v) && v.length > 0 && v.every((t) => typeof t === 'number' && Number.isInteger(t) && t >= 0 && t <= 0xffffffff);
}

function textList(v: unknown, name: string): string[] {
  if (typeof v === 'string') return [v];
  if (Array.isArray(v) && v.length > 0 && v.every((x) => typeof x === 'string')) return v as string[];
  throw badRequest(`"${name}" must be a string or a non-empty list of strings`, name);
}

export function parsePoolingRequest(api: PoolingApi, body: Record<string, unknown>): PoolingRequest {
  const model = body.model;
  if (model !== undefined && model !== null && typeof model !== 'string') throw badRequest('"model" must be a string', 'model');
  const base = { api, body, model: (model as string | undefined) || null };
  if (api === 'embeddings' || api === 'pooling') {
    if (body.messages !== undefined && body.input === undefined) {
      const chat = parseChatInput(body);
      return { ...base, inputs: [], chat, routing: null };
    }
    const input = body.input;
    let inputs: PoolingInput[];
    if (typeof input === 'string') inputs = [input];
    else if (isTokenArray(input)) inputs = [input];
    else if (Array.isArray(input) && input.length > 0 && input.every((x) => typeof x === 'string')) inputs = input as string[];
    else if (Array.isArray(input) && input.length > 0 && input.every(isTokenArray)) inputs = input as number[][];
    else throw badRequest('"input" must be a string, a list of strings, a list of token ids, or a list of token-id lists', 'input');
    return { ...base, inputs, chat: null, routing: inputs[0] as string | number[] };
  }
  if (api === 'score') {
    const q = textList(body.text_1, 'text_1');
    const d = textList(body.text_2, 'text_2');
    if (q.length !== 1 && q.length !== d.length) {
      throw badRequest(`"text_1" must have one item or as many as "text_2" (${d.length}), got ${q.length}`, 'text_1');
    }
    const inputs = d.map((document, i) => ({ query: q.length === 1 ? q[0] : q[i], document }));
    return { ...base, inputs, chat: null, routing: q[0] };
  }
  if (typeof body.query !== 'string') throw badRequest('"query" must be a string', 'query');
  const docs = body.documents;
  if (!Array.isArray(docs) || docs.length === 0) throw badRequest('"documents" must be a non-empty list', 'documents');
  const query = body.query;
  const inputs = docs.map((d, i) => {
    const document =
      typeof d === 'string'
        ? d
        : d && typeof d === 'object' && typeof (d as { text?: unknown }).text === 'string'
          ? (d as { text: string }).text
          : null;
    if (document === null) throw badRequest(`documents[${i}] must be a string or an object with a string "text"`, `documents[${i}]`);
    return { query, document };
  });
  return { ...base, inputs, chat: null, routing: query };
}
