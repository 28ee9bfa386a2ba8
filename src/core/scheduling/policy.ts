/**
 * Routing policies are plug-ins: given the eligible candidates and the request, rank them best first.
 * The first is the pick; the rest are the order for retries. Selected by name in configuration.
 */
import type { KvKnobs } from '../types.ts';
import type { Rng } from '../rng.ts';

/** One eligible source as a policy sees it. */
export interface Candidate {
  readonly source: number;
  readonly key: string;
  /** Leading request blocks this source holds (max of event index and overlay). */
  readonly overlapBlocks: number;
  /** Blocks right after the overlap that the source holds in host memory / on disk (offload tiers). */
  readonly hostTierBlocks?: number;
  readonly diskTierBlocks?: number;
  /** Blocks right after the overlap held on shared (REMOTE) storage. */
  readonly remoteTierBlocks?: number;
  /** The source's KV capacity in blocks (engine num_gpu_blocks), when known. */
  readonly capacityBlocks?: number;
  /** All blocks the source holds (tie-breaker: fewer means more room). */
  readonly cachedBlocks: number;
  readonly activePrefillTokens: number;
  readonly activeBlocks: number;
  /** Leading request blocks already active on the source (shared with in-flight requests). */
  readonly activePrefixBlocks: number;
  readonly activeRequests: number;
  /** Trailing partial blocks among `activeBlocks` (one per in-flight request whose prompt ends mid-block). */
  readonly activePartialBlocks?: number;
  /** The engine's gauges as last scraped (stale between scrapes); absent when nothing scrapes them. */
  readonly scraped?: { readonly waiting: number; readonly kvUsage: number };
}

export interface PolicyContext {
  readonly candidates: readonly Candidate[];
  readonly promptTokens: number;
  /** ceil(promptTokens / blockSize). */
  readonly requestBlocks: number;
  readonly blockSize: number;
  readonly seqHashes: BigUint64Array;
  readonly knobs: KvKnobs;
  readonly rng: Rng;
  /** The routing clock, ms (policies with TTLs or request-rate windows). */
  readonly now?: number;
}

export interface Ranking {
  /** Candidate indices, best first. */
  readonly order: number[];
  /** Cost per candidate index (lower is better); NaN where the policy does not score. */
  readonly costs: number[];
}

export interface Policy {
  readonly name: string;
  /**
   * Among sources that hold no prefix of the request, this policy prefers the less loaded (kv, kv-pressure,
   * least-loaded): selection over a large fleet may then evaluate only the least loaded of them.
   */
  readonly loadOrdered?: boolean;
  /** false: the candidates' overlap comes from the event index alone, without the predicted overlay. */
  readonly overlay?: boolean;
  /** The policy reads engine gauges (Candidate.scraped), scraped at this interval, ms (the simulator honours it). */
  readonly scrapeIntervalMs?: number;
  rank(ctx: PolicyContext): Ranking;
  /** Called with the candidate actually chosen (after affinity): policies with their own approximate index learn here. */
  routed?(ctx: PolicyContext, chosen: number): void;
  /** The policy's stages and formula (composed policies: pipeline.ts); shown by /debug/state and the docs table. */
  describe?(): PolicyDescription;
}

export interface PolicyDescription {
  readonly name: string;
  readonly cost: string;
  readonly scorers: ReadonlyArray<{ readonly name: string; readonly weight: string; readonly formula: string }>;
  readonly picker: { readonly name: string; readonly formula: string };
}

/** One policy in the registry (registry.ts): a name, a one-line summary and a factory. */
export interface PolicyEntry {
  readonly name: string;
  readonly summary: string;
  /** The policy of one leg of a disaggregated request, chosen by the Dispatcher, not by requests or settings. */
  readonly leg?: 'prefill' | 'decode';
  /** A new instance (a policy may keep state between requests, e.g. round-robin's turn: one per router). */
  create(): Policy;
}

/**
 * Indices sorted by cost, ties broken by `tie` then by a seeded shuffle key (one draw per index, in index order).
 *
 * The comparison (cost, then tie, then the draw) is a total preorder unless a cost or a tie is NaN, so every stable
 * sort orders it the same way: a merge sort with the comparison written inline (no comparator calls, `tie` read once
 * per index) gives Array#sort's order at about half its time for a fleet's 64 candidates. With a NaN, whose comparisons
 * are not transitive, the order is Array#sort's own.
 */
export function orderByCost(costs: readonly number[], rng: Rng, tie?: (i: number) => number): number[] {
  const n = costs.length;
  const jitter: number[] = [];
  const ties: number[] = [];
  let order: number[] = [];
  let nan = false;
  for (let i = 0; i < n; i++) {
    jitter.push(rng());
    order.push(i);
    const t = tie ? tie(i) : 0;
    ties.push(t);
    if (Number.isNaN(costs[i]) || Number.isNaN(t)) nan = true;
  }
  if (nan) {
    order.sort((a, b) => costs[a] - costs[b] || ties[a] - ties[b] || jitter[a] - jitter[b]);
    return order;
  }
  // Bottom-up merge sort; the left run wins unless its head compares greater (stable).
  let next: number[] = order.slice();
  for (let width = 1; width < n; width *= 2) {
    for (let lo = 0; lo < n; lo += 2 * width) {
      const mid = Math.min(lo + width, n);
      const hi = Math.min(lo + 2 * width, n);
      let i = lo;
      let j = mid;
      let k = lo;
      while (i < mid && j < hi) {
        const a = order[i];
        const b = order[j];
        if ((costs[a] - costs[b] || ties[a] - ties[b] || jitter[a] - jitter[b]) > 0) {
          next[k++] = b;
          j++;
        } else {
          next[k++] = a;
          i++;
        }
      }
      while (i < mid) next[k++] = order[i++];
      while (j < hi) next[k++] = order[j++];
    }
    const done = next;
    next = order;
    order = done;
  }
  return order;
}
