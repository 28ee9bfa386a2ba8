/**
 * Named scenarios for `kvroute sim --scenario NAME`.
 *
 * seed: the case that started the project (docs/protocols.md §6). Production traffic with 44% of requests under
 * 1,800 tokens, a mean near 14k and a tail past 130k, on a fleet small enough to evict. The router's per-request
 * histogram read 0.320 while the engines' counters read 0.767; block-weighted router counters read 0.790. The
 * scenario replays the skewed generator on such a fleet and shows the three numbers side by side.
 */
import type { FleetOptions } from './fleet.ts';
import { generateSkewed } from './traces/generate.ts';
import type { TraceRequest } from './traces/format.ts';

export interface Scenario {
  readonly name: string;
  readonly description: string;
  readonly requests: TraceRequest[];
  readonly fleet: Omit<FleetOptions, 'policy' | 'onProgress'>;
  readonly policies: string[];
}

export const SCENARIOS = ['seed'] as const;

export function scenario(name: string, seed = 1, requests: number = SEED_SCENARIO.requests): Scenario {
  if (name !== 'seed') throw new Error(`unknown scenario "${name}"; known: ${SCENARIOS.join(', ')}`);
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
