/**
 * Anthropic's Messages API on vLLM: system + messages + tools rendered as chat for routing tokens, Anthropic's SSE
 * events passed through, errors in Anthropic's shape. Usage: input_tokens (uncached), cache_read_input_tokens
 * (delivered reuse), output_tokens.
 */
import { anthropicSseError, parseMessagesRequest } from './messages-request.ts';
import { parseKvrouteField, requireObject, withoutKvroute } from './openai-request.ts';
import { readAnthropicUsage } from './sse.ts';
import type { ApiAdapter, RoutedRequest } from './types.ts';

export const messagesApi: ApiAdapter = {
  name: 'messages',
  dialect: 'anthropic',
  errors: 'anthropic',
  parse(raw: unknown): RoutedRequest {
    const body = requireObject(raw);
    const m = parseMessagesRequest(body);
    const { policy, knobs } = parseKvrouteField(body);
    return {
      model: m.model,
      stream: m.stream,
      cacheSalt: typeof body.cache_salt === 'string' && body.cache_salt !== '' ? body.cache_salt : null,
      policy,
      knobs,
      prompt: { kind: 'chat', chat: m.chat },
      pinsAnswer: false,
      stripUsage: false,
      upstreamBody: (text) => withoutKvroute(body, text),
    };
  },
  readAnswer: (json) => readAnthropicUsage((json as { usage?: unknown } | null)?.usage),
  streamError: anthropicSseError,
};
