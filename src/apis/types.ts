/**
 * What differs between the routed APIs, and nothing else: how a body is parsed into what routing needs, where the
 * usage of an answer is, how a stream ends, and the shape of errors. The one proxy path (inference.ts, proxy.ts) does
 * the rest identically for every API.
 */
import type { KvKnobs } from '../core/types.ts';
import type { ChatPromptInput } from '../tokenizer/chat.ts';
import type { SseDialect, StreamUsage } from './sse.ts';

export type ApiName = 'chat' | 'completions' | 'responses' | 'messages' | 'embeddings' | 'pooling' | 'score' | 'rerank';

/** The prompt the router tokenizes for prefix affinity. */
export type RoutingPrompt =
  | { readonly kind: 'ids'; readonly ids: readonly number[] }
  | { readonly kind: 'text'; readonly text: string }
  | { readonly kind: 'chat'; readonly chat: ChatPromptInput }
  | { readonly kind: 'none' };

export interface RoutedRequest {
  readonly model: string;
  readonly stream: boolean;
  readonly cacheSalt: string | null;
  readonly policy?: string;
  readonly knobs?: Partial<KvKnobs>;
  readonly prompt: RoutingPrompt;
  /** The request continues state the engine stored under this key (previous_response_id): follow its pin. */
  readonly pinKey?: string;
  /** The answer's id names state the engine stores (a stored response): pin it to the worker that served. */
  readonly pinsAnswer: boolean;
  /** OpenAI dialect: the router asked for the usage chunk, the client did not (it is stripped). */
  readonly stripUsage: boolean;
  /** The body sent upstream, from the client's bytes. */
  upstreamBody(raw: string): string;
  /** The same as bytes, built from the client's bytes without decoding them; null: use upstreamBody. */
  upstreamBytes?(raw: Buffer): Buffer | null;
}

export type ErrorStyle = 'openai' | 'anthropic';

export interface ApiAdapter {
  readonly name: ApiName;
  readonly dialect: SseDialect;
  readonly errors: ErrorStyle;
  /** Parses a JSON body; throws a 400 HttpError naming the field. */
  parse(body: unknown): RoutedRequest;
  /** Usage (and the answer's id) of a whole JSON answer; undefined fields are unknown. */
  readAnswer(json: unknown): StreamUsage | undefined;
  /**
   * readAnswer needs more of the answer than its `usage` object (the Responses API's id): the whole answer is parsed.
   * Otherwise readAnswer is given `{ usage }` read from the answer's tail (answerUsage, src/apis/sse.ts).
   */
  readonly answerNeedsWhole?: boolean;
  /** The in-band frame of a stream that failed after its first byte. */
  streamError(message: string): string;
}
