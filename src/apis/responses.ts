/**
 * OpenAI's Responses API on vLLM: input items and instructions rendered as chat for routing tokens; a request naming
 * `previous_response_id` follows the pin of that response to the worker that stored it; a stored answer's id is
 * pinned to the worker that served it. Usage: input_tokens, output_tokens, input_tokens_details.cached_tokens.
 */
import { badRequest } from '../http/errors.ts';
import { parseKvrouteField, requireObject, withoutKvroute } from './openai-request.ts';
import { parseResponsesRequest } from './responses-request.ts';
import { readResponsesUsage } from './sse.ts';
import type { ApiAdapter, RoutedRequest } from './types.ts';

export const responsesApi: ApiAdapter = {
  name: 'responses',
  dialect: 'responses',
  errors: 'openai',
  parse(raw: unknown): RoutedRequest {
    const body = requireObject(raw);
    const r = parseResponsesRequest(body);
    const { policy, knobs } = parseKvrouteField(body);
    if (r.model === null) throw badRequest('"model" is required: the router picks workers by the model they serve', 'model');
    return {
      model: r.model,
      stream: r.stream,
      cacheSalt: r.cacheSalt,
      policy,
      knobs,
      prompt: { kind: 'chat', chat: r.chat },
      pinKey: r.previousResponseId ?? undefined,
      pinsAnswer: r.store,
      stripUsage: false,
      upstreamBody: (text) => withoutKvroute(body, text),
    };
  },
  answerNeedsWhole: true,
  readAnswer(json) {
    const j = json as { usage?: unknown; id?: unknown } | null;
    const usage = readResponsesUsage(j?.usage) ?? {};
    return { ...usage, responseId: typeof j?.id === 'string' ? j.id : undefined };
  },
  streamError: (message) => `event: error\ndata: ${JSON.stringify({ type: 'error', code: 'stream_failed', message, param: null })}\n\n`,
};
