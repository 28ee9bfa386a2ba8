/**
 * Validation of the two proxied endpoints. Only what routing needs is checked strictly (model, prompt or messages,
 * stream flags, kvroute's own knobs); everything else is the engine's business and passes through untouched.
 */
import type { KvKnobs } from '../core/types.ts';
import type { ChatPromptInput } from '../tokenizer/chat.ts';
import { badRequest } from '../http/errors.ts';

export type Endpoint = 'chat' | 'completions';

export interface ParsedRequest {
  readonly endpoint: Endpoint;
  readonly body: Record<string, unknown>;
  readonly model: string;
  readonly stream: boolean;
  /** The client asked for the usage chunk itself (otherwise the router asks for it and strips it). */
  readonly clientWantsUsage: boolean;
  readonly cacheSalt: string | null;
  /** Token ids given by the client (completions with token-id prompts). */
  readonly promptIds: readonly number[] | null;
  /** String prompt of a completion (the first one when a list is given). */
  readonly promptText: string | null;
  readonly chat: ChatPromptInput | null;
  /** Per-request routing overrides (`kvroute: {policy, knobs}` in the body; removed before forwarding). */
  readonly policy?: string;
  readonly knobs?: Partial<KvKnobs>;
}

function isTokenArray(v: unknown): v is number[] {
  if (!Array.isArray(v) || v.length === 0) return false;
  for (const t of v) if (typeof t !== 'number' || !Number.isInteger(t) || t < 0 || t > 0xffffffff) return false;
  return true;
}

function optionalObject(body: Record<string, unknown>, key: string): Record<string, unknown> | null {
  const v = body[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== 'object' || Array.isArray(v)) throw badRequest(`"${key}" must be an object`, key);
  return v as Record<string, unknown>;
}

function optionalBoolean(body: Record<string, unknown>, key: string): boolean | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw badRequest(`"${key}" must be a boolean`, key);
  return v;
}

const KNOB_NAMES = ['prefillLoadScale', 'overlapCredit', 'temperature'] as const;

export function parseRequest(endpoint: Endpoint, raw: unknown): ParsedRequest {
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) throw badRequest('request body must be a JSON object');
  const body = raw as Record<string, unknown>;
  const model = body.model;
  if (typeof model !== 'string' || model.length === 0) throw badRequest('"model" is required and must be a string', 'model');
  const stream = optionalBoolean(body, 'stream') ?? false;
  const streamOptions = optionalObject(body, 'stream_options');
  const includeUsage = streamOptions?.include_usage;
  if (includeUsage !== undefined && includeUsage !== null && typeof includeUsage !== 'boolean') {
    throw badRequest('"stream_options.include_usage" must be a boolean', 'stream_options.include_usage');
  }
  const cacheSalt = body.cache_salt;
  if (cacheSalt !== undefined && cacheSalt !== null && typeof cacheSalt !== 'string') {
    throw badRequest('"cache_salt" must be a string', 'cache_salt');
  }

  let policy: string | undefined;
  let knobs: Partial<KvKnobs> | undefined;
  const ours = optionalObject(body, 'kvroute');
  if (ours) {
    if (ours.policy !== undefined) {
      if (typeof ours.policy !== 'string') throw badRequest('"kvroute.policy" must be a string', 'kvroute.policy');
      policy = ours.policy;
    }
    const k = ours.knobs;
    if (k !== undefined) {
      if (!k || typeof k !== 'object' || Array.isArray(k)) throw badRequest('"kvroute.knobs" must be an object', 'kvroute.knobs');
      const out: Record<string, number> = {};
      for (const name of KNOB_NAMES) {
        const v = (k as Record<string, unknown>)[name];
        if (v === undefined) continue;
        if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) {
          throw badRequest(`"kvroute.knobs.${name}" must be a non-negative number`, `kvroute.knobs.${name}`);
        }
        out[name] = v;
      }
      knobs = out;
    }
  }

  let promptIds: readonly number[] | null = null;
  let promptText: string | null = null;
  let chat: ChatPromptInput | null = null;
  if (endpoint === 'completions') {
    const p = body.prompt;
    if (typeof p === 'string') promptText = p;
    else if (isTokenArray(p)) promptIds = p;
    else if (Array.isArray(p) && p.length > 0 && p.every((x) => typeof x === 'string')) promptText = p[0] as string;
    else if (Array.isArray(p) && p.length > 0 && p.every(isTokenArray)) promptIds = p[0] as number[];
    else {
      throw badRequest('"prompt" must be a string, a list of strings, a list of token ids, or a list of token-id lists', 'prompt');
    }
  } else {
    const messages = body.messages;
    if (!Array.isArray(messages) || messages.length === 0) {
      throw badRequest('"messages" must be a non-empty array', 'messages');
    }
    for (let i = 0; i < messages.length; i++) {
      const m = messages[i];
      if (!m || typeof m !== 'object' || typeof (m as { role?: unknown }).role !== 'string') {
        throw badRequest(`messages[${i}] must be an object with a string "role"`, `messages[${i}]`);
      }
    }
    const tools = body.tools;
    if (tools !== undefined && tools !== null && !Array.isArray(tools)) throw badRequest('"tools" must be an array', 'tools');
    const tpl = body.chat_template;
    if (tpl !== undefined && tpl !== null && typeof tpl !== 'string') {
      throw badRequest('"chat_template" must be a string', 'chat_template');
    }
    chat = {
      messages,
      tools: (tools as unknown[] | null | undefined) ?? null,
      add_generation_prompt: optionalBoolean(body, 'add_generation_prompt'),
      continue_final_message: optionalBoolean(body, 'continue_final_message'),
      chat_template_kwargs: optionalObject(body, 'chat_template_kwargs'),
      documents: Array.isArray(body.documents) ? body.documents : null,
      chat_template: (tpl as string | null | undefined) ?? null,
    };
  }

  return {
    endpoint,
    body,
    model,
    stream,
    clientWantsUsage: includeUsage === true,
    cacheSalt: typeof cacheSalt === 'string' && cacheSalt.length > 0 ? cacheSalt : null,
    promptIds,
    promptText,
    chat,
    policy,
    knobs,
  };
}

/**
 * The body sent upstream: kvroute's own field removed, and for streams the usage chunk requested, because the
 * delivered cached tokens it carries are how the router learns what the engine actually reused.
 *
 * The client's bytes are reused whenever possible: re-serialising a 128k-token prompt costs milliseconds. `raw` must be
 * the text `req.body` was parsed from (a JSON object, so its last non-space character is the closing brace).
 */
export function upstreamBody(req: ParsedRequest, raw?: string): string {
  const ours = 'kvroute' in req.body;
  const addUsage = req.stream && !req.clientWantsUsage;
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
    const so = (rest.stream_options as Record<string, unknown> | undefined) ?? {};
    rest.stream_options = { ...so, include_usage: true };
  }
  return JSON.stringify(rest);
}
