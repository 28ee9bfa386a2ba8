/**
 * The built-in scorers: cost terms per candidate, lower is better (bs = block size, requestBlocks = n =
 * ceil(promptTokens / bs)). Each is its formula in a few lines; the formula text is what docs and /debug/state show.
 */
import type { Scorer, WeightedScorer } from './pipeline.ts';
import type { PolicyContext } from './policy.ts';

/** Dynamo's two terms for candidate i: blocks of prefill queued (after credit) and decode blocks after admission. */
export function kvTerms(ctx: PolicyContext, i: number): { prefill: number; decode: number } {
  return { prefill: prefillBlocks(ctx, i), decode: decodeBlocks(ctx, i) };
}

function prefillBlocks(ctx: PolicyContext, i: number): number {
  const c = ctx.candidates[i];
  const { overlapCredit, hostTierCredit, diskTierCredit, remoteTierCredit } = ctx.knobs;
  // Offload tiers (off by default): blocks loadable from host memory or disk save part of their prefill.
  const credited =
    c.overlapBlocks +
    (hostTierCredit ?? 0) * (c.hostTierBlocks ?? 0) +
    (diskTierCredit ?? 0) * (c.diskTierBlocks ?? 0) +
    (remoteTierCredit ?? 0) * (c.remoteTierBlocks ?? 0);
  return Math.max(c.activePrefillTokens / ctx.blockSize + ctx.requestBlocks - overlapCredit * credited, 0);
}

function decodeBlocks(ctx: PolicyContext, i: number): number {
  const c = ctx.candidates[i];
  return c.activeBlocks + ctx.requestBlocks - c.activePrefixBlocks;
}

export const PREFILL_LOAD: Scorer = {
  name: 'prefill-load',
  formula:
    'max(activePrefillTokens/bs + requestBlocks - overlapCredit * (overlap + hostTierCredit*hostTier + diskTierCredit*diskTier + remoteTierCredit*remoteTier), 0)',
  score: prefillBlocks,
};

export const DECODE_LOAD: Scorer = {
  name: 'decode-load',
  formula: 'activeBlocks + requestBlocks - activePrefix',
  score: decodeBlocks,
};

/**
 * A running request's KV blocks slow a worker's steps through memory traffic, barely, until memory runs short; what
 * delays a new request's first token is the prefill queued ahead of it plus its own uncached tokens. The plain cost
 * weighs an active decode block like a block of prefill, so the worker holding a conversation's prefix while still
 * decoding its previous turn looks expensive and the next turn goes cold elsewhere (conversation trace, 8 workers:
 * 78% of the oracle's hit; kv-pressure 91%, bench/RESULTS.md). Near full memory the weight is 1: Dynamo's cost.
 */
export function pressureDecode(minWeight: number): Scorer {
  return {
    name: 'pressure-decode',
    formula: `clamp(decode / capacityBlocks, ${minWeight === 1 / 64 ? '1/64' : minWeight}, 1) * decode (weight 1 when capacityBlocks is unknown), decode = activeBlocks + requestBlocks - activePrefix`,
    score: (ctx, i) => {
      const decode = decodeBlocks(ctx, i);
      const capacity = ctx.candidates[i].capacityBlocks;
      const pressure = capacity ? Math.min(1, Math.max(minWeight, decode / capacity)) : 1;
      return pressure * decode;
    },
  };
}

function loadOf(ctx: PolicyContext, i: number): number {
  const c = ctx.candidates[i];
  return c.activePrefillTokens / ctx.blockSize + c.activeBlocks;
}

export const LOAD: Scorer = { name: 'load', formula: 'activePrefillTokens/bs + activeBlocks', score: loadOf };

export const PREFILL_WEIGHT: WeightedScorer = { scorer: PREFILL_LOAD, weight: (k) => k.prefillLoadScale, weightName: 'prefillLoadScale' };

/** The P/D decode leg's cost: decode load and KV memory, with the decode worker's own cache credited when reused. */
function decodeLeg(ctx: PolicyContext, i: number): number {
  const c = ctx.candidates[i];
  const credit = ctx.knobs.decodeOverlapCredit ?? 0;
  return c.activePrefillTokens / ctx.blockSize + c.activeBlocks + ctx.requestBlocks - c.activePrefixBlocks - credit * c.overlapBlocks;
}

export const DECODE_LEG: Scorer = {
  name: 'decode-leg',
  formula: 'activePrefillTokens/bs + activeBlocks + requestBlocks - activePrefix - decodeOverlapCredit * overlap',
  score: decodeLeg,
};

/** Dynamo's cost for candidate i: prefillLoadScale * prefill-load + decode-load. */
export function kvCost(ctx: PolicyContext, i: number): number {
  const t = kvTerms(ctx, i);
  return ctx.knobs.prefillLoadScale * t.prefill + t.decode;
}
