/**
 * Routing policies prototyped in the simulator before they move to src/core/scheduling (owned by the core).
 *
 * kv-pressure: NVIDIA Dynamo's cost with the decode term weighted by KV-memory pressure.
 *
 *   prefill(w)  = max(activePrefillTokens(w)/bs + requestBlocks - overlap(w), 0)        (as kv)
 *   decode(w)   = activeBlocks(w) + requestBlocks - activePrefix(w)                     (as kv)
 *   pressure(w) = clamp(decode(w) / capacityBlocks(w), minWeight, 1)
 *   cost(w)     = prefill(w) + pressure(w) * decode(w)
 *   near-ties (cost within `tieMarginBlocks` of the best) -> fewest cached blocks -> seeded random
 *
 * Why: in a paged engine a running request's KV blocks cost decode time only through memory traffic, and a step's
 * decode time barely depends on which worker holds them until memory runs short; what delays a new request's first
 * token is the prefill queued ahead of it plus its own uncached tokens. The plain cost weighs one active decode block
 * like one block of prefill, so a worker that holds a conversation's prefix but is still decoding its previous turn
 * looks expensive and the next turn goes cold elsewhere (conversation trace, 8 workers: 78% of the oracle). Weighting
 * decode by the fraction of KV memory it would occupy keeps the kv cost where memory is tight (pressure -> 1 is
 * Dynamo's cost) and lets prefix reuse and prefill balance decide when it is not.
 *
 * The near-tie margin (1 block): with the decode term nearly gone, a one-block overlap (the system prompt that every
 * worker caches after its first request) is enough to beat an idle worker forever, so idle workers never warm up
 * (conversation trace, 32 workers: several workers got no request at all, prefill imbalance 1.81). Treating costs
 * within one block of the best as equal and preferring the emptiest cache among them fixes that (imbalance 1.04)
 * without giving up real prefix reuse.
 */
import { orderByCost, type Policy, type PolicyContext, type Ranking } from '../core/scheduling/policy.ts';

export class KvPressurePolicy implements Policy {
  readonly name = 'kv-pressure';

  constructor(
    /** KV capacity per source in blocks (engine num_gpu_blocks). */
    readonly capacityBlocks: number,
    /** Floor of the decode weight: active blocks never count for less than this fraction of a prefill block. */
    readonly minWeight = 1 / 64,
    /** Costs within this many blocks of the best are treated as ties. */
    readonly tieMarginBlocks = 1,
  ) {
    if (!(capacityBlocks > 0)) throw new RangeError(`capacity must be positive, got ${capacityBlocks}`);
  }

  cost(ctx: PolicyContext, i: number): number {
    const c = ctx.candidates[i];
    const prefill = Math.max(c.activePrefillTokens / ctx.blockSize + ctx.requestBlocks - ctx.knobs.overlapCredit * c.overlapBlocks, 0);
    const decode = c.activeBlocks + ctx.requestBlocks - c.activePrefixBlocks;
    const pressure = Math.min(1, Math.max(this.minWeight, decode / this.capacityBlocks));
    return ctx.knobs.prefillLoadScale * prefill + pressure * decode;
  }

  rank(ctx: PolicyContext): Ranking {
    const costs = ctx.candidates.map((_, i) => this.cost(ctx, i));
    let min = Infinity;
    for (const c of costs) if (c < min) min = c;
    const banded = costs.map((c) => (c <= min + this.tieMarginBlocks ? min : c));
    return { order: orderByCost(banded, ctx.rng, (i) => ctx.candidates[i].cachedBlocks), costs };
  }
}

/** Prototype policies by name; each runs under the router's `kv` slot (see installPolicy in fleet.ts). */
export const SIM_POLICY_NAMES = ['kv-pressure'] as const;

export function createSimPolicy(name: string, capacityBlocks: number): Policy | undefined {
  if (name === 'kv-pressure') return new KvPressurePolicy(capacityBlocks);
  return undefined;
}
