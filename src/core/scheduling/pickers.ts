/**
 * The built-in pickers: each orders the candidates best first from their costs (the first is the pick, the rest the
 * order for retries).
 */
import type { Picker } from './pipeline.ts';
import { orderByCost } from './policy.ts';

/** Softmax over min-max normalised costs; uniform when all costs are equal. */
export function sampleSoftmax(costs: readonly number[], temperature: number, rng: () => number): number {
  let min = Infinity;
  let max = -Infinity;
  for (const c of costs) {
    if (c < min) min = c;
    if (c > max) max = c;
  }
  const range = max - min;
  const weights = costs.map((c) => (range === 0 ? 1 : Math.exp(-(c - min) / (range * temperature))));
  const total = weights.reduce((a, b) => a + b, 0);
  let r = rng() * total;
  for (let i = 0; i < weights.length; i++) {
    r -= weights[i];
    if (r < 0) return i;
  }
  return weights.length - 1;
}

export const MIN_COST: Picker = {
  name: 'min-cost',
  loadOrdered: true,
  formula:
    'ascending cost; ties: fewest cached blocks, then seeded random; temperature T > 0: first ~ exp(-(c - c_min) / ((c_max - c_min) T))',
  pick(ctx, costs) {
    const order = orderByCost(costs, ctx.rng, (i) => ctx.candidates[i].cachedBlocks);
    const T = ctx.knobs.temperature;
    if (T > 0 && order.length > 1) {
      const first = sampleSoftmax(costs, T, ctx.rng);
      order.splice(order.indexOf(first), 1);
      order.unshift(first);
    }
    return order;
  },
};

/**
 * Costs within `margin` blocks of the best are ties: a one-block edge (the system prompt every worker caches) must not
 * beat an idle worker forever, or idle workers never warm up (32 workers: imbalance 1.81 -> 1.04). Among ties, more
 * overlap beyond the margin wins (a sibling of an in-flight request joins it rather than recomputing its prefix
 * elsewhere), then the emptiest cache, then a seeded random choice.
 */
export function bandedMin(margin: number): Picker {
  return {
    name: 'banded-min',
    loadOrdered: true,
    formula: `costs within ${margin} block(s) of the best are ties; ties: more overlap beyond ${margin} block(s), fewest cached blocks, seeded random`,
    pick(ctx, costs) {
      let min = Infinity;
      for (const x of costs) if (x < min) min = x;
      const banded = costs.map((x) => (x <= min + margin ? min : x));
      // Lexicographic tie key: overlap beyond the margin (descending), then cached blocks (ascending). An argument, not
      // a named closure: tsx (esbuild's keepNames) would rename a named one on every call.
      return orderByCost(
        banded,
        ctx.rng,
        (i) => -Math.max(0, ctx.candidates[i].overlapBlocks - margin) * 2 ** 32 + ctx.candidates[i].cachedBlocks,
      );
    },
  };
}

export const LOWEST: Picker = {
  name: 'lowest',
  loadOrdered: true,
  formula: 'ascending cost; ties seeded random',
  pick: (ctx, costs) => orderByCost(costs, ctx.rng),
};

export const RANDOM: Picker = {
  name: 'random',
  formula: 'uniform, seeded',
  pick: (ctx) =>
    orderByCost(
      ctx.candidates.map(() => 0),
      ctx.rng,
    ),
};

/** Round-robin keeps its turn between requests: one picker object per policy instance. */
export function roundRobin(): Picker {
  let next = 0;
  return {
    name: 'round-robin',
    formula: 'next source (by source number) after the last pick',
    pick(ctx) {
      const n = ctx.candidates.length;
      // Order by source number so the rotation is stable when candidates come and go.
      const bySource = ctx.candidates.map((_, i) => i).sort((a, b) => ctx.candidates[a].source - ctx.candidates[b].source);
      let start = bySource.findIndex((i) => ctx.candidates[i].source >= next);
      if (start < 0) start = 0;
      const order = Array.from({ length: n }, (_, k) => bySource[(start + k) % n]);
      next = ctx.candidates[order[0]].source + 1;
      return order;
    },
  };
}

/** lowbias32 (not rng.ts's splitmix32 finaliser: prefix-hash picks depend on these constants). */
function lowbias32(x: number): number {
  x = Math.imul(x ^ (x >>> 16), 0x7feb352d);
  x = Math.imul(x ^ (x >>> 15), 0x846ca68b);
  return (x ^ (x >>> 16)) >>> 0;
}

function stringHash(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

/** `costs` are the candidates' loads (the `load` scorer). */
export function rendezvous(prefixBlocks: number, epsilon: number): Picker {
  return {
    name: 'rendezvous',
    formula: `rendezvous hash of the first ${prefixBlocks} blocks picks a home; skip homes with load > (1 + ${epsilon}) * mean load + requestBlocks`,
    pick(ctx, loads) {
      const n = ctx.seqHashes.length;
      // The seq hash of block K-1 names the whole first-K-block prefix. Prompts shorter than one block hash by length.
      const key = n === 0 ? ctx.promptTokens : Number(ctx.seqHashes[Math.min(prefixBlocks, n) - 1] & 0xffffffffn);
      const scores = ctx.candidates.map((c) => lowbias32(key ^ stringHash(c.key)));
      const order = ctx.candidates.map((_, i) => i).sort((a, b) => scores[b] - scores[a]);
      let sum = 0;
      for (const l of loads) sum += l;
      const mean = sum / Math.max(1, loads.length);
      const bound = (1 + epsilon) * mean + ctx.requestBlocks;
      const within = order.filter((i) => loads[i] <= bound);
      const beyond = order.filter((i) => loads[i] > bound);
      return [...within, ...beyond];
    },
  };
}
