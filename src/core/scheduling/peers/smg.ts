/**
 * SGLang Model Gateway `cache_aware` (the CLI default), two versions (smg-project/smg model_gateway/src/policies/
 * cache_aware.rs; CLI defaults from src/main.rs: cache_threshold 0.3, balance_abs 64, balance_rel 1.5):
 *
 * `smg` (@f8daa883, since e19055424 of 2026-08-16, uniform ties since 352f77e19):
 *   L = in-flight requests this gateway sent; rate = matched prefix / prompt in its approximate tree
 *   rate > 0.3 -> best = least-loaded worker among those holding the matched prefix (uniform among ties)
 *   else       -> best = argmin (L, requests processed, index)
 *   spill: L_best > 1.5 * mean L and L_best > mean L + 64 -> argmin (L, processed, index)
 * `smg-legacy` (the rule before 2026-08-16; vllm-project/router src/policies/cache_aware.rs @16917f49 still has it):
 *   (max L - min L) > 64 and max L > 1.5 * min L -> argmin L; else rate > 0.3 -> the matched prefix's most recent
 *   holder; else argmin L.
 * Both insert the request's prefix for the chosen worker. Simplifications: the tree is kept in router blocks (the
 * gateway's is per character over HTTP, per token over gRPC: a match is rounded down to whole blocks), and its
 * 120 s LRU eviction to 2^26 characters is not modelled (the league's traces stay far below it).
 */
import type { Policy, PolicyContext, Ranking } from '../policy.ts';
import { argminUniform, OwnIndex, withFirst } from './own-index.ts';

export const SMG = { cacheThreshold: 0.3, balanceAbs: 64, balanceRel: 1.5 } as const;

abstract class SmgBase implements Policy {
  abstract readonly name: string;
  readonly overlay = false;
  protected readonly tree = new OwnIndex({ group: 1 });
  protected readonly processed = new Map<string, number>();

  /** Matched blocks per candidate and the match rate of the best. */
  protected match(ctx: PolicyContext): { matched: number[]; best: number; rate: number } {
    const matched = ctx.candidates.map((c) => this.tree.match(c.key, ctx.seqHashes));
    const best = Math.max(0, ...matched);
    return { matched, best, rate: ctx.promptTokens > 0 ? (best * ctx.blockSize) / ctx.promptTokens : 0 };
  }

  /** argmin over (in-flight requests, processed count, index): deterministic, as the gateway's min_idx. */
  protected minIdx(ctx: PolicyContext): number {
    let pick = 0;
    const key = (i: number) => [ctx.candidates[i].activeRequests, this.processed.get(ctx.candidates[i].key) ?? 0, i];
    for (let i = 1; i < ctx.candidates.length; i++) {
      const a = key(i);
      const b = key(pick);
      if (a[0] < b[0] || (a[0] === b[0] && (a[1] < b[1] || (a[1] === b[1] && a[2] < b[2])))) pick = i;
    }
    return pick;
  }

  abstract pick(ctx: PolicyContext): number;

  rank(ctx: PolicyContext): Ranking {
    const first = this.pick(ctx);
    const order = withFirst(ctx.candidates.length, first, (i) => ctx.candidates[i].activeRequests);
    return { order, costs: ctx.candidates.map((c) => c.activeRequests) };
  }

  routed(ctx: PolicyContext, chosen: number): void {
    const key = ctx.candidates[chosen].key;
    this.tree.record(key, ctx.seqHashes, ctx.now ?? 0);
    this.processed.set(key, (this.processed.get(key) ?? 0) + 1);
  }
}

export class SmgPolicy extends SmgBase {
  readonly name = 'smg';

  pick(ctx: PolicyContext): number {
    const n = ctx.candidates.length;
    const L = (i: number) => ctx.candidates[i].activeRequests;
    const { matched, best, rate } = this.match(ctx);
    let pick: number;
    if (best > 0 && rate > SMG.cacheThreshold) {
      const holders = [...Array(n).keys()].filter((i) => matched[i] === best);
      pick = argminUniform(n, L, ctx.rng, holders);
    } else pick = this.minIdx(ctx);
    let sum = 0;
    for (let i = 0; i < n; i++) sum += L(i);
    const avg = sum / n;
    if (L(pick) > SMG.balanceRel * avg && L(pick) > avg + SMG.balanceAbs) pick = this.minIdx(ctx);
    return pick;
  }
}

export class SmgLegacyPolicy extends SmgBase {
  readonly name = 'smg-legacy';
  /** Most recent holder of each block (the tenant a legacy tree match returns). */
  private readonly lastHolder = new Map<bigint, number>();

  pick(ctx: PolicyContext): number {
    const loads = ctx.candidates.map((c) => c.activeRequests);
    const max = Math.max(...loads);
    const min = Math.min(...loads);
    if (max - min > SMG.balanceAbs && max > SMG.balanceRel * min) return this.minIdx(ctx);
    const { matched, best, rate } = this.match(ctx);
    if (best > 0 && rate > SMG.cacheThreshold) {
      const holders = [...ctx.candidates.keys()].filter((i) => matched[i] === best);
      const key = ctx.seqHashes[best - 1];
      const recent = this.lastHolder.get(key);
      const hit = holders.find((i) => ctx.candidates[i].source === recent);
      return hit ?? holders[0];
    }
    return this.minIdx(ctx);
  }

  override routed(ctx: PolicyContext, chosen: number): void {
    super.routed(ctx, chosen);
    for (const h of ctx.seqHashes) this.lastHolder.set(h, ctx.candidates[chosen].source);
  }
}
