/** OpenAI chat completions and completions: the request parser shared with the mock engine, usage in `usage`. */
import { sseErrorFrame } from '../http/errors.ts';
import { type Endpoint, parseRequest, upstreamBody, upstreamBytes } from './openai-request.ts';
import { readUsage } from './sse.ts';
import type { ApiAdapter, RoutedRequest } from './types.ts';

function adapter(endpoint: Endpoint): ApiAdapter {
  return {
    name: endpoint,
    dialect: 'openai',
    errors: 'openai',
    parse(body: unknown): RoutedRequest {
      const p = parseRequest(endpoint, body);
      return {
        model: p.model,
        stream: p.stream,
        cacheSalt: p.cacheSalt,
        policy: p.policy,
        knobs: p.knobs,
        prompt: p.promptIds
          ? { kind: 'ids', ids: p.promptIds }
          : p.promptText !== null
            ? { kind: 'text', text: p.promptText }
            : p.chat
              ? { kind: 'chat', chat: p.chat }
              : { kind: 'none' },
        pinsAnswer: false,
        stripUsage: !p.clientWantsUsage,
        upstreamBody: (raw) => upstreamBody(p, raw),
        upstreamBytes: (raw) => upstreamBytes(p, raw),
      };
    },
    readAnswer: (json) => readUsage((json as { usage?: unknown } | null)?.usage),
    streamError: (message) => sseErrorFrame(message, 'stream_failed'),
  };
}

export const chatApi = adapter('chat');
export const completionsApi = adapter('completions');
