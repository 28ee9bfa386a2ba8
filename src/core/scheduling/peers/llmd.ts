/**
 * llm-d router's two defaults (llm-d/llm-d-router @ebab6879):
 *
 * `llmd`, the built-in and chart profile (pkg/epp/config/loader/defaults.go; config/charts/routerlib/templates/
 * _config.yaml): score = 2 * queue + 2 * kv-cache-utilization + 3 * prefix, max-score picker (shuffle, then stable sort:
 * uniform ties).
 *   queue   (q_max - q)/(q_max - q_min) over the scraped waiting queues (vllm:num_requests_waiting); 1 when all equal
 *   kv      1 - scraped vllm:kv_cache_usage_perc
 *   prefix  matched/total blocks of max(64, bs) tokens in the approximate prefix producer: chained hashes of the
 *           prefixes the router itself sent each endpoint (inserted after scheduling), an LRU per endpoint of
 *           num_gpu_blocks entries; the walk stops at the first block no endpoint holds
 * Metrics are scraped every 50 ms (the default refresh): stale in between. Without scraped gauges (kvroute serve does
 * not scrape engines) the router's own counts stand in: in-flight requests for the queue and
 * active blocks / capacity for the KV usage.
 *
 * `llmd-baseline`, release 0.8's optimized-baseline guide (filter/prefixcacheaffinity/plugin.go,
 * scorer/tokenload/token_load.go, dataproducer/inflightload/producer.go at plugin defaults):
 *   sticky = {e : m_e >= 0.80}; keep all if sticky is empty, or if the least-loaded sticky endpoint's estimated wait
 *   exceeds the least-loaded other's by more than 18 s at 15,928 prefill tokens/s; else keep sticky
 *   score = 1 - min(1, (T_e + U_e) / 4,194,304) -> max-score, uniform ties
 *   T_e = in-flight uncached prompt tokens the router sent e (released at the first token), U_e = this request's
 *   tokens not matched on e in the approximate index.
 * Simplifications: blocks hash engine token ids (llm-d's default token producer estimates ~4 bytes per token); the
 * in-flight tokens are the router's own count (uncached by the event index's match, not the approximate one).
 */
import { orderByScore } from './score.ts';
import { groupFor, OwnIndex } from './own-index.ts';
import type { Policy, PolicyContext, Ranking } from '../policy.ts';

const LLMD_BLOCK_TOKENS = 64;
/** num_gpu_blocks default of the prefix producer's LRU when the engine's is unknown. */
const LRU_DEFAULT = 31_250;

class Prefix {
  private index?: OwnIndex;
  private keysOf?: { seq: BigUint64Array; keys: bigint[] };

  private idx(ctx: PolicyContext): OwnIndex {
    if (!this.index) {
      const group = groupFor(Math.max(LLMD_BLOCK_TOKENS, ctx.blockSize), ctx.blockSize);
      const cap = ctx.candidates[0]?.capacityBlocks;
      this.index = new OwnIndex({ group, capacity: cap ?? LRU_DEFAULT });
    }
    return this.index;
  }

  keys(ctx: PolicyContext): bigint[] {
    if (this.keysOf?.seq !== ctx.seqHashes) this.keysOf = { seq: ctx.seqHashes, keys: this.idx(ctx).keys(ctx.seqHashes) };
    return this.keysOf.keys;
  }

  /** Matched peer blocks per candidate, and the request's peer blocks. */
  match(ctx: PolicyContext): { matched: number[]; total: number; tokensPerBlock: number } {
    const idx = this.idx(ctx);
    const keys = this.keys(ctx);
    return {
      matched: ctx.candidates.map((c) => idx.match(c.key, keys)),
      total: keys.length,
      tokensPerBlock: idx.group * ctx.blockSize,
    };
  }

  record(ctx: PolicyContext, chosen: number): void {
    this.idx(ctx).record(ctx.candidates[chosen].key, this.keys(ctx));
  }
}

function gauges(ctx: PolicyContext): { waiting: number[]; kvUsage: number[] } {
  return {
    waiting: ctx.candidates.map((c) => (c.scraped ? c.scraped.waiting : c.activeRequests)),
    kvUsage: ctx.candidates.map((c) =>
      c.scraped ? c.scraped.kvUsage : c.capacityBlocks ? Math.min(1, c.activeBlocks / c.capacityBlocks) : 0,
    ),
  };
}

export class LlmdPolicy implements Policy {
  readonly name = 'llmd';
  readonly overlay = false;
  readonly scrapeIntervalMs = 50;
  private readonly prefix = new Prefix();

  rank(ctx: PolicyContext): Ranking {
    const { waiting, kvUsage } = gauges(ctx);
    const qMax = Math.max(...waiting);
    const qMin = Math.min(...waiting);
    const { matched, total } = this.prefix.match(ctx);
    const scores = ctx.candidates.map((_, i) => {
      const queue = qMax === qMin ? 1 : (qMax - waiting[i]) / (qMax - qMin);
      const kv = 1 - Math.min(1, Math.max(0, kvUsage[i]));
      const prefix = total > 0 ? matched[i] / total : 0;
      return 2 * queue + 2 * kv + 3 * prefix;
    });
    return { order: orderByScore(scores, ctx.rng), costs: scores.map((s) => -s) };
  }

  routed(ctx: PolicyContext, chosen: number): void {
    this.prefix.record(ctx, chosen);
  }
}

export const BASELINE = { threshold: 0.8, penaltyMs: 18_000, prefillTokensPerS: 15_928, maxTokens: 4_194_304 } as const;

export class LlmdBaselinePolicy implements Policy {
  readonly name = 'llmd-baseline';
  readonly overlay = false;
  private readonly prefix = new Prefix();

  rank(ctx: PolicyContext): Ranking {
    const { matched, total, tokensPerBlock } = this.prefix.match(ctx);
    const n = ctx.candidates.length;
    const ratio = matched.map((m) => (total > 0 ? m / total : 0));
    const T = ctx.candidates.map((c) => c.activePrefillTokens);
    const sticky = [...Array(n).keys()].filter((i) => ratio[i] >= BASELINE.threshold);
    const others = [...Array(n).keys()].filter((i) => ratio[i] < BASELINE.threshold);
    let keep = sticky;
    if (sticky.length === 0) keep = others;
    else if (others.length > 0) {
      const wait = (ids: number[]) => (Math.min(...ids.map((i) => T[i])) / BASELINE.prefillTokensPerS) * 1000;
      if (wait(sticky) - wait(others) > BASELINE.penaltyMs) keep = [...Array(n).keys()];
    }
    const kept = new Set(keep);
    const scores = ctx.candidates.map((_, i) => {
      const uncached = Math.max(0, ctx.promptTokens - matched[i] * tokensPerBlock);
      const s = 1 - Math.min(1, (T[i] + uncached) / BASELINE.maxTokens);
      // Filtered-out endpoints come after every kept one (the order retries take).
      return kept.has(i) ? s : s - 2;
    });
    return { order: orderByScore(scores, ctx.rng), costs: scores.map((s) => -s) };
  }

  routed(ctx: PolicyContext, chosen: number): void {
    this.prefix.record(ctx, chosen);
  }
}
