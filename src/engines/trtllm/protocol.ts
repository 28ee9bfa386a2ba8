/**
 * TensorRT-LLM's OpenAI request models, as strictly as trtllm-serve applies them, for the mock engine's TensorRT-LLM
 * side and the tests: NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py @0076e9390e1ed11515f149eec356f5a03f4a00d8
 * (`OpenAIBaseModel`: `ConfigDict(extra="forbid", populate_by_name=True)`; `ChatCompletionRequest`,
 * `CompletionRequest`, `DisaggregatedParams`, `UsageInfo`), and tensorrt_llm/serve/openai_server.py @00057725d9a6
 * (a RequestValidationError answers 400 `{"error": str(exc)}`).
 *
 * Field names are facts of that file; the checks are these (pydantic's, reported as it reports them):
 * - an unknown field is `extra_forbidden` at ('body', ...path): also a second spelling of an aliased field (chat's
 *   max_completion_tokens has validation_alias max_tokens: pydantic-core marks the first key it finds as used,
 *   `max_tokens`, so `max_completion_tokens` beside it is the extra one);
 * - a JSON object with the same key twice is refused (`json_duplicate_key`): stricter than upstream, whose json.loads
 *   keeps the last one, so a router that sends duplicates is caught rather than silently half-read;
 * - `disaggregated_params` holds only the fields of the release modelled (`TRTLLM_DISAGG_FIELDS`); `request_type` is
 *   required; its ids (`ctx_request_id`, `disagg_request_id`, `ctx_dp_rank`) must be integers in the JSON text (any
 *   size: Python ints are exact); `ctx_usage` is a UsageInfo, itself extra="forbid";
 * - the model validators that bite a router: `stream_options` only with `stream: true`; completions refuse a `suffix`.
 */
import { rawMembers } from '../raw-json.ts';

/** Chat's fields (`ChatCompletionRequest`), in the file's order; `max_tokens` is max_completion_tokens' alias. */
const CHAT_FIELDS = [
  'messages',
  'prompt_token_ids',
  'prompt_token_ids_b64',
  'model',
  'frequency_penalty',
  'logit_bias',
  'logprobs',
  'top_logprobs',
  'max_completion_tokens',
  'n',
  'presence_penalty',
  'response_format',
  'seed',
  'stop',
  'stream',
  'stream_options',
  'temperature',
  'top_p',
  'tools',
  'tool_choice',
  'parallel_tool_calls',
  'user',
  'reasoning_effort',
  'thinking',
  'thinking_token_budget',
  'prompt_ignore_length',
  'best_of',
  'use_beam_search',
  'top_k',
  'top_p_min',
  'min_p',
  'repetition_penalty',
  'length_penalty',
  'early_stopping',
  'stop_token_ids',
  'include_stop_str_in_output',
  'ignore_eos',
  'min_tokens',
  'skip_special_tokens',
  'spaces_between_special_tokens',
  'truncate_prompt_tokens',
  'lora_request',
  'echo',
  'add_generation_prompt',
  'add_special_tokens',
  'documents',
  'chat_template',
  'chat_template_kwargs',
  'injected_chat_template_kwargs',
  'media_io_kwargs',
  'disaggregated_params',
  'conversation_params',
  'cache_salt',
  'priority',
  'agent_hierarchy',
  'mm_processor_kwargs',
] as const;

/** Completions' fields (`CompletionRequest`). */
const COMPLETION_FIELDS = [
  'model',
  'prompt',
  'best_of',
  'echo',
  'frequency_penalty',
  'logit_bias',
  'logprobs',
  'max_tokens',
  'n',
  'presence_penalty',
  'seed',
  'stop',
  'stream',
  'stream_options',
  'suffix',
  'temperature',
  'top_p',
  'user',
  'lora_request',
  'prompt_ignore_length',
  'use_beam_search',
  'top_k',
  'top_p_min',
  'min_p',
  'repetition_penalty',
  'length_penalty',
  'early_stopping',
  'stop_token_ids',
  'include_stop_str_in_output',
  'ignore_eos',
  'min_tokens',
  'skip_special_tokens',
  'spaces_between_special_tokens',
  'truncate_prompt_tokens',
  'return_context_logits',
  'detokenize',
  'thinking_token_budget',
  'add_special_tokens',
  'response_format',
  'disaggregated_params',
  'priority',
  'conversation_params',
] as const;

