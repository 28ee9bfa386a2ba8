import { describe, expect, it } from 'vitest';
import { createRng } from '../../src/core/rng.ts';
import { orderByCost } from '../../src/core/scheduling/policy.ts';

/** The order before the inline merge sort: Array#sort with the comparator calling `tie` per comparison. */
function reference(costs: readonly number[], rng: () => number, tie?: (i: number) => number): number[] {
  const jitter = costs.map(() => rng());
  const order = costs.map((_, i) => i);
  order.sort((a, b) => costs[a] - costs[b] || (tie ? tie(a) - tie(b) : 0) || jitter[a] - jitter[b]);
  return order;
}

describe('orderByCost', () => {
  it('orders as Array#sort did, with ties, infinities and equal tie keys, and leaves the rng at the same draw', () => {
    const gen = createRng(7);
    for (let trial = 0; trial < 2_000; trial++) {
      const n = 1 + Math.floor(gen() * 80);
      // Few distinct values, so costs and tie keys collide often.
      const costs = Array.from({ length: n }, () => {
        const r = gen();
        return r < 0.05 ? Infinity : r < 0.08 ? -Infinity : Math.floor(gen() * 6) + (gen() < 0.5 ? 0 : 0.5);
      });
      const keys = Array.from({ length: n }, () => Math.floor(gen() * 3));
      const tie = trial % 3 === 0 ? undefined : (i: number) => keys[i];
      const a = createRng(trial);
      const b = createRng(trial);
      expect(orderByCost(costs, a, tie)).toEqual(reference(costs, b, tie));
      expect(a()).toBe(b());
    }
  });

  it('with NaN costs (a policy without scorers) orders by tie, then the seeded draw, as before', () => {
    const costs = [NaN, NaN, NaN, NaN, NaN];
    const tie = (i: number) => [3, 1, 3, 0, 1][i];
    expect(orderByCost(costs, createRng(5), tie)).toEqual(reference(costs, createRng(5), tie));
    const mixed = [2, NaN, 1, NaN, 0, 2];
    expect(orderByCost(mixed, createRng(9))).toEqual(reference(mixed, createRng(9)));
  });
});
