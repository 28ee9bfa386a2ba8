/**
 * The built-in policies. Each is a few lines around its formula.
 *
 * kv-pressure    the default: kv with decode weighted by KV memory pressure (see KvPressurePolicy below)
 * kv             cost(w) = prefillLoadScale * prefill(w) + decode(w)                     (NVIDIA Dynamo's cost)
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

/** Dynamo's two terms for candidate i: blocks of prefill queued (after credit) and decode blocks after admission. */
export function kvTerms(ctx: PolicyContext, i: number): { prefill: number; decode: number } {
  const c = ctx.candidates[i];
  const { overlapCredit, hostTierCredit, diskTierCredit } = ctx.knobs;
  // Offload tiers (off by default): blocks loadable from host memory or disk save part of their prefill.
  const credited = c.overlapBlocks + (hostTierCredit ?? 0) * (c.hostTierBlocks ?? 0) + (diskTierCredit ?? 0) * (c.diskTierBlocks ?? 0);
  const prefill = Math.max(c.activePrefillTokens / ctx.blockSize + ctx.requestBlocks - overlapCredit * credited, 0);
  return { prefill, decode: c.activeBlocks + ctx.requestBlocks - c.activePrefixBlocks };
}

export function kvCost(ctx: PolicyContext, i: number): number {
  const t = kvTerms(ctx, i);
  return ctx.knobs.prefillLoadScale * t.prefill + t.decode;
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

/**
 * kv-pressure (default): Dynamo's terms with the decode term weighted by KV memory pressure.
 *
 *   cost(w) = prefillLoadScale * prefill(w) + clamp(decode(w) / capacityBlocks(w), 1/64, 1) * decode(w)
 *
 * A running request's KV blocks slow a worker's steps through memory traffic, barely, until memory runs short; what
 * delays a new request's first token is the prefill queued ahead of it plus its own uncached tokens. The plain cost
 * weighs an active decode block like a block of prefill, so the worker holding a conversation's prefix while still
 * decoding its previous turn looks expensive and the next turn goes cold elsewhere (conversation trace, 8 workers:
 * 78% of the oracle's hit; kv-pressure 91%, bench/RESULTS.md). Near full memory the weight is 1: Dynamo's cost.
 * Without a known capacity the weight is 1 too.
 *
 * Costs within `tieMarginBlocks` (1) of the best are ties: a one-block edge (the system prompt every worker caches)
 * must not beat an idle worker forever, or idle workers never warm up (32 workers: imbalance 1.81 -> 1.04). Among
 * ties, more overlap beyond that same one-block margin wins (a sibling of an in-flight request joins it rather than
 * recomputing its prefix elsewhere), then the emptiest cache, then a seeded random choice.
 */
export class KvPressurePolicy implements Policy {
  readonly name = 'kv-pressure';

  constructor(
    readonly minWeight = 1 / 64,
    readonly tieMarginBlocks = 1,
  ) {}

  rank(ctx: PolicyContext): Ranking {
    const costs = ctx.candidates.map((c, i) => {
      const { prefill, decode } = kvTerms(ctx, i);
      const pressure = c.capacityBlocks ? Math.min(1, Math.max(this.minWeight, decode / c.capacityBlocks)) : 1;
      return ctx.knobs.prefillLoadScale * prefill + pressure * decode;
    });
    let min = Infinity;
    for (const x of costs) if (x < min) min = x;
    const margin = this.tieMarginBlocks;
    const banded = costs.map((x) => (x <= min + margin ? min : x));
    // Lexicographic tie key: overlap beyond the margin (descending), then cached blocks (ascending).
    const tie = (i: number) => {
      const c = ctx.candidates[i];
      return -Math.max(0, c.overlapBlocks - margin) * 2 ** 32 + c.cachedBlocks;
    };
    return { order: orderByCost(banded, ctx.rng, tie), costs };
  }
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
    const order = orderByCost(
      ctx.candidates.map(() => 0),
      ctx.rng,
    );
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

export const POLICY_NAMES = ['kv-pressure', 'kv', 'round-robin', 'random', 'least-loaded', 'prefix-hash'] as const;
export const DEFAULT_POLICY: PolicyName = 'kv-pressure';
export type PolicyName = (typeof POLICY_NAMES)[number];

export function createPolicy(name: string): Policy {
  switch (name) {
    case 'kv-pressure':
      return new KvPressurePolicy();
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
