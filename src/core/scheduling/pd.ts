/**
 * The two legs of a disaggregated (prefill/decode) decision, each a pipeline run on its own pool with its own policy:
 *
 *   pd-prefill  the prefill pool chases the cache: prefillLoadScale * prefill-load, banded-min picker
 *               prefill-load = max(activePrefillTokens/bs + n - overlapCredit * overlap, 0), overlap raised by the
 *               predicted overlay (siblings in flight on a prefill worker are credited before its Stored events).
 *               No decode term: a prefill worker holds a request's blocks only until the decode side pulls them.
 *   pd-decode   the decode pool balances decode load and KV memory:
 *               decode-leg = activePrefillTokens/bs + activeBlocks + n - activePrefix - decodeOverlapCredit * overlap
 *               (blocks queued for prefill on the worker, plus its KV blocks in use after admission), min-cost picker
 *               (ties: fewest cached blocks, then seeded random). decodeOverlapCredit is 0 unless decode workers'
 *               caches are reused (conditional disaggregation serves short increments from them; vLLM's decode side
 *               pulls only the blocks it does not hold).
 */
import { bandedMin, MIN_COST, PREFILL_LOAD } from './policies.ts';
import { ComposedPolicy, type Scorer, unitWeight, type WeightedScorer } from './pipeline.ts';
import type { PolicyContext } from './policy.ts';

export const PD_PREFILL_POLICY = 'pd-prefill';
export const PD_DECODE_POLICY = 'pd-decode';
export const PD_POLICY_NAMES = [PD_PREFILL_POLICY, PD_DECODE_POLICY] as const;

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

export function createPdPolicy(name: string): ComposedPolicy | undefined {
  // Built on demand: policies.ts imports this module, so its exports are not initialised at this module's evaluation.
  if (name === PD_PREFILL_POLICY) {
    const prefillWeight: WeightedScorer = { scorer: PREFILL_LOAD, weight: (k) => k.prefillLoadScale, weightName: 'prefillLoadScale' };
    return new ComposedPolicy(PD_PREFILL_POLICY, [prefillWeight], bandedMin(1));
  }
  if (name === PD_DECODE_POLICY) return new ComposedPolicy(PD_DECODE_POLICY, [unitWeight(DECODE_LEG)], MIN_COST);
  return undefined;
}
