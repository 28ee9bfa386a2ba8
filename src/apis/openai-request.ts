/**
 * OpenAI request parsing shared by the router and the mock engine. The fields both read (model, the prompt forms,
 * messages and the chat-template inputs, stream, stream_options, cache_salt) are checked here once, by vLLM's rules, so a
 * body the router forwards is one the engine accepts, and a body refused is refused by both with the same status, param
 * and message. Everything else passes through untouched (vLLM ignores unknown fields too).
 *
 * On top of this part the router adds its own `kvroute` knobs and needs a model to pick workers by (`parseRequest`); the
 * mock engine adds its generation parameters (src/mocker/openai.ts). Types are checked strictly as JSON types: vLLM's
 * pydantic models would also coerce "true" or "5", which a router that must know whether it streams should not guess.
 */
import type { KvKnobs } from '../core/types.ts';
import type { ChatPromptInput } from '../tokenizer/chat.ts';
import { badRequest } from '../http/errors.ts';

export type Endpoint = 'chat' | 'completions';

/** One prompt of a completion request: text, or token ids given by the client. */
export type CompletionPrompt = string | readonly number[];

/** The part of a completion or chat request the router and the engine read alike. */
export interface OpenAiRequest {
  readonly endpoint: Endpoint;
  readonly body: Record<string, unknown>;
  /** null when absent or empty: vLLM then serves its default model. */
  readonly model: string | null;
  readonly stream: boolean;
  /**
   * The final usage chunk is asked for: a stream with `stream_options` whose `include_usage` is not false or null
   * (vLLM's StreamOptions defaults include_usage to true).
   */
  readonly includeUsage: boolean;
  /** null when absent (an empty string is refused, as vLLM does). */
  readonly cacheSalt: string | null;
  /** Completions: every prompt, in order (one unless a list of prompts is given); empty for chat. */
  readonly prompts: readonly CompletionPrompt[];
  readonly chat: ChatPromptInput | null;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function isTokenArray(v: unknown): v is number[] {
  if (!Array.isArray(v) || v.length === 0) return false;
  for (const t of v) if (typeof t !== 'number' || !Number.isInteger(t) || t < 0 || t > 0xffffffff) return false;
  return true;
}

function optionalObject(body: Record<string, unknown>, key: string): Record<string, unknown> | null {
  const v = body[key];
  if (v === undefined || v === null) return null;
  if (!isObject(v)) throw badRequest(`"${key}" must be an object`, key);
  return v;
}

function optionalBoolean(body: Record<string, unknown>, key: string): boolean | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw badRequest(`"${key}" must be a boolean`, key);
  return v;
}

function optionalString(body: Record<string, unknown>, key: string): string | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') throw badRequest(`"${key}" must be a string`, key);
  return v;
}

/** JSON.parse with the answer both servers give for a body that is not JSON. */
export function parseJsonBody(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw badRequest(`request body is not valid JSON: ${(err as Error).message}`, null, 'invalid_json');
  }
}

/** The body of every OpenAI endpoint is a JSON object. */
export function requireObject(raw: unknown): Record<string, unknown> {
  if (!isObject(raw)) throw badRequest('request body must be a JSON object');
  return raw;
}

/** `messages` and the chat-template inputs (chat completions, and /tokenize with messages). */
export function parseChatInput(body: Record<string, unknown>): ChatPromptInput {
  const messages = body.messages;
  if (!Array.isArray(messages) || messages.length === 0) throw badRequest('"messages" must be a non-empty array', 'messages');
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i];
    if (!isObject(m) || typeof m.role !== 'string') {
      throw badRequest(`messages[${i}] must be an object with a string "role"`, `messages[${i}]`);
    }
    const c = m.content;
    if (c !== undefined && c !== null && typeof c !== 'string' && !Array.isArray(c)) {
      throw badRequest(`messages[${i}].content must be a string, a list of content parts, or null`, `messages[${i}].content`);
    }
  }
  const tools = body.tools;
  if (tools !== undefined && tools !== null && !Array.isArray(tools)) throw badRequest('"tools" must be an array', 'tools');
  const documents = body.documents;
  if (documents !== undefined && documents !== null && !(Array.isArray(documents) && documents.every(isObject))) {
    throw badRequest('"documents" must be a list of objects', 'documents');
  }
  const addGenerationPrompt = optionalBoolean(body, 'add_generation_prompt');
  const continueFinalMessage = optionalBoolean(body, 'continue_final_message');
  if (addGenerationPrompt === true && continueFinalMessage === true) {
    throw badRequest('"continue_final_message" and "add_generation_prompt" cannot both be true', 'continue_final_message');
  }
  return {
    messages,
    tools: (tools as unknown[] | null | undefined) ?? null,
    add_generation_prompt: addGenerationPrompt,
    continue_final_message: continueFinalMessage,
    chat_template_kwargs: optionalObject(body, 'chat_template_kwargs'),
    documents: (documents as unknown[] | null | undefined) ?? null,
    chat_template: optionalString(body, 'chat_template') ?? null,
  };
}

