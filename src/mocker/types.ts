/** The mock engine's public API: its options, live faults, counters and the handle `startMocker` returns. */
import type { HashType, WireFormat } from '../engines/vllm/events.ts';
import type { EngineConfig, MockEngine } from './engine/index.ts';
import type { MockPd, MockPdOptions } from './disagg-side.ts';
import type { MockTokenizer } from './tokenizer.ts';

export interface MockerFaults {
  /** Fraction of event batches not sent on PUB (they still take a seq and stay replayable: a gap to recover). */
  dropEventFraction: number;
  /** Fraction of generation requests answered 500. */
  failRequestFraction: number;
  /** The instance dies (sockets closed, connections dropped) when request N+1 arrives; null = never. */
  dieAfterRequests: number | null;
  /** Steps take this many times longer (modelled time, hence TTFT, and wall time). */
  slowdown: number;
  /** The process stays up but the engine is dead, as vLLM after an engine-core crash: /health and generation answer 503. */
  unhealthy: boolean;
  /**
   * A P/D prefill's first token ends its request (EOS): vLLM's prefill then answers without kv_transfer_params,
   * TensorRT-LLM's context leg with finish_reason "stop" (the router must not send a generation leg).
   */
  eosFirstToken: boolean;
}

export interface MockerOptions {
  /** HTTP port; 0 or absent = a free port. */
  port?: number;
  host?: string;
  /** Served model name. */
  model?: string;
  /** Extra model names served as LoRA adapters: a request naming one runs under that lora_name. */
  loraModules?: string[];
  engine?: Partial<EngineConfig>;
  /** Wall time runs this many times faster than modelled time. */
  speedup?: number;
  /** ZMQ PUB endpoint for KV events (bound); port * or 0 = a free port; null disables events. Rank r binds port + r. */
  zmqEndpoint?: string | null;
  /**
   * Connect the PUB socket(s) to zmqEndpoint (rank r to port + r) instead of binding: what vLLM does when the endpoint
   * has no '*', so a router can bind one SUB and let engines come to it. Default false (bind).
   */
  zmqConnect?: boolean;
  /**
   * ZMQ ROUTER endpoint answering replay requests; rank r binds port + r; null disables replay. Absent: the ports right
   * after the event ports (event port + dataParallelSize, so 5558 for one rank publishing on 5557), a free port when the
   * event port is free-chosen or the PUB connects, none when events are disabled.
   */
  replayEndpoint?: string | null;
  topic?: string;
  /**
   * vLLM's event layouts over ZMQ (map, array), or trtllm: TensorRT-LLM's JSON events drained by POST /kv_cache_events
   * (no ZMQ publisher then).
   */
  eventFormat?: WireFormat | 'trtllm';
  hashType?: HashType;
  /** Outer batch layout (vLLM 0.26 sends an array batch). */
  batchLayout?: 'array' | 'map';
  dataParallelSize?: number;
  /** Batches kept for replay per rank (vLLM buffer_steps). */
  bufferSteps?: number;
  /**
   * Directory with tokenizer.json (+ tokenizer_config.json), or a tokenizer already loaded from one (loadHfTokenizer;
   * the embedded fleet's engines share one: each load costs over a second of CPU); absent = the deterministic
   * SimpleTokenizer.
   */
  tokenizer?: string | MockTokenizer;
  /** Report usage.prompt_tokens_details.cached_tokens (vLLM --enable-prompt-tokens-details). Default true. */
  enablePromptTokensDetails?: boolean;
  /** max_tokens when a request gives none. Default 16. */
  defaultMaxTokens?: number;
  faults?: Partial<MockerFaults>;
  /** Seed of the fault dice. */
  seed?: number;
  /** A side of a disaggregated prefill/decode pair (role prefill or decode), speaking an engine's handoff. */
  pd?: MockPdOptions;
}

export interface MockerStats {
  requests: number;
  failedRequests: number;
  badRequests: number;
  publishedBatches: number;
  droppedBatches: number;
  replayRequests: number;
  sendErrors: number;
  /** `traceparent` headers of the last requests that carried one (newest last, at most 256). */
  traceparents: string[];
}

export interface MockerHandle {
  readonly url: string;
  readonly port: number;
  /** Rank 0's endpoints in connectable form (tcp://127.0.0.1:PORT); null when disabled. */
  readonly zmqEndpoint: string | null;
  readonly replayEndpoint: string | null;
  readonly zmqEndpoints: string[];
  readonly replayEndpoints: string[];
  /** Rank 0's engine. */
  readonly engine: MockEngine;
  readonly engines: MockEngine[];
  /** Live fault settings (mutable). */
  readonly faults: MockerFaults;
  readonly stats: MockerStats;
  readonly dead: boolean;
  /** The P/D side (leases, rooms, counters), when started with a role. */
  readonly pd: MockPd | null;
  /** SGLang prefill: the bootstrap server's port. */
  readonly bootstrapPort: number | null;
  close(): Promise<void>;
  /** Restart in place: in-flight requests dropped, cache and counters cleared, seq back to 0; no AllBlocksCleared. */
  restart(): Promise<void>;
  /** Simulated crash: closes HTTP and ZMQ; restart() brings the instance back on the same ports. */
  die(): Promise<void>;
}
