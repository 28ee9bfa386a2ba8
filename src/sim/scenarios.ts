/**
 * Named scenarios for `kvroute sim --scenario NAME`.
 *
 * seed: the case that started the project (docs/protocols.md §6). Production traffic with 44% of requests under
 * 1,800 tokens, a mean near 14k and a tail past 130k, on a fleet small enough to evict. The router's per-request
 * histogram read 0.320 while the engines' counters read 0.767; block-weighted router counters read 0.790. The
 * scenario replays the skewed generator on such a fleet and shows the three numbers side by side.
 */
import type { RoutingSettings } from '../config/routing.ts';
import type { FleetOptions } from './fleet.ts';
import { generateNoisyNeighbour, generateSkewed } from './traces/generate.ts';
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

export const SCENARIOS = ['seed', 'noisy-neighbour'] as const;

/**
 * noisy-neighbour: three steady chat tenants and one that sends 12x their rate for a third of the run, on a fleet whose
 * workers are busy above 2,048 active prefill tokens, so the flood has to queue: FIFO against fair
 * queuing, per-tenant TTFT and Jain's index.
 */
export const NOISY_SCENARIO = { requests: 3_000, rate: 2.4, workers: 2, blockSize: 16, gpuBlocks: 65_536, busyPrefillTokens: 2_048 };

export function scenario(name: string, seed = 1, requests?: number): Scenario {
  if (name === 'noisy-neighbour') {
    const n = NOISY_SCENARIO;
    return {
      name,
      description:
        'three steady tenants and one flooding tenant (12x, a third of the run) on a fleet that must queue: FIFO vs fair queuing',
      requests: generateNoisyNeighbour({ requests: requests ?? n.requests, seed, rate: n.rate }),
      fleet: {
        workers: n.workers,
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
  return {
    name,
    description:
      'skewed production shape (44% under 1,800 tokens, mean ~14k, agentic tail past 130k) on a fleet small enough to ' +
      'evict: request-weighted router hit vs block-weighted router hit vs engine-delivered',
    requests: generateSkewed({ requests, seed, rate: SEED_SCENARIO.rate, thinkTimeS: SEED_SCENARIO.thinkTimeS }),
    fleet: {
      workers: SEED_SCENARIO.workers,
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
