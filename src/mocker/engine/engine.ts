/**
 * The mock engine: a vLLM-v1-like continuous-batching scheduler over the paged prefix cache of cache.ts, with a step
 * timing model. Pure and synchronous: time comes in as an argument; no timers, no I/O, no Math.random.
 * See index.ts for the API contract.
 */
import { createHash } from 'node:crypto';
import { xxh3 } from '@node-rs/xxhash';
import { SeqHasher, hashSeed } from '../../core/hashing.ts';
import { GPU_MEDIUM } from '../../core/types.ts';
import { splitU64, u32View } from '../../core/index/u64-map.ts';
import { BlockPool } from './cache.ts';
import { HostTier } from './host-tier.ts';
import { type EngineCacheGroup, type GroupHold, HybridGroups } from './hybrid.ts';
import { mmBlockKeys, mmItemsError } from '../../core/multimodal.ts';
import type { CacheGroupKind, MmBlockKey, MmItem } from '../../core/types.ts';
import { DEFAULT_POLYNOMIAL, stepDurationMs, type StepWork, type TimingModel } from './timing.ts';

export interface EngineConfig {
  /** Tokens per KV block (vLLM default 16). */
  blockSize: number;
  numGpuBlocks: number;
  /** Max running requests (vLLM --max-num-seqs). */
  maxNumSeqs: number;
  /** Token budget per step (vLLM --max-num-batched-tokens); prefill is chunked to fit. */
  maxNumBatchedTokens: number;
  /** Prompt + output limit in tokens. */
  maxModelLen: number;
  enablePrefixCaching: boolean;
  timing: TimingModel;
  /** Output token ids are drawn from [0, vocabSize). */
  vocabSize: number;
  /** Mixed into every request's output seed. */
  seed: number;
  /**
   * Hybrid model: the KV-cache groups, in group-index order (./hybrid.ts). Absent or one full-attention group: a
   * model with one group, whose events carry no group fields beyond group 0.
   */
  cacheGroups?: readonly EngineCacheGroup[];
  /**
   * Host tier (CPU offload) of this many blocks behind the GPU cache (./host-tier.ts): evicted GPU blocks go there and
   * a prefix look-up continues in it. Absent or 0: none. Not with a hybrid model.
   */
  hostBlocks?: number;
}

/** The medium a host-tier block is announced on (vLLM's CPU offloading). */
export const HOST_MEDIUM = 'CPU';

export const DEFAULT_ENGINE_CONFIG: EngineConfig = {
  blockSize: 16,
  numGpuBlocks: 16384,
  maxNumSeqs: 256,
  maxNumBatchedTokens: 8192,
  maxModelLen: 32768,
  enablePrefixCaching: true,
  timing: DEFAULT_POLYNOMIAL,
  vocabSize: 32000,
  seed: 0,
};

export interface EngineRequest {
  readonly requestId: string;
  readonly promptTokens: readonly number[];
  /** Output tokens to generate (the request finishes with reason "length" after this many). */
  readonly maxTokens: number;
  readonly loraName?: string | null;
  readonly cacheSalt?: string | null;
  /** Output seed; default derived from the prompt tokens, so the same prompt yields the same output. */
  readonly seed?: number;
  /**
   * Disaggregated decode: prompt tokens whose KV arrived from a prefill worker. They count as computed at admission
   * (all but the last prompt token, which is computed here for its logits, as vLLM does) and join the prefix cache.
   */
  readonly preloadedTokens?: number;
  /** Disaggregated prefill: keep the request's blocks after it finishes, until `releaseHeld` (vLLM's KV lease). */
  readonly holdOnFinish?: boolean;
  /** Multimodal items (their placeholder tokens are in the prompt); their identity enters the block hashes. */
  readonly mmItems?: readonly MmItem[];
}

/** Newly cached full blocks of one request in one step (one vLLM BlockStored). Structurally a core StoredEvent. */
export interface EngineStoredEvent {
  readonly kind: 'stored';
  readonly parent: bigint | null;
  readonly engineIds: bigint[];
  /** Tokens of the new blocks only: engineIds.length * blockSize. */
  readonly tokens: number[];
  readonly blockSize: number;
  readonly loraName: string | null;
  /** Stable small id per LoRA name in this engine (vLLM's lora_id), null without LoRA. */
  readonly loraId: number | null;
  readonly cacheSalt: string | null;
  /** One entry per block as vLLM sends them: [lora_name?, (mm identifier, offset)..., cache_salt (first block)?] or null. */
  readonly extraKeys: (BlockExtraKeys | null)[];
  readonly medium: string;
  /** Router sequence hashes of the blocks (for tests; a real engine never sends these). */
  readonly routerSeqHashes: bigint[];
  /** Hybrid models: the block's cache group, its kind and window (the core StoredEvent's fields). */
  readonly groupIdx?: number;
  readonly groupKind?: CacheGroupKind;
  readonly slidingWindow?: number;
  /** Per block, its multimodal keys (the core StoredEvent's field); absent for text-only events. */
  readonly mmKeys?: (MmBlockKey[] | null)[];
}

