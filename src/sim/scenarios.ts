/**
 * Named scenarios for `kvroute sim --scenario NAME`.
 *
 * seed: the case that started the project (docs/protocols.md §6). Production traffic with 44% of requests under
 * 1,800 tokens, a mean near 14k and a tail past 130k, on a fleet small enough to evict. The router's per-request
 * histogram read 0.320 while the engines' counters read 0.767; block-weighted router counters read 0.790. The
 * scenario replays the skewed generator on such a fleet and shows the three numbers side by side.
 */
import type { RoutingSettings } from '../config/routing.ts';
import type { FleetOptions } from './run-fleet.ts';
import { AGENTIC_DEFAULTS, generateAgentic, generateNoisyNeighbour, generateSkewed } from './traces/generate.ts';
import type { TraceRequest } from './traces/format.ts';

export interface Scenario {
  readonly name: string;
  readonly description: string;
  readonly requests: TraceRequest[];
  readonly fleet: Omit<FleetOptions, 'policy' | 'onProgress'>;
  /** Routing settings of its own (as `kvroute serve` names them); flags given on `kvroute sim` override them. */
  readonly settings?: Partial<RoutingSettings>;
  readonly policies: string[];
  /** Queue orders to compare (runs per policy); default the dispatcher's. */
  readonly queueOrders?: ReadonlyArray<'fair' | 'fifo'>;
}

export const SCENARIOS = ['seed', 'noisy-neighbour', 'agentic', 'pd'] as const;

/** What a caller (the league, `kvroute sim --workers`) may change in a scenario while keeping its point. */
export interface ScenarioOverrides {
  /**
   * Engines in the fleet. The arrival rate scales with it, so each engine sees the load the scenario was built for
   * (the noisy tenant still floods, the agentic fleet still evicts); a P/D fleet keeps its 1:3 prefill:decode split.
   */
  readonly workers?: number;
}

/**
 * agentic and pd: the agentic generator (Mooncake tool&agent shape, src/sim/traces/generate.ts) on engines of
 * 1,048,576 tokens of KV each: the capacity Dynamo's replay falls back to (16,384 blocks of 64 tokens,
 * components/src/dynamo/replay/main.py), so, as in Dynamo's KV-router experiment, the hour's working set does not fit
 * and routing decides what stays cached. pd splits the same engine count 1:3 into prefill and decode workers.
 */
export const AGENTIC_SCENARIO = { requests: 6_000, workers: 8, blockSize: 16, capacityTokens: 16_384 * 64 };

/**
 * noisy-neighbour: three steady chat tenants and one that sends 12x their rate for a third of the run, on a fleet whose
 * workers are busy above 2,048 active prefill tokens, so the flood has to queue: FIFO against fair
 * queuing, per-tenant TTFT and Jain's index.
 */
export const NOISY_SCENARIO = { requests: 3_000, rate: 2.4, workers: 2, blockSize: 16, gpuBlocks: 65_536, busyPrefillTokens: 2_048 };

export function scenario(name: string, seed = 1, requests?: number, over: ScenarioOverrides = {}): Scenario {
  if (over.workers !== undefined && !(Number.isInteger(over.workers) && over.workers >= (name === 'pd' ? 2 : 1))) {
    throw new RangeError(`scenario ${name}: workers must be an integer >= ${name === 'pd' ? 2 : 1}, got ${over.workers}`);
  }
  if (name === 'agentic' || name === 'pd') {
    const a = AGENTIC_SCENARIO;
    const workers = over.workers ?? a.workers;
    const prefill = Math.max(1, Math.round(workers / 4));
    const trace = generateAgentic({ requests: requests ?? a.requests, seed, rate: (AGENTIC_DEFAULTS.rate * workers) / a.workers });
    const fleet = { workers, blockSize: a.blockSize, gpuBlocks: a.capacityTokens / a.blockSize, seed };
    return name === 'agentic'
      ? {
          name,
          description: `agentic tool-use sessions (Mooncake tool&agent shape) on ${workers} engines of 1M tokens of KV: the working set evicts`,
          requests: trace,
          fleet,
          policies: ['kv-pressure', 'kv', 'round-robin'],
        }
      : {
          name,
          description: `the agentic trace on a disaggregated fleet: ${prefill} prefill and ${workers - prefill} decode workers (vLLM flavour, KV moved over RDMA)`,
          requests: trace,
          fleet: { ...fleet, prefillWorkers: prefill, decodeWorkers: workers - prefill },
          policies: ['kv-pressure', 'kv', 'round-robin'],
        };
  }
  if (name === 'noisy-neighbour') {
    const n = NOISY_SCENARIO;
    const workers = over.workers ?? n.workers;
    return {
      name,
      description:
        'three steady tenants and one flooding tenant (12x, a third of the run) on a fleet that must queue: FIFO vs fair queuing',
      // More engines, proportionally more traffic over the same span (the generator's span is requests / rate).
      requests: generateNoisyNeighbour({
        requests: requests ?? Math.round((n.requests * workers) / n.workers),
        seed,
        rate: (n.rate * workers) / n.workers,
      }),
      fleet: {
        workers,
        blockSize: n.blockSize,
        gpuBlocks: n.gpuBlocks,
        seed,
      },
      settings: { busyPrefillTokens: n.busyPrefillTokens, queueLimit: 100_000, queueTimeoutMs: 600_000 },
      policies: ['kv-pressure'],
      queueOrders: ['fifo', 'fair'],
    };
  }
  if (name !== 'seed') throw new Error(`unknown scenario "${name}"; known: ${SCENARIOS.join(', ')}`);
  requests ??= SEED_SCENARIO.requests;
  const workers = over.workers ?? SEED_SCENARIO.workers;
  return {
    name,
    description:
      'skewed production shape (44% under 1,800 tokens, mean ~14k, agentic tail past 130k) on a fleet small enough to ' +
      'evict: request-weighted router hit vs block-weighted router hit vs engine-delivered',
    requests: generateSkewed({
      requests,
      seed,
      rate: (SEED_SCENARIO.rate * workers) / SEED_SCENARIO.workers,
      thinkTimeS: SEED_SCENARIO.thinkTimeS,
    }),
    fleet: {
      workers,
      blockSize: SEED_SCENARIO.blockSize,
      gpuBlocks: SEED_SCENARIO.gpuBlocks,
      seed,
    },
    policies: ['kv'],
  };
}

export const SEED_SCENARIO = {
  requests: 4000,
  rate: 1,
  /** Tool time between agentic turns: long enough that the sessions' working set overflows the fleet's cache. */
  thinkTimeS: 20,
  workers: 4,
  blockSize: 16,
  /** 196k tokens per worker: the longest session (160k) still fits, the fleet's working set does not. */
  gpuBlocks: 12_288,
};
