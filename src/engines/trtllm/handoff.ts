/**
 * TensorRT-LLM's disaggregated handoff, router side, as its own disaggregated server speaks it (NVIDIA/TensorRT-LLM
 * tensorrt_llm/serve/openai_disagg_service.py @00bb903d965f: `_get_ctx_request`, `_need_gen`, `_get_gen_request`;
 * the fields per tensorrt_llm/serve/openai_protocol.py @0076e9390e1e). Serve and the endpoint picker both use it.
 *
 * context     the client's body (its max-tokens field as the client spelled it: TensorRT-LLM's chat request has one
 *             field, max_completion_tokens, with validation_alias max_tokens, under extra="forbid", so a second
 *             spelling is a 400) + disaggregated_params {request_type: "context_only", disagg_request_id}, stream
 *             false, without stream_options; the JSON answer is read whole
 * finished?   when the answer's finish_reason is not "length" or "not_finished", the context answer is the client's
 *             answer (its disaggregated_params removed) and no generation leg is sent
 * generation  the client's body + the answer's choices[0].disaggregated_params copied member by member (int64 ids
 *             digit for digit) with request_type "generation_only" and ctx_usage = the answer's usage, plus the
 *             answer's prompt_token_ids (chat) or prompt (completions); an answer without the params is counted and
 *             the generation leg goes without them (it recomputes). The params live on the first choice in every
 *             openai_protocol.py copy read; none has them at the answer's top level.
 *
 * Optional fields: `disagg_request_id` and `ctx_usage` exist only in newer DisaggregatedParams (docs/engines.md names
 * the releases). Per worker, `disagg-id=` and `ctx-usage=` say auto (send; when the server's 400 names the field as
 * extra_forbidden, resend without it and remember that for the worker), on or off.
 */
import { appendMembers, rawFirstElement, rawMember, rawMembers } from '../raw-json.ts';
import { type AfterPrefill, clientFields, type HandoffClient, type SequentialHandoff, sendsField } from '../handoff.ts';

/** DisaggregatedParams fields older TensorRT-LLM releases lack: sent per the worker's settings and what it refused. */
export const TRTLLM_OPTIONAL_FIELDS = ['disagg_request_id', 'ctx_usage'] as const;

/** finish_reason values of a context answer that leave the request to the generation leg (`_need_gen`). */
const CONTINUES = new Set(['length', 'not_finished']);

/** The context leg: the client's body + disaggregated_params, not streamed. */
export function trtllmContextBody(client: Pick<HandoffClient, 'body'>, disaggRequestId: bigint | null): string {
  const body = clientFields(client as HandoffClient, 'disaggregated_params', 'stream_options');
  body.stream = false;
  // The id goes in as a bare integer: JSON.stringify cannot write a bigint.
  const params =
    disaggRequestId === null
      ? '{"request_type":"context_only"}'
      : `{"request_type":"context_only","disagg_request_id":${disaggRequestId.toString()}}`;
  return appendMembers(JSON.stringify(body), [['disaggregated_params', params]]);
}

/** The raw text of the context answer's first choice, or undefined. */
function firstChoice(answer: string): string | undefined {
  const choices = rawMember(answer, 'choices');
  const first = choices === undefined ? undefined : rawFirstElement(choices);
  return first?.startsWith('{') ? first : undefined;
}

/**
 * The context answer's disaggregated_params as the generation leg carries them (raw JSON, int64 ids digit for digit):
 * request_type generation_only, ctx_usage = the answer's usage, the optional fields kept only if `sends` allows them.
 * Undefined when the answer's first choice has none.
 */
export function trtllmGenerationParams(
  answer: string,
  sends: (field: string) => boolean = () => true,
  sentDisaggRequestId: bigint | null = null,
): string | undefined {
  const raw = rawMember(firstChoice(answer) ?? '{}', 'disaggregated_params');
  if (raw === undefined || !raw.startsWith('{')) return undefined;
  const members = (rawMembers(raw) ?? []).filter(
    ([k]) => k !== 'request_type' && k !== 'ctx_usage' && !(k === 'disagg_request_id' && !sends(k)),
  );
  members.push(['request_type', '"generation_only"']);
  // Upstream sets the id on the generation request whatever the answer echoed.
  if (sentDisaggRequestId !== null && sends('disagg_request_id') && !members.some(([k]) => k === 'disagg_request_id'))
    members.push(['disagg_request_id', sentDisaggRequestId.toString()]);
  const usage = rawMember(answer, 'usage');
  if (usage?.startsWith('{') && sends('ctx_usage')) members.push(['ctx_usage', usage]);
  return appendMembers('{}', members);
}

