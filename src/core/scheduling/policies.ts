/**
 * The built-in policies: each a registry entry (name, one-line summary, factory) composing scorers (scorers.ts) and a
 * picker (pickers.ts). The registry (registry.ts) lists them with the peer policies; docs and /debug/state show each
 * policy's formula from its describe().
 */
import { bandedMin, LOWEST, MIN_COST, RANDOM, rendezvous, roundRobin } from './pickers.ts';
import { ComposedPolicy, unitWeight } from './pipeline.ts';
import type { PolicyEntry } from './policy.ts';
import { DECODE_LEG, DECODE_LOAD, LOAD, PREFILL_WEIGHT, pressureDecode } from './scorers.ts';

/** NVIDIA Dynamo's cost: prefillLoadScale * prefill-load + decode-load, min-cost picker. */
export class KvPolicy extends ComposedPolicy {
  constructor() {
    super('kv', [PREFILL_WEIGHT, unitWeight(DECODE_LOAD)], MIN_COST);
  }
}

/** The default: Dynamo's terms with the decode term weighted by KV memory pressure, one-block tie band. */
export class KvPressurePolicy extends ComposedPolicy {
  constructor(
    readonly minWeight = 1 / 64,
    readonly tieMarginBlocks = 1,
  ) {
    super('kv-pressure', [PREFILL_WEIGHT, unitWeight(pressureDecode(minWeight))], bandedMin(tieMarginBlocks));
  }
}

export const PD_PREFILL_POLICY = 'pd-prefill';
export const PD_DECODE_POLICY = 'pd-decode';

export const BUILT_IN_POLICIES: readonly PolicyEntry[] = [
  {
    name: 'kv-pressure',
    summary: "the default: Dynamo's terms with the decode term weighted by KV memory pressure, one-block tie band",
    create: () => new KvPressurePolicy(),
  },
  { name: 'kv', summary: "NVIDIA Dynamo's cost", create: () => new KvPolicy() },
  { name: 'round-robin', summary: 'next source in turn', create: () => new ComposedPolicy('round-robin', [], roundRobin()) },
  { name: 'random', summary: 'uniform, seeded', create: () => new ComposedPolicy('random', [], RANDOM) },
  {
    name: 'least-loaded',
    summary: 'least load, ignoring the cache',
    create: () => new ComposedPolicy('least-loaded', [unitWeight(LOAD)], LOWEST),
  },
  {
    name: 'prefix-hash',
    summary: 'a home per request prefix (rendezvous hash of its first 4 blocks), passed over when overloaded',
    create: () => new ComposedPolicy('prefix-hash', [unitWeight(LOAD)], rendezvous(4, 0.25)),
  },
  {
    // No decode term: a prefill worker holds a request's blocks only until the decode side pulls them. The overlap
    // includes the predicted overlay (siblings in flight on a prefill worker are credited before their Stored events).
    name: PD_PREFILL_POLICY,
    summary: 'P/D prefill leg: the prefill pool chases the cache',
    leg: 'prefill',
    create: () => new ComposedPolicy(PD_PREFILL_POLICY, [PREFILL_WEIGHT], bandedMin(1)),
  },
  {
    // decodeOverlapCredit is 0 unless decode workers' caches are reused (conditional disaggregation serves short
    // increments from them; vLLM's decode side pulls only the blocks it does not hold).
    name: PD_DECODE_POLICY,
    summary: 'P/D decode leg: the decode pool balances decode load and KV memory',
    leg: 'decode',
    create: () => new ComposedPolicy(PD_DECODE_POLICY, [unitWeight(DECODE_LEG)], MIN_COST),
  },
];