/** A block's extra keys as vLLM orders them: LoRA name, multimodal (identifier, offset) pairs, cache_salt. */
export type BlockExtraKeys = readonly (string | MmBlockKey)[];

export interface EngineRemovedEvent {
  readonly kind: 'removed';
  readonly engineIds: bigint[];
  readonly medium: string;
  readonly groupIdx?: number;
}

export type EngineEvent = EngineStoredEvent | EngineRemovedEvent;

export interface RequestOutput {
  readonly requestId: string;
  /** Tokens produced by this step (0 or 1). */
  readonly newTokens: number[];
  /** True when `newTokens` holds the request's first output token. */
  readonly firstToken: boolean;
  readonly finished: boolean;
  readonly finishReason: 'length' | null;
  readonly promptTokens: number;
  readonly completionTokens: number;
  /** Prompt tokens served from the prefix cache at first scheduling (vLLM's num_cached_tokens). */
  readonly cachedTokens: number;
  /** Engine-clock times (ms): arrival, and the end of the step that produced the first token. */
  readonly arrivalMs: number;
  readonly firstTokenMs: number | null;
}

export interface StepResult {
  /** Modelled duration; outputs and events become visible at now + durationMs. 0 when nothing was scheduled. */
  readonly durationMs: number;
  /** Events in the order they happened (evictions during scheduling, then blocks cached by the step). */
  readonly events: EngineEvent[];
  readonly outputs: RequestOutput[];
  readonly scheduledRequests: number;
  readonly scheduledTokens: number;
  readonly preempted: string[];
}

export interface EngineCounters {
  /** Prompt tokens queried against the prefix cache (first scheduling; recomputes after preemption excluded, as vLLM). */
  prefixCacheQueries: number;
  /** Of those, tokens served from the cache. */
  prefixCacheHits: number;
  promptTokens: number;
  generationTokens: number;
  preemptions: number;
  requestsFinished: number;
  requestsAborted: number;
  steps: number;
  blocksStored: number;
  blocksEvicted: number;
  /** Host tier: prompt tokens loaded back from it at first scheduling (in cachedTokens, not in prefixCacheHits). */
  hostHitTokens: number;
  /** Host tier: blocks copied to it on GPU eviction, blocks loaded back from it, blocks it dropped when full. */
  hostStored: number;
  hostLoaded: number;
  hostEvicted: number;
}

export interface DumpBlock {
  readonly engineId: bigint;
  readonly parentEngineId: bigint | null;
  /** Router-compatible sequence hash (src/core/hashing.ts with the request's lora/salt seed). */
  readonly seqHash: bigint;
  readonly loraName: string | null;
  readonly cacheSalt: string | null;
  readonly refCount: number;
}

export class EngineInputError extends Error {
  constructor(
    message: string,
    readonly code: 'empty_prompt' | 'bad_max_tokens' | 'too_long' | 'too_many_blocks' | 'duplicate_request' | 'bad_token' | 'bad_mm_items',
  ) {
    super(message);
    this.name = 'EngineInputError';
  }
}

type Status = 'waiting' | 'running';

/** Blocks taken out of the host tier for one admission: engine ids and router hash halves, in chain order. */
interface HostRun {
  ids: bigint[];
  lo: number[];
  hi: number[];
}

class Req {
  readonly tokens: number[];
  readonly promptLen: number;
  numComputed = 0;
  blocks: number[] = [];
  /** Leading blocks of `blocks` that are registered in the cache. */
  numCachedBlocks = 0;
  cachedTokens = -1;
  firstTokenMs: number | null = null;
  numPreemptions = 0;
  status: Status = 'waiting';
  readonly hasher: SeqHasher;
  readonly seed: number;
  /** Hybrid models: the request's blocks in the other cache groups. */
  groupHold: GroupHold | null = null;

  constructor(
    readonly input: EngineRequest,
    readonly arrivalMs: number,
    blockSize: number,
    engineSeed: number,
  ) {
    this.tokens = input.promptTokens.slice();
    this.promptLen = this.tokens.length;
    const items = input.mmItems && input.mmItems.length > 0 ? input.mmItems : null;
    this.hasher = new SeqHasher(
      blockSize,
      hashSeed(input.loraName, input.cacheSalt),
      items ? (from, blocks) => mmBlockKeys(items, from, blocks, blockSize) : undefined,
    );
    this.hasher.extend(this.tokens);
    this.seed = (input.seed ?? promptSeed(input.promptTokens)) ^ engineSeed;
  }

  get outputs(): number {
    return this.tokens.length - this.promptLen;
  }
}

/** FNV-1a over the prompt's token ids: the default output seed (same prompt, same output, like temperature 0). */
function promptSeed(tokens: readonly number[]): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < tokens.length; i++) {
    h = Math.imul(h ^ (tokens[i] & 0xffff), 0x01000193);
    h = Math.imul(h ^ (tokens[i] >>> 16), 0x01000193);
  }
  return h >>> 0;
}

