/**
 * The shape every engine's disaggregated handoff has (docs/engines.md "Disaggregated serving"): what the two legs'
 * bodies are built from, what the router knows of each worker of the pair, and the two flows the engines use. The
 * orchestration (sending, waiting, retrying, accounting) is the front ends' (src/runtime/prefill-leg.ts, src/server/disagg-attempt.ts); the bodies are the
 * engine's (src/engines/NAME/handoff.ts), so serve and the endpoint picker speak each engine one way.
 */
import type { OptionalFieldSetting } from '../config/worker-spec.ts';
import type { DisaggRequestIds } from './trtllm/ids.ts';

/** The client's request as the legs' bodies are built from it. */
export interface HandoffClient {
  /** The client's JSON body (kvroute's own field included: every body drops it). */
  readonly body: Record<string, unknown>;
  /** The client's body as received (a vLLM decode leg is this, byte for byte, plus kv_transfer_params). */
  readonly text: string;
  /** The body as the router forwards it (usage asked for on streams): SGLang's legs start from it. */
  readonly upstreamBody: string;
  /** /v1/chat/completions (true) or /v1/completions. */
  readonly chat: boolean;
}

/** A worker's optional handoff fields: its settings (by wire field name) and the fields its server refused. */
export interface HandoffFields {
  readonly settings: Readonly<Record<string, OptionalFieldSetting>>;
  /** Learned from the server's 400 answers (auto only); kept for the worker's life. */
  readonly refused: Set<string>;
}

/** Whether a leg to this worker carries the optional field `name`. */
export function sendsField(fields: HandoffFields, name: string): boolean {
  const s = fields.settings[name] ?? 'auto';
  return s === 'on' || (s === 'auto' && !fields.refused.has(name));
}

/** What a handoff needs of one worker of the pair. */
export interface HandoffWorker {
  readonly id: string;
  readonly url: string;
  /** Data-parallel ranks behind the URL. */
  readonly ranks: number;
  /** The rank the dispatcher chose for this leg. */
  readonly rank: number;
  /** SGLang prefill workers' bootstrap port. */
  readonly bootstrapPort: number;
  readonly fields: HandoffFields;
}

export interface HandoffPair {
  readonly prefill: HandoffWorker;
  readonly decode: HandoffWorker;
  /** TensorRT-LLM's disagg_request_id source (unique across router replicas). */
  readonly ids: DisaggRequestIds;
}

/** What the prefill leg's answer means for the decode leg. */
export type AfterPrefill =
  /** The decode leg's body; `transferParams`: the answer carried the engine's handoff state (else it recomputes). */
  | { readonly kind: 'decode'; readonly body: string; readonly transferParams: boolean }
  /** The prefill answer already finished the request (its first token ended it): it is the client's answer. */
  | { readonly kind: 'finished'; readonly answer: string };

/** Prefill first, read whole; the decode leg's body is built from its answer (vLLM, TensorRT-LLM). */
export interface SequentialHandoff {
  readonly flow: 'sequential';
  prefillBody(client: HandoffClient, pair: HandoffPair): string;
  /** `sentPrefill`: the prefill body as sent (TensorRT-LLM's disagg_request_id travels on from it). */
  afterPrefill(client: HandoffClient, answer: string, pair: HandoffPair, sentPrefill: string): AfterPrefill;
  /** The optional fields a leg's refusal names (status and body): the leg can be resent without them. */
  refusedFields(status: number, text: string): string[];
}

/** Both legs at once with bodies that name the same bootstrap room (SGLang). */
export interface BootstrapHandoff {
  readonly flow: 'bootstrap';
  bodies(client: HandoffClient, pair: HandoffPair): { readonly prefill: string; readonly decode: string };
}

export type PdHandoff = SequentialHandoff | BootstrapHandoff;

/** The client's body without kvroute's own field and without the fields named, as an object. */
export function clientFields(client: HandoffClient, ...drop: string[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(client.body)) if (k !== 'kvroute' && !drop.includes(k)) out[k] = v;
  return out;
}
