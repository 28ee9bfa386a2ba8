/**
 * The oracle: an infinite cache shared by the whole fleet, prefix reuse only. It bounds what any router can reach
 * on a trace, whatever the fleet size.
 *
 * Definition (reproduces the figures published with the traces, data/traces/README.md, exactly: conversation
 * 0.366 / 0.384, synthetic 0.640 / 0.423): a request's reusable blocks are its leading hash ids that appeared in any earlier request (trace
 * order), counted in 512-token trace blocks, including a matching trailing partial block; its denominator is
 * len(hash_ids) = ceil(input_length / 512).
 *   block-weighted   = sum(reused) / sum(len(hash_ids))     (ratio of sums; what engine counters give)
 *   request-weighted = mean(reused / len(hash_ids))         (mean of ratios; what a histogram gives)
 * Variants that were checked and do NOT reproduce them: capping reuse at floor(input_length/512) full blocks
 * (0.3660 / 0.3821 on conversation), token-weighted min(reused*512, len)/len (0.3736 / 0.4094), dividing by full
 * blocks (0.3819 / 0.4794). On a recording (`kvroute serve --record`) the blocks are its router hashes at the
 * recorded block size and the denominator its full blocks. Any id reuse (not only the leading run) gives the same figures as prefix reuse on both
 * traces, because an id names its whole prefix.
 */
import type { TraceRequest } from './traces/format.ts';

export interface OracleResult {
  readonly requests: number;
  readonly islBlocks: number;
  readonly reusedBlocks: number;
  readonly blockWeighted: number;
  readonly requestWeighted: number;
}

/** Incremental oracle, so the simulator can feed requests as it replays them. */
export class Oracle {
  private readonly seen = new Set<number | bigint>();
  private requests = 0;
  private isl = 0;
  private reused = 0;
  private ratioSum = 0;

  /** Adds a request in trace order; returns its reusable leading blocks. */
  add(req: TraceRequest): number {
    // A recording's blocks are its router hashes at the recorded block size (full blocks only).
    const ids: ArrayLike<number | bigint> = req.blockHashes ?? req.hashIds;
    let k = 0;
    while (k < ids.length && this.seen.has(ids[k])) k++;
    for (let j = 0; j < ids.length; j++) this.seen.add(ids[j]);
    this.requests++;
    this.isl += ids.length;
    this.reused += k;
    if (ids.length > 0) this.ratioSum += k / ids.length;
    return k;
  }

  result(): OracleResult {
    return {
      requests: this.requests,
      islBlocks: this.isl,
      reusedBlocks: this.reused,
      blockWeighted: this.isl === 0 ? 0 : this.reused / this.isl,
      requestWeighted: this.requests === 0 ? 0 : this.ratioSum / this.requests,
    };
  }
}

export function computeOracle(requests: Iterable<TraceRequest>): OracleResult {
  const o = new Oracle();
  for (const r of requests) o.add(r);
  return o.result();
}
