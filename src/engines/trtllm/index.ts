/**
 * TensorRT-LLM: KV events polled from trtllm-serve's POST /kv_cache_events (./events.ts decodes them,
 * src/transport/trtllm-poll.ts polls), or over ZMQ in vLLM's layout when a publisher is named (`events=`, no replay);
 * the disaggregated_params handoff (./handoff.ts); no prefix-cache metrics are mirrored (none verified).
 */
import type { EngineAdapter } from '../adapter.ts';
import { trtllmHandoff } from './handoff.ts';

export const trtllm: EngineAdapter = {
  name: 'trtllm',
  title: 'TensorRT-LLM',
  events: { zmqWire: 'vllm', httpPoll: true, replay: false },
  pd: trtllmHandoff,
  metrics: {},
};
