/**
 * Embeddings (OpenAI's /v1/embeddings) and vLLM's /pooling, /score, /rerank: routed on their prompt (the first input, or
 * the query of a score/rerank) so requests repeating a prefix meet the engine that cached it. These APIs report no
 * cached tokens: delivered reuse is unknown, never zero.
 */
import { badRequest, sseErrorFrame } from '../http/errors.ts';
import { type PoolingApi, parsePoolingRequest } from './pooling-request.ts';
import { parseKvrouteField, requireObject, withoutKvroute } from './openai-request.ts';
import { readUsage } from './sse.ts';
import type { ApiAdapter, RoutedRequest } from './types.ts';

function adapter(api: PoolingApi): ApiAdapter {
  return {
    name: api,
    dialect: 'openai',
    errors: 'openai',
    parse(raw: unknown): RoutedRequest {
      const body = requireObject(raw);
      const p = parsePoolingRequest(api, body);
      const { policy, knobs } = parseKvrouteField(body);
      if (p.model === null) throw badRequest('"model" is required: the router picks workers by the model they serve', 'model');
      const r = p.routing;
      return {
        model: p.model,
        stream: false,
        cacheSalt: typeof body.cache_salt === 'string' && body.cache_salt !== '' ? body.cache_salt : null,
        policy,
        knobs,
        prompt: p.chat
          ? { kind: 'chat', chat: p.chat }
          : typeof r === 'string'
            ? { kind: 'text', text: r }
            : r
              ? { kind: 'ids', ids: r }
              : { kind: 'none' },
        pinsAnswer: false,
        stripUsage: false,
        upstreamBody: (text) => withoutKvroute(body, text),
      };
    },
    readAnswer: (json) => readUsage((json as { usage?: unknown } | null)?.usage),
    streamError: (message) => sseErrorFrame(message, 'stream_failed'),
  };
}

export const embeddingsApi = adapter('embeddings');
export const poolingApi = adapter('pooling');
export const scoreApi = adapter('score');
export const rerankApi = adapter('rerank');