/** Output token `index` of a request with output seed `seed` (a stateless integer hash, so preemption cannot change it). */
export function outputToken(seed: number, index: number, vocabSize: number): number {
  let x = (seed ^ Math.imul(index + 1, 0x9e3779b9)) >>> 0;
  x = Math.imul(x ^ (x >>> 16), 0x85ebca6b);
  x = Math.imul(x ^ (x >>> 13), 0xc2b2ae35);
  x = (x ^ (x >>> 16)) >>> 0;
  return x % vocabSize;
}

/** The output tokens a request will get: for tests and clients that want to predict them. */
export function expectedOutputTokens(
  req: Pick<EngineRequest, 'promptTokens' | 'seed'>,
  n: number,
  vocabSize: number,
  engineSeed = 0,
): number[] {
  const seed = (req.seed ?? promptSeed(req.promptTokens)) ^ engineSeed;
  return Array.from({ length: n }, (_, i) => outputToken(seed, i, vocabSize));
}

export class MockEngine {
  readonly config: EngineConfig;
  private pool: BlockPool;
  private readonly requests = new Map<string, Req>();
  private waiting: Req[] = [];
  private running: Req[] = [];
  private pendingEvents: EngineEvent[] = [];
  private readonly loraIds = new Map<string, number>();
  /** Blocks of finished requests kept for a remote decode side to pull (holdOnFinish). */
  private readonly held = new Map<string, number[]>();
  counters: EngineCounters = MockEngine.zeroCounters();
  /** Hybrid models: the cache groups besides the main (first full-attention) one. */
  private readonly hybrid: HybridGroups | null;
  /** The host tier (CPU offload), or null without one. */
  private host: HostTier | null;

  constructor(config: Partial<EngineConfig> = {}) {
    this.config = { ...DEFAULT_ENGINE_CONFIG, ...config };
    const c = this.config;
    for (const k of ['blockSize', 'numGpuBlocks', 'maxNumSeqs', 'maxNumBatchedTokens', 'maxModelLen', 'vocabSize'] as const) {
      if (!Number.isInteger(c[k]) || c[k] < 1) throw new RangeError(`${k} must be a positive integer, got ${c[k]}`);
    }
    const groups = c.cacheGroups;
    this.hybrid = groups && groups.length > 1 ? new HybridGroups(groups, c.blockSize) : null;
    if (groups && groups.length === 1 && groups[0].kind !== 'full_attention') {
      throw new RangeError('a model with one cache group must be full attention');
    }
    const hostBlocks = c.hostBlocks ?? 0;
    if (!Number.isInteger(hostBlocks) || hostBlocks < 0) throw new RangeError(`hostBlocks must be an integer >= 0, got ${hostBlocks}`);
    if (hostBlocks > 0 && this.hybrid) throw new RangeError('a host tier is not modelled for hybrid models');
    this.host = hostBlocks > 0 ? new HostTier(hostBlocks) : null;
    this.pool = this.newPool();
  }

  /** Blocks the host tier holds (0 without one). */
  get hostCachedBlocks(): number {
    return this.host?.size ?? 0;
  }

  /** Blocks the other cache groups of a hybrid model could not cache (no free block). */
  get groupBlocksNotCached(): number {
    return this.hybrid?.uncachedBlocks ?? 0;
  }

  private static zeroCounters(): EngineCounters {
    return {
      prefixCacheQueries: 0,
      prefixCacheHits: 0,
      promptTokens: 0,
      generationTokens: 0,
      preemptions: 0,
      requestsFinished: 0,
      requestsAborted: 0,
      steps: 0,
      blocksStored: 0,
      blocksEvicted: 0,
      hostHitTokens: 0,
      hostStored: 0,
      hostLoaded: 0,
      hostEvicted: 0,
    };
  }

  private newPool(): BlockPool {
    return new BlockPool(this.config.numGpuBlocks, (pool, block) => {
      this.counters.blocksEvicted++;
      if (this.host) this.offload(pool, block);
      // vLLM emits one BlockRemoved per evicted block (with its group in a hybrid model).
      if (this.hybrid) {
        this.pendingEvents.push({
          kind: 'removed',
          engineIds: [pool.engineIdOf(block)],
          medium: GPU_MEDIUM,
          groupIdx: pool.groupOf(block),
        });
      } else {
        this.pendingEvents.push({ kind: 'removed', engineIds: [pool.engineIdOf(block)], medium: GPU_MEDIUM });
      }
    });
  }

  /**
   * A GPU block being evicted goes to the host tier (announced there first, so whoever maps engine ids still knows it);
   * the host block it displaces is announced removed.
   */
  private offload(pool: BlockPool, block: number): void {
    const host = this.host!;
    const [lo, hi] = splitU64(pool.seqHashOf(block));
    const id = pool.engineIdOf(block);
    const parent = pool.parentIdOf(block);
    const dropped = host.store(lo, hi, id);
    this.counters.hostStored++;
    if (dropped !== null) {
      this.counters.hostEvicted++;
      this.pendingEvents.push({ kind: 'removed', engineIds: [dropped], medium: HOST_MEDIUM });
    }
    const who = pool.identityOf(block);
    this.pendingEvents.push({
      kind: 'stored',
      parent,
      engineIds: [id],
      tokens: [],
      blockSize: this.config.blockSize,
      loraName: who.loraName,
      loraId: who.loraName ? this.loraId(who.loraName) : null,
      cacheSalt: who.cacheSalt,
      extraKeys: [null],
      medium: HOST_MEDIUM,
      routerSeqHashes: [pool.seqHashOf(block)],
    });
  }

