/** The routed paths and their adapters. Each path is forwarded to the engine as it came (vLLM serves them all). */
import { messagesApi } from './messages.ts';
import { chatApi, completionsApi } from './openai.ts';
import { embeddingsApi, poolingApi, rerankApi, scoreApi } from './pooling.ts';
import { responsesApi } from './responses.ts';
import type { ApiAdapter } from './types.ts';

export type { ApiAdapter, ApiName, RoutedRequest, RoutingPrompt } from './types.ts';

export const ROUTED_PATHS: ReadonlyMap<string, ApiAdapter> = new Map([
  ['/v1/chat/completions', chatApi],
  ['/v1/completions', completionsApi],
  ['/v1/responses', responsesApi],
  ['/v1/messages', messagesApi],
  ['/v1/embeddings', embeddingsApi],
  ['/pooling', poolingApi],
  ['/v1/pooling', poolingApi],
  ['/score', scoreApi],
  ['/v1/score', scoreApi],
  ['/rerank', rerankApi],
  ['/v1/rerank', rerankApi],
  ['/v2/rerank', rerankApi],
]);

/** Paths answered with Anthropic's error shape (every error, the router's own included). */
export function anthropicPath(path: string): boolean {
  return path === '/v1/messages' || path.startsWith('/v1/messages/');
}
