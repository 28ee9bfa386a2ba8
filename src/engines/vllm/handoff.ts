/**
 * vLLM's disaggregated handoff (NixlConnector), both sides of the wire, as vLLM's own proxy speaks it
 * (vllm-project/vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py @030ea52effcb; the P side's answer per
 * vllm/distributed/kv_transfer/kv_connector/v1/nixl/scheduler.py @053da34be7ea, `request_finished`).
 *
 * prefill  the client's body + kv_transfer_params {do_remote_decode: true, do_remote_prefill: false, remote_*: null},
 *          stream false, max_tokens 1 (and max_completion_tokens 1 when present), without stream_options, min_tokens,
 *          min_completion_tokens; the whole JSON answer is read
 * decode   the client's own body + the answer's top-level kv_transfer_params copied verbatim (byte for byte); an answer
 *          without them (the first token ended the request: vLLM returns params only when length-capped) is counted
 *          and the decode leg goes without (it recomputes)
 */
import { appendMembers, rawMember } from '../raw-json.ts';
import { type AfterPrefill, clientFields, type HandoffClient, type SequentialHandoff } from '../handoff.ts';

/** vLLM's prefill request: what the NixlConnector's P side expects. */
export const VLLM_PREFILL_PARAMS = {
  do_remote_decode: true,
  do_remote_prefill: false,
  remote_engine_id: null,
  remote_block_ids: null,
  remote_host: null,
  remote_port: null,
} as const;

export function vllmPrefillBody(client: Pick<HandoffClient, 'body'>): string {
  const body = clientFields(client as HandoffClient);
  body.kv_transfer_params = { ...VLLM_PREFILL_PARAMS };
  body.stream = false;
  body.max_tokens = 1;
  if ('max_completion_tokens' in body) body.max_completion_tokens = 1;
  delete body.stream_options;
  delete body.min_tokens;
  delete body.min_completion_tokens;
  return JSON.stringify(body);
}

/** The answer's kv_transfer_params as raw JSON, or undefined when absent, null or not an object. */
export function vllmTransferParams(answer: string): string | undefined {
  const raw = rawMember(answer, 'kv_transfer_params');
  return raw?.startsWith('{') ? raw : undefined;
}

/** The decode leg: the client's own body (its stream, stream_options, max_tokens, min_tokens) + kv_transfer_params. */
export function vllmDecodeBody(client: Pick<HandoffClient, 'body' | 'text'>, transferParams: string | undefined): string {
  const untouched = !('kvroute' in client.body) && !('kv_transfer_params' in client.body);
  const base = untouched ? client.text : JSON.stringify(clientFields(client as HandoffClient, 'kv_transfer_params'));
  return transferParams === undefined ? base : appendMembers(base, [['kv_transfer_params', transferParams]]);
}

export const vllmHandoff: SequentialHandoff = {
  flow: 'sequential',
  prefillBody: (client) => vllmPrefillBody(client),
  afterPrefill(client, answer): AfterPrefill {
    const params = vllmTransferParams(answer);
    return { kind: 'decode', body: vllmDecodeBody(client, params), transferParams: params !== undefined };
  },
  // vLLM's handoff has no optional fields to drop.
  refusedFields: () => [],
};