  get numRunning(): number {
    return this.running.length;
  }

  get numWaiting(): number {
    return this.waiting.length;
  }

  /** Fraction of blocks in use (refCount > 0); cached-but-free blocks do not count, as vLLM's kv_cache_usage_perc. */
  get kvUsage(): number {
    return this.pool.usedBlocks / this.pool.numBlocks;
  }

  get cachedBlocks(): number {
    return this.pool.cachedBlocks;
  }

  /** True when a step would schedule something. */
  hasWork(): boolean {
    return this.running.length > 0 || this.waiting.length > 0;
  }

  has(requestId: string): boolean {
    return this.requests.has(requestId);
  }

  /** Validates and queues a request. Throws EngineInputError on input that could never be served. */
  addRequest(req: EngineRequest, nowMs: number): void {
    const c = this.config;
    const n = req.promptTokens.length;
    if (this.requests.has(req.requestId))
      throw new EngineInputError(`request id ${req.requestId} is already in the engine`, 'duplicate_request');
    if (n === 0) throw new EngineInputError('prompt must contain at least one token', 'empty_prompt');
    for (const t of req.promptTokens) {
      if (!Number.isInteger(t) || t < 0 || t > 0xffffffff)
        throw new EngineInputError(`token id ${t} is not an unsigned 32-bit integer`, 'bad_token');
    }
    if (req.mmItems && req.mmItems.length > 0) {
      const err = mmItemsError(req.mmItems, n);
      if (err) throw new EngineInputError(err, 'bad_mm_items');
    }
    if (!Number.isInteger(req.maxTokens) || req.maxTokens < 1)
      throw new EngineInputError(`max_tokens must be a positive integer, got ${req.maxTokens}`, 'bad_max_tokens');
    if (n + req.maxTokens > c.maxModelLen) {
      throw new EngineInputError(
        `This model's maximum context length is ${c.maxModelLen} tokens. However, you requested ${n + req.maxTokens} tokens (${n} in the messages, ${req.maxTokens} in the completion).`,
        'too_long',
      );
    }
    // The KV of the last output token is never computed.
    const needBlocks = Math.ceil((n + req.maxTokens - 1) / c.blockSize);
    if (needBlocks > c.numGpuBlocks) {
      throw new EngineInputError(`request needs ${needBlocks} KV blocks but the engine has ${c.numGpuBlocks}`, 'too_many_blocks');
    }
    const r = new Req(req, nowMs, c.blockSize, c.seed);
    this.requests.set(req.requestId, r);
    this.waiting.push(r);
  }

  /** Removes a request wherever it is (client went away); its cached blocks stay cached. */
  abort(requestId: string): boolean {
    const r = this.requests.get(requestId);
    if (!r) return false;
    this.requests.delete(requestId);
    const q = r.status === 'running' ? this.running : this.waiting;
    const i = q.indexOf(r);
    if (i >= 0) q.splice(i, 1);
    this.pool.release(r.blocks);
    r.blocks = [];
    if (r.groupHold) this.hybrid?.release(this.pool, r.groupHold);
    this.counters.requestsAborted++;
    return true;
  }

  /** Frees the blocks a finished request held for its decode side (pulled, or the lease expired). */
  releaseHeld(requestId: string): boolean {
    const blocks = this.held.get(requestId);
    if (!blocks) return false;
    this.held.delete(requestId);
    this.pool.release(blocks);
    return true;
  }

  /** Leading prompt tokens this engine's prefix cache holds for a prompt (what a decode side need not pull). */
  prefixHitTokens(promptTokens: readonly number[], loraName?: string | null, cacheSalt?: string | null): number {
    if (!this.config.enablePrefixCaching || promptTokens.length === 0) return 0;
    const bs = this.config.blockSize;
    const h = new SeqHasher(bs, hashSeed(loraName, cacheSalt));
    h.extend(promptTokens);
    return this.pool.matchPrefix(h.seqHashes(), Math.floor((promptTokens.length - 1) / bs)).length * bs;
  }

  /** A restart: every request dropped, the cache emptied, counters zeroed, no event emitted. Returns the dropped ids. */
  reset(): string[] {
    this.held.clear();
    const ids = [...this.requests.keys()];
    this.requests.clear();
    this.waiting = [];
    this.running = [];
    this.pendingEvents = [];
    this.loraIds.clear();
    this.counters = MockEngine.zeroCounters();
    if (this.host) this.host = new HostTier(this.host.capacity);
    this.pool = this.newPool();
    return ids;
  }

