import type { Rng } from '../../rng.ts';

/** Scores this close are equal (float sums of weighted terms). */
export const MAX_SCORE_EPS = 1e-12;

/** Max-score order: highest first, exact ties in a uniformly random order (shuffle, then stable sort). */
export function orderByScore(scores: readonly number[], rng: Rng): number[] {
  const jitter = scores.map(() => rng());
  const order = scores.map((_, i) => i);
  order.sort((a, b) => (Math.abs(scores[b] - scores[a]) > MAX_SCORE_EPS ? scores[b] - scores[a] : jitter[a] - jitter[b]));
  return order;
}
