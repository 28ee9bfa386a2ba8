/**
 * `dynamo`: NVIDIA Dynamo's KV router as its defaults ship (ai-dynamo/dynamo lib/kv-router/src/scheduling/selector/
 * default.rs, selector/mod.rs, scheduling/config.rs @07a6c9ce), strictly:
 *
 *   cost = max(0, (P + isl)/bs - overlap) + (activeCompleteBlocks + newCompleteBlocks)
 *
 * L = overlap credit = 1, active-request weight 0, temperature 0; `isl/bs` unrounded; the trailing partial block is
 * never counted (kvroute's `kv` counts it once per request); exact ties uniformly at random (PR #9516; `kv` prefers the
 * emptiest cache); overlap from KV events only (no predicted overlay: `--router-predicted-ttl-secs` is off by default);
 * no tier credits (the simulator has no tiers). P = prefill tokens routed to the source and not yet past their first
 * token, as Dynamo's slot tracker counts them.
 */
import { orderByCost, type Policy, type PolicyContext, type Ranking } from '../policy.ts';

export function dynamoCost(ctx: PolicyContext, i: number): number {
  const c = ctx.candidates[i];
  const bs = ctx.blockSize;
  const complete = Math.floor(ctx.promptTokens / bs);
  const prefill = Math.max(0, (c.activePrefillTokens + ctx.promptTokens) / bs - c.overlapBlocks);
  const activeComplete = c.activeBlocks - (c.activePartialBlocks ?? 0);
  const fresh = complete - Math.min(c.activePrefixBlocks, complete);
  return prefill + activeComplete + fresh;
}

export const DYNAMO: Policy = {
  name: 'dynamo',
  overlay: false,
  rank(ctx: PolicyContext): Ranking {
    const costs = ctx.candidates.map((_, i) => dynamoCost(ctx, i));
    return { order: orderByCost(costs, ctx.rng), costs };
  },
};