  /** Runs one scheduler step starting at `nowMs`. */
  step(nowMs: number): StepResult {
    const c = this.config;
    const bs = c.blockSize;
    let budget = c.maxNumBatchedTokens;
    const scheduled: { r: Req; numNew: number }[] = [];
    const preempted: string[] = [];

    // 1. Running requests first (decodes and unfinished prefill chunks), FCFS; preempt from the back when blocks run out.
    let i = 0;
    while (i < this.running.length && budget > 0) {
      const r = this.running[i];
      const numNew = Math.min(r.tokens.length - r.numComputed, budget);
      let ok = false;
      for (;;) {
        if (this.allocateSlots(r, r.numComputed + numNew, null)) {
          ok = true;
          break;
        }
        const victim = this.running.pop()!;
        this.preempt(victim);
        preempted.push(victim.input.requestId);
        if (victim === r) break;
      }
      if (!ok) break;
      scheduled.push({ r, numNew });
      budget -= numNew;
      i++;
    }

    // 2. Waiting requests (new and preempted), only when nothing was preempted this step (as vLLM).
    if (preempted.length === 0) {
      while (this.waiting.length > 0 && budget > 0 && this.running.length < c.maxNumSeqs) {
        const r = this.waiting[0];
        let hit =
          c.enablePrefixCaching && r.numComputed === 0
            ? this.pool.matchPrefix(r.hasher.seqHashes(), Math.floor((r.tokens.length - 1) / bs))
            : [];
        // Hybrid: the full-attention hit is usable only as far as every other group can resume (./hybrid.ts).
        if (this.hybrid && hit.length > 0) hit = hit.slice(0, this.hybrid.hitBlocks(this.pool, r.hasher.seqHashes(), hit.length));
        const localHit = hit.length * bs;
        // The host tier continues the look-up where the GPU's stops; its run is taken out now (so the evictions that
        // make room for it cannot drop it) and loaded back into the fresh blocks, or put back if nothing fits.
        const loaded = this.host && c.enablePrefixCaching && r.numComputed === 0 ? this.takeFromHost(r, hit.length) : null;
        const tierHit = localHit + (loaded ? loaded.ids.length * bs : 0);
        // KV received from a prefill worker counts as computed; the last prompt token is computed here for its logits.
        const computed = r.numPreemptions === 0 ? Math.max(tierHit, Math.min(r.input.preloadedTokens ?? 0, r.promptLen - 1)) : tierHit;
        const numNew = Math.min(r.tokens.length - computed, budget);
        if (!this.allocateSlots(r, computed + numNew, hit)) {
          if (loaded) this.putBackToHost(loaded);
          break;
        }
        if (loaded && loaded.ids.length > 0) {
          this.counters.hostLoaded += loaded.ids.length;
          this.pendingEvents.push({ kind: 'removed', engineIds: loaded.ids, medium: HOST_MEDIUM });
          if (r.numPreemptions === 0) this.counters.hostHitTokens += loaded.ids.length * bs;
        }
        this.waiting.shift();
        this.running.push(r);
        r.status = 'running';
        r.numComputed = computed;
        r.numCachedBlocks = hit.length;
        if (this.hybrid && c.enablePrefixCaching) {
          r.groupHold ??= this.hybrid.newHold();
          this.hybrid.admit(this.pool, r.groupHold, r.hasher.seqHashes(), hit.length);
        }
        if (r.cachedTokens < 0) {
          r.cachedTokens = computed;
          this.counters.promptTokens += r.promptLen;
        }
        // vLLM keeps no prefix-cache stats when prefix caching is off.
        if (r.numPreemptions === 0 && c.enablePrefixCaching) {
          this.counters.prefixCacheQueries += r.tokens.length;
          this.counters.prefixCacheHits += localHit; // transferred KV is not a prefix-cache hit (vLLM counts it apart)
        }
        scheduled.push({ r, numNew });
        budget -= numNew;
      }
    }

    if (scheduled.length === 0) {
      const events = this.pendingEvents;
      this.pendingEvents = [];
      return { durationMs: 0, events, outputs: [], scheduledRequests: 0, scheduledTokens: 0, preempted };
    }

    // 3. Execute: account the work, cache newly full blocks, sample one token per request whose tokens are all computed.
    const work: StepWork = { prefillTokens: 0, prefillAttnTokens2: 0, decodeRequests: 0, decodeContextTokens: 0, kvUsage: this.kvUsage };
    for (const { r, numNew } of scheduled) {
      const before = r.numComputed;
      if (r.outputs > 0 && before === r.tokens.length - 1 && numNew === 1) {
        work.decodeRequests++;
        work.decodeContextTokens += before + 1;
      } else {
        work.prefillTokens += numNew;
        work.prefillAttnTokens2 += numNew * (2 * before + numNew);
      }
      r.numComputed += numNew;
      if (c.enablePrefixCaching) this.cacheFullBlocks(r);
      if (this.hybrid && r.groupHold) this.cacheGroupBlocks(r, r.groupHold);
    }
    const durationMs = stepDurationMs(c.timing, work);
    const endMs = nowMs + durationMs;
    const outputs: RequestOutput[] = [];
    const finished: Req[] = [];
    for (const { r } of scheduled) {
      if (r.numComputed < r.tokens.length) continue; // a prefill chunk that did not reach the end
      const tok = outputToken(r.seed, r.outputs, c.vocabSize);
      r.tokens.push(tok);
      ONE[0] = tok;
      r.hasher.extend(ONE); // SeqHasher copies what it keeps
      this.counters.generationTokens++;
      const first = r.firstTokenMs === null;
      if (first) r.firstTokenMs = endMs;
      const done = r.outputs >= r.input.maxTokens || r.tokens.length >= c.maxModelLen;
      if (done) finished.push(r);
      outputs.push({
        requestId: r.input.requestId,
        newTokens: [tok],
        firstToken: first,
        finished: done,
        finishReason: done ? 'length' : null,
        promptTokens: r.promptLen,
        completionTokens: r.outputs,
        cachedTokens: r.cachedTokens,
        arrivalMs: r.arrivalMs,
        firstTokenMs: r.firstTokenMs,
      });
    }
    for (const r of finished) {
      this.running.splice(this.running.indexOf(r), 1);
      this.requests.delete(r.input.requestId);
      if (r.input.holdOnFinish) this.held.set(r.input.requestId, r.blocks);
      else this.pool.release(r.blocks);
      r.blocks = [];
      // The other groups' blocks are not part of a P/D lease: the decode side pulls full attention only.
      if (r.groupHold) this.hybrid?.release(this.pool, r.groupHold);
      this.counters.requestsFinished++;
    }
    this.counters.steps++;
    const events = this.pendingEvents;
    this.pendingEvents = [];
    let scheduledTokens = 0;
    for (const s of scheduled) scheduledTokens += s.numNew;
    return { durationMs, events, outputs, scheduledRequests: scheduled.length, scheduledTokens, preempted };
  }