/** The generation leg: the client's body + the handoff params + the prompt's token ids from the context answer. */
export function trtllmGenerationBody(
  client: Pick<HandoffClient, 'body'>,
  answer: string,
  params: string | undefined,
  chat: boolean,
): string {
  const rest = clientFields(client as HandoffClient, 'disaggregated_params');
  const members: [string, string][] = [];
  if (params !== undefined) members.push(['disaggregated_params', params]);
  const ids = rawMember(answer, 'prompt_token_ids');
  if (ids?.startsWith('[')) {
    if (chat) members.push(['prompt_token_ids', ids]);
    else {
      delete rest.prompt;
      members.push(['prompt', ids]);
    }
  }
  return appendMembers(JSON.stringify(rest), members);
}

/** The context answer when it already finished the request (`_need_gen` false), without its handoff params. */
export function trtllmFinishedAnswer(answer: string): string | undefined {
  const first = firstChoice(answer);
  const finish = first === undefined ? undefined : rawMember(first, 'finish_reason');
  if (finish === undefined || finish === 'null') return undefined;
  let reason: unknown;
  try {
    reason = JSON.parse(finish);
  } catch {
    return undefined;
  }
  if (typeof reason !== 'string' || CONTINUES.has(reason)) return undefined;
  // The remaining ids (prompt_token_ids, token counts) are below 2^53: a parse and re-serialisation keeps them exact.
  const obj = JSON.parse(answer) as { choices: Record<string, unknown>[] };
  delete obj.choices[0].disaggregated_params;
  return JSON.stringify(obj);
}

/**
 * A whole chat or completion answer as the stream a client that asked for one expects: one chunk with the whole
 * content and its finish_reason, a usage chunk, [DONE]. (TensorRT-LLM's own disaggregated server answers a streamed
 * request whose context leg finished with an empty stream; a router that drops the token would lose the answer.)
 */
export function answerAsStream(answer: string, chat: boolean): string {
  const a = JSON.parse(answer) as {
    id?: string;
    created?: number;
    model?: string;
    usage?: unknown;
    choices?: { index?: number; message?: { content?: string | null }; text?: string; finish_reason?: string | null }[];
  };
  const head = { id: a.id, object: chat ? 'chat.completion.chunk' : 'text_completion', created: a.created, model: a.model };
  const chunks = (a.choices ?? []).map((c) => ({
    ...head,
    choices: [
      chat
        ? {
            index: c.index ?? 0,
            delta: { role: 'assistant', content: c.message?.content ?? '' },
            logprobs: null,
            finish_reason: c.finish_reason ?? null,
          }
        : { index: c.index ?? 0, text: c.text ?? '', logprobs: null, finish_reason: c.finish_reason ?? null },
    ],
  }));
  if (a.usage !== undefined) chunks.push({ ...head, choices: [], usage: a.usage } as (typeof chunks)[number]);
  return `${chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`).join('')}data: [DONE]\n\n`;
}

/**
 * The optional fields a TensorRT-LLM refusal names: a 400 whose body reports pydantic's extra_forbidden at
 * ('body', 'disaggregated_params', FIELD) (trtllm-serve answers a RequestValidationError with 400 and the error's text).
 */
export function trtllmRefusedFields(status: number, text: string): string[] {
  if (status !== 400 || !text.includes('extra_forbidden')) return [];
  return TRTLLM_OPTIONAL_FIELDS.filter((f) => new RegExp(`['"]disaggregated_params['"]\\s*,\\s*['"]${f}['"]`).test(text));
}

/** The disagg_request_id a context body carries, or null. */
function sentId(body: string): bigint | null {
  const m = /"disagg_request_id":(\d+)/.exec(rawMember(body, 'disaggregated_params') ?? '');
  return m ? BigInt(m[1]) : null;
}

export const trtllmHandoff: SequentialHandoff = {
  flow: 'sequential',
  prefillBody: (client, pair) => trtllmContextBody(client, sendsField(pair.prefill.fields, 'disagg_request_id') ? pair.ids.next() : null),
  afterPrefill(client, answer, pair, sentPrefill): AfterPrefill {
    const finished = trtllmFinishedAnswer(answer);
    if (finished !== undefined) return { kind: 'finished', answer: finished };
    const params = trtllmGenerationParams(answer, (f) => sendsField(pair.decode.fields, f), sentId(sentPrefill));
    return { kind: 'decode', body: trtllmGenerationBody(client, answer, params, client.chat), transferParams: params !== undefined };
  },
  refusedFields: trtllmRefusedFields,
};
