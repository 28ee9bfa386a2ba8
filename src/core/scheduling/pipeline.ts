/**
 * Routing as a pipeline of small named stages (llm-d's filter -> score -> pick; Dynamo's eligibility apart from scoring):
 *
 *   filters   which sources may take the request at all (filters.ts: worker-level pin, model, role, health, breaker,
 *             subset in the Dispatcher; source-level allow, exclude, busy in KvRouter.route)
 *   facts     what filters and scorers read of each candidate: overlap, tiers, load, capacity (facts.ts)
 *   scorers   cost terms per candidate, each weighted; the policy's cost is their weighted sum (lower is better)
 *   picker    orders the candidates from their costs (first = the pick, the rest = the order for retries)
 *
 * A policy is a named composition of scorers (scorers.ts) and a picker (pickers.ts), registered by name in registry.ts.
 * Plug-ins may still implement `Policy.rank` directly.
 */
import type { KvKnobs } from '../types.ts';
import type { Policy, PolicyContext, PolicyDescription, Ranking } from './policy.ts';

export type { PolicyDescription } from './policy.ts';

/** One cost term per candidate; lower is better. */
export interface Scorer {
  readonly name: string;
  /** The formula, as docs and /debug/state show it. */
  readonly formula: string;
  score(ctx: PolicyContext, i: number): number;
}

/** Orders candidates best first from their total costs (NaN costs: the picker does not use them). */
export interface Picker {
  readonly name: string;
  readonly formula: string;
  /** With load-monotone scorers, the picker's best cold candidate is among the least loaded (sampled selection). */
  readonly loadOrdered?: boolean;
  pick(ctx: PolicyContext, costs: readonly number[]): number[];
}

export interface WeightedScorer {
  readonly scorer: Scorer;
  /** Weight of this term for a request (knobs may be overridden per request). */
  weight(knobs: KvKnobs): number;
  /** The weight's name in formulas (`prefillLoadScale`, `1`). */
  readonly weightName: string;
}

/** cost(w) = Σ weight_k · scorer_k(w); then the picker orders. No scorers: every cost is NaN. */
export class ComposedPolicy implements Policy {
  readonly loadOrdered: boolean;

  constructor(
    readonly name: string,
    readonly scorers: readonly WeightedScorer[],
    readonly picker: Picker,
  ) {
    this.loadOrdered = this.scorers.length > 0 && (picker.loadOrdered ?? false);
  }

  rank(ctx: PolicyContext): Ranking {
    const n = ctx.candidates.length;
    const costs: number[] = new Array(n);
    if (this.scorers.length === 0) costs.fill(NaN);
    else {
      const weights = this.scorers.map((s) => s.weight(ctx.knobs));
      for (let i = 0; i < n; i++) {
        let cost = 0;
        for (let k = 0; k < this.scorers.length; k++) cost += weights[k] * this.scorers[k].scorer.score(ctx, i);
        costs[i] = cost;
      }
    }
    return { order: this.picker.pick(ctx, costs), costs };
  }

  describe(): PolicyDescription {
    return {
      name: this.name,
      cost: this.scorers.length === 0 ? '(none)' : this.scorers.map((s) => `${s.weightName} * ${s.scorer.name}`).join(' + '),
      scorers: this.scorers.map((s) => ({ name: s.scorer.name, weight: s.weightName, formula: s.scorer.formula })),
      picker: { name: this.picker.name, formula: this.picker.formula },
    };
  }
}

export const unitWeight = (scorer: Scorer): WeightedScorer => ({ scorer, weight: () => 1, weightName: '1' });
