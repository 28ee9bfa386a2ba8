/**
 * The protocol types every kvroute module shares. One concept, one type, defined here once.
 *
 * Hash representation: 64-bit hashes are `bigint` at the edges (events, CLI, JSON as decimal strings) and live in
 * `BigUint64Array`s inside the core, whose `Uint32Array` view gives (lo, hi) pairs to the hot index without any bigint
 * arithmetic.
 */

/**
 * The engines kvroute speaks to, in the order docs and messages list them. The one place the list is spelled outside
 * src/engines/: the registry there (src/engines/index.ts) holds one adapter per name (a name without an adapter does
 * not compile), and every other module derives from the registry, or from this list where it may not import the
 * registry (src/config: settings import only the core).
 */
export const ENGINE_NAMES = ['vllm', 'sglang', 'trtllm'] as const;
export type EngineName = (typeof ENGINE_NAMES)[number];

/** A routing target: one data-parallel rank of one worker (a DP-8 engine is 8 sources). */
export interface SourceId {
  readonly workerId: string;
  readonly dpRank: number;
}

/** Stable string key of a source, used in maps, metrics labels and JSON. */
export function sourceKey(source: SourceId): string {
  return source.dpRank === 0 ? source.workerId : `${source.workerId}#${source.dpRank}`;
}

/** Inverse of {@link sourceKey}. A worker id containing '#' is only ambiguous when followed by digits alone. */
export function parseSourceKey(key: string): SourceId {
  const m = /^(.*)#(\d+)$/.exec(key);
  return m ? { workerId: m[1], dpRank: Number(m[2]) } : { workerId: key, dpRank: 0 };
}

/**
 * An engine's opaque block id, normalised at the edge to an unsigned 64-bit integer: vLLM's uint64 as is, SGLang's
 * signed int64 reinterpreted (BigInt.asUintN), byte-string ids folded to 64 bits by the engine adapter.
 */
export type EngineBlockId = bigint;

/** Storage tier of a block. Only "GPU" blocks carry tokens; lower tiers are tracked by engine id alone. */
export type Medium = string;
export const GPU_MEDIUM = 'GPU';

// ---- Tiers and placement of a block (media, locality, ownership: docs/engines.md). Declaration merging keeps these
// fields in one block of their own; they add to StoredEvent / RemovedEvent below.
/** Where an offloaded copy lives relative to the engine: LOCAL (its own host / disk) or REMOTE (shared storage). */
export type Locality = 'LOCAL' | 'REMOTE';
export interface StoredEvent {
  /** vLLM main, FS / OBJ media: LOCAL or REMOTE. Absent: local. A REMOTE copy is not this engine's hit unless configured. */
  readonly locality?: Locality;
  /** vLLM main: who owns the stored copy (decoded and kept, not used for routing). */
  readonly ownership?: string;
}
export interface RemovedEvent {
  readonly locality?: Locality;
}
// ---- end of the tier block

/**
 * Newly cached full blocks on one source, in order. The router computes its own hashes from `tokens`
 * (`engineIds.length * blockSize` ids) chained from the parent's router hash. `seqHashes`, when present, are the
 * router's own sequence hashes already computed (index dumps, relays); they replace `tokens`.
 */
export interface StoredEvent {
  readonly kind: 'stored';
  readonly parent: EngineBlockId | null;
  readonly engineIds: readonly EngineBlockId[];
  readonly tokens: ArrayLike<number> | null;
  readonly blockSize: number;
  readonly seqHashes?: BigUint64Array;
  /** LoRA adapter name the blocks were computed under (feeds the hash seed, docs/protocols.md §1). */
  readonly loraName?: string | null;
  /** cache_salt of the request that created the first block (feeds the hash seed). */
  readonly cacheSalt?: string | null;
  readonly medium?: Medium;
  readonly groupIdx?: number;
}

export interface RemovedEvent {
  readonly kind: 'removed';
  readonly engineIds: readonly EngineBlockId[];
  readonly medium?: Medium;
  readonly groupIdx?: number;
}

export interface ClearedEvent {
  readonly kind: 'cleared';
}

/** A KV-cache event, normalised from any engine's wire format. Nothing past the edge knows which engine sent it. */
export type KvEvent = StoredEvent | RemovedEvent | ClearedEvent;