  /** The run of r's blocks from `from` on that the host tier holds, taken out of it (at most the matchable blocks). */
  private takeFromHost(r: Req, from: number): HostRun {
    const host = this.host!;
    const v = u32View(r.hasher.seqHashes());
    const max = Math.floor((r.tokens.length - 1) / this.config.blockSize);
    const out: HostRun = { ids: [], lo: [], hi: [] };
    for (let j = from; j < max && host.has(v[2 * j], v[2 * j + 1]); j++) {
      out.lo.push(v[2 * j]);
      out.hi.push(v[2 * j + 1]);
      out.ids.push(host.take(v[2 * j], v[2 * j + 1])!);
    }
    return out;
  }

  /** Undoes takeFromHost (the request did not fit): tail first, so the prefix is the most recent again. */
  private putBackToHost(t: HostRun): void {
    for (let k = t.ids.length - 1; k >= 0; k--) this.host!.store(t.lo[k], t.hi[k], t.ids[k]);
  }

  /**
   * Makes `r` hold enough blocks for `totalTokens` tokens, first taking the prefix-hit blocks `hit` (new admissions).
   * All or nothing: returns false without side effects when the free blocks do not suffice.
   */
  private allocateSlots(r: Req, totalTokens: number, hit: number[] | null): boolean {
    const need = Math.ceil(totalTokens / this.config.blockSize);
    const have = r.blocks.length + (hit ? hit.length : 0);
    const fresh = Math.max(0, need - have);
    let evictableHits = 0;
    if (hit) for (const b of hit) if (this.pool.refCount(b) === 0) evictableHits++;
    if (fresh > this.pool.freeBlocks - evictableHits) return false;
    if (hit) {
      for (const b of hit) {
        this.pool.touch(b);
        r.blocks.push(b);
      }
    }
    for (let k = 0; k < fresh; k++) r.blocks.push(this.pool.allocate());
    return true;
  }

  private preempt(r: Req): void {
    this.pool.release(r.blocks);
    r.blocks = [];
    if (r.groupHold) this.hybrid?.release(this.pool, r.groupHold);
    r.numComputed = 0;
    r.numCachedBlocks = 0;
    r.numPreemptions++;
    r.status = 'waiting';
    this.waiting.unshift(r);
    this.counters.preemptions++;
  }