function parsePrompts(p: unknown): CompletionPrompt[] {
  if (typeof p === 'string') return [p];
  if (isTokenArray(p)) return [p];
  if (Array.isArray(p) && p.length > 0 && p.every((x) => typeof x === 'string')) return p as string[];
  if (Array.isArray(p) && p.length > 0 && p.every(isTokenArray)) return p as number[][];
  throw badRequest('"prompt" must be a string, a list of strings, a list of token ids, or a list of token-id lists', 'prompt');
}

/** Parses the shared part of a completion or chat request; throws a 400 HttpError naming the field. */
export function parseOpenAiRequest(endpoint: Endpoint, raw: unknown): OpenAiRequest {
  const body = requireObject(raw);
  const model = optionalString(body, 'model') || null;
  const stream = optionalBoolean(body, 'stream') ?? false;
  const streamOptions = optionalObject(body, 'stream_options');
  let includeUsage = false;
  if (streamOptions) {
    // vLLM refuses stream options on a request that does not stream (an empty object passes, as in Python).
    if (!stream && Object.keys(streamOptions).length > 0) {
      throw badRequest('"stream_options" can only be given when "stream" is true', 'stream_options');
    }
    const v = streamOptions.include_usage;
    if (v !== undefined && v !== null && typeof v !== 'boolean') {
      throw badRequest('"stream_options.include_usage" must be a boolean', 'stream_options.include_usage');
    }
    includeUsage = stream && v !== false && v !== null;
  }
  const cacheSalt = body.cache_salt;
  if (cacheSalt !== undefined && cacheSalt !== null && (typeof cacheSalt !== 'string' || cacheSalt.length === 0)) {
    throw badRequest('"cache_salt" must be a non-empty string', 'cache_salt');
  }
  const prompts = endpoint === 'completions' ? parsePrompts(body.prompt) : [];
  const chat = endpoint === 'chat' ? parseChatInput(body) : null;
  return {
    endpoint,
    body,
    model,
    stream,
    includeUsage,
    cacheSalt: (cacheSalt as string | null | undefined) ?? null,
    prompts,
    chat,
  };
}

// ------------------------------------------------------------------------------------------ the router's view

export interface ParsedRequest {
  readonly endpoint: Endpoint;
  readonly body: Record<string, unknown>;
  readonly model: string;
  readonly stream: boolean;
  /** The client asked for the usage chunk itself (otherwise the router asks for it and strips it). */
  readonly clientWantsUsage: boolean;
  readonly cacheSalt: string | null;
  /** Token ids given by the client (completions with token-id prompts; the first prompt of a list). */
  readonly promptIds: readonly number[] | null;
  /** String prompt of a completion (the first one when a list is given). */
  readonly promptText: string | null;
  readonly chat: ChatPromptInput | null;
  /** Per-request routing overrides (`kvroute: {policy, knobs}` in the body; removed before forwarding). */
  readonly policy?: string;
  readonly knobs?: Partial<KvKnobs>;
}

const KNOB_NAMES = ['prefillLoadScale', 'overlapCredit', 'temperature'] as const;

