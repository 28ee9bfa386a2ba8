/**
 * The routing settings, defined once: what the core's KvRouter and Dispatcher take (block size, policy and its knobs,
 * seed, candidate selection, tier credits, the P/D threshold, busy thresholds, queue, retries, breaker, flow control,
 * sessions, pins). `kvroute serve` and `kvroute epp` take all of them, `kvroute sim` the ones a simulation uses (with
 * list-valued sweep variants, src/config/sim.ts), relay, mocker and hash the block size. `routerOptionsFrom` and
 * `dispatchOptionsFrom` are the one mapping from resolved settings to the core's options, for the live router
 * (src/runtime/compose.ts) and the simulator (src/cli/sim.ts) alike.
 *
 * Defaults the core also applies come from the core's constants (DEFAULT_POLICY, DEFAULT_KNOBS, DEFAULT_STORE_ONLY_TTL_MS), not from copies.
 */
import { z } from 'zod';
import type { DispatchOptions } from '../core/dispatch/dispatcher.ts';
import { DEFAULT_KNOBS, type KvRouterOptions, TIER_CREDIT_ON } from '../core/router.ts';
import { DEFAULT_POLICY, POLICY_NAMES } from '../core/scheduling/registry.ts';
import { DEFAULT_STORE_ONLY_TTL_MS } from '../core/tiers.ts';
import { BAND_SPEC_GRAMMAR, bandSchema, numberMapSchema } from './flow-spec.ts';
import { GROUPS } from './groups.ts';
import { choice, custom, flag, integer, list, number, optional, withDefault } from './settings.ts';

const ms = (min = 0) => integer({ min });

/** `NAME=N,NAME=N` as text (flag, variable), or a mapping / list in a config file. */
const nameNumberMap = (what: string, min: number) =>
  custom(
    z.preprocess((v) => (typeof v === 'string' ? v.split(/[\s,]+/).filter(Boolean) : v), numberMapSchema(what, min)),
    `NAME=NUMBER pairs separated by commas (NUMBER >= ${min}; NAME "*" = every other tenant)`,
    { detailed: true },
  );

