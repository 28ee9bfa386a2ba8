/**
 * The mock engine's side of a disaggregated handoff, per engine (src/engines/NAME/mock.ts): how one engine's prefill or
 * decode server reads a leg's body and what it answers. The mock engine (src/mocker/disagg-side.ts) is the host: it holds the
 * leases, the bootstrap rooms and the KV pulls the engines' handoffs share, and runs the plan a handoff returns.
 */
import type { EngineName } from '../core/types.ts';
import type { SglangDpRouting } from './sglang/dp-routing.ts';
import type { TrtllmDisaggRelease } from './trtllm/protocol.ts';

/** What the OpenAI surface does differently for one request of a P/D leg. */
export interface PdPlan {
  /** The engine request id to use (a prefill's lease id: its held blocks are found by it). */
  readonly requestId?: string;
  readonly maxTokens?: number;
  readonly preloadedTokens?: number;
  readonly holdOnFinish?: boolean;
  readonly extra?: () => Record<string, unknown>;
  /** Fields of the answer's first choice (TensorRT-LLM's disaggregated_params live there). */
  readonly choiceExtra?: () => Record<string, unknown>;
  /** The whole answer's JSON text, rewritten before it is sent (int64 ids written as bare integers). */
  readonly rewrite?: (json: string) => string;
  readonly onComplete?: () => void;
  /** The leg cannot be served (KV load failed, bootstrap timed out): answer this error. */
  readonly failure?: string;
  /** The engine's request validation refused the leg: this status and body, before anything runs. */
  readonly refusal?: { readonly status: number; readonly body: string };
}

/** One request of a P/D leg as the engine sees it. */
export interface MockLeg {
  readonly role: 'prefill' | 'decode';
  readonly endpoint: 'chat' | 'completions';
  /** The tokenized prompt. */
  readonly prompt: readonly number[];
  readonly body: Record<string, unknown>;
  /** The body as received (ids past 2^53 are read from it). */
  readonly raw: string;
  /** The DP rank the request runs on. */
  readonly rank: number;
  /** The client left. */
  readonly closed: () => boolean;
  /** Prompt tokens this engine's prefix cache holds now. */
  readonly localHitTokens: () => number;
  /** Injected fault: the request's first generated token ends it (EOS), so a prefill finishes with "stop". */
  readonly eosFirstToken: boolean;
}

/** SGLang's bootstrap room: the decode side's arrival, and the KV the prefill side hands over (or an error). */
export interface MockRoom {
  readonly decodeArrived: Promise<void>;
  arrive(): void;
  readonly kvReady: Promise<{ numTokens: number } | { error: string }>;
  ready(v: { numTokens: number } | { error: string }): void;
  /** The prefill rank that served the room (set by the prefill side). */
  prefillRank?: number;
}

/** What the mock engine offers a handoff. */
export interface MockPdHost {
  /** The address peers reach this engine on. */
  readonly host: string;
  httpPort(): number;
  readonly engineId: string;
  readonly ranks: number;
  /** The engine's KV block size, tokens. */
  readonly blockSize: number;
  readonly loadFailurePolicy: 'fail' | 'recompute';
  readonly bootstrapTimeoutMs: number;
  readonly options: MockHandoffOptions;
  /** A fresh number (lease ids, context request ids). */
  nextSeq(): number;
  /** A prefill whose blocks stay held after it finishes, until pulled or until the lease runs out. */
  lease(prompt: readonly number[], leaseId: string): PdPlan;
  /** Pulls a lease's KV from a peer's side channel (the pull ends the lease). */
  pull(where: {
    readonly host: unknown;
    readonly port: unknown;
    readonly leaseId: unknown;
  }): Promise<{ numTokens: number } | { error: string }>;
  /** Waits the time `tokens` take to cross the transfer link, and counts them. */
  transfer(tokens: number): Promise<void>;
  /** Waits `ms` of model time (the speed-up applied). */
  sleep(ms: number): Promise<void>;
  /** SGLang prefill: the room of a bootstrap_room. */
  room(key: string): MockRoom;
  dropRoom(key: string): void;
  /**
   * SGLang decode: asks a prefill's bootstrap server for a room's KV, held by the prefill rank the engine expects (a
   * rank, 'room': the room mod the prefill's DP size, or null: wherever the bootstrap server says it is).
   */
  fetchBootstrap(
    host: string,
    port: number,
    room: string,
    prefillRank: number | 'room' | null,
  ): Promise<{ numTokens: number } | { error: string }>;
  readonly stats: MockPdStats;
}

export interface MockPdStats {
  leasesExpired: number;
  pulls: number;
  pullsGone: number;
  transferredTokens: number;
  bootstrapTimeouts: number;
  /** TensorRT-LLM context legs: the disagg_request_id of each (as sent, decimal), the last 1,000. */
  disaggRequestIds: string[];
  /** Legs refused by the engine's request validation (TensorRT-LLM's extra="forbid"). */
  refusedLegs: number;
  /** The last generation legs' disaggregated_params (raw JSON), the last 100 (TensorRT-LLM). */
  generationParams: string[];
}

/** Per-engine settings of the mock's handoff side (which release it models). */
export interface MockHandoffOptions {
  /** TensorRT-LLM: which DisaggregatedParams the server knows (src/engines/trtllm/protocol.ts). Default current. */
  readonly trtllmDisaggParams?: TrtllmDisaggRelease;
  /** SGLang: which request fields pick the DP rank (src/engines/sglang/mock.ts). Default header. */
  readonly sglangDpRouting?: SglangDpRouting;
}

/** One engine's mock handoff. */
export interface MockHandoff {
  readonly name: EngineName;
  /** How this leg is served (null: as an ordinary request). */
  plan(host: MockPdHost, leg: MockLeg): Promise<PdPlan | null>;
  /**
   * The DP rank a request runs on as this engine picks it, or null for the mock's default (the x-data-parallel-rank
   * header, else the least loaded rank; vLLM's behaviour).
   */
  rank?(host: Pick<MockPdHost, 'ranks' | 'options'>, req: MockRankRequest): number | null;
}

export interface MockRankRequest {
  readonly role: 'prefill' | 'decode';
  readonly header: string | undefined;
  readonly body: Record<string, unknown>;
  readonly raw: string;
}

export const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
