/**
 * The built-in policies. Each is a few lines around its formula.
 *
 * kv (default)   cost(w) = prefillLoadScale * prefill(w) + decode(w)                     (NVIDIA Dynamo's cost)
 *                prefill(w) = max(activePrefillTokens(w)/bs + requestBlocks - overlapCredit * credited(w), 0)
 *                credited(w) = overlap(w) + hostTierCredit * hostTier(w) + diskTierCredit * diskTier(w)
 *                (tier credits 0 by default: offload tiers count only when enabled)
 *                decode(w)  = activeBlocks(w) + requestBlocks - activePrefix(w)
 *                temperature 0: min cost, ties -> fewest cached blocks -> seeded random;
 *                T > 0: sample p_i ∝ exp(-(c_i - c_min) / ((c_max - c_min) * T)).
 * round-robin    next source in turn.
 * random         uniform, seeded.
 * least-loaded   min activePrefillTokens/bs + activeBlocks; ties seeded random.
 * prefix-hash    rendezvous hash of the request's first K blocks (its prefix identity) picks a home source;
 *                bounded load: a home whose load exceeds (1 + epsilon) x mean load is skipped for the next in order.
 */
import { orderByCost, type Policy, type PolicyContext, type Ranking } from './policy.ts';

export function kvCost(ctx: PolicyContext, i: number): number {
  const c = ctx.candidates[i];
  const { prefillLoadScale, overlapCredit, hostTierCredit, diskTierCredit } = ctx.knobs;
  const bs = ctx.blockSize;
  // Offload tiers (off by default): blocks loadable from host memory or disk save part of their prefill.
  const credited =
    c.overlapBlocks + (hostTierCredit ?? 0) * (c.hostTierBlocks ?? 0) + (diskTierCredit ?? 0) * (c.diskTierBlocks ?? 0);
  const prefill = Math.max(c.activePrefillTokens / bs + ctx.requestBlocks - overlapCredit * credited, 0);
  const decode = c.activeBlocks + (ctx.requestBlocks - c.activePrefixBlocks);
  return prefillLoadScale * prefill + decode;
}

export class KvPolicy implements Policy {
  readonly name = 'kv';

  rank(ctx: PolicyContext): Ranking {
    const costs = ctx.candidates.map((_, i) => kvCost(ctx, i));
    const order = orderByCost(costs, ctx.rng, (i) => ctx.candidates[i].cachedBlocks);
    const T = ctx.knobs.temperature;
    if (T > 0 && order.length > 1) {
      const first = sampleSoftmax(costs, T, ctx.rng);
      const at = order.indexOf(first);
      order.splice(at, 1);
      order.unshift(first);
    }
    return { order, costs };
  }
}

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

export class RoundRobinPolicy implements Policy {
  readonly name = 'round-robin';
  private next = 0;

  rank(ctx: PolicyContext): Ranking {
    const n = ctx.candidates.length;
    // Order by source number so the rotation is stable when candidates come and go.
    const bySource = ctx.candidates.map((_, i) => i).sort((a, b) => ctx.candidates[a].source - ctx.candidates[b].source);
    let start = bySource.findIndex((i) => ctx.candidates[i].source >= this.next);
    if (start < 0) start = 0;
    const order = Array.from({ length: n }, (_, k) => bySource[(start + k) % n]);
    this.next = ctx.candidates[order[0]].source + 1;
    return { order, costs: ctx.candidates.map(() => NaN) };
  }
}

export class RandomPolicy implements Policy {
  readonly name = 'random';

  rank(ctx: PolicyContext): Ranking {
    const order = orderByCost(ctx.candidates.map(() => 0), ctx.rng);
    return { order, costs: ctx.candidates.map(() => NaN) };
  }
}

function loadOf(ctx: PolicyContext, i: number): number {
  const c = ctx.candidates[i];
  return c.activePrefillTokens / ctx.blockSize + c.activeBlocks;
}

export class LeastLoadedPolicy implements Policy {
  readonly name = 'least-loaded';

  rank(ctx: PolicyContext): Ranking {
    const costs = ctx.candidates.map((_, i) => loadOf(ctx, i));
    return { order: orderByCost(costs, ctx.rng), costs };
  }
}

function mix32(x: number): number {
  x = Math.imul(x ^ (x >>> 16), 0x7feb352d);
  x = Math.imul(x ^ (x >>> 15), 0x846ca68b);
  return (x ^ (x >>> 16)) >>> 0;
}

function stringHash(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

export class PrefixHashPolicy implements Policy {
  readonly name = 'prefix-hash';

  constructor(
    readonly prefixBlocks = 4,
    readonly epsilon = 0.25,
  ) {}

  rank(ctx: PolicyContext): Ranking {
    const n = ctx.seqHashes.length;
    // The seq hash of block K-1 names the whole first-K-block prefix. Prompts shorter than one block hash by length.
    const key = n === 0 ? ctx.promptTokens : Number(ctx.seqHashes[Math.min(this.prefixBlocks, n) - 1] & 0xffffffffn);
    const scores = ctx.candidates.map((c) => mix32(key ^ stringHash(c.key)));
    const order = ctx.candidates.map((_, i) => i).sort((a, b) => scores[b] - scores[a]);
    const loads = ctx.candidates.map((_, i) => loadOf(ctx, i));
    const mean = loads.reduce((a, b) => a + b, 0) / Math.max(1, loads.length);
    const bound = (1 + this.epsilon) * mean + ctx.requestBlocks;
    const within = order.filter((i) => loads[i] <= bound);
    const beyond = order.filter((i) => loads[i] > bound);
    return { order: [...within, ...beyond], costs: loads };
  }
}

export const POLICY_NAMES = ['kv', 'round-robin', 'random', 'least-loaded', 'prefix-hash'] as const;
export type PolicyName = (typeof POLICY_NAMES)[number];

export function createPolicy(name: string): Policy {
  switch (name) {
    case 'kv':
      return new KvPolicy();
    case 'round-robin':
      return new RoundRobinPolicy();
    case 'random':
      return new RandomPolicy();
    case 'least-loaded':
      return new LeastLoadedPolicy();
    case 'prefix-hash':
      return new PrefixHashPolicy();
    default:
      throw new RangeError(`unknown policy "${name}"; known: ${POLICY_NAMES.join(', ')}`);
  }
}