/** The router's own settings: block size, policy and knobs, seed, selection, tiers, P/D, pins. */
export const ROUTING = {
  blockSize: withDefault(integer({ min: 1 }), 16, {
    flag: '-b, --block-size <n>',
    env: 'KVROUTE_BLOCK_SIZE',
    help: "tokens per KV block, the router's and the engines' (equal, or an engine's a multiple or divisor: docs/engines.md)",
    group: GROUPS.routing,
  }),
  selection: withDefault(choice(['auto', 'exhaustive', 'sampled']), 'auto', {
    flag: '--selection <mode>',
    env: 'KVROUTE_SELECTION',
    help:
      'how candidates are found: exhaustive scans every source; sampled evaluates the sources that can hold the prefix plus ' +
      'the 16 least loaded (kv, kv-pressure, least-loaded); auto samples above 256 sources (docs/routing.md)',
    group: GROUPS.routing,
  }),
  policy: withDefault(choice(POLICY_NAMES), DEFAULT_POLICY, {
    flag: '--policy <name>',
    env: 'KVROUTE_POLICY',
    help: 'routing policy',
    group: GROUPS.routing,
  }),
  prefillLoadScale: withDefault(number({ min: 0 }), DEFAULT_KNOBS.prefillLoadScale, {
    flag: '--prefill-load-scale <x>',
    env: 'KVROUTE_PREFILL_LOAD_SCALE',
    help: 'kv policies: weight of prefill load against decode load',
    group: GROUPS.routing,
  }),
  overlapCredit: withDefault(number({ min: 0 }), DEFAULT_KNOBS.overlapCredit, {
    flag: '--overlap-credit <x>',
    env: 'KVROUTE_OVERLAP_CREDIT',
    help: 'kv policies: prefill blocks saved per cached block',
    group: GROUPS.routing,
  }),
  temperature: withDefault(number({ min: 0 }), DEFAULT_KNOBS.temperature, {
    flag: '--temperature <x>',
    env: 'KVROUTE_TEMPERATURE',
    help: 'kv policies: 0 picks the cheapest worker, > 0 samples a softmax over costs',
    group: GROUPS.routing,
  }),
  seed: withDefault(integer({ min: 0, max: 2 ** 32 - 1 }), 0, {
    flag: '--seed <n>',
    env: 'KVROUTE_SEED',
    help: "seed of the router's random choices (ties, temperature)",
    group: GROUPS.routing,
  }),
  tierCredit: withDefault(flag(), false, {
    flag: '--tier-credit',
    env: 'KVROUTE_TIER_CREDIT',
    help: 'credit KV blocks engines offloaded to host memory (0.75 of a GPU block) or disk (0.25) in the kv policies',
    group: GROUPS.routing,
  }),
  tierRemoteCredit: withDefault(number({ min: 0, max: 1 }), 0, {
    flag: '--tier-remote-credit <x>',
    env: 'KVROUTE_TIER_REMOTE_CREDIT',
    help:
      'credit per block an engine can load from shared REMOTE storage (FS / OBJ with REMOTE locality), as a fraction of a ' +
      "GPU block; 0 (default): a remote copy is not the engine's own hit (docs/engines.md)",
    group: GROUPS.routing,
  }),
  storeOnlyTtlMs: withDefault(ms(0), DEFAULT_STORE_ONLY_TTL_MS, {
    flag: '--store-only-ttl-ms <ms>',
    env: 'KVROUTE_STORE_ONLY_TTL_MS',
    help:
      'offloaded blocks of a medium that never sends removals (LMCache CPU) stop counting this long after their last ' +
      'store; 0 = never (docs/engines.md)',
    group: GROUPS.routing,
  }),
  // 64 MiB: ~2.5 M blocks (~27 bytes of budget per block: 16-byte cells at 50-80% load, the group ring's eighth), the
  // full KV caches of 25-125 engines of 20k-100k blocks; past it the least recently routed blocks fleet-wide go first,
  // as the engines evict too. Unbounded, 3,000 req/s x 32 new blocks per request for the 120 s TTL would be ~11 M
  // entries (~300 MiB).
  approxTableMb: withDefault(number({ min: 1, max: 1_048_576 }), 64, {
    flag: '--approx-table-mb <mb>',
    env: 'KVROUTE_APPROX_TABLE_MB',
    help:
      'memory budget (MiB, the table and its record ring: ~27 bytes of budget per block, 64 MiB hold ~2.5 M) of approximate mode, which ' +
      'remembers the blocks routed to workers without KV events; the least recently routed dropped beyond (a worker ' +
      'also never holds more than its KV capacity, blocks=, when known)',
    group: GROUPS.routing,
  }),
  // 1,024: the largest threshold whose decode-side prefill step (≈ 32 ms in the timing model, plus the batch's decode
  // step) stays within a 50 ms per-token ITL SLO; the simulator's sweep behind it is in bench/RESULTS.md (P/D).
  disaggMinUncachedTokens: withDefault(integer({ min: 0 }), 1024, {
    flag: '--disagg-min-uncached-tokens <n>',
    env: 'KVROUTE_DISAGG_MIN_UNCACHED_TOKENS',
    help:
      'P/D fleets: a request whose uncached prompt tokens on its decode worker are at most this is served there alone ' +
      '(no prefill leg); 0 disaggregates every request with an uncached token',
    group: GROUPS.routing,
  }),
  decodeOverlapCredit: withDefault(number({ min: 0 }), 0, {
    flag: '--decode-overlap-credit <x>',
    env: 'KVROUTE_DECODE_OVERLAP_CREDIT',
    help: "P/D fleets: blocks credited on the decode leg per block the decode worker holds (when decode workers' caches are reused)",
    group: GROUPS.routing,
  }),
  responsePinLimit: withDefault(integer({ min: 0 }), 100_000, {
    flag: '--response-pin-limit <n>',
    env: 'KVROUTE_RESPONSE_PIN_LIMIT',
    help: 'stored responses remembered with the worker holding them (previous_response_id goes there); 0 disables pinning',
    group: GROUPS.routing,
  }),
  responsePinTableMb: withDefault(number({ min: 0, max: 1_048_576 }), 32, {
    flag: '--response-pin-table-mb <mb>',
    env: 'KVROUTE_RESPONSE_PIN_TABLE_MB',
    help:
      'memory budget (MiB, estimated: 120 bytes + 2 per character of the response id per pin) of the response pins; ' +
      'the oldest dropped beyond (as past --response-pin-limit)',
    group: GROUPS.routing,
  }),
  responsePinTtlMs: withDefault(ms(1), 3_600_000, {
    flag: '--response-pin-ttl-ms <ms>',
    env: 'KVROUTE_RESPONSE_PIN_TTL_MS',
    help: 'how long a stored response stays pinned to its worker',
    group: GROUPS.routing,
  }),
};