  /** Registers r's blocks that became full with this step's computed tokens, announcing them as one event per run. */
  private cacheFullBlocks(r: Req): void {
    const bs = this.config.blockSize;
    const full = Math.floor(r.numComputed / bs);
    if (full <= r.numCachedBlocks) return;
    const seqs = r.hasher.seqHashes();
    const seq32 = u32View(seqs);
    const loraName = r.input.loraName || null;
    const cacheSalt = r.input.cacheSalt || null;
    const identity = this.pool.identity(loraName, cacheSalt);
    const loraKeys = loraName ? [loraName] : null;
    const items = r.input.mmItems && r.input.mmItems.length > 0 ? r.input.mmItems : null;
    const hybrid = this.hybrid;
    // A run of newly announced consecutive blocks becomes one BlockStored; a duplicate (shared, not announced) ends it.
    let runStart = -1;
    let runParent: bigint | null = null;
    let runIds: bigint[] = [];
    let runSeqs: bigint[] = [];
    let runExtra: (BlockExtraKeys | null)[] = [];
    let runMm: (MmBlockKey[] | null)[] | null = null;
    const closeRun = (end: number) => {
      if (runStart < 0) return;
      const ev: { -readonly [K in keyof EngineStoredEvent]: EngineStoredEvent[K] } = {
        kind: 'stored',
        parent: runParent,
        engineIds: runIds,
        tokens: r.tokens.slice(runStart * bs, end * bs),
        blockSize: bs,
        loraName,
        loraId: loraName ? this.loraId(loraName) : null,
        cacheSalt,
        extraKeys: runExtra,
        medium: GPU_MEDIUM,
        routerSeqHashes: runSeqs,
      };
      if (hybrid) {
        ev.groupIdx = hybrid.primary;
        ev.groupKind = 'full_attention';
      }
      if (runMm) ev.mmKeys = runMm;
      this.pendingEvents.push(ev);
      runStart = -1;
      runIds = [];
      runSeqs = [];
      runExtra = [];
      runMm = null;
    };
    for (let j = r.numCachedBlocks; j < full; j++) {
      const lo = seq32[2 * j];
      const hi = seq32[2 * j + 1];
      const existing = this.pool.lookup32(lo, hi);
      if (existing >= 0 && existing !== r.blocks[j]) {
        // Another request cached the same block meanwhile: share it and drop our copy (no duplicate announced).
        this.pool.touch(existing);
        this.pool.release([r.blocks[j]]);
        r.blocks[j] = existing;
        closeRun(j);
        continue;
      }
      // Block j-1 of r is always cached here: registered just before, or swapped for the cached copy.
      const parentId = j > 0 ? this.pool.engineIdOf(r.blocks[j - 1]) : null;
      const mm = items ? (mmBlockKeys(items, j, 1, bs)?.[0] ?? null) : null;
      const extra = blockExtraKeys(j, loraKeys, mm, cacheSalt);
      const engineId = engineBlockId(parentId, r.tokens, j * bs, bs, extra);
      this.pool.register(r.blocks[j], lo, hi, engineId, parentId, identity, hybrid?.primary ?? 0);
      this.counters.blocksStored++;
      if (runStart < 0) {
        runStart = j;
        runParent = parentId;
      }
      runIds.push(engineId);
      runSeqs.push(seqs[j]);
      runExtra.push(extra);
      if (mm) {
        runMm ??= new Array<MmBlockKey[] | null>(runIds.length - 1).fill(null);
        runMm.push(mm);
      } else runMm?.push(null);
    }
    closeRun(full);
    r.numCachedBlocks = full;
  }

  /** The other cache groups' newly full blocks, announced one event per run and group (hybrid models). */
  private cacheGroupBlocks(r: Req, hold: GroupHold): void {
    const hybrid = this.hybrid!;
    const bs = this.config.blockSize;
    const loraName = r.input.loraName || null;
    const cacheSalt = r.input.cacheSalt || null;
    const identity = this.pool.identity(loraName, cacheSalt);
    const seqs = r.hasher.seqHashes();
    const idOf = (j: number) => this.pool.engineIdOf(r.blocks[j]);
    const runs = hybrid.afterCompute(this.pool, hold, seqs, r.numComputed, idOf, identity);
    const loraKeys = loraName ? [loraName] : null;
    const items = r.input.mmItems && r.input.mmItems.length > 0 ? r.input.mmItems : null;
    for (const run of runs) {
      const engineIds: bigint[] = [];
      const routerSeqHashes: bigint[] = [];
      const extraKeys: (BlockExtraKeys | null)[] = [];
      const mmKeys: (MmBlockKey[] | null)[] = [];
      for (let j = run.from; j < run.to; j++) {
        engineIds.push(idOf(j));
        routerSeqHashes.push(seqs[j]);
        const mm = items ? (mmBlockKeys(items, j, 1, bs)?.[0] ?? null) : null;
        extraKeys.push(blockExtraKeys(j, loraKeys, mm, cacheSalt));
        mmKeys.push(mm);
      }
      this.counters.blocksStored += engineIds.length;
      const ev: { -readonly [K in keyof EngineStoredEvent]: EngineStoredEvent[K] } = {
        kind: 'stored',
        parent: run.from > 0 ? idOf(run.from - 1) : null,
        engineIds,
        tokens: r.tokens.slice(run.from * bs, run.to * bs),
        blockSize: bs,
        loraName,
        loraId: loraName ? this.loraId(loraName) : null,
        cacheSalt,
        extraKeys,
        medium: GPU_MEDIUM,
        routerSeqHashes,
        groupIdx: run.group,
        groupKind: run.kind,
      };
      if (run.slidingWindow !== undefined) ev.slidingWindow = run.slidingWindow;
      if (mmKeys.some((k) => k !== null)) ev.mmKeys = mmKeys;
      this.pendingEvents.push(ev);
    }
  }

  private loraId(name: string): number {
    let id = this.loraIds.get(name);
    if (id === undefined) {
      id = this.loraIds.size + 1;
      this.loraIds.set(name, id);
    }
    return id;
  }