/** Why an event (or part of one) was not applied. Counted per reason; nothing throws. */
export type RejectReason =
  | 'unknown_source'
  | 'unknown_parent'
  | 'unknown_block'
  | 'duplicate_block'
  | 'token_count_mismatch'
  | 'block_size_mismatch'
  | 'empty_event'
  | 'unknown_medium';

/** Outcome of applying one event: blocks applied, and the first rejection reason if any part was rejected. */
export interface ApplyResult {
  readonly applied: number;
  readonly rejected: number;
  readonly reason?: RejectReason;
}

/** Per-source overlap of one request with the cache, as found by an index. */
export interface OverlapScores {
  /** Leading blocks (contiguous from block 0) each source holds, by source index; absent sources hold 0. */
  readonly overlap: Map<number, number>;
}

/** Knobs of the kv cost policy that a request may override (docs/protocols.md §5). */
export interface KvKnobs {
  /** Weight of prefill load against decode load. Default 1. */
  readonly prefillLoadScale: number;
  /** Blocks of prefill saved per overlapping block. Default 1. */
  readonly overlapCredit: number;
  /** 0 picks the minimum cost; T > 0 samples a softmax over min-max normalised costs. */
  readonly temperature: number;
  /** Credit per block held in host memory (offload tier), as a fraction of a GPU block. 0 = off; 0.75 when on. */
  readonly hostTierCredit?: number;
  /** Credit per block held on disk (offload tier). 0 = off; 0.25 when on. */
  readonly diskTierCredit?: number;
  /** Credit per block held on shared REMOTE storage (FS / OBJ). 0 unless configured: not this engine's hit. */
  readonly remoteTierCredit?: number;
  /** Decode leg of a disaggregated pair: blocks credited per block the decode worker already holds. Default 0. */
  readonly decodeOverlapCredit?: number;
}

export interface RouteRequest {
  /** Caller's id for the request; lifecycle calls (firstToken, finish) use it. */
  readonly requestId: string;
  /** Prompt token ids. Either these or `seqHashes` + `promptTokens`. */
  readonly tokens?: ArrayLike<number>;
  /** The request's router sequence hashes (full blocks only), already computed. */
  readonly seqHashes?: BigUint64Array;
  /** Prompt length in tokens; required with `seqHashes`, derived from `tokens` otherwise. */
  readonly promptTokens?: number;
  readonly loraName?: string | null;
  readonly cacheSalt?: string | null;
  /** Policy name and kv knob overrides for this request only. */
  readonly policy?: string;
  readonly knobs?: Partial<KvKnobs>;
  /** Source keys this request may go to (for example the workers serving its model); all when absent. */
  readonly allow?: ReadonlySet<string>;
  /** Source keys this request must not go to (for example the worker a retry moves away from). */
  readonly exclude?: ReadonlySet<string>;
  /**
   * Affinity (a session's or a conversation's last source): picked first when it passed the filters and its load is
   * within (1 + loadFactor) x the candidates' mean load + the request's blocks.
   */
  readonly prefer?: { readonly sourceKey: string; readonly loadFactor: number };

  /**
   * Record this routing in the reuse ledger (default true). The decode leg of a disaggregated request is not: the
   * prefix hit that matters is the prefill worker's. `KvRouter.account` records it later if it becomes the served leg.
   */
  readonly account?: boolean;
}

/** One candidate's view at routing time, kept in the decision for debugging and for retries (next best). */
export interface CandidateScore {
  readonly source: string;
  readonly overlapBlocks: number;
  readonly cachedBlocks: number;
  readonly activePrefillTokens: number;
  readonly activeBlocks: number;
  /** The policy's cost (lower is better); NaN for policies that do not score. */
  readonly cost: number;
}

