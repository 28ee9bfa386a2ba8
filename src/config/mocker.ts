/**
 * `kvroute mocker`'s settings: HTTP listener, cache and scheduler, step timing, KV events, P/D handoff and faults.
 * Read from flags only (KVROUTE_* variables configure the router, not a mock engine). What the mock engine and the
 * engine registry define (engine names, P/D releases, timing defaults, hybrid layouts) sits above this folder: the
 * command passes it in.
 */
import { z } from 'zod';
import { ENGINE_SIDE, triple, zmqEndpoint } from './engine-side.ts';
import { ROUTING } from './routing.ts';
import { serveSchema } from './serve.ts';
import { choice, custom, flag, integer, list, number, optional, port, redefault, text, withDefault } from './settings.ts';

type Names = readonly [string, ...string[]];
type Coefficients = [number, number, number];

/** What the mocker's settings take from the layers above config. */
export interface MockerFacts<E extends Names, T extends Names, S extends Names, G> {
  readonly engines: E;
  readonly defaultEngine: E[number];
  readonly trtllmReleases: T;
  readonly sglangDpRoutings: S;
  readonly polynomial: { readonly prefill: readonly number[]; readonly decode: readonly number[]; readonly decodeMinMs: number };
  readonly firstPrinciples: {
    readonly params: number;
    readonly layers: number;
    readonly attnWidth: number;
    readonly bytesPerWeight: number;
    readonly kvBytesPerToken: number;
    readonly gpus: number;
    readonly peakFlops: number;
    readonly mfu: number;
    readonly hbmBandwidth: number;
    readonly memEfficiency: number;
    readonly c0Ms: number;
    readonly c1Ms: number;
  };
  readonly hybridPresets: readonly string[];
  /** Layout text -> cache groups; throws with a message naming what is wrong. */
  readonly parseHybrid: (text: string) => G;
}

const fp = (key: string, value: number, help: string, min: number, max?: number) =>
  withDefault(number({ min, max }), value, { flag: `--fp-${key} <${max === 1 ? 'x' : 'n'}>`, env: '', help: `first-principles: ${help}` });

/** HTTP listener, served names, block size, cache and scheduler limits. */
const SERVING = {
  port: redefault(serveSchema.shape.port, 8100, { flag: '--port <n>', help: 'HTTP port (0 = a free port)' }),
  host: redefault(serveSchema.shape.host, '0.0.0.0', { help: 'HTTP listen address' }),
  model: redefault(ENGINE_SIDE.model, 'mock-model'),
  loraModules: optional(list(z.string().min(1), { accepts: 'adapter names' }), {
    flag: '--lora-modules <names...>',
    env: '',
    help: 'LoRA adapter names also served; a request naming one runs under that lora_name',
  }),
  blockSize: ROUTING.blockSize,
  numGpuBlocks: withDefault(integer({ min: 1 }), 16384, { flag: '--num-gpu-blocks <n>', env: '', help: 'KV blocks in the cache' }),
  maxNumSeqs: withDefault(integer({ min: 1 }), 256, { flag: '--max-num-seqs <n>', env: '', help: 'max running requests per step' }),
  maxNumBatchedTokens: withDefault(integer({ min: 1 }), 8192, {
    flag: '--max-num-batched-tokens <n>',
    env: '',
    help: 'token budget per step (prefill is chunked to fit)',
  }),
  maxModelLen: withDefault(integer({ min: 1 }), 32768, { flag: '--max-model-len <n>', env: '', help: 'max prompt + output tokens' }),
  enablePrefixCaching: withDefault(flag(), true, {
    flag: '--no-enable-prefix-caching',
    env: '',
    help: 'disable prefix caching (no hits, no events)',
  }),
};

