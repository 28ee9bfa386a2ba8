/**
 * AIBrix `prefix-cache` (vllm-project/aibrix pkg/plugins/gateway/algorithms/prefix_cache.go,
 * pkg/utils/prefixcacheindexer/hash.go @e3e10f9e):
 *   R = running requests per pod counted by this gateway
 *   candidates = the pods with the fewest R if max R - min R > 8, else every ready pod
 *   match%_p = leading prefix blocks the gateway sent p / the request's blocks, over the candidates
 *   with matches: shuffle, sort by (match% desc, R asc), take the first with R <= mean(R) + 1 std(R) (over all pods)
 *   otherwise (no match, or none within the bound): fewest R, uniform among ties
 *   after routing the chosen pod's blocks are recorded; blocks unused for 20 min expire.
 * Simplification: AIBrix hashes 4-byte blocks of the prompt text; here router blocks of token ids.
 */
import type { Policy, PolicyContext, Ranking } from '../policy.ts';
import { argminUniform, OwnIndex, withFirst } from './own-index.ts';

export const AIBRIX = { imbalanceAbs: 8, ttlMs: 20 * 60_000, tableBlocks: 200_000 } as const;

export class AibrixPolicy implements Policy {
  readonly name = 'aibrix';
  readonly overlay = false;
  private readonly table = new OwnIndex({ group: 1, ttlMs: AIBRIX.ttlMs, capacity: AIBRIX.tableBlocks });

  rank(ctx: PolicyContext): Ranking {
    const n = ctx.candidates.length;
    const R = ctx.candidates.map((c) => c.activeRequests);
    const min = Math.min(...R);
    const max = Math.max(...R);
    const all = [...Array(n).keys()];
    const cand = max - min > AIBRIX.imbalanceAbs ? all.filter((i) => R[i] === min) : all;
    const now = ctx.now ?? 0;
    const blocks = ctx.seqHashes.length;
    const pct = ctx.candidates.map((c) => (blocks > 0 ? this.table.match(c.key, ctx.seqHashes, now) / blocks : 0));
    const mean = R.reduce((a, b) => a + b, 0) / n;
    const std = Math.sqrt(R.reduce((a, r) => a + (r - mean) ** 2, 0) / n);
    const jitter = all.map(() => ctx.rng());
    const matched = cand.filter((i) => pct[i] > 0).sort((a, b) => pct[b] - pct[a] || R[a] - R[b] || jitter[a] - jitter[b]);
    let pick = matched.find((i) => R[i] <= mean + std) ?? -1;
    if (pick < 0) pick = argminUniform(n, (i) => R[i], ctx.rng, cand);
    return { order: withFirst(n, pick, (i) => R[i]), costs: R.slice() };
  }

  routed(ctx: PolicyContext, chosen: number): void {
    this.table.record(ctx.candidates[chosen].key, ctx.seqHashes, ctx.now ?? 0);
  }
}
