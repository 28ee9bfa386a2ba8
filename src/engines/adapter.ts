/**
 * What kvroute knows of one engine, in one object per engine (src/engines/NAME/index.ts): how its KV events arrive,
 * its disaggregated handoff, and the Prometheus names of its prefix-cache metrics. The registry (./index.ts) is the
 * one list of these; every module that depends on the engine asks it instead of naming engines.
 */
import type { EngineName } from '../core/types.ts';
import type { ZmqWire } from './common.ts';
import type { PdHandoff } from './handoff.ts';

export interface EngineEvents {
  /** The payload layout of the engine's ZMQ publisher (`events=` on the worker). */
  readonly zmqWire: ZmqWire;
  /** Without `events=`, the router polls the engine's HTTP event endpoint (TensorRT-LLM's POST /kv_cache_events). */
  readonly httpPoll: boolean;
  /** The ZMQ publisher answers replay requests (`replay=`): gaps are recovered instead of resetting the source. */
  readonly replay: boolean;
}

/** The engine's prefix-cache metrics, as the engine mirror (src/metrics/scrape.ts) reads them. */
export interface EngineMetricNames {
  /** Counter of prompt tokens looked up in the prefix cache. */
  readonly prefixQueries?: string;
  /** Counter of prompt tokens served from it. */
  readonly prefixHits?: string;
  /** A hit-rate gauge, for engines that expose no counters (re-exported, never summed). */
  readonly hitRate?: string;
  /** A gauge whose `num_gpu_blocks` label is the KV capacity per rank. */
  readonly cacheConfig?: string;
}

export interface EngineAdapter {
  readonly name: EngineName;
  /** How the engine calls itself, for messages and docs. */
  readonly title: string;
  readonly events: EngineEvents;
  readonly pd: PdHandoff;
  readonly metrics: EngineMetricNames;
}