  /** The cached blocks (the truth the router's index should converge to). */
  dump(): DumpBlock[] {
    const p = this.pool;
    const main = this.hybrid?.primary ?? 0;
    return p
      .cachedBlockList()
      .filter((b) => p.groupOf(b) === main)
      .map((b) => {
        const id = p.identityOf(b);
        return {
          engineId: p.engineIdOf(b),
          parentEngineId: p.parentIdOf(b),
          seqHash: p.seqHashOf(b),
          loraName: id.loraName,
          cacheSalt: id.cacheSalt,
          refCount: p.refCount(b),
        };
      });
  }

  /** Router sequence hashes of every cached block. */
  cachedSeqHashes(): Set<bigint> {
    const main = this.hybrid?.primary ?? 0;
    return new Set(
      this.pool
        .cachedBlockList()
        .filter((b) => this.pool.groupOf(b) === main)
        .map((b) => this.pool.seqHashOf(b)),
    );
  }

  /** Consistency checks for tests: throws on a broken invariant. */
  checkInvariants(): void {
    const refs = new Map<number, number>();
    for (const r of [...this.running, ...this.waiting]) {
      for (const b of r.blocks) refs.set(b, (refs.get(b) ?? 0) + 1);
      if (r.status === 'waiting' && r.blocks.length > 0) throw new Error(`waiting request ${r.input.requestId} holds blocks`);
      if (r.blocks.length * this.config.blockSize < r.numComputed) throw new Error(`request ${r.input.requestId} computed past its blocks`);
    }
    let used = 0;
    for (let b = 0; b < this.pool.numBlocks; b++) {
      const want = refs.get(b) ?? 0;
      if (this.pool.refCount(b) !== want) throw new Error(`block ${b}: refCount ${this.pool.refCount(b)}, held by ${want}`);
      if (want > 0) used++;
    }
    if (used !== this.pool.usedBlocks) throw new Error(`used ${this.pool.usedBlocks} != held ${used}`);
    if (this.running.length > this.config.maxNumSeqs) throw new Error('running exceeds maxNumSeqs');
  }
}

/** A block's extra keys in vLLM's order (generate_block_hash_extra_keys): LoRA, multimodal pairs, cache_salt. */
function blockExtraKeys(j: number, loraKeys: string[] | null, mm: MmBlockKey[] | null, cacheSalt: string | null): BlockExtraKeys | null {
  if (!mm && !(j === 0 && cacheSalt)) return loraKeys;
  const out: (string | MmBlockKey)[] = loraKeys ? [...loraKeys] : [];
  if (mm) out.push(...mm);
  if (j === 0 && cacheSalt) out.push(cacheSalt);
  return out;
}

/** Scratch for the one-token hasher extension of every decode step. */
const ONE = [0];

const ENGINE_ID_SEED = 0x6d6f636b2d766c6cn; // "mock-vll": any seed unlike the router's 1337
let idScratch = Buffer.alloc(9 + 4 * 64);

/**
 * The engine's own block id: xxh3_64(LE u64 parent id ‖ has-parent byte ‖ LE u32 tokens ‖ JSON extra keys, seed
 * ENGINE_ID_SEED). A chain like vLLM's (parent + tokens + extra keys) but unrelated to the router's hash, so a router
 * must learn the engine id -> own hash mapping from events, as with real vLLM. (xxh3 rather than sha256: 10x cheaper
 * for the simulator, and the value is opaque anyway.)
 */
export function engineBlockId(
  parent: bigint | null,
  tokens: readonly number[],
  from: number,
  count: number,
  extra: BlockExtraKeys | null,
): bigint {
  const extraBytes = extra && extra.length > 0 ? Buffer.from(JSON.stringify(extra), 'utf8') : null;
  const len = 9 + 4 * count + (extraBytes ? extraBytes.length : 0);
  if (idScratch.length < len) idScratch = Buffer.alloc(len * 2);
  const b = idScratch;
  b.writeBigUInt64LE(parent ?? 0n, 0);
  b[8] = parent === null ? 0 : 1;
  for (let i = 0; i < count; i++) b.writeUInt32LE(tokens[from + i] >>> 0, 9 + 4 * i);
  if (extraBytes) extraBytes.copy(b, 9 + 4 * count);
  return xxh3.xxh64(b.subarray(0, len), ENGINE_ID_SEED);
}

/**
 * The 32-byte form of an engine id (hash type "bytes", like vLLM's sha256 digests): 24 bytes of sha256(LE u64 id)
 * then the id big-endian, so the u64 form is the low 64 bits of the bytes form, as in vLLM.
 */
export function engineIdBytes(id: bigint): Uint8Array {
  const le = Buffer.alloc(8);
  le.writeBigUInt64LE(id);
  const out = Buffer.alloc(32);
  createHash('sha256').update(le).digest().copy(out, 0, 0, 24);
  out.writeBigUInt64BE(id, 24);
  return new Uint8Array(out.buffer, out.byteOffset, 32);
}
