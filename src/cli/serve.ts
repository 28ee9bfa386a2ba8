/** `kvroute serve`: the OpenAI-compatible KV-aware router. */
import { type Command, Option } from 'commander';
import pino from 'pino';
import { POLICY_NAMES } from '../core/scheduling/policies.ts';
import { type RunningServer, startServer } from '../server/app.ts';
import { DEFAULTS, loadConfigFile, parseWorkerSpec, type ServeConfig, type WorkerSpec } from '../server/config.ts';
import { LOG_REDACT_PATHS, parseRateLimit } from '../server/security/index.ts';
import { bundledTokenizerDir, startEmbeddedFleet, type EmbeddedFleet } from '../mocker/embedded.ts';

function int(name: string, min = 0) {
  return (v: string): number => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min) throw new Error(`${name} must be an integer >= ${min}, got "${v}"`);
    return n;
  };
}

function num(name: string, min = 0) {
  return (v: string): number => {
    const n = Number(v);
    if (!Number.isFinite(n) || n < min) throw new Error(`${name} must be a number >= ${min}, got "${v}"`);
    return n;
  };
}

/** 32mb, 512k, 1048576 -> bytes. */
function bytes(v: string): number {
  const m = /^(\d+(?:\.\d+)?)\s*(b|k|kb|m|mb|g|gb)?$/i.exec(v.trim());
  if (!m) throw new Error(`--body-limit must be a size like 32mb, 512kb or 1048576, got "${v}"`);
  const mult = { b: 1, k: 1024, kb: 1024, m: 1024 ** 2, mb: 1024 ** 2, g: 1024 ** 3, gb: 1024 ** 3 }[(m[2] ?? 'b').toLowerCase()]!;
  return Math.floor(Number(m[1]) * mult);
}

/** --worker may repeat; KVROUTE_WORKERS holds several specs separated by whitespace or ';'. */
function collectWorkers(v: string, prev: WorkerSpec[] = []): WorkerSpec[] {
  const specs = v.split(/[\s;]+/).filter(Boolean);
  return [...prev, ...specs.map(parseWorkerSpec)];
}

/** Flag name -> ServeConfig key, for the precedence merge. */
const KEYS: Array<[string, keyof ServeConfig]> = [
  ['host', 'host'],
  ['port', 'port'],
  ['blockSize', 'blockSize'],
  ['policy', 'policy'],
  ['prefillLoadScale', 'prefillLoadScale'],
  ['overlapCredit', 'overlapCredit'],
  ['temperature', 'temperature'],
  ['seed', 'seed'],
  ['busyKvFraction', 'busyKvFraction'],
  ['busyPrefillTokens', 'busyPrefillTokens'],
  ['queueLimit', 'queueLimit'],
  ['queueTimeoutMs', 'queueTimeoutMs'],
  ['retries', 'retries'],
  ['bodyLimit', 'bodyLimitBytes'],
  ['tokenizer', 'tokenizerDir'],
  ['tokenizerThreads', 'tokenizerThreads'],
  ['remoteTokenize', 'remoteTokenize'],
  ['adminToken', 'adminToken'],
  ['healthIntervalMs', 'healthIntervalMs'],
  ['healthTimeoutMs', 'healthTimeoutMs'],
  ['ejectAfter', 'ejectAfter'],
  ['breakerThreshold', 'breakerThreshold'],
  ['breakerCooldownMs', 'breakerCooldownMs'],
  ['shutdownGraceMs', 'shutdownGraceMs'],
  ['metricsPrefix', 'metricsPrefix'],
  ['engineMetricsIntervalMs', 'engineMetricsIntervalMs'],
  ['logLevel', 'logLevel'],
  ['upstreamTimeoutMs', 'upstreamTimeoutMs'],
  ['apiKey', 'apiKeys'],
  ['apiKeyFile', 'apiKeyFile'],
  ['rateLimit', 'rateLimit'],
  ['allowWorkerHosts', 'allowWorkerHosts'],
  ['headerTimeoutMs', 'headerTimeoutMs'],
  ['bodyTimeoutMs', 'bodyTimeoutMs'],
  ['maxJsonDepth', 'maxJsonDepth'],
  ['clientStallTimeoutMs', 'clientStallTimeoutMs'],
  ['tierCredit', 'tierCredit'],
];