/**
 * `DisaggregatedParams` as three generations of releases have it: `basic`, the five fields of the older copies of the
 * same file (index copies, commit not pinned); `current`, the copy @0076e9390e1e; `disagg-id`, the current fields
 * without ctx_usage and the two after it, standing for the releases that had disagg_request_id but not yet ctx_usage
 * (TensorRT-LLM 1.3.0rc13's llmapi DisaggregatedParams documents disagg_request_id and no ctx_usage; the exact
 * OpenAI-model field list of such a release is not pinned). docs/engines.md gives what is known of the releases.
 */
export const TRTLLM_DISAGG_FIELDS = {
  basic: ['request_type', 'first_gen_tokens', 'ctx_request_id', 'encoded_opaque_state', 'draft_tokens'],
  'disagg-id': [
    'request_type',
    'first_gen_tokens',
    'first_gen_log_probs',
    'first_gen_logits',
    'ctx_request_id',
    'encoded_opaque_state',
    'draft_tokens',
    'disagg_request_id',
    'ctx_dp_rank',
    'ctx_info_endpoint',
    'schedule_style',
  ],
  current: [
    'request_type',
    'first_gen_tokens',
    'first_gen_log_probs',
    'first_gen_logits',
    'ctx_request_id',
    'encoded_opaque_state',
    'draft_tokens',
    'disagg_request_id',
    'ctx_dp_rank',
    'ctx_info_endpoint',
    'schedule_style',
    'ctx_usage',
    'return_prompt_token_ids_b64',
    'resolved_thinking',
  ],
} as const;
export type TrtllmDisaggRelease = keyof typeof TRTLLM_DISAGG_FIELDS;
export const TRTLLM_DISAGG_RELEASES = Object.keys(TRTLLM_DISAGG_FIELDS) as [TrtllmDisaggRelease, ...TrtllmDisaggRelease[]];

const USAGE_FIELDS = ['prompt_tokens', 'total_tokens', 'completion_tokens', 'prompt_tokens_details'];
const INT_FIELDS = new Set(['ctx_request_id', 'disagg_request_id', 'ctx_dp_rank']);
const INT_LIST_FIELDS = new Set(['first_gen_tokens', 'draft_tokens']);

/** One error as pydantic reports it (input as its JSON text). */
export interface PydanticError {
  readonly type: string;
  readonly loc: readonly string[];
  readonly msg: string;
  readonly input: string;
}

const isInt = (raw: string) => /^-?\d+$/.test(raw);

/** The members of an object's text, or an error; duplicates reported. */
function members(raw: string, loc: readonly string[], errors: PydanticError[]): [string, string][] | null {
  const m = raw.trimStart().startsWith('{') ? rawMembers(raw) : undefined;
  if (!m) {
    errors.push({ type: 'model_type', loc, msg: 'Input should be a valid dictionary or object', input: raw.slice(0, 80) });
    return null;
  }
  const seen = new Set<string>();
  for (const [k] of m) {
    if (seen.has(k)) errors.push({ type: 'json_duplicate_key', loc: [...loc, k], msg: 'Duplicate key in JSON object', input: k });
    seen.add(k);
  }
  return m;
}

function checkUsage(raw: string, loc: readonly string[], errors: PydanticError[]): void {
  const m = members(raw, loc, errors);
  for (const [k, v] of m ?? []) {
    if (!USAGE_FIELDS.includes(k))
      errors.push({ type: 'extra_forbidden', loc: [...loc, k], msg: 'Extra inputs are not permitted', input: v });
    else if (k === 'prompt_tokens_details' && v !== 'null') {
      for (const [dk, dv] of members(v, [...loc, k], errors) ?? []) {
        if (dk !== 'cached_tokens')
          errors.push({ type: 'extra_forbidden', loc: [...loc, k, dk], msg: 'Extra inputs are not permitted', input: dv });
      }
    } else if (k !== 'prompt_tokens_details' && !isInt(v) && !(k === 'completion_tokens' && v === 'null'))
      errors.push({ type: 'int_parsing', loc: [...loc, k], msg: 'Input should be a valid integer', input: v });
  }
}