/** The router's own `kvroute` field of any API's body: a policy and knob overrides for this request. */
export function parseKvrouteField(body: Record<string, unknown>): { policy?: string; knobs?: Partial<KvKnobs> } {
  const ours = optionalObject(body, 'kvroute');
  if (!ours) return {};
  let policy: string | undefined;
  let knobs: Partial<KvKnobs> | undefined;
  if (ours.policy !== undefined) {
    if (typeof ours.policy !== 'string') throw badRequest('"kvroute.policy" must be a string', 'kvroute.policy');
    policy = ours.policy;
  }
  const k = ours.knobs;
  if (k !== undefined) {
    if (!isObject(k)) throw badRequest('"kvroute.knobs" must be an object', 'kvroute.knobs');
    const out: Record<string, number> = {};
    for (const name of KNOB_NAMES) {
      const v = k[name];
      if (v === undefined) continue;
      if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) {
        throw badRequest(`"kvroute.knobs.${name}" must be a non-negative number`, `kvroute.knobs.${name}`);
      }
      out[name] = v;
    }
    knobs = out;
  }
  return { policy, knobs };
}

/**
 * The router's parse: the shared part, then its own `kvroute` field. Unlike vLLM (which serves its default model), the
 * router needs the model: it picks workers by the models they serve.
 */
export function parseRequest(endpoint: Endpoint, raw: unknown): ParsedRequest {
  const req = parseOpenAiRequest(endpoint, raw);
  const { policy, knobs } = parseKvrouteField(req.body);
  if (req.model === null) throw badRequest('"model" is required: the router picks workers by the model they serve', 'model');
  const first = req.prompts[0];
  return {
    endpoint,
    body: req.body,
    model: req.model,
    stream: req.stream,
    clientWantsUsage: req.includeUsage,
    cacheSalt: req.cacheSalt,
    promptIds: first !== undefined && typeof first !== 'string' ? first : null,
    promptText: typeof first === 'string' ? first : null,
    chat: req.chat,
    policy,
    knobs,
  };
}

/**
 * The body sent upstream: kvroute's own field removed, and for streams the usage chunk requested explicitly, because the
 * delivered cached tokens it carries are how the router learns what the engine actually reused.
 *
 * The client's bytes are reused whenever possible: re-serialising a 128k-token prompt costs milliseconds. `raw` must be
 * the text `req.body` was parsed from (a JSON object, so its last non-space character is the closing brace).
 */
export function upstreamBody(req: ParsedRequest, raw?: string): string {
  const ours = 'kvroute' in req.body;
  const so = req.body.stream_options;
  const explicitUsage = isObject(so) && so.include_usage === true;
  const addUsage = req.stream && !explicitUsage;
  if (raw !== undefined && !ours) {
    if (!addUsage) return raw;
    if (!('stream_options' in req.body)) {
      const end = raw.lastIndexOf('}');
      const empty = Object.keys(req.body).length === 0;
      return `${raw.slice(0, end)}${empty ? '' : ','}"stream_options":{"include_usage":true}}`;
    }
  }
  const { kvroute: _ours, ...rest } = req.body;
  if (addUsage) {
    const prev = isObject(rest.stream_options) ? rest.stream_options : {};
    rest.stream_options = { ...prev, include_usage: true };
  }
  return JSON.stringify(rest);
}

const USAGE_FIELD = Buffer.from('"stream_options":{"include_usage":true}}');
const USAGE_FIELD_AFTER = Buffer.from(',"stream_options":{"include_usage":true}}');

/**
 * {@link upstreamBody} as bytes, built from the client's bytes without decoding them: the same bytes as
 * `Buffer.from(upstreamBody(req, raw.toString()))`, or null when the body must be re-serialised (kvroute's own field,
 * or stream_options to amend).
 */
export function upstreamBytes(req: ParsedRequest, raw: Buffer): Buffer | null {
  if ('kvroute' in req.body) return null;
  const so = req.body.stream_options;
  const explicitUsage = isObject(so) && so.include_usage === true;
  if (!req.stream || explicitUsage) return raw;
  if ('stream_options' in req.body) return null;
  const end = raw.lastIndexOf(0x7d);
  const empty = Object.keys(req.body).length === 0;
  return Buffer.concat([raw.subarray(0, end), empty ? USAGE_FIELD : USAGE_FIELD_AFTER]);
}

/** Any API's body without kvroute's own field; the client's bytes when it has none (re-serialising costs time). */
export function withoutKvroute(body: Record<string, unknown>, raw: string): string {
  if (!('kvroute' in body)) return raw;
  const { kvroute: _ours, ...rest } = body;
  return JSON.stringify(rest);
}