/** The step timing models, their defaults the engine's. */
function timingSettings(
  P: MockerFacts<Names, Names, Names, unknown>['polynomial'],
  F: MockerFacts<Names, Names, Names, unknown>['firstPrinciples'],
) {
  return {
    timing: withDefault(choice(['polynomial', 'first-principles']), 'polynomial', {
      flag: '--timing <model>',
      env: '',
      help: 'step timing model (docs/protocols.md §7)',
    }),
    prefillPoly: withDefault(triple(), [...P.prefill] as Coefficients, {
      flag: '--prefill-poly <a2,a1,a0>',
      env: '',
      help: 'polynomial: prefill_ms = a2·T² + a1·T + a0 (T = new prefill tokens)',
    }),
    decodePoly: withDefault(triple(), [...P.decode] as Coefficients, {
      flag: '--decode-poly <b2,b1,b0>',
      env: '',
      help: 'polynomial: decode_ms = max(min, b2·p² + b1·p + b0) (p = KV usage)',
    }),
    decodeMinMs: withDefault(number({ min: 0 }), P.decodeMinMs, {
      flag: '--decode-min-ms <ms>',
      env: '',
      help: 'polynomial: decode step floor',
    }),
    fpParams: fp('params', F.params, 'model parameters', 1),
    fpLayers: fp('layers', F.layers, 'layers', 1),
    fpAttnWidth: fp('attn-width', F.attnWidth, 'attention width d', 1),
    fpBytesPerWeight: fp('bytes-per-weight', F.bytesPerWeight, 'bytes per weight', 0),
    fpKvBytesPerToken: fp('kv-bytes-per-token', F.kvBytesPerToken, 'KV bytes per context token', 0),
    fpGpus: fp('gpus', F.gpus, 'GPUs', 1),
    fpPeakFlops: fp('peak-flops', F.peakFlops, 'peak FLOP/s per GPU', 1),
    fpMfu: fp('mfu', F.mfu, 'model FLOPs utilisation', 0.001, 1),
    fpHbmBandwidth: fp('hbm-bandwidth', F.hbmBandwidth, 'HBM bytes/s per GPU', 1),
    fpMemEfficiency: fp('mem-efficiency', F.memEfficiency, 'achieved fraction of HBM bandwidth', 0.001, 1),
    fpC0Ms: withDefault(number({ min: 0 }), F.c0Ms, {
      flag: '--fp-c0-ms <ms>',
      env: '',
      help: 'first-principles: fixed prefill step cost',
    }),
    fpC1Ms: withDefault(number({ min: 0 }), F.c1Ms, { flag: '--fp-c1-ms <ms>', env: '', help: 'first-principles: fixed decode step cost' }),
  };
}

/** Speed, KV events and replay, the HTTP API's details. */
const EVENTS = {
  speedup: withDefault(number({ min: 1e-6 }), 1, {
    flag: '--speedup <x>',
    env: '',
    help: 'run this many times faster than modelled time',
  }),
  zmqEndpoint: withDefault(zmqEndpoint({ none: true }), 'tcp://*:5557', {
    flag: '--zmq-endpoint <ep>',
    env: '',
    help: 'KV events PUB endpoint (bound; "none" disables); rank r uses port + r',
  }),
  zmqConnect: withDefault(flag(), false, {
    flag: '--zmq-connect',
    env: '',
    help: "connect the PUB socket to --zmq-endpoint instead of binding (vLLM connects when the endpoint has no '*'; the router binds a SUB)",
  }),
  replayEndpoint: optional(zmqEndpoint({ none: true }), {
    flag: '--replay-endpoint <ep>',
    env: '',
    help:
      'replay ROUTER endpoint (bound; "none" disables); rank r uses port + r. Default: the ports right after the event ports, ' +
      'event port + data-parallel size (tcp://*:5558 for one rank on 5557), so N ranks take 2N consecutive ports and ' +
      'mockers whose --zmq-endpoint ports are 2N apart never collide',
  }),
  topic: ENGINE_SIDE.topic,
  eventFormat: withDefault(choice(['array', 'map', 'trtllm']), 'map', {
    flag: '--event-format <fmt>',
    env: '',
    help:
      'event layout: map (tagged, vLLM >= June 2026) or array (legacy positional) over ZMQ, or trtllm (TensorRT-LLM JSON ' +
      'events drained by POST /kv_cache_events, no ZMQ)',
  }),
  hashType: withDefault(choice(['u64', 'bytes', 'i64']), 'u64', {
    flag: '--hash-type <type>',
    env: '',
    help: 'block id wire type: u64 (vLLM default), bytes (32-byte sha256), i64 (SGLang)',
  }),
  batchLayout: withDefault(choice(['array', 'map']), 'array', {
    flag: '--batch-layout <layout>',
    env: '',
    help: 'outer batch layout (vLLM 0.26 sends array)',
  }),
  dataParallelSize: withDefault(integer({ min: 1 }), 1, {
    flag: '--data-parallel-size <n>',
    env: '',
    help: 'data-parallel ranks (one engine each; header x-data-parallel-rank picks one)',
  }),
  bufferSteps: withDefault(integer({ min: 1 }), 10000, {
    flag: '--buffer-steps <n>',
    env: '',
    help: 'event batches kept for replay per rank',
  }),
  tokenizer: optional(text(), {
    flag: '--tokenizer <dir>',
    env: '',
    help: 'directory with tokenizer.json and tokenizer_config.json (default: a deterministic word tokenizer)',
  }),
  promptTokensDetails: withDefault(flag(), true, {
    flag: '--no-prompt-tokens-details',
    env: '',
    help: 'omit usage.prompt_tokens_details.cached_tokens (vLLM without --enable-prompt-tokens-details)',
  }),
  defaultMaxTokens: withDefault(integer({ min: 1 }), 16, {
    flag: '--default-max-tokens <n>',
    env: '',
    help: 'max_tokens when a request sets none',
  }),
};

