/**
 * vLLM: KV events over ZMQ with replay (./events.ts; vllm/distributed/kv_events.py), the NixlConnector handoff
 * (./handoff.ts), and the v1 engine's prefix-cache counters.
 */
import type { EngineAdapter } from '../adapter.ts';
import { vllmHandoff } from './handoff.ts';

export const vllm: EngineAdapter = {
  name: 'vllm',
  title: 'vLLM',
  events: { zmqWire: 'vllm', httpPoll: false, replay: true },
  pd: vllmHandoff,
  metrics: {
    prefixQueries: 'vllm:prefix_cache_queries_total',
    prefixHits: 'vllm:prefix_cache_hits_total',
    cacheConfig: 'vllm:cache_config_info',
  },
};