/** Busy thresholds, the queue and retries. */
export const ADMISSION = {
  busyKvFraction: optional(number({ min: 0, max: 1, minExclusive: true }), {
    flag: '--busy-kv-fraction <x>',
    env: 'KVROUTE_BUSY_KV_FRACTION',
    help: "a worker is busy above this fraction of its KV blocks in active use (needs the worker's KV capacity)",
    group: GROUPS.admission,
  }),
  busyPrefillTokens: optional(integer({ min: 0 }), {
    flag: '--busy-prefill-tokens <n>',
    env: 'KVROUTE_BUSY_PREFILL_TOKENS',
    help: 'a worker is busy with more active prefill tokens than this',
    group: GROUPS.admission,
  }),
  queueLimit: withDefault(integer({ min: 0 }), 1024, {
    flag: '--queue-limit <n>',
    env: 'KVROUTE_QUEUE_LIMIT',
    help: 'requests waiting while all workers are busy; beyond: 503 + Retry-After',
    group: GROUPS.admission,
  }),
  queueTimeoutMs: withDefault(ms(1), 30_000, {
    flag: '--queue-timeout-ms <ms>',
    env: 'KVROUTE_QUEUE_TIMEOUT_MS',
    help: 'longest wait in the queue before 503 + Retry-After',
    group: GROUPS.admission,
  }),
  retries: withDefault(integer({ min: 0 }), 2, {
    flag: '--retries <n>',
    env: 'KVROUTE_RETRIES',
    help: 'retries on the next-best worker after a connection error or 5xx before the first byte',
    group: GROUPS.admission,
  }),
};

/** The per-worker circuit breaker. */
export const BREAKER = {
  breakerThreshold: withDefault(integer({ min: 1 }), 5, {
    flag: '--breaker-threshold <n>',
    env: 'KVROUTE_BREAKER_THRESHOLD',
    help: "consecutive request failures that open a worker's circuit breaker",
    group: GROUPS.health,
  }),
  breakerCooldownMs: withDefault(ms(0), 10_000, {
    flag: '--breaker-cooldown-ms <ms>',
    env: 'KVROUTE_BREAKER_COOLDOWN_MS',
    help: 'time an open breaker waits before one trial request',
    group: GROUPS.health,
  }),
};

/** Flow control: priority bands, fair queuing across tenants, token budgets, deadlines, session affinity. */
export const FLOW = {
  bands: withDefault(
    list(bandSchema, {
      accepts: `band specs ${BAND_SPEC_GRAMMAR}`,
      separators: /[\s;]+/,
      detailed: true,
      range: `${BAND_SPEC_GRAMMAR}; the variable: specs separated by spaces or ";"`,
    }),
    [],
    {
      flag: '--band <spec>',
      env: 'KVROUTE_BANDS',
      help:
        'a priority band of the queue (repeatable): requests with priority <= max-priority join it (lower runs first); ' +
        'its own queue TTL; sheddable = 429 at once when the fleet is saturated; order within a tenant fcfs or edf. ' +
        'Default: one band for every priority',
      group: GROUPS.flow,
    },
  ),
  queueOrder: withDefault(choice(['fair', 'fifo']), 'fair', {
    flag: '--queue-order <order>',
    env: 'KVROUTE_QUEUE_ORDER',
    help: 'fair: bands, then fair queuing across tenants; fifo: one queue in arrival order',
    group: GROUPS.flow,
  }),
  tenantWeights: optional(nameNumberMap('a tenant weight', 0.001), {
    flag: '--tenant-weights <list>',
    env: 'KVROUTE_TENANT_WEIGHTS',
    help: "fair queuing weights, e.g. acme=2,beta=1 (default 1): a tenant's share of contended capacity",
    group: GROUPS.flow,
  }),
  tenantTokenBudgets: optional(nameNumberMap('a token budget', 1), {
    flag: '--tenant-token-budgets <list>',
    env: 'KVROUTE_TENANT_TOKEN_BUDGETS',
    help: 'tokens per minute (prompt + output) per tenant, e.g. acme=200000,*=50000; beyond: 429 + Retry-After',
    group: GROUPS.flow,
  }),
  prefillTokensPerSecond: optional(number({ min: 0, minExclusive: true }), {
    flag: '--prefill-tokens-per-second <n>',
    env: 'KVROUTE_PREFILL_TOKENS_PER_SECOND',
    help:
      "an engine's prefill throughput, for judging x-kvroute-slo-ttft-ms deadlines before it has been learned from " +
      'first tokens (absent: deadlines are judged once learned)',
    group: GROUPS.flow,
  }),
  sessionTtlMs: withDefault(ms(1), 600_000, {
    flag: '--session-ttl-ms <ms>',
    env: 'KVROUTE_SESSION_TTL_MS',
    help: 'a session forgets its worker this long after its last request',
    group: GROUPS.flow,
  }),
  sessionTableMb: withDefault(number({ min: 0, max: 1_048_576 }), 32, {
    flag: '--session-table-mb <mb>',
    env: 'KVROUTE_SESSION_TABLE_MB',
    help:
      'memory budget (MiB, estimated: 120 bytes + 2 per character of the id per session) of the remembered sessions; ' +
      'least recently used dropped beyond (at most 100,000 sessions either way)',
    group: GROUPS.flow,
  }),
  sessionLoadFactor: withDefault(number({ min: 0 }), 0.5, {
    flag: '--session-load-factor <x>',
    env: 'KVROUTE_SESSION_LOAD_FACTOR',
    help: "a session leaves its worker when that worker's load exceeds (1 + x) x the mean load + the request's blocks",
    group: GROUPS.flow,
  }),
};

