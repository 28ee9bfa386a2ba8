/**
 * Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`), parsed once for the router and the mock
 * engine, and turned into the chat messages the engine renders with its chat template (as vLLM's Anthropic endpoint
 * does), so the router's routing tokens are the engine's prompt:
 *
 *   system: "text" | [{type: "text", text}]       -> a system message first
 *   content blocks text                            -> text parts
 *   tool_use {id, name, input} (assistant)         -> a tool call (arguments = JSON of input)
 *   tool_result {tool_use_id, content} (user)      -> a tool message
 *   image / document                               -> passed to the template as parts (no text)
 *   tools [{name, description, input_schema}]      -> chat tools {type: "function", function: {...}}
 *
 * Errors on this API have Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
 */
import type { ServerResponse } from 'node:http';
import { badRequest, type HttpError } from '../http/errors.ts';
import type { ChatPromptInput } from '../tokenizer/chat.ts';

export interface MessagesRequest {
  readonly body: Record<string, unknown>;
  readonly model: string;
  readonly stream: boolean;
  readonly maxTokens: number;
  readonly chat: ChatPromptInput;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function text(blocks: unknown, where: string): string {
  if (typeof blocks === 'string') return blocks;
  if (!Array.isArray(blocks)) throw badRequest(`${where} must be a string or a list of content blocks`, where);
  return blocks.map((b) => (isObject(b) && b.type === 'text' && typeof b.text === 'string' ? b.text : '')).join('\n');
}

/** The chat messages of `system` and `messages`, in order. */
export function anthropicToMessages(system: unknown, messages: unknown): unknown[] {
  const out: unknown[] = [];
  if (system !== undefined && system !== null) out.push({ role: 'system', content: text(system, 'system') });
  if (!Array.isArray(messages) || messages.length === 0) throw badRequest('messages: must be a non-empty list', 'messages');
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i];
    const where = `messages.${i}`;
    if (!isObject(m) || (m.role !== 'user' && m.role !== 'assistant')) {
      throw badRequest(`${where}.role: must be "user" or "assistant"`, `${where}.role`);
    }
    if (typeof m.content === 'string') {
      out.push({ role: m.role, content: m.content });
      continue;
    }
    if (!Array.isArray(m.content)) throw badRequest(`${where}.content: must be a string or a list of content blocks`, `${where}.content`);
    const parts: unknown[] = [];
    const toolCalls: unknown[] = [];
    const toolResults: unknown[] = [];
    for (let j = 0; j < m.content.length; j++) {
      const b = m.content[j];
      if (!isObject(b) || typeof b.type !== 'string')
        throw badRequest(`${where}.content.${j}: must be a content block`, `${where}.content.${j}`);
      if (b.type === 'text') {
        if (typeof b.text !== 'string') throw badRequest(`${where}.content.${j}.text: must be a string`, `${where}.content.${j}.text`);
        parts.push({ type: 'text', text: b.text });
      } else if (b.type === 'tool_use') {
        if (typeof b.name !== 'string') throw badRequest(`${where}.content.${j}.name: must be a string`, `${where}.content.${j}.name`);
        toolCalls.push({
          id: String(b.id ?? `toolu_${j}`),
          type: 'function',
          function: { name: b.name, arguments: JSON.stringify(b.input ?? {}) },
        });
      } else if (b.type === 'tool_result') {
        toolResults.push({
          role: 'tool',
          tool_call_id: String(b.tool_use_id ?? ''),
          content: text(b.content ?? '', `${where}.content.${j}.content`),
        });
      } else if (b.type === 'thinking' || b.type === 'redacted_thinking') {
      } else parts.push(b);
    }
    out.push(...toolResults);
    if (parts.length > 0 || toolCalls.length > 0) {
      const msg: Record<string, unknown> = { role: m.role, content: parts.length > 0 ? parts : null };
      if (toolCalls.length > 0) msg.tool_calls = toolCalls;
      out.push(msg);
    }
  }
  return out;
}

export function anthropicTools(tools: unknown): unknown[] | null {
  if (tools === undefined || tools === null) return null;
  if (!Array.isArray(tools)) throw badRequest('tools: must be a list', 'tools');
  const out = tools
    .filter((t): t is Record<string, unknown> => isObject(t) && typeof t.name === 'string')
    .map((t) => ({ type: 'function', function: { name: t.name, description: t.description ?? '', parameters: t.input_schema ?? {} } }));
  return out.length > 0 ? out : null;
}

/**
 * Parses a Messages request by Anthropic's rules (model, max_tokens >= 1 and messages required). `countTokens`: the
 * count_tokens body, which has no max_tokens and never streams.
 */
export function parseMessagesRequest(body: Record<string, unknown>, countTokens = false): MessagesRequest {
  if (typeof body.model !== 'string' || body.model === '') throw badRequest('model: field required', 'model');
  const mt = body.max_tokens;
  if (!countTokens && (typeof mt !== 'number' || !Number.isSafeInteger(mt) || mt < 1)) {
    throw badRequest('max_tokens: field required (an integer >= 1)', 'max_tokens');
  }
  const stream = body.stream;
  if (stream !== undefined && stream !== null && typeof stream !== 'boolean') throw badRequest('stream: must be a boolean', 'stream');
  return {
    body,
    model: body.model,
    stream: !countTokens && stream === true,
    maxTokens: typeof mt === 'number' ? mt : 0,
    chat: { messages: anthropicToMessages(body.system, body.messages), tools: anthropicTools(body.tools) },
  };
}

/** Anthropic's error types by HTTP status. */
export function anthropicErrorType(status: number): string {
  switch (status) {
    case 400:
      return 'invalid_request_error';
    case 401:
      return 'authentication_error';
    case 403:
      return 'permission_error';
    case 404:
      return 'not_found_error';
    case 413:
      return 'request_too_large';
    case 429:
      return 'rate_limit_error';
    case 503:
    case 529:
      return 'overloaded_error';
    default:
      return status >= 500 ? 'api_error' : 'invalid_request_error';
  }
}

export function anthropicErrorBody(status: number, message: string): string {
  return JSON.stringify({ type: 'error', error: { type: anthropicErrorType(status), message } });
}

/** Writes an HttpError in Anthropic's shape (its status and headers kept). */
export function sendAnthropicError(res: ServerResponse, err: HttpError): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = anthropicErrorBody(err.status, err.message);
  res.writeHead(err.status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...err.headers });
  res.end(body);
}

/** The SSE event sent when a stream fails after its first byte. */
export function anthropicSseError(message: string): string {
  return `event: error\ndata: ${JSON.stringify({ type: 'error', error: { type: 'api_error', message } })}\n\n`;
}