function checkDisaggParams(raw: string, release: TrtllmDisaggRelease, errors: PydanticError[]): void {
  const loc = ['body', 'disaggregated_params'];
  if (raw === 'null') return;
  const m = members(raw, loc, errors);
  if (!m) return;
  const allowed: readonly string[] = TRTLLM_DISAGG_FIELDS[release];
  if (!m.some(([k]) => k === 'request_type'))
    errors.push({ type: 'missing', loc: [...loc, 'request_type'], msg: 'Field required', input: raw });
  for (const [k, v] of m) {
    const at = [...loc, k];
    if (!allowed.includes(k)) errors.push({ type: 'extra_forbidden', loc: at, msg: 'Extra inputs are not permitted', input: v });
    else if (v === 'null' && k !== 'request_type') continue;
    else if (k === 'request_type' && !v.startsWith('"'))
      errors.push({ type: 'string_type', loc: at, msg: 'Input should be a valid string', input: v });
    else if (INT_FIELDS.has(k) && !isInt(v))
      errors.push({ type: 'int_parsing', loc: at, msg: 'Input should be a valid integer', input: v });
    else if (INT_LIST_FIELDS.has(k)) {
      let ok = false;
      try {
        const list = JSON.parse(v) as unknown;
        ok = Array.isArray(list) && list.every((x) => Number.isInteger(x));
      } catch {
        /* not JSON: refused below */
      }
      if (!ok) errors.push({ type: 'list_type', loc: at, msg: 'Input should be a valid list of integers', input: v });
    } else if (k === 'encoded_opaque_state' && !v.startsWith('"'))
      errors.push({ type: 'string_type', loc: at, msg: 'Input should be a valid string', input: v });
    else if (k === 'ctx_usage') checkUsage(v, at, errors);
    else if (k === 'schedule_style' && v !== '0' && v !== '1')
      errors.push({ type: 'enum', loc: at, msg: 'Input should be 0 or 1', input: v });
  }
}

/** Everything trtllm-serve's request model refuses in this body (raw JSON text); empty when it accepts it. */
export function trtllmRequestErrors(
  raw: string,
  endpoint: 'chat' | 'completions',
  release: TrtllmDisaggRelease = 'current',
): PydanticError[] {
  const errors: PydanticError[] = [];
  const m = members(raw, ['body'], errors);
  if (!m) return errors;
  const fields: readonly string[] = endpoint === 'chat' ? CHAT_FIELDS : COMPLETION_FIELDS;
  // Chat: the alias is looked up first; the field's own name beside it is then an extra input.
  const aliasFirst = endpoint === 'chat' && m.some(([k]) => k === 'max_tokens');
  const value = (k: string) => m.find(([n]) => n === k)?.[1];
  for (const [k, v] of m) {
    const known = fields.includes(k) || (endpoint === 'chat' && k === 'max_tokens');
    if (!known || (aliasFirst && k === 'max_completion_tokens'))
      errors.push({ type: 'extra_forbidden', loc: ['body', k], msg: 'Extra inputs are not permitted', input: v });
  }
  const dp = value('disaggregated_params');
  if (dp !== undefined) checkDisaggParams(dp, release, errors);
  const so = value('stream_options');
  if (so !== undefined && so !== 'null' && so !== 'false' && value('stream') !== 'true') {
    errors.push({
      type: 'value_error',
      loc: ['body'],
      msg: 'Value error, Stream options can only be defined when stream is true.',
      input: so,
    });
  }
  const suffix = value('suffix');
  if (endpoint === 'completions' && suffix !== undefined && suffix !== 'null' && suffix !== '""') {
    errors.push({ type: 'value_error', loc: ['body'], msg: 'Value error, suffix is not supported', input: suffix });
  }
  return errors;
}

const pyString = (s: string) => `'${s.replace(/\\/g, '\\\\').replace(/'/g, "\\'")}'`;

/** trtllm-serve's 400 body for these errors: `{"error": str(exc)}`, the error list as Python prints it. */
export function trtllmErrorBody(errors: readonly PydanticError[]): string {
  const items = errors.map(
    (e) => `{'type': ${pyString(e.type)}, 'loc': (${e.loc.map(pyString).join(', ')}), 'msg': ${pyString(e.msg)}, 'input': ${e.input}}`,
  );
  return JSON.stringify({ error: `[${items.join(', ')}]` });
}