/** The admission settings' keys (busy thresholds, queue, retries). */
export const ADMISSION_SETTINGS = Object.keys(ADMISSION) as Array<keyof typeof ADMISSION>;

/** Every routing setting, as one schema (its defaults: `ROUTING_DEFAULTS`). */
export const routingSchema = z.strictObject({ ...ROUTING, ...ADMISSION, ...BREAKER, ...FLOW });

/** The resolved routing settings: what `routerOptionsFrom` and `dispatchOptionsFrom` read. */
export type RoutingSettings = z.output<typeof routingSchema>;
export type RoutingSettingKey = keyof RoutingSettings & string;

/** Every routing setting's default. */
export const ROUTING_DEFAULTS: RoutingSettings = routingSchema.parse({});

/** The KvRouter's options from the routing settings (a front end adds its clock). */
export function routerOptionsFrom(s: RoutingSettings): KvRouterOptions {
  return {
    blockSize: s.blockSize,
    policy: s.policy,
    knobs: {
      prefillLoadScale: s.prefillLoadScale,
      overlapCredit: s.overlapCredit,
      temperature: s.temperature,
      decodeOverlapCredit: s.decodeOverlapCredit,
      ...(s.tierCredit ? TIER_CREDIT_ON : {}),
      ...(s.tierRemoteCredit > 0 ? { remoteTierCredit: s.tierRemoteCredit } : {}),
    },
    storeOnlyTtlMs: s.storeOnlyTtlMs,
    approxTableBytes: Math.floor(s.approxTableMb * 2 ** 20),
    seed: s.seed,
    selection: s.selection,
    busy: { activeBlockFraction: s.busyKvFraction, activePrefillTokens: s.busyPrefillTokens },
  };
}

/** The Dispatcher's options from the routing settings. */
export function dispatchOptionsFrom(s: RoutingSettings): DispatchOptions {
  return {
    queueLimit: s.queueLimit,
    queueTimeoutMs: s.queueTimeoutMs,
    retries: s.retries,
    breaker: { threshold: s.breakerThreshold, cooldownMs: s.breakerCooldownMs },
    pins: { limit: s.responsePinLimit, ttlMs: s.responsePinTtlMs, maxBytes: Math.floor(s.responsePinTableMb * 2 ** 20) },
    flow: { bands: s.bands, order: s.queueOrder, weights: s.tenantWeights },
    tokenBudgets: s.tenantTokenBudgets,
    sessions: { ttlMs: s.sessionTtlMs, loadFactor: s.sessionLoadFactor, maxBytes: Math.floor(s.sessionTableMb * 2 ** 20) },
    prefillTokensPerSecond: s.prefillTokensPerSecond,
    pd: { minUncachedTokens: s.disaggMinUncachedTokens },
  };
}
