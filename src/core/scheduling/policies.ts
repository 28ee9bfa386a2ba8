/**
 * The built-in scorers, pickers and the policies composed from them. Each stage is a few lines around its formula
 * (docs/routing.md lists them all).
 *
 * Scorers (cost terms, lower is better; bs = block size, n = requestBlocks = ceil(promptTokens / bs)):
 *   prefill-load     max(activePrefillTokens/bs + n - overlapCredit * credited, 0)
 *                    credited = overlap + hostTierCredit * hostTier + diskTierCredit * diskTier
 *                               + remoteTierCredit * remoteTier (tier credits 0 unless on)
 *   decode-load      activeBlocks + n - activePrefix
 *   pressure-decode  clamp(decode / capacityBlocks, 1/64, 1) * decode            (decode = decode-load; weight 1 without capacity)
 *   load             activePrefillTokens/bs + activeBlocks
 * Pickers:
 *   min-cost         ascending cost; ties -> fewest cached blocks -> seeded random; temperature T > 0 samples the first
 *                    from p_i ∝ exp(-(c_i - c_min) / ((c_max - c_min) * T))
 *   banded-min       costs within `margin` blocks of the best are ties; ties -> more overlap beyond the margin ->
 *                    fewest cached blocks -> seeded random
 *   lowest           ascending cost; ties seeded random
 *   round-robin      next source in turn
 *   random           uniform, seeded
 *   rendezvous       rendezvous hash of the request's first K blocks picks a home; a home whose load exceeds
 *                    (1 + epsilon) * mean load + n is skipped for the next in order (bounded load)
 * Policies:
 *   kv-pressure (default)  prefillLoadScale * prefill-load + pressure-decode, banded-min
 *   kv                     prefillLoadScale * prefill-load + decode-load, min-cost       (NVIDIA Dynamo's cost)
 *   least-loaded           load, lowest
 *   prefix-hash            load, rendezvous
 *   round-robin            round-robin
 *   random                 random
 *   dynamo, llmd, llmd-baseline, smg, smg-legacy, aibrix, ps-kvaware, ps-prefixaware: peers' defaults (peers/)
 */
import { ComposedPolicy, type Picker, type Scorer, unitWeight, type WeightedScorer } from './pipeline.ts';
import { createPdPolicy } from './pd.ts';
import { createPeerPolicy, PEER_POLICY_NAMES } from './peers/index.ts';
import { orderByCost, type Policy, type PolicyContext } from './policy.ts';

// ------------------------------------------------------------------------------------------------ scorers

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
    formula: `clamp(decode / capacityBlocks, ${minWeight === 1 / 64 ? '1/64' : minWeight}, 1) * decode, decode = activeBlocks + requestBlocks - activePrefix`,
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

const prefillWeight: WeightedScorer = { scorer: PREFILL_LOAD, weight: (k) => k.prefillLoadScale, weightName: 'prefillLoadScale' };

// ------------------------------------------------------------------------------------------------ pickers

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
      // Lexicographic tie key: overlap beyond the margin (descending), then cached blocks (ascending).
      const tie = (i: number) => {
        const c = ctx.candidates[i];
        return -Math.max(0, c.overlapBlocks - margin) * 2 ** 32 + c.cachedBlocks;
      };
      return orderByCost(banded, ctx.rng, tie);
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

// ------------------------------------------------------------------------------------------------ policies

/** NVIDIA Dynamo's cost: prefillLoadScale * prefill-load + decode-load, min-cost picker. */
export class KvPolicy extends ComposedPolicy {
  constructor() {
    super('kv', [prefillWeight, unitWeight(DECODE_LOAD)], MIN_COST);
  }
}

/** The default: Dynamo's terms with the decode term weighted by KV memory pressure, one-block tie band. */
export class KvPressurePolicy extends ComposedPolicy {
  constructor(
    readonly minWeight = 1 / 64,
    readonly tieMarginBlocks = 1,
  ) {
    super('kv-pressure', [prefillWeight, unitWeight(pressureDecode(minWeight))], bandedMin(tieMarginBlocks));
  }
}

export function kvCost(ctx: PolicyContext, i: number): number {
  const t = kvTerms(ctx, i);
  return ctx.knobs.prefillLoadScale * t.prefill + t.decode;
}

export const POLICY_NAMES = ['kv-pressure', 'kv', 'round-robin', 'random', 'least-loaded', 'prefix-hash', ...PEER_POLICY_NAMES] as const;
export const DEFAULT_POLICY: PolicyName = 'kv-pressure';
export type PolicyName = (typeof POLICY_NAMES)[number];

export function createPolicy(name: string): Policy {
  const pd = createPdPolicy(name) ?? createPeerPolicy(name);
  if (pd) return pd;
  switch (name) {
    case 'kv-pressure':
      return new KvPressurePolicy();
    case 'kv':
      return new KvPolicy();
    case 'round-robin':
      return new ComposedPolicy('round-robin', [], roundRobin());
    case 'random':
      return new ComposedPolicy('random', [], RANDOM);
    case 'least-loaded':
      return new ComposedPolicy('least-loaded', [unitWeight(LOAD)], LOWEST);
    case 'prefix-hash':
      return new ComposedPolicy('prefix-hash', [unitWeight(LOAD)], rendezvous(4, 0.25));
    default:
      throw new RangeError(`unknown policy "${name}"; known: ${POLICY_NAMES.join(', ')}`);
  }
}
