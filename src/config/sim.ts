/**
 * `kvroute sim`'s routing settings: the routing settings a simulation uses (src/config/routing.ts: same flags, ranges,
 * defaults and help as `kvroute serve`), read from flags only (KVROUTE_* variables configure the router, not a
 * simulation). The settings a simulation compares side by side are list-valued sweep variants (`--policy`,
 * `--queue-order`, `--disagg-min-uncached-tokens`); each run is one value of each, mapped to the core's options by
 * the same `routerOptionsFrom` / `dispatchOptionsFrom` as the live router.
 */
import { z } from 'zod';
import { COMPARED_POLICIES } from '../core/scheduling/registry.ts';
import { ADMISSION, BREAKER, FLOW, ROUTING, ROUTING_DEFAULTS, type RoutingSettings } from './routing.ts';
import { redefault, sweepOf } from './settings.ts';

export const simSchema = z.strictObject({
  blockSize: ROUTING.blockSize,
  policy: sweepOf(ROUTING.policy, {
    default: [...COMPARED_POLICIES],
    help: 'routing policies to compare, comma-separated (a scenario brings its own)',
  }),
  prefillLoadScale: ROUTING.prefillLoadScale,
  overlapCredit: ROUTING.overlapCredit,
  temperature: ROUTING.temperature,
  seed: redefault(ROUTING.seed, 1, { help: 'seed of the router, the engines and a scenario generator' }),
  selection: ROUTING.selection,
  disaggMinUncachedTokens: sweepOf(ROUTING.disaggMinUncachedTokens, {
    help: 'P/D: conditional disaggregation thresholds to compare, comma-separated (see kvroute serve --help)',
  }),
  decodeOverlapCredit: ROUTING.decodeOverlapCredit,
  tierCredit: ROUTING.tierCredit,
  ...ADMISSION,
  ...BREAKER,
  bands: FLOW.bands,
  queueOrder: sweepOf(FLOW.queueOrder, {
    help: 'queue orders to compare, comma-separated: fair (bands, fair queuing across tenants) and/or fifo (a scenario brings its own)',
  }),
  tenantWeights: FLOW.tenantWeights,
  tenantTokenBudgets: FLOW.tenantTokenBudgets,
  prefillTokensPerSecond: FLOW.prefillTokensPerSecond,
  sessionTtlMs: FLOW.sessionTtlMs,
  sessionLoadFactor: FLOW.sessionLoadFactor,
});

/** The resolved settings of `kvroute sim`. */
export type SimSettings = z.output<typeof simSchema>;

/** The values of a sim's sweeps one run takes. */
export interface SweepPoint {
  readonly policy: RoutingSettings['policy'];
  readonly queueOrder: RoutingSettings['queueOrder'];
  readonly disaggMinUncachedTokens: number;
}

/** The routing settings of one run: the sim's settings at one point of its sweeps, the rest as `kvroute serve`'s defaults. */
export function runSettings(s: SimSettings, point: SweepPoint): RoutingSettings {
  return { ...ROUTING_DEFAULTS, ...s, ...point };
}
