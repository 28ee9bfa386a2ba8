/**
 * The mock vLLM engine: the composition root of its shell around the pure engine model (./engine/). Each piece has one
 * job: the rank loop steps the engines on their clocks (rank-loop.ts), the KV events go out over ZMQ (zmq.ts), vLLM's
 * metrics (metrics.ts), the OpenAI surface (openai.ts, responses.ts), faults (faults.ts), HTTP plumbing (http.ts). This
 * file wires them and owns the lifecycle: start, crash (die), restart in place, close.
 *
 * Several instances can run in one process: every socket, timer, registry and counter belongs to the instance.
 */
import type { ServerResponse } from 'node:http';
import { EngineMetrics } from './metrics.ts';
import { MockEngine, type EngineConfig } from './engine/index.ts';
import { FaultInjector } from './faults.ts';
import { MockHttpServer, type PostHandler } from './http.ts';
import { GENERATION_ROUTES, OpenAiSurface } from './openai.ts';
import { MockPd } from './disagg-side.ts';
import { Rank, RankLoop } from './rank-loop.ts';
import { loadHfTokenizer, SimpleTokenizer, type MockTokenizer } from './tokenizer.ts';
import type { MockerHandle, MockerOptions, MockerStats } from './types.ts';
import { TrtllmEventBuffer } from '../engines/trtllm/mock-events.ts';
import { KvEventPublisher } from './zmq.ts';

export type { MockerFaults, MockerHandle, MockerOptions, MockerStats } from './types.ts';

