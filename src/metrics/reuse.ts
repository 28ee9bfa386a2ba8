/**
 * The reuse family: predicted, available and delivered hit rates per worker. Every hit-rate quantity is exported so
 * that both aggregations can be computed from one scrape (docs/protocols.md §6):
 *   request-weighted (mean of ratios) = rate(router_kv_hit_rate_sum) / rate(router_kv_hit_rate_count)
 *   block-weighted   (ratio of sums)  = rate(router_kv_overlap_blocks_total) / rate(router_kv_isl_blocks_total)
 * Only the second is comparable with the engine's hits/queries counters (router_engine_prefix_cache_*, scrape.ts).
 */
import { Counter, Histogram, type Registry } from 'prom-client';
import type { FinishedRequest } from '../core/router.ts';
import type { RouteDecision } from '../core/types.ts';
import { fastCounter, fastHistogram } from './bound.ts';
import { HIT_RATE_BUCKETS, PREDICTION_ERROR_BUCKETS } from './buckets.ts';

type Worker = { worker: string };

export class ReuseSeries {
  private readonly hitRate: Histogram<'worker'>;
  private readonly availableHitRate: Histogram<'worker'>;
  private readonly overlapBlocks: Counter<'worker'>;
  private readonly islBlocks: Counter<'worker'>;
  private readonly bestOverlapBlocks: Counter<'worker'>;
  private readonly engineCachedTokens: Counter<'worker'>;
  private readonly enginePromptTokens: Counter<'worker'>;
  private readonly predictedCachedTokens: Counter<'worker'>;
  private readonly predictionError: Histogram<'worker'>;
  private readonly deliveredHitRate: Histogram<'worker'>;

  /** `labelAll`: gives every known worker its label (and zeroed series) before the family is read. */
  constructor(registry: Registry, p: string, labelAll: () => void) {
    const registers = [registry];
    const w = ['worker'] as const;
    this.hitRate = fastHistogram(
      new Histogram({
        name: `${p}router_kv_hit_rate`,
        help:
          'Predicted hit rate per request: overlap blocks on the chosen worker / isl blocks. _sum/_count is a MEAN OF ' +
          "RATIOS (request-weighted), dragged down by many short cold requests; not comparable with the engine's " +
          'hits/queries. For that use router_kv_overlap_blocks_total / router_kv_isl_blocks_total.',
        buckets: HIT_RATE_BUCKETS,
        labelNames: w,
        registers,
        // The family's first series, so this runs before the others are read: every known worker gets zeroed series.
        collect: labelAll,
      }),
    );
    this.availableHitRate = fastHistogram(
      new Histogram({
        name: `${p}router_kv_available_hit_rate`,
        help:
          'Reuse available per request: best overlap over eligible workers / isl blocks (request-weighted when read as ' +
          '_sum/_count). Block-weighted: router_kv_best_overlap_blocks_total / router_kv_isl_blocks_total.',
        buckets: HIT_RATE_BUCKETS,
        labelNames: w,
        registers,
      }),
    );
    this.overlapBlocks = fastCounter(
      new Counter({
        name: `${p}router_kv_overlap_blocks_total`,
        help:
          'Prompt blocks the chosen worker already held, summed at routing time. rate(this)/rate(router_kv_isl_blocks_total) ' +
          "is the block-weighted predicted hit rate (a ratio of sums), directly comparable with the engine's hits/queries.",
        labelNames: w,
        registers,
      }),
    );
    this.islBlocks = fastCounter(
      new Counter({
        name: `${p}router_kv_isl_blocks_total`,
        help: 'Prompt blocks routed (ceil(prompt tokens / block size) per request), summed at routing time.',
        labelNames: w,
        registers,
      }),
    );
    this.bestOverlapBlocks = fastCounter(
      new Counter({
        name: `${p}router_kv_best_overlap_blocks_total`,
        help:
          'Best overlap among eligible workers, summed at routing time (reuse available in the fleet). The gap to ' +
          'router_kv_overlap_blocks_total is reuse traded for load balance. Labelled by the chosen worker.',
        labelNames: w,
        registers,
      }),
    );
    this.engineCachedTokens = fastCounter(
      new Counter({
        name: `${p}router_kv_engine_cached_tokens_total`,
        help:
          'Delivered reuse: usage.prompt_tokens_details.cached_tokens the engine reported, summed over requests that ' +
          'reported it (absent is unknown, not zero, and is not counted).',
        labelNames: w,
        registers,
      }),
    );
    this.enginePromptTokens = fastCounter(
      new Counter({
        name: `${p}router_kv_engine_prompt_tokens_total`,
        help: 'Prompt tokens of the same requests as router_kv_engine_cached_tokens_total (the delivered denominator).',
        labelNames: w,
        registers,
      }),
    );
    this.predictedCachedTokens = fastCounter(
      new Counter({
        name: `${p}router_kv_predicted_cached_tokens_total`,
        help:
          'Cached tokens the router predicted, for the same requests as router_kv_engine_cached_tokens_total ' +
          '(overlap in tokens, never the last prompt token).',
        labelNames: w,
        registers,
      }),
    );
    this.predictionError = fastHistogram(
      new Histogram({
        name: `${p}router_kv_prediction_error_tokens`,
        help: 'Per request with an engine report: predicted minus delivered cached tokens (>0 the router over-predicted).',
        buckets: PREDICTION_ERROR_BUCKETS,
        labelNames: w,
        registers,
      }),
    );
    this.deliveredHitRate = fastHistogram(
      new Histogram({
        name: `${p}router_kv_delivered_hit_rate`,
        help:
          'Per request with an engine report: cached tokens / prompt tokens. _sum/_count is request-weighted; the ' +
          'token-weighted delivered rate is router_kv_engine_cached_tokens_total / router_kv_engine_prompt_tokens_total.',
        buckets: HIT_RATE_BUCKETS,
        labelNames: w,
        registers,
      }),
    );
  }

