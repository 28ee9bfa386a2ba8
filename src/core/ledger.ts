/**
 * The reuse ledger: three quantities that are easy to confuse (docs/protocols.md §6), each kept so that both
 * aggregations can be read from the same totals:
 *   available  best overlap over eligible sources            (what the fleet had)
 *   chosen     overlap on the picked source, at routing time  (what the router predicted)
 *   delivered  cached tokens the engine reported             (what the engine did)
 * request-weighted = mean of per-request ratios (what a histogram's _sum/_count gives);
 * block-weighted   = ratio of sums (what the engine's hits/queries counters give).
 * ratio_of_sums = mean_of_ratios + Cov(n, h) / mean(n): on skewed lengths they differ by tens of points.
 */
export interface ReuseTotals {
  /** Requests routed with a non-empty prompt. */
  requests: number;
  /** Σ isl blocks (ceil(prompt/bs)). */
  islBlocks: number;
  /** Σ overlap blocks on the chosen source. */
  overlapBlocks: number;
  /** Σ best overlap over eligible sources. */
  bestOverlapBlocks: number;
  /** Σ overlap/isl per request. */
  chosenRatioSum: number;
  /** Σ best/isl per request. */
  bestRatioSum: number;
  /** Requests whose engine reported cached tokens (the delivered view covers only these). */
  deliveredRequests: number;
  deliveredPromptTokens: number;
  deliveredCachedTokens: number;
  /** For the same requests: cached tokens the router predicted. */
  deliveredPredictedTokens: number;
  /** Σ cached/prompt per delivered request. */
  deliveredRatioSum: number;
  /** Σ predicted/prompt per delivered request. */
  deliveredPredictedRatioSum: number;
}

export interface ReuseView {
  readonly requests: number;
  readonly predicted: { readonly requestWeighted: number; readonly blockWeighted: number };
  readonly available: { readonly requestWeighted: number; readonly blockWeighted: number };
  /** Over the requests with an engine report only; NaN when there are none. */
  readonly delivered: {
    readonly requests: number;
    readonly requestWeighted: number;
    readonly tokenWeighted: number;
    /** The router's prediction for the same requests, token-weighted: compare with tokenWeighted. */
    readonly predictedTokenWeighted: number;
  };
}

export function emptyTotals(): ReuseTotals {
  return {
    requests: 0,
    islBlocks: 0,
    overlapBlocks: 0,
    bestOverlapBlocks: 0,
    chosenRatioSum: 0,
    bestRatioSum: 0,
    deliveredRequests: 0,
    deliveredPromptTokens: 0,
    deliveredCachedTokens: 0,
    deliveredPredictedTokens: 0,
    deliveredRatioSum: 0,
    deliveredPredictedRatioSum: 0,
  };
}

const ratio = (a: number, b: number) => (b > 0 ? a / b : NaN);

export function viewOf(t: ReuseTotals): ReuseView {
  return {
    requests: t.requests,
    predicted: { requestWeighted: ratio(t.chosenRatioSum, t.requests), blockWeighted: ratio(t.overlapBlocks, t.islBlocks) },
    available: { requestWeighted: ratio(t.bestRatioSum, t.requests), blockWeighted: ratio(t.bestOverlapBlocks, t.islBlocks) },
    delivered: {
      requests: t.deliveredRequests,
      requestWeighted: ratio(t.deliveredRatioSum, t.deliveredRequests),
      tokenWeighted: ratio(t.deliveredCachedTokens, t.deliveredPromptTokens),
      predictedTokenWeighted: ratio(t.deliveredPredictedTokens, t.deliveredPromptTokens),
    },
  };
}

/**
 * Cached tokens the router predicts the engine will report: the overlap in tokens, but never the last prompt token
 * (vLLM always computes at least one token), so a fully cached prompt of n tokens predicts floor((n-1)/bs)*bs.
 */
export function predictedCachedTokens(overlapBlocks: number, promptTokens: number, blockSize: number): number {
  if (promptTokens <= 0) return 0;
  return Math.min(overlapBlocks, Math.floor((promptTokens - 1) / blockSize)) * blockSize;
}

export class ReuseLedger {
  readonly total: ReuseTotals = emptyTotals();
  readonly bySource = new Map<string, ReuseTotals>();

  private of(source: string): ReuseTotals {
    let t = this.bySource.get(source);
    if (!t) {
      t = emptyTotals();
      this.bySource.set(source, t);
    }
    return t;
  }

  /** At routing time. An empty prompt has no hit ratio: it stays out of both views (as out of the histogram). */
  routed(source: string, islBlocks: number, overlapBlocks: number, bestOverlapBlocks: number): void {
    if (islBlocks <= 0) return;
    for (const t of [this.total, this.of(source)]) {
      t.requests++;
      t.islBlocks += islBlocks;
      t.overlapBlocks += overlapBlocks;
      t.bestOverlapBlocks += bestOverlapBlocks;
      t.chosenRatioSum += overlapBlocks / islBlocks;
      t.bestRatioSum += bestOverlapBlocks / islBlocks;
    }
  }

  /** Takes back a routing recorded by `routed` (an attempt that was retried elsewhere). */
  unrouted(source: string, islBlocks: number, overlapBlocks: number, bestOverlapBlocks: number): void {
    if (islBlocks <= 0) return;
    for (const t of [this.total, this.of(source)]) {
      t.requests--;
      t.islBlocks -= islBlocks;
      t.overlapBlocks -= overlapBlocks;
      t.bestOverlapBlocks -= bestOverlapBlocks;
      t.chosenRatioSum -= overlapBlocks / islBlocks;
      t.bestRatioSum -= bestOverlapBlocks / islBlocks;
    }
  }

  /** When the engine reported cached tokens for a finished request. */
  delivered(source: string, promptTokens: number, cachedTokens: number, predictedTokens: number): void {
    if (promptTokens <= 0) return;
    for (const t of [this.total, this.of(source)]) {
      t.deliveredRequests++;
      t.deliveredPromptTokens += promptTokens;
      t.deliveredCachedTokens += cachedTokens;
      t.deliveredPredictedTokens += predictedTokens;
      t.deliveredRatioSum += cachedTokens / promptTokens;
      t.deliveredPredictedRatioSum += predictedTokens / promptTokens;
    }
  }

  view(source?: string): ReuseView {
    return viewOf(source === undefined ? this.total : this.of(source));
  }
}