export async function startMocker(options: MockerOptions = {}): Promise<MockerHandle> {
  const model = options.model ?? 'mock-model';
  const host = options.host ?? '127.0.0.1';
  const speedup = options.speedup ?? 1;
  if (!(speedup > 0)) throw new RangeError(`speedup must be > 0, got ${speedup}`);
  const dp = options.dataParallelSize ?? 1;
  if (!Number.isInteger(dp) || dp < 1) throw new RangeError(`dataParallelSize must be a positive integer, got ${dp}`);
  const stats: MockerStats = {
    requests: 0,
    failedRequests: 0,
    badRequests: 0,
    publishedBatches: 0,
    droppedBatches: 0,
    replayRequests: 0,
    sendErrors: 0,
    traceparents: [],
  };
  const faults = new FaultInjector(options.faults, options.seed ?? 12345, stats);
  // Checked before anything is loaded or bound: a port clash is a start-up error, not a half-started instance.
  const trtllmEvents = options.eventFormat === 'trtllm';
  const zmq = new KvEventPublisher({
    endpoints: {
      events: options.zmqEndpoint === null || trtllmEvents ? null : (options.zmqEndpoint ?? `tcp://${host}:*`),
      connect: options.zmqConnect ?? false,
      replay: options.replayEndpoint,
      ranks: dp,
      host,
    },
    topic: options.topic ?? '',
    format: options.eventFormat === 'trtllm' || options.eventFormat === undefined ? 'map' : options.eventFormat,
    hashType: options.hashType ?? 'u64',
    batchLayout: options.batchLayout ?? 'array',
    bufferSteps: options.bufferSteps ?? 10_000,
    dropBatch: () => faults.dropBatch(),
    stats,
  });

  const tokenizer: MockTokenizer =
    typeof options.tokenizer === 'string'
      ? await loadHfTokenizer(options.tokenizer)
      : (options.tokenizer ?? new SimpleTokenizer(options.engine?.vocabSize ?? 32000));
  const engineCfg: Partial<EngineConfig> = { ...options.engine, vocabSize: options.engine?.vocabSize ?? tokenizer.vocabSize };
  const ranks = Array.from({ length: dp }, (_, r) => new Rank(r, new MockEngine(engineCfg)));
  const engines = ranks.map((r) => r.engine);
  const cfg = engines[0].config;
  const metrics = new EngineMetrics(model, engines, cfg);
  const trtllm = trtllmEvents
    ? new TrtllmEventBuffer({ ranks: dp, blockSize: cfg.blockSize, capacityBlocks: cfg.numGpuBlocks, bufferEvents: options.bufferSteps })
    : null;
  let dead = false;
  let closed = false;
  const loop = new RankLoop(ranks, {
    speedup,
    slowdown: () => faults.faults.slowdown,
    running: () => !closed && !dead,
    onEvents: (rank, events) => (trtllm ? trtllm.publish(rank, events) : zmq.publish(rank, events)),
    onFirstToken: (rank, s) => metrics.observeTtft(rank, s),
    onFinished: (rank, s) => metrics.observeE2e(rank, s),
  });
  let port = 0;
  const pd =
    options.pd && options.pd.role !== 'both'
      ? new MockPd(
          options.pd,
          host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host,
          () => port,
          speedup,
          `mock-${(options.seed ?? 12345).toString(16)}-${process.pid}-${Date.now() % 1e6}`,
          dp,
        )
      : null;
  const openai = new OpenAiSurface({
    model,
    loraModules: new Set(options.loraModules ?? []),
    tokenizer,
    config: cfg,
    loop,
    faults,
    promptTokensDetails: options.enablePromptTokensDetails ?? true,
    defaultMaxTokens: options.defaultMaxTokens ?? 16,
    pd: pd ?? undefined,
  });

  const surface = openai.routes();
  // The crash fault counts generation requests: request N+1 finds the instance dead.
  const counted =
    (handler: PostHandler): PostHandler =>
    async (req, res, body, raw) => {
      if (faults.countRequest()) {
        req.socket.destroy();
        await die();
        return;
      }
      await handler(req, res, body, raw);
    };
  const http = new MockHttpServer(
    host,
    {
      get: {
        ...surface.get,
        '/metrics': (_req, res) => metrics.serve(res),
        '/fault': (_req, res) => faults.show(res),
      },
      post: {
        ...surface.post,
        ...Object.fromEntries(GENERATION_ROUTES.map((r) => [r, counted(surface.post[r])])),
        '/fault': (_req, res, body) => faults.handle(res, body, { restart, die }),
        ...(trtllm ? { '/kv_cache_events': (_req: unknown, res: ServerResponse) => trtllm.drain(res) } : {}),
      },
    },
    (err) => {
      if (err.status === 400) stats.badRequests++;
    },
    (req) => {
      // The W3C trace context a router sent (tests check the engine saw the router's trace).
      const tp = req.headers.traceparent;
      if (typeof tp === 'string') {
        stats.traceparents.push(tp);
        if (stats.traceparents.length > 256) stats.traceparents.shift();
      }
    },
  );

  port = await http.listen(options.port ?? 0);
  try {
    await zmq.open();
    await pd?.open();
  } catch (err) {
    await http.close();
    zmq.close();
    await pd?.close();
    throw err;
  }

  /** In-flight requests dropped, engines and metrics reset, event seq back to 0 (a restart or a crash). */
  function dropInFlight(): void {
    loop.reset();
    zmq.reset();
    trtllm?.reset();
    metrics.reset();
    faults.restarted();
    pd?.reset();
  }

  async function die(): Promise<void> {
    if (dead || closed) return;
    dead = true;
    dropInFlight();
    zmq.close();
    await http.close();
  }

  async function restart(): Promise<void> {
    if (closed) throw new Error('mocker is closed');
    dropInFlight();
    if (dead) {
      await http.listen(port);
      await zmq.open();
      dead = false;
    }
  }

  async function close(): Promise<void> {
    if (closed) return;
    const wasDead = dead;
    dropInFlight();
    closed = true;
    zmq.close();
    await pd?.close();
    if (!wasDead) await http.close();
  }

  return {
    url: `http://${host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host}:${port}`,
    port,
    get zmqEndpoint() {
      return zmq.eventEndpoints[0] ?? null;
    },
    get replayEndpoint() {
      return zmq.replayEndpoints[0] ?? null;
    },
    get zmqEndpoints() {
      return zmq.eventEndpoints;
    },
    get replayEndpoints() {
      return zmq.replayEndpoints;
    },
    engine: engines[0],
    engines,
    faults: faults.faults,
    stats,
    get dead() {
      return dead;
    },
    pd,
    get bootstrapPort() {
      return pd?.bootstrapPort ?? null;
    },
    close,
    restart,
    die,
  };
}
