/**
 * What the API handlers (messages, pooling, responses) use of the OpenAI surface that hosts them: model names, the chat
 * template, and running prompts on the engine. An interface of its own so the handlers and the surface (openai.ts) do
 * not import each other.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { MmItem } from '../../core/types.ts';
import type { ChatPromptInput } from '../../tokenizer/chat.ts';
import type { PdPlan } from '../disagg-side.ts';
import type { Rank } from '../rank-loop.ts';
import type { Answer } from '../responses.ts';

/** Prompts to run and the answer that consumes their outputs (see OpenAiSurface.run). */
export interface RunSpec {
  /** The answer's id; engine request ids derive from it. */
  readonly id: string;
  readonly prompts: number[][];
  /** null: the engine's default (defaultMaxTokens, capped by the context left). */
  readonly maxTokens: number | null;
  readonly loraName: string | null;
  readonly cacheSalt: string | null;
  readonly seed?: number;
  /** The request field named in a prompt error. */
  readonly promptParam: string;
  /** Starts the answer (headers may go out now) once the requests are in the engine; one sink per prompt. */
  readonly answer: (arrivalMs: number) => Answer;
  /** The rank to run on (default: the x-data-parallel-rank header's, or the least loaded). */
  readonly rank?: Rank;
  /** One side of a disaggregated pair (chat and completions only): the engine request's id, output and KV. */
  readonly plan?: PdPlan | null;
  /** The caller already rolled the fault dice for this request. */
  readonly faultsChecked?: boolean;
  /** Multimodal items of the (single) prompt: placeholder tokens already in it. */
  readonly mmItems?: readonly MmItem[];
}

export interface Surface {
  /** The LoRA module a request's `model` names; null for the base model (or none); an unknown model is a 404. */
  resolveModel(model: string | null): string | null;
  renderChat(input: ChatPromptInput): string;
  run(req: IncomingMessage, res: ServerResponse, spec: RunSpec): void;
}
