/**
 * The Responses API request (`POST /v1/responses`), parsed once for the router and the mock engine: both turn `input`
 * and `instructions` into the chat messages the engine renders with its chat template (as vLLM does), so the router's
 * routing tokens are the engine's prompt. A request that names `previous_response_id` continues a conversation the
 * engine stored: its earlier turns are on that engine only, which is why the router pins it there.
 *
 *   instructions                          -> a system message first
 *   input: "text"                         -> one user message
 *   {role, content} / {type: "message"}   -> that message; content parts input_text / output_text -> text parts
 *   {type: "function_call", call_id, name, arguments}  -> an assistant message with one tool call
 *   {type: "function_call_output", call_id, output}    -> a tool message
 *   {type: "reasoning"}                   -> dropped (the template does not render past reasoning)
 *   tools [{type: "function", name, description, parameters}] -> chat tools {type, function: {...}}
 */
import { badRequest } from '../http/errors.ts';
import type { ChatPromptInput } from '../tokenizer/chat.ts';

export interface ResponsesRequest {
  readonly body: Record<string, unknown>;
  /** null when absent or empty (the engine then serves its default model). */
  readonly model: string | null;
  readonly stream: boolean;
  readonly previousResponseId: string | null;
  /** The engine stores the response (default true): only then can a later request continue it. */
  readonly store: boolean;
  readonly cacheSalt: string | null;
  readonly maxOutputTokens: number | null;
  /** The new turn(s) as chat input (the stored earlier turns are not here). */
  readonly chat: ChatPromptInput;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function partsText(content: unknown, where: string): string | unknown[] {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) throw badRequest(`${where}.content must be a string or a list of content parts`, `${where}.content`);
  return content.map((p, j) => {
    if (!isObject(p) || typeof p.type !== 'string')
      throw badRequest(`${where}.content[${j}] must be a content part`, `${where}.content[${j}]`);
    if ((p.type === 'input_text' || p.type === 'output_text' || p.type === 'text') && typeof p.text === 'string') {
      return { type: 'text', text: p.text };
    }
    return p; // images and files pass through to the template as they are (they do not render as text)
  });
}

/** The messages of `input` (and `instructions`), in order. */
export function responsesToMessages(input: unknown, instructions: unknown): unknown[] {
  const out: unknown[] = [];
  if (instructions !== undefined && instructions !== null) {
    if (typeof instructions !== 'string') throw badRequest('"instructions" must be a string', 'instructions');
    out.push({ role: 'system', content: instructions });
  }
  if (typeof input === 'string') {
    out.push({ role: 'user', content: input });
    return out;
  }
  if (!Array.isArray(input) || input.length === 0) throw badRequest('"input" must be a string or a non-empty list of items', 'input');
  for (let i = 0; i < input.length; i++) {
    const item = input[i];
    const where = `input[${i}]`;
    if (!isObject(item)) throw badRequest(`${where} must be an object`, where);
    const type = item.type ?? 'message';
    if (type === 'message') {
      if (typeof item.role !== 'string') throw badRequest(`${where}.role must be a string`, `${where}.role`);
      const role = item.role === 'developer' ? 'system' : item.role;
      out.push({ role, content: partsText(item.content, where) });
    } else if (type === 'function_call') {
      if (typeof item.name !== 'string' || typeof item.arguments !== 'string') {
        throw badRequest(`${where} (function_call) needs a string name and arguments`, where);
      }
      const id = typeof item.call_id === 'string' ? item.call_id : `call_${i}`;
      out.push({
        role: 'assistant',
        content: null,
        tool_calls: [{ id, type: 'function', function: { name: item.name, arguments: item.arguments } }],
      });
    } else if (type === 'function_call_output') {
      const output = typeof item.output === 'string' ? item.output : JSON.stringify(item.output ?? '');
      out.push({ role: 'tool', tool_call_id: typeof item.call_id === 'string' ? item.call_id : '', content: output });
    } else if (type === 'reasoning') {
    } else {
      throw badRequest(`${where}: input items of type "${String(type)}" are not supported`, `${where}.type`);
    }
  }
  return out;
}

/** Responses function tools as chat tools; other tool types (web search, file search) have no template form. */
export function responsesTools(tools: unknown): unknown[] | null {
  if (tools === undefined || tools === null) return null;
  if (!Array.isArray(tools)) throw badRequest('"tools" must be an array', 'tools');
  const out: unknown[] = [];
  for (const t of tools) {
    if (!isObject(t) || t.type !== 'function' || typeof t.name !== 'string') continue;
    out.push({ type: 'function', function: { name: t.name, description: t.description ?? '', parameters: t.parameters ?? {} } });
  }
  return out.length > 0 ? out : null;
}

export function parseResponsesRequest(body: Record<string, unknown>): ResponsesRequest {
  const model = body.model;
  if (model !== undefined && model !== null && typeof model !== 'string') throw badRequest('"model" must be a string', 'model');
  const stream = body.stream;
  if (stream !== undefined && stream !== null && typeof stream !== 'boolean') throw badRequest('"stream" must be a boolean', 'stream');
  const prev = body.previous_response_id;
  if (prev !== undefined && prev !== null && (typeof prev !== 'string' || prev === '')) {
    throw badRequest('"previous_response_id" must be a non-empty string', 'previous_response_id');
  }
  const store = body.store;
  if (store !== undefined && store !== null && typeof store !== 'boolean') throw badRequest('"store" must be a boolean', 'store');
  const salt = body.cache_salt;
  if (salt !== undefined && salt !== null && (typeof salt !== 'string' || salt === '')) {
    throw badRequest('"cache_salt" must be a non-empty string', 'cache_salt');
  }
  const mot = body.max_output_tokens;
  if (mot !== undefined && mot !== null && (typeof mot !== 'number' || !Number.isSafeInteger(mot) || mot < 1)) {
    throw badRequest('"max_output_tokens" must be an integer >= 1', 'max_output_tokens');
  }
  const kwargs = body.chat_template_kwargs;
  if (kwargs !== undefined && kwargs !== null && !isObject(kwargs))
    throw badRequest('"chat_template_kwargs" must be an object', 'chat_template_kwargs');
  return {
    body,
    model: (model as string | undefined) || null,
    stream: stream === true,
    previousResponseId: (prev as string | undefined) ?? null,
    store: store !== false,
    cacheSalt: (salt as string | undefined) ?? null,
    maxOutputTokens: (mot as number | undefined) ?? null,
    chat: {
      messages: responsesToMessages(body.input, body.instructions),
      tools: responsesTools(body.tools),
      chat_template_kwargs: (kwargs as Record<string, unknown> | undefined) ?? null,
    },
  };
}