function collectList(v: string, prev: string[] = []): string[] {
  return [...prev, ...v.split(/[\s,]+/).filter(Boolean)];
}

export function registerServe(program: Command): void {
  const d = DEFAULTS;
  const opt = (flags: string, desc: string, env: string) => new Option(flags, desc).env(env);
  program
    .command('serve')
    .summary('run the OpenAI-compatible KV-cache-aware router')
    .description(
      'Serve POST /v1/chat/completions and /v1/completions (streaming and not), routing each request to the worker ' +
        "that already holds its prompt prefix (KV events when a worker publishes them, the router's own decisions " +
        'otherwise). Also GET /v1/models, /health, /metrics, /debug/state, and POST/DELETE /admin/workers with ' +
        '--admin-token. Without workers, starts an embedded fleet of mock engines so the endpoint works at once.\n\n' +
        'Precedence: flag > KVROUTE_* environment variable > --config file > default.',
    )
    .addOption(
      opt(
        '-w, --worker <spec>',
        'engine to route to (repeatable): URL[,events=tcp://host:port][,replay=tcp://host:port][,dp=N][,model=NAME][,id=NAME][,blocks=N][,engine=vllm|sglang]. ' +
          'events= enables KV-event routing (vLLM --kv-events-config publisher endpoint); without it the worker runs in approximate mode',
        'KVROUTE_WORKERS',
      ).argParser(collectWorkers),
    )
    .addOption(
      opt('-c, --config <file>', 'YAML or JSON config file with the same settings (camelCase keys, "workers" list)', 'KVROUTE_CONFIG'),
    )
    .addOption(opt('--host <addr>', 'listen address', 'KVROUTE_HOST').default(d.host))
    .addOption(opt('-p, --port <n>', 'listen port (0 = any free port)', 'KVROUTE_PORT').argParser(int('--port')).default(d.port))
    .addOption(
      opt('-b, --block-size <n>', "KV block size in tokens; must equal the engines' block size", 'KVROUTE_BLOCK_SIZE')
        .argParser(int('--block-size', 1))
        .default(d.blockSize),
    )
    .addOption(
      opt('--policy <name>', 'routing policy', 'KVROUTE_POLICY')
        .choices([...POLICY_NAMES])
        .default(d.policy),
    )
    .addOption(
      opt('--prefill-load-scale <x>', 'kv policy: weight of prefill load against decode load', 'KVROUTE_PREFILL_LOAD_SCALE')
        .argParser(num('--prefill-load-scale'))
        .default(d.prefillLoadScale),
    )
    .addOption(
      opt('--overlap-credit <x>', 'kv policy: prefill blocks saved per cached block', 'KVROUTE_OVERLAP_CREDIT')
        .argParser(num('--overlap-credit'))
        .default(d.overlapCredit),
    )
    .addOption(
      opt('--temperature <x>', 'kv policy: 0 picks the cheapest worker, >0 samples a softmax over costs', 'KVROUTE_TEMPERATURE')
        .argParser(num('--temperature'))
        .default(d.temperature),
    )
    .addOption(
      opt('--seed <n>', "seed of the router's random choices (ties, temperature)", 'KVROUTE_SEED').argParser(int('--seed')).default(d.seed),
    )
    .addOption(
      opt(
        '--busy-kv-fraction <x>',
        'a worker is busy above this fraction of its KV blocks in active use (needs blocks= on the worker)',
        'KVROUTE_BUSY_KV_FRACTION',
      ).argParser(num('--busy-kv-fraction')),
    )
    .addOption(
      opt(
        '--busy-prefill-tokens <n>',
        'a worker is busy with more active prefill tokens than this',
        'KVROUTE_BUSY_PREFILL_TOKENS',
      ).argParser(int('--busy-prefill-tokens')),
    )
    .addOption(
      opt('--queue-limit <n>', 'requests waiting while all workers are busy; beyond: 503 + Retry-After', 'KVROUTE_QUEUE_LIMIT')
        .argParser(int('--queue-limit'))
        .default(d.queueLimit),
    )
    .addOption(
      opt('--queue-timeout-ms <ms>', 'longest wait in the queue before 503 + Retry-After', 'KVROUTE_QUEUE_TIMEOUT_MS')
        .argParser(int('--queue-timeout-ms', 1))
        .default(d.queueTimeoutMs),
    )
    .addOption(
      opt('--retries <n>', 'retries on the next-best worker after a connection error or 5xx before the first byte', 'KVROUTE_RETRIES')
        .argParser(int('--retries'))
        .default(d.retries),
    )
    .addOption(
      opt('--body-limit <size>', 'largest request body (413 beyond), e.g. 32mb', 'KVROUTE_BODY_LIMIT')
        .argParser(bytes)
        .default(d.bodyLimitBytes, '32mb'),
    )
    .addOption(
      opt(
        '-t, --tokenizer <dir>',
        'directory with tokenizer.json + tokenizer_config.json (chat template) for routing',
        'KVROUTE_TOKENIZER',
      ),
    )
    .addOption(
      opt(
        '--tokenizer-threads <n>',
        'tokenize in a worker thread (1) so long prompts never block streaming, or inline (0)',
        'KVROUTE_TOKENIZER_THREADS',
      )
        .argParser(int('--tokenizer-threads'))
        .default(d.tokenizerThreads),
    )
    .addOption(
      new Option(
        '--no-remote-tokenize',
        "without --tokenizer, do not ask the worker's POST /tokenize (route chat/text prompts without prefix affinity)",
      ),
    )
    .addOption(
      opt(
        '--admin-token <token>',
        'enables POST/DELETE /admin/workers for requests with "Authorization: Bearer <token>"',
        'KVROUTE_ADMIN_TOKEN',
      ),
    )
    .addOption(
      opt(
        '--api-key <key>',
        'API key accepted on /v1 as "Authorization: Bearer <key>" (repeatable; env: comma/space separated); none = open',
        'KVROUTE_API_KEYS',
      ).argParser(collectList),
    )
    .addOption(opt('--api-key-file <file>', 'file with one API key per line (chmod 600)', 'KVROUTE_API_KEY_FILE'))
    .addOption(
      opt(
        '--rate-limit <rps[,burst]>',
        'per API key (per client address without keys) token bucket, e.g. 10,20; 429 + Retry-After beyond',
        'KVROUTE_RATE_LIMIT',
      ).argParser((v) => (parseRateLimit(v), v)),
    )
    .addOption(
      opt(
        '--allow-worker-hosts <list>',
        'hosts/CIDRs admin-registered workers must be inside (comma separated)',
        'KVROUTE_ALLOW_WORKER_HOSTS',
      ).argParser(collectList),
    )
    .addOption(
      opt('--header-timeout-ms <ms>', 'a client must send its request head within this', 'KVROUTE_HEADER_TIMEOUT_MS')
        .argParser(int('--header-timeout-ms'))
        .default(d.headerTimeoutMs),
    )
    .addOption(
      opt(
        '--body-timeout-ms <ms>',
        'a client must send its whole request within this (0 disables); responses are never cut',
        'KVROUTE_BODY_TIMEOUT_MS',
      )
        .argParser(int('--body-timeout-ms'))
        .default(d.bodyTimeoutMs),
    )
    .addOption(
      opt('--max-json-depth <n>', 'request bodies nesting deeper are refused with 400 before parsing', 'KVROUTE_MAX_JSON_DEPTH')
        .argParser(int('--max-json-depth', 1))
        .default(d.maxJsonDepth),
    )
    .addOption(
      opt(
        '--client-stall-timeout-ms <ms>',
        'a streaming client that reads nothing for this long is dropped and its load freed (0 disables)',
        'KVROUTE_CLIENT_STALL_TIMEOUT_MS',
      )
        .argParser(int('--client-stall-timeout-ms'))
        .default(d.clientStallTimeoutMs),
    )
    .addOption(
      opt(
        '--tier-credit',
        'credit KV blocks engines offloaded to host memory (0.75 of a GPU block) or disk (0.25) in the kv policy',
        'KVROUTE_TIER_CREDIT',
      ),
    )
    .addOption(
      opt(
        '--upstream-timeout-ms <ms>',
        'longest silence from a worker (before its response head or between chunks) before the attempt fails',
        'KVROUTE_UPSTREAM_TIMEOUT_MS',
      )
        .argParser(int('--upstream-timeout-ms', 1))
        .default(d.upstreamTimeoutMs),
    )
    .addOption(
      opt('--health-interval-ms <ms>', 'health probe period (GET /health, GET /v1/models); 0 disables', 'KVROUTE_HEALTH_INTERVAL_MS')
        .argParser(int('--health-interval-ms'))
        .default(d.healthIntervalMs),
    )
    .addOption(
      opt('--health-timeout-ms <ms>', 'health probe timeout', 'KVROUTE_HEALTH_TIMEOUT_MS')
        .argParser(int('--health-timeout-ms', 1))
        .default(d.healthTimeoutMs),
    )
    .addOption(
      opt(
        '--eject-after <n>',
        'consecutive failed probes before a worker is ejected (readmitted on the next success)',
        'KVROUTE_EJECT_AFTER',
      )
        .argParser(int('--eject-after', 1))
        .default(d.ejectAfter),
    )
    .addOption(
      opt('--breaker-threshold <n>', "consecutive request failures that open a worker's circuit breaker", 'KVROUTE_BREAKER_THRESHOLD')
        .argParser(int('--breaker-threshold', 1))
        .default(d.breakerThreshold),
    )
    .addOption(
      opt('--breaker-cooldown-ms <ms>', 'time an open breaker waits before one trial request', 'KVROUTE_BREAKER_COOLDOWN_MS')
        .argParser(int('--breaker-cooldown-ms'))
        .default(d.breakerCooldownMs),
    )
    .addOption(
      opt('--shutdown-grace-ms <ms>', 'on SIGTERM/SIGINT, time given to in-flight streams to finish', 'KVROUTE_SHUTDOWN_GRACE_MS')
        .argParser(int('--shutdown-grace-ms'))
        .default(d.shutdownGraceMs),
    )
    .addOption(
      opt('--metrics-prefix <prefix>', 'prefix of every metric name (e.g. dynamo_component_)', 'KVROUTE_METRICS_PREFIX').default(
        d.metricsPrefix,
      ),
    )
    .addOption(
      opt(
        '--engine-metrics-interval-ms <ms>',
        "period of scraping the engines' /metrics into router_engine_* series (0 disables)",
        'KVROUTE_ENGINE_METRICS_INTERVAL_MS',
      )
        .argParser(int('--engine-metrics-interval-ms'))
        .default(d.engineMetricsIntervalMs),
    )
    .addOption(
      opt('--log-level <level>', 'log level', 'KVROUTE_LOG_LEVEL')
        .choices(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'])
        .default(d.logLevel),
    )
    .addOption(
      opt(
        '--nats <urls>',
        'scale out: discover workers and KV events from NATS JetStream (fed by `kvroute relay`) and share load with the other replicas; comma-separated URLs',
        'KVROUTE_NATS',
      ),
    )
    .addOption(opt('--replica-id <id>', "this replica's id among router replicas (default: random)", 'KVROUTE_REPLICA_ID'))
    .addOption(
      opt(
        '--snapshot-interval-ms <ms>',
        'with --nats: index snapshot period while this replica holds the snapshot lease; 0 never writes',
        'KVROUTE_SNAPSHOT_INTERVAL_MS',
      )
        .argParser(int('--snapshot-interval-ms'))
        .default(30_000),
    )
    .addOption(
      opt(
        '--mock-workers <n>',
        'size of the embedded mock fleet started when no worker is given (0: start with none)',
        'KVROUTE_MOCK_WORKERS',
      )
        .argParser(int('--mock-workers'))
        .default(4),
    )
    .addOption(opt('--mock-model <name>', 'model name served by the embedded mock fleet', 'KVROUTE_MOCK_MODEL').default('mock-model'))
    .addHelpText(
      'after',
      '\nExamples:\n' +
        '  kvroute serve                                   # 4 embedded mock engines with KV events, port 8080\n' +
        '  kvroute serve -w http://gpu1:8000,events=tcp://gpu1:5557 -w http://gpu2:8000,events=tcp://gpu2:5557 \\\n' +
        '                --tokenizer /models/Qwen3-8B --block-size 16\n' +
        '  KVROUTE_WORKERS="http://a:8000 http://b:8000" KVROUTE_ADMIN_TOKEN=s3cret kvroute serve\n',
    )
    .action(async (_opts: unknown, cmd: Command) => {
      const opts = cmd.opts() as Record<string, unknown>;
      const fromFile = opts.config ? await loadConfigFile(String(opts.config)) : {};
      const config: ServeConfig = { ...DEFAULTS, ...fromFile };
      const cfg = config as unknown as Record<string, unknown>;
      for (const [flag, key] of KEYS) {
        const source = cmd.getOptionValueSource(flag);
        const value = opts[flag];
        if (value === undefined) continue;
        if (source === 'default' && key in fromFile) continue; // the config file beats built-in defaults
        cfg[key] = value;
      }
      const cliWorkers = (opts.worker as WorkerSpec[] | undefined) ?? [];
      config.workers = [...(fromFile.workers ?? []), ...cliWorkers];

      const log = pino({ level: config.logLevel, base: undefined, redact: LOG_REDACT_PATHS });
      let fleet: EmbeddedFleet | null = null;
      const mockCount = opts.mockWorkers as number;
      const natsUrls = opts.nats
        ? String(opts.nats)
            .split(',')
            .map((u) => u.trim())
            .filter(Boolean)
        : [];
      if (config.workers.length === 0 && mockCount > 0 && natsUrls.length === 0) {
        config.tokenizerDir ??= bundledTokenizerDir();
        log.info(`no --worker given: starting an embedded fleet of ${mockCount} mock engines (a few seconds)`);
        fleet = await startEmbeddedFleet({
          count: mockCount,
          model: String(opts.mockModel),
          blockSize: config.blockSize,
          tokenizerDir: config.tokenizerDir,
        });
        config.workers = fleet.workers;
        log.info(
          { workers: fleet.workers.map((w) => ({ url: w.url, events: w.events })), tokenizer: config.tokenizerDir ?? null },
          `embedded fleet up: ${mockCount} mock engines serving "${opts.mockModel}" with KV events over ZMQ`,
        );
      }
      // With --nats, /health says 503 until the snapshot is loaded and the event stream caught up.
      let natsReady = natsUrls.length === 0;
      let server: RunningServer;
      try {
        server = await startServer(config, { logger: log, readiness: () => natsReady });
      } catch (err) {
        await fleet?.close();
        throw err;
      }
      let replica: { close(): Promise<void> } | null = null;
      if (natsUrls.length > 0) {
        const { attachToServer } = await import('../transport/nats/attach.ts');
        log.info({ nats: natsUrls }, 'joining the replicas on NATS: loading the index snapshot and catching up');
        replica = await attachToServer(server, {
          servers: natsUrls,
          replicaId: opts.replicaId as string | undefined,
          snapshotIntervalMs: opts.snapshotIntervalMs as number,
          log: {
            info: (o: object, m: string) => log.info(o, m),
            warn: (o: object, m: string) => log.warn(o, m),
            error: (o: object, m: string) => log.error(o, m),
          },
        });
        natsReady = true;
        log.info('replica ready: snapshot loaded and stream caught up');
      }
      log.info(
        { url: server.url, workers: config.workers.length, policy: config.policy, blockSize: config.blockSize },
        `kvroute listening on ${server.url} (OpenAI API at ${server.url}/v1)`,
      );
      let stopping = false;
      const stop = (signal: string) => {
        if (stopping) {
          log.warn('second signal: exiting now');
          process.exit(1);
        }
        stopping = true;
        log.info({ signal, inFlight: server.inFlight(), graceMs: config.shutdownGraceMs }, 'shutting down');
        void (replica?.close() ?? Promise.resolve())
          .then(() => server.close())
          .then(() => fleet?.close())
          .then(() => process.exit(0));
      };
      process.on('SIGTERM', () => stop('SIGTERM'));
      process.on('SIGINT', () => stop('SIGINT'));
    });
}