/** Injected faults (also changed at run time: POST /fault). */
const FAULTS = {
  seed: redefault(ROUTING.seed, 0, { help: 'seed of output tokens and fault dice' }),
  dropEventFraction: withDefault(number({ min: 0, max: 1 }), 0, {
    flag: '--drop-event-fraction <x>',
    env: '',
    help: 'fault: fraction of event batches not sent (still replayable)',
  }),
  failRequestFraction: withDefault(number({ min: 0, max: 1 }), 0, {
    flag: '--fail-request-fraction <x>',
    env: '',
    help: 'fault: fraction of requests answered 500',
  }),
  dieAfterRequests: optional(integer({ min: 0 }), {
    flag: '--die-after-requests <n>',
    env: '',
    help: 'fault: crash (close every socket) when request n+1 arrives',
  }),
  slowdown: withDefault(number({ min: 1e-6 }), 1, { flag: '--slowdown <x>', env: '', help: 'fault: steps take x times longer' }),
};

/** Disaggregated serving: the role, the handoff protocol and its releases, transfer and bootstrap. */
function pdSettings<const E extends Names, const T extends Names, const S extends Names>(f: MockerFacts<E, T, S, unknown>) {
  return {
    role: redefault(ENGINE_SIDE.role, 'both'),
    pdProtocol: withDefault(choice(f.engines), f.defaultEngine as never, {
      flag: '--pd-protocol <name>',
      env: '',
      help: "the handoff protocol of --role: vLLM's NixlConnector flow, SGLang's bootstrap or TensorRT-LLM's disaggregated_params",
    }),
    pdTrtllmParams: withDefault(choice(f.trtllmReleases), 'current' as never, {
      flag: '--pd-trtllm-params <release>',
      env: '',
      help:
        'TensorRT-LLM: the DisaggregatedParams fields the server knows: current (openai_protocol.py @0076e9390e1e), disagg-id ' +
        '(disagg_request_id but no ctx_usage) or basic (the five fields of older releases); others are refused as extra',
    }),
    pdSglangDpRouting: withDefault(choice(f.sglangDpRoutings), 'header' as never, {
      flag: '--pd-sglang-dp-routing <release>',
      env: '',
      help:
        'SGLang: what picks the DP rank, as a release reads it: header (x-data-parallel-rank, then routed_dp_rank; sglang#19832), ' +
        'body (routed_dp_rank, disagg_prefill_dp_rank; #19268), legacy-body (data_parallel_rank; #6884) or room ' +
        '(bootstrap_room mod the DP size only)',
    }),
    kvLeaseMs: withDefault(integer({ min: 0 }), 30_000, {
      flag: '--kv-lease-ms <ms>',
      env: '',
      help: 'vLLM prefill: how long finished blocks wait for the decode side (kv_lease_duration)',
    }),
    kvLoadFailurePolicy: withDefault(choice(['fail', 'recompute']), 'fail', {
      flag: '--kv-load-failure-policy <p>',
      env: '',
      help: 'vLLM decode: a KV load that fails is an error (fail) or recomputed here',
    }),
    kvTransferBandwidth: withDefault(number({ min: 1 }), 50e9, {
      flag: '--kv-transfer-bandwidth <bytes/s>',
      env: '',
      help: 'P/D: KV transfer bandwidth in bytes per second (transfer time = bytes / this)',
    }),
    kvBytesPerToken: optional(number({ min: 1 }), {
      flag: '--kv-bytes-per-token <n>',
      env: '',
      help: "P/D: KV bytes per token moved (default: the timing model's, 147456 for an 8B model)",
    }),
    bootstrapPort: withDefault(port(), 8998, {
      flag: '--bootstrap-port <n>',
      env: '',
      help: 'SGLang prefill: bootstrap server port (--disaggregation-bootstrap-port; 0 = a free port)',
    }),
    bootstrapTimeoutMs: withDefault(integer({ min: 1 }), 300_000, {
      flag: '--bootstrap-timeout-ms <ms>',
      env: '',
      help: "SGLang: the prefill's bootstrap and the decode's waiting timeout",
    }),
  };
}

export function mockerSchema<const E extends Names, const T extends Names, const S extends Names, G>(f: MockerFacts<E, T, S, G>) {
  const hybrid = custom(
    z.string().transform((t, ctx): G => {
      try {
        return f.parseHybrid(t);
      } catch (err) {
        ctx.addIssue({ code: 'custom', message: (err as Error).message });
        return z.NEVER;
      }
    }),
    'a hybrid layout',
    { detailed: true, range: '' },
  );
  return z.strictObject({
    ...SERVING,
    hybrid: optional(hybrid, {
      flag: '--hybrid <layout>',
      env: '',
      help:
        `hybrid attention: KV-cache groups published apart (group_idx, kv_cache_spec_kind, sliding window), hits as vLLM's ` +
        `hybrid allocator gives them; a preset (${f.hybridPresets.join(', ')}) or groups in order, e.g. full,sliding:128,mamba`,
    }),
    ...timingSettings(f.polynomial, f.firstPrinciples),
    ...EVENTS,
    ...FAULTS,
    ...pdSettings(f),
  });
}