  /** Series exist at 0 from the moment a worker is known, so rate() sees the first request instead of a new series. */
  zero(worker: Worker): void {
    for (const c of [
      this.overlapBlocks,
      this.islBlocks,
      this.bestOverlapBlocks,
      this.engineCachedTokens,
      this.enginePromptTokens,
      this.predictedCachedTokens,
    ]) {
      c.inc(worker, 0);
    }
    for (const h of [this.hitRate, this.availableHitRate, this.predictionError, this.deliveredHitRate]) h.zero(worker);
  }

  /** The prediction, at routing time. */
  routed(worker: Worker, decision: RouteDecision): void {
    const isl = decision.islBlocks;
    this.islBlocks.inc(worker, isl);
    this.overlapBlocks.inc(worker, decision.overlapBlocks);
    this.bestOverlapBlocks.inc(worker, decision.bestOverlapBlocks);
    // A zero-block prompt has no ratio; the ledger skips it too, so histogram and ledger agree.
    if (isl > 0) {
      this.hitRate.observe(worker, decision.overlapBlocks / isl);
      this.availableHitRate.observe(worker, decision.bestOverlapBlocks / isl);
    }
  }

  /** Delivered reuse, counted only when the engine reported cached tokens (the condition the ledger uses). */
  finished(worker: Worker, f: FinishedRequest): void {
    const cached = f.cachedTokens;
    // The decode leg of a disaggregated request reports the transferred KV as cached: not a prefix hit, not counted.
    if (!f.accounted || cached === undefined || !Number.isFinite(cached) || cached < 0 || f.promptTokens <= 0) return;
    this.engineCachedTokens.inc(worker, cached);
    this.enginePromptTokens.inc(worker, f.promptTokens);
    this.predictedCachedTokens.inc(worker, f.predictedCachedTokens);
    this.predictionError.observe(worker, f.predictedCachedTokens - cached);
    this.deliveredHitRate.observe(worker, cached / f.promptTokens);
  }
}