export interface RouteDecision {
  readonly kind: 'routed';
  readonly requestId: string;
  readonly source: SourceId;
  readonly sourceKey: string;
  readonly policy: string;
  readonly promptTokens: number;
  /** ceil(promptTokens / blockSize): what the request-weighted hit rate divides by. */
  readonly islBlocks: number;
  /** Leading blocks the chosen source holds (chosen reuse). At most floor(promptTokens / blockSize). */
  readonly overlapBlocks: number;
  /** Best overlap over all eligible sources (reuse available in the fleet). */
  readonly bestOverlapBlocks: number;
  /** Candidates ordered best first by the policy's preference. */
  readonly candidates: readonly CandidateScore[];
  /**
   * The prompt's sequence hashes. When route() computed them they live in memory the router recycles: give them back
   * with `KvRouter.releaseHashes` once nothing of the caller's reads them again (the dispatcher does on finish), or
   * never (then they are ordinary garbage); copy them to keep them past a release.
   */
  readonly seqHashes: BigUint64Array;
  /** With `prefer`: kept (the preferred source was picked), overloaded or unavailable (it was not). */
  readonly affinity?: 'kept' | 'overloaded' | 'unavailable';
  /** Phase durations of route() in ms (hash, find matches, select), when the router was given a clock. */
  readonly timingsMs?: { readonly hash: number; readonly find: number; readonly select: number };
}

/** No source could take the request; the shell decides whether to queue or reject. */
export interface RouteRefusal {
  readonly kind: 'refused';
  readonly requestId: string;
  /** no_sources: none allowed; all_excluded: every allowed source was excluded; all_busy: the rest were busy. */
  readonly reason: 'no_sources' | 'all_excluded' | 'all_busy' | 'duplicate_request';
  readonly busySources: readonly string[];
  /** The request's hashes, when computed before the refusal (a caller that retries later reuses them). */
  readonly seqHashes?: BigUint64Array;
  readonly promptTokens?: number;
}

export type RouteResult = RouteDecision | RouteRefusal;

/** What the engine reported when the request ended. */
export interface FinishInfo {
  /** usage.prompt_tokens_details.cached_tokens; undefined when the engine did not report it (unknown, not zero). */
  readonly cachedTokens?: number;
  /**
   * 'retried': the attempt failed before the engine answered and the request moves to another source; the routing is
   * taken back out of the ledger, so a retried request counts once, where it was served.
   */
  readonly outcome?: 'ok' | 'cancelled' | 'error' | 'retried';
}

// ------------------------------------------------------------------ hybrid cache groups and multimodal block keys
// (issue 18; docs/engines.md "Hybrid attention (cache groups)" and "Multimodal block keys"). Declared as interface
// merges so these fields stay one block.

/**
 * What a KV-cache group holds, normalised from vLLM's `kv_cache_spec_kind`: `full_attention` (also `mla_attention`,
 * `sink_full_attention`) keeps every block of a prefix; `sliding_window` (also `sliding_window_mla`) needs only the
 * last window of blocks before a cut; `mamba` keeps recurrent state at the block boundaries where it was saved.
 * `unknown`: a kind kvroute cannot reason about (chunked local attention, anything newer): its group is not indexed.
 */
export type CacheGroupKind = 'full_attention' | 'sliding_window' | 'mamba' | 'unknown';

/** One cache group of a source, as its events describe it. */
export interface CacheGroupSpec {
  readonly kind: CacheGroupKind;
  /** Sliding window in tokens (vLLM's `kv_cache_spec_sliding_window`); sliding-window groups only. */
  readonly slidingWindow?: number;
}

/**
 * The multimodal part of a block's identity, as vLLM puts it in `extra_keys`: one (identifier, offset) pair per
 * multimodal item overlapping the block, offset = item start - block start in tokens (negative when the item began in
 * an earlier block).
 */
export type MmBlockKey = readonly [identifier: string, offset: number];

/** A multimodal item of a prompt: its identity and the placeholder tokens it occupies. */
export interface MmItem {
  /** The engine's identifier of the item (vLLM: the user's uuid, else its mm_hash). */
  readonly identifier: string;
  /** First placeholder token of the item in the prompt. */
  readonly offset: number;
  /** Placeholder tokens the item occupies. */
  readonly length: number;
}

export interface StoredEvent {
  /** Kind of the event's cache group (absent: an engine that does not say; group 0 is then full attention). */
  readonly groupKind?: CacheGroupKind;
  /** Sliding window in tokens, for sliding-window groups. */
  readonly slidingWindow?: number;
  /** Per block, the multimodal keys of its identity (null for a text-only block); absent when no block has any. */
  readonly mmKeys?: readonly (readonly MmBlockKey[] | null)[];
  /** vLLM's `session_id`, carried for observers; routing does not read it. */
  readonly sessionId?: string;
}

export interface RouteRequest {
  /** Multimodal items of the prompt (their placeholder tokens are in `tokens`); they enter the block hashes. */
  readonly mmItems?: readonly MmItem[];
}
