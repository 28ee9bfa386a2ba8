/**
 * The routing composition every front end shares: the core (KvRouter + Dispatcher), the shells around it (workers and
 * their probes, KV event ingestion, the tokenizer, the engine metrics mirror) and the metrics registry. `kvroute serve`
 * puts its HTTP listeners in front of it (app.ts), `kvroute epp` its ext_proc gRPC server (src/epp/); both then make
 * the same decisions from the same settings, and a NATS replica attaches to either (nats.ts).
 */
import pino, { type Logger } from 'pino';
import { Dispatcher } from '../core/dispatch/dispatcher.ts';
import { KvRouter } from '../core/router.ts';
import { parseSourceKey } from '../core/types.ts';
import { dispatchOptionsFrom, routerOptionsFrom } from '../config/routing.ts';
import type { ServeConfig } from '../config/serve.ts';
import { FlowMetrics } from '../metrics/flow.ts';
import { PdMetrics } from '../metrics/disagg.ts';
import { registerMrcGauges } from '../metrics/mrc.ts';
import { registerTableGauges, registerTokenizerGauges, sumCaches, type TokenizerCacheGauges } from '../metrics/memory.ts';
import { RecordMetrics } from '../metrics/record.ts';
import { RouterMetrics } from '../metrics/registry.ts';
import type { EngineMirror } from '../metrics/scrape.ts';
import { LocalTokenizer } from '../tokenizer/local.ts';
import { RemoteTokenizer } from '../tokenizer/remote.ts';
import { inlineTokenizer, type TokenizerService, threadTokenizer } from '../tokenizer/service.ts';
import { ServerEvents } from './events.ts';
import { Lifecycle } from './lifecycle.ts';
import { MrcFeed } from './mrc-feed.ts';
import { TrafficRecorder } from './recorder.ts';
import { LOG_REDACT_PATHS } from './security/index.ts';
import { type Worker, WorkerSet } from './workers.ts';

export interface ComposeOptions {
  readonly logger?: Logger;
  /** The front end, named in a --record file's header (default serve). */
  readonly frontEnd?: 'serve' | 'epp';
  /** Pre-loaded tokenizer (tests share one instead of loading per server). */
  readonly tokenizer?: LocalTokenizer | null;
}

export interface RouterCore {
  readonly config: ServeConfig;
  readonly log: Logger;
  readonly router: KvRouter;
  readonly dispatcher: Dispatcher;
  readonly lifecycle: Lifecycle;
  readonly workers: WorkerSet;
  readonly metrics: RouterMetrics;
  readonly flowMetrics: FlowMetrics;
  readonly pd: PdMetrics;
  readonly events: ServerEvents;
  /** The miss-ratio curves (null with --mrc-sample-rate 0). */
  readonly mrc: MrcFeed | null;
  /** The traffic recorder (--record FILE), null when off. */
  readonly recorder: TrafficRecorder | null;
  /** The local tokenizer, when the mode is local. */
  readonly tokenizer: TokenizerService | null;
  /** The engines tokenize (render endpoints or /tokenize), when the mode says so. */
  readonly remote: RemoteTokenizer | null;
  /**
   * More tokenizer caches the router_tokenizer_cache_* series add to this process's own (the HTTP shells' of
   * --processes): each read at scrape time.
   */
  readonly tokenizerCaches: Set<() => Promise<TokenizerCacheGauges | undefined>>;
  /** The worker the engines' tokenizer is asked on for a model (the dispatcher's pass-through choice), if any. */
  tokenizingWorker(model: string): Promise<Worker | undefined>;
  /** Refuses queued requests and stops every shell (probes, ingestion, tokenizer, mirror, metrics). */
  close(): Promise<void>;
}

export async function buildTokenizer(config: ServeConfig, options: ComposeOptions, log: Logger): Promise<TokenizerService | null> {
  if (options.tokenizer) return inlineTokenizer(options.tokenizer);
  if (!config.tokenizerDir) return null;
  const cacheBytes = Math.floor(config.tokenizerCacheMb * 2 ** 20);
  const tokenizer =
    config.tokenizerThreads > 0
      ? await threadTokenizer(config.tokenizerDir, { cacheBytes })
      : inlineTokenizer(await LocalTokenizer.load(config.tokenizerDir, { cacheBytes }));
  log.info({ dir: config.tokenizerDir, mode: tokenizer.kind, ...(await tokenizer.info()) }, 'loaded tokenizer');
  return tokenizer;
}

