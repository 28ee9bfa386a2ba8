/**
 * `kvroute relay`'s settings: NATS, the engine it relays (worker id, event and replay endpoints, ranks, model, URL,
 * engine, role) and the stream's limits. Read from flags only (KVROUTE_* variables configure the router; the relay's
 * Kubernetes discovery settings are serve's, src/config/k8s.ts). The engine names come from the engine registry,
 * which sits above this folder: the command passes them in.
 */
import { z } from 'zod';
import { ENGINE_SIDE, zmqEndpoint } from './engine-side.ts';
import { namesText } from './parsers.ts';
import { ROUTING } from './routing.ts';
import { serveSchema } from './serve.ts';
import { bytes, choice, integer, optional, port, text, withDefault } from './settings.ts';

export function relaySchema<const E extends readonly [string, ...string[]]>(engines: E, defaultEngine: E[number]) {
  return z.strictObject({
    nats: optional(text(), { flag: '--nats <url>', env: '', help: 'NATS server URL(s), comma-separated (nats://host:4222)' }),
    worker: optional(text(), {
      flag: '--worker <id>',
      env: '',
      help: 'worker id, as the router names it ([A-Za-z0-9_-], no dots); required without --k8s-*',
    }),
    events: optional(zmqEndpoint({ connectable: true }), {
      flag: '--events <endpoint>',
      env: '',
      help:
        "rank 0's KV event endpoint (vLLM kv-events-config endpoint, connectable form); required without --k8s-*, " +
        'except for --flavor trtllm, whose events are polled from --url',
    }),
    replay: optional(zmqEndpoint({ connectable: true }), {
      flag: '--replay <endpoint>',
      env: '',
      help: "rank 0's replay endpoint (vLLM replay_endpoint); without it gaps reset the worker",
    }),
    dp: withDefault(integer({ min: 1 }), 1, { flag: '--dp <n>', env: '', help: 'data-parallel ranks (rank r uses the ports + r)' }),
    model: ENGINE_SIDE.model,
    url: optional(text(), {
      flag: '--url <url>',
      env: '',
      help: "the engine's OpenAI base URL (http://host:8000), published for the router's proxy",
    }),
    flavor: withDefault(choice(engines), defaultEngine as never, {
      flag: '--flavor <name>',
      env: '',
      help: `the engine (${namesText(engines)}): its event layout; trtllm without --events polls --url's POST /kv_cache_events`,
    }),
    role: ENGINE_SIDE.role,
    bootstrapPort: optional(port(1), {
      flag: '--bootstrap-port <n>',
      env: '',
      help: 'SGLang prefill workers: the bootstrap port, published in the registry',
    }),
    topic: ENGINE_SIDE.topic,
    heartbeatMs: withDefault(integer({ min: 1 }), 2000, {
      flag: '--heartbeat-ms <n>',
      env: '',
      help: 'registry heartbeat period',
    }),
    maxAgeS: withDefault(integer({ min: 1 }), 3600, {
      flag: '--max-age-s <n>',
      env: '',
      help: 'stream retention by age (when the stream is created)',
    }),
    maxBytes: withDefault(bytes(), 1024 ** 3, {
      flag: '--max-bytes <n>',
      env: '',
      help: 'stream retention by size, e.g. 1gb (when the stream is created)',
    }),
    replicas: withDefault(integer({ min: 1 }), 1, {
      flag: '--replicas <n>',
      env: '',
      help: 'JetStream replicas of the stream and buckets (when created)',
    }),
    statsEveryS: withDefault(integer({ min: 1 }), 60, {
      flag: '--stats-every-s <n>',
      env: '',
      help: 'log publishing counters this often',
    }),
    logLevel: serveSchema.shape.logLevel,
    blockSize: ROUTING.blockSize,
  });
}
