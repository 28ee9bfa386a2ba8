/**
 * SGLang: KV events over ZMQ with replay in SGLang's own layout (./events.ts), the bootstrap handoff (./handoff.ts),
 * and its cache-hit-rate gauge (SGLang exposes no prefix-cache counters).
 */
import type { EngineAdapter } from '../adapter.ts';
import { sglangHandoff } from './handoff.ts';

export const sglang: EngineAdapter = {
  name: 'sglang',
  title: 'SGLang',
  events: { zmqWire: 'sglang', httpPoll: false, replay: true },
  pd: sglangHandoff,
  metrics: { hitRate: 'sglang:cache_hit_rate' },
};