export async function composeRouter(config: ServeConfig, options: ComposeOptions = {}): Promise<RouterCore> {
  const log = options.logger ?? pino({ level: config.logLevel, base: undefined, redact: LOG_REDACT_PATHS });
  // The one mapping from settings to the core's options (the simulator uses it too, src/cli/sim.ts).
  const router = new KvRouter({ ...routerOptionsFrom(config), clock: () => performance.now() });
  const dispatcher = new Dispatcher(router, dispatchOptionsFrom(config));
  const metrics = new RouterMetrics({ router, prefix: config.metricsPrefix });
  const flowMetrics = new FlowMetrics(metrics.registry, metrics.prefix, () => dispatcher.census(), [
    ...Object.keys(config.tenantWeights ?? {}),
    ...Object.keys(config.tenantTokenBudgets ?? {}).filter((t) => t !== '*'),
  ]);
  const pd = new PdMetrics(
    metrics.registry,
    config.metricsPrefix,
    () => dispatcher.pdStats,
    () => dispatcher.workers().flatMap((w) => w.sourceKeys.map((sourceKey) => ({ sourceKey, role: w.role }))),
  );
  metrics.setDecodeSources((key) => dispatcher.worker(parseSourceKey(key).workerId)?.role === 'decode');
  const lifecycle = new Lifecycle(dispatcher, metrics, flowMetrics, log);
  const mrc =
    config.mrcSampleRate > 0
      ? new MrcFeed(lifecycle, router, {
          sampleRate: config.mrcSampleRate,
          maxSamples: config.mrcMaxSamples,
          halfLifeRequests: config.mrcHalfLife,
        })
      : null;
  if (mrc) registerMrcGauges(metrics.registry, metrics.prefix, mrc, config.mrcSampleRate, config.mrcMaxSamples);
  const recorder = config.record
    ? new TrafficRecorder(
        {
          path: config.record,
          maxBytes: config.recordMaxBytes,
          files: config.recordFiles,
          bufferBytes: config.recordBufferBytes,
          blockSize: config.blockSize,
          source: options.frontEnd ?? 'serve',
        },
        new RecordMetrics(metrics.registry, metrics.prefix),
        log,
      )
    : null;
  recorder?.attach(lifecycle);
  // --tokenizer-mode: local needs --tokenizer; render and remote ask the engines (and ignore local files).
  const mode = config.tokenizerMode ?? (config.tokenizerDir || options.tokenizer ? 'local' : config.remoteTokenize ? 'remote' : null);
  if (mode === 'local' && !config.tokenizerDir && !options.tokenizer) {
    throw new Error("--tokenizer-mode local needs --tokenizer <dir> (the model's tokenizer.json and tokenizer_config.json)");
  }
  const tokenizer = mode === 'local' ? await buildTokenizer(config, options, log) : null;
  const remote =
    mode === 'render' || mode === 'remote'
      ? new RemoteTokenizer({ mode: mode === 'render' ? 'render' : 'tokenize', cacheBytes: Math.floor(config.tokenizerCacheMb * 2 ** 20) })
      : null;
  registerTableGauges(metrics.registry, metrics.prefix, dispatcher);
  const tokenizerCaches = new Set<() => Promise<TokenizerCacheGauges | undefined>>();
  registerTokenizerGauges(metrics.registry, metrics.prefix, async () => {
    const own = (tokenizer ? (await tokenizer.info()).cache : remote?.cacheInfo) as TokenizerCacheGauges | undefined;
    if (tokenizerCaches.size === 0) return own;
    return sumCaches([own, ...(await Promise.all([...tokenizerCaches].map((read) => read().catch(() => undefined))))]);
  });
  const events = new ServerEvents(router, metrics, log, config.blockSize);

  const workers = new WorkerSet(
    dispatcher,
    {
      intervalMs: config.healthIntervalMs,
      timeoutMs: config.healthTimeoutMs,
      ejectAfter: config.ejectAfter,
      upstreamTimeoutMs: config.upstreamTimeoutMs,
    },
    {
      onEffects: (effects) => lifecycle.apply(effects),
      onAdded: (w) => events.added(w),
      onRemoved: (w) => events.removed(w),
      onHealthChange: (w, healthy) => {
        for (const k of w.sourceKeys) metrics.setHealthy(k, healthy);
        if (healthy) log.info({ worker: w.id }, 'worker healthy again: readmitted');
        else log.warn({ worker: w.id, error: w.lastProbeError }, 'worker failed health checks: ejected');
      },
    },
  );
  try {
    for (const spec of config.workers) await workers.add(spec);
  } catch (err) {
    await Promise.all([events.close(), tokenizer?.close(), workers.destroy()]);
    metrics.stop();
    throw err;
  }
  workers.startHealthChecks();

  // Engine-side prefix-cache counters mirrored next to the router's own (the honest comparison of hit rates); the
  // engine's KV capacity learned on the way feeds the kv-pressure policy (unless blocks= says otherwise).
  const mirror: EngineMirror | null =
    config.engineMetricsIntervalMs > 0
      ? metrics.mirrorEngines({
          targets: () => workers.list().map((w) => ({ workerId: w.id, url: w.url })),
          intervalMs: config.engineMetricsIntervalMs,
          onCapacity: (workerId, numGpuBlocks) => dispatcher.learnCapacity(workerId, numGpuBlocks),
        })
      : null;

  let closed: Promise<void> | null = null;
  const close = (): Promise<void> => {
    closed ??= (async () => {
      lifecycle.close();
      await recorder?.close();
      await mirror?.stop();
      await tokenizer?.close();
      await workers.destroy();
      await events.close();
      metrics.stop();
    })();
    return closed;
  };
  const tokenizingWorker = async (model: string): Promise<Worker | undefined> => {
    const target = dispatcher.passthroughTarget(model, Date.now());
    return 'workerId' in target ? workers.get(target.workerId) : undefined;
  };
  return {
    config,
    log,
    router,
    dispatcher,
    lifecycle,
    workers,
    metrics,
    flowMetrics,
    pd,
    events,
    mrc,
    recorder,
    tokenizer,
    remote,
    tokenizerCaches,
    tokenizingWorker,
    close,
  };
}
