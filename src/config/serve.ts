/**
 * Every `kvroute serve` setting, defined once: config-file key (the field name), type, default, range or choices,
 * flag, `KVROUTE_*` variable and help text. The commander options, the environment mapping, config-file validation,
 * the precedence merge (flag > KVROUTE_* > --config file > default) and `ServeConfig` all come from `serveSchema`.
 */
import type { Command } from 'commander';
import { z } from 'zod';
import { POLICY_NAMES } from '../core/scheduling/policies.ts';
import { parseAllowList } from '../runtime/security/allow-hosts.ts';
import { parseRateLimit } from '../runtime/security/rate-limit.ts';
import {
  addSettingsOptions,
  bytes,
  choice,
  custom,
  flag,
  flagValues,
  integer,
  list,
  longFlag,
  number,
  optional,
  readConfigFile,
  resolveSettings,
  type Resolved,
  SettingError,
  type SettingsSchema,
  settingLabel,
  settingsOf,
  text,
  withDefault,
} from './settings.ts';
import { LOG_LEVELS } from './parsers.ts';
import { OTLP_PROTOCOLS, TRACE_SAMPLERS } from '../runtime/tracing.ts';
import { BAND_SPEC_GRAMMAR, bandSchema, numberMapSchema } from './flow-spec.ts';
import { WORKER_SPEC_GRAMMAR, workerSchema } from './worker-spec.ts';
import { MAX_TARGET_PORTS, parseLabelSelector, POOL_GROUPS, type PoolGroup } from '../discovery/k8s/pods.ts';

export { parseWorkerSpec, type WorkerSpec, workerFromUnknown } from './worker-spec.ts';

const G = {
  listen: 'Listening and workers:',
  routing: 'Routing:',
  admission: 'Admission, queue and retries:',
  tokenizer: 'Tokenizer:',
  security: 'Security:',
  clients: 'Client limits:',
  health: 'Worker health and circuit breaker:',
  observability: 'Metrics and logs:',
  flow: 'Flow control, tenants and sessions (docs/flow-control.md):',
  scaleOut: 'Scale-out (NATS JetStream):',
  mock: 'Embedded mock fleet (when no worker is given):',
  k8s: 'Kubernetes discovery (docs/kubernetes.md):',
} as const;

const port = integer({ min: 0, max: 65535 });
const ms = (min = 0) => integer({ min });

/**
 * The engines' ports in a selected pod, as an InferencePool's targetPorts (up to 8, each once: one worker per
 * podIP:port). A config file's single number is read as a list of one.
 */
const ENGINE_PORTS_TEXT = `1 to ${MAX_TARGET_PORTS} ports (1-65535) separated by commas, each once`;
const enginePorts = {
  ...list(z.int().min(1).max(65535), { accepts: ENGINE_PORTS_TEXT }),
  schema: z.preprocess(
    (v) => (Array.isArray(v) ? v.map((p) => (typeof p === 'string' && /^\d+$/.test(p.trim()) ? Number(p) : p)) : [v]),
    z
      .array(z.int().min(1).max(65535))
      .min(1)
      .max(MAX_TARGET_PORTS)
      .refine((ports) => new Set(ports).size === ports.length, 'a port is listed twice'),
  ),
};

/** rps[,burst], checked by the parser the server uses. */
const rateLimit = custom(
  z.string().refine(
    (v) => {
      try {
        parseRateLimit(v);
        return true;
      } catch {
        return false;
      }
    },
    { error: 'bad rate limit' },
  ),
  '"<rps>" or "<rps>,<burst>" with rps > 0 and burst an integer >= 1 (e.g. 10,20)',
  { range: 'e.g. 10,20' },
);

/** `NAME=N,NAME=N` as text (flag, variable), or a mapping / list in a config file. */
const nameNumberMap = (what: string, min: number) =>
  custom(
    z.preprocess((v) => (typeof v === 'string' ? v.split(/[\s,]+/).filter(Boolean) : v), numberMapSchema(what, min)),
    `NAME=NUMBER pairs separated by commas (NUMBER >= ${min}; NAME "*" = every other tenant)`,
    { detailed: true },
  );

/** Session-id headers of common agent clients (each sends one stable id per conversation). */
export const SESSION_PRESETS = {
  generic: ['x-session-id', 'x-session-affinity'],
  'claude-code': ['x-claude-code-session-id'],
  codex: ['session-id', 'session_id'],
  opencode: ['x-opencode-session'],
} as const satisfies Record<string, readonly string[]>;

/** Hosts/CIDRs, checked by the parser the server uses; its message names the bad entry. */
const hostList = list(z.string().min(1), {
  accepts: 'a list of CIDRs, IP addresses, host names or *.suffix',
  detailed: true,
});

export const serveSchema = z.strictObject({
  workers: withDefault(
    list(workerSchema, {
      accepts: `worker specs ${WORKER_SPEC_GRAMMAR}`,
      separators: /[\s;]+/,
      detailed: true,
      range: `${WORKER_SPEC_GRAMMAR}; the variable: specs separated by spaces or ";"`,
    }),
    [],
    {
      flag: '-w, --worker <spec>',
      env: 'KVROUTE_WORKERS',
      help:
        'engine to route to (repeatable). events= enables KV-event routing (vLLM --kv-events-config publisher endpoint); ' +
        'without it the worker runs in approximate mode',
      group: G.listen,
    },
  ),
  host: withDefault(text(), '127.0.0.1', { flag: '--host <addr>', env: 'KVROUTE_HOST', help: 'listen address', group: G.listen }),
  port: withDefault(port, 8080, { flag: '-p, --port <n>', env: 'KVROUTE_PORT', help: 'listen port (0 = any free port)', group: G.listen }),
  processes: withDefault(integer({ min: 1, max: 256 }), 1, {
    flag: '--processes <n>',
    env: 'KVROUTE_PROCESSES',
    help:
      'HTTP processes sharing the port (node:cluster): each parses, tokenizes and proxies; one routing core in the primary ' +
      'makes every decision (docs/architecture.md "Every core"). 1 = one process',
    group: G.listen,
  }),
  blockSize: withDefault(integer({ min: 1 }), 16, {
    flag: '-b, --block-size <n>',
    env: 'KVROUTE_BLOCK_SIZE',
    help: "KV block size in tokens; must equal the engines' block size",
    group: G.routing,
  }),
  selection: withDefault(choice(['auto', 'exhaustive', 'sampled']), 'auto', {
    flag: '--selection <mode>',
    env: 'KVROUTE_SELECTION',
    help:
      'how candidates are found: exhaustive scans every source; sampled evaluates the sources that can hold the prefix plus ' +
      'the 16 least loaded (kv, kv-pressure, least-loaded); auto samples above 256 sources (docs/routing.md)',
    group: G.routing,
  }),
  policy: withDefault(choice(POLICY_NAMES), 'kv-pressure', {
    flag: '--policy <name>',
    env: 'KVROUTE_POLICY',
    help: 'routing policy',
    group: G.routing,
  }),
  prefillLoadScale: withDefault(number({ min: 0 }), 1, {
    flag: '--prefill-load-scale <x>',
    env: 'KVROUTE_PREFILL_LOAD_SCALE',
    help: 'kv policies: weight of prefill load against decode load',
    group: G.routing,
  }),
  overlapCredit: withDefault(number({ min: 0 }), 1, {
    flag: '--overlap-credit <x>',
    env: 'KVROUTE_OVERLAP_CREDIT',
    help: 'kv policies: prefill blocks saved per cached block',
    group: G.routing,
  }),
  temperature: withDefault(number({ min: 0 }), 0, {
    flag: '--temperature <x>',
    env: 'KVROUTE_TEMPERATURE',
    help: 'kv policies: 0 picks the cheapest worker, > 0 samples a softmax over costs',
    group: G.routing,
  }),
  seed: withDefault(integer({ min: 0, max: 2 ** 32 - 1 }), 0, {
    flag: '--seed <n>',
    env: 'KVROUTE_SEED',
    help: "seed of the router's random choices (ties, temperature)",
    group: G.routing,
  }),
  tierCredit: withDefault(flag(), false, {
    flag: '--tier-credit',
    env: 'KVROUTE_TIER_CREDIT',
    help: 'credit KV blocks engines offloaded to host memory (0.75 of a GPU block) or disk (0.25) in the kv policies',
    group: G.routing,
  }),
  tierRemoteCredit: withDefault(number({ min: 0, max: 1 }), 0, {
    flag: '--tier-remote-credit <x>',
    env: 'KVROUTE_TIER_REMOTE_CREDIT',
    help:
      'credit per block an engine can load from shared REMOTE storage (FS / OBJ with REMOTE locality), as a fraction of a ' +
      "GPU block; 0 (default): a remote copy is not the engine's own hit (docs/engines.md)",
    group: G.routing,
  }),
  storeOnlyTtlMs: withDefault(ms(0), 300_000, {
    flag: '--store-only-ttl-ms <ms>',
    env: 'KVROUTE_STORE_ONLY_TTL_MS',
    help:
      'offloaded blocks of a medium that never sends removals (LMCache CPU) stop counting this long after their last ' +
      'store; 0 = never (docs/engines.md)',
    group: G.routing,
  }),
  // 1,024: the largest threshold whose decode-side prefill step (≈ 32 ms in the timing model, plus the batch's decode
  // step) stays within a 50 ms per-token ITL SLO; the simulator's sweep behind it is in bench/RESULTS.md (P/D).
  disaggMinUncachedTokens: withDefault(integer({ min: 0 }), 1024, {
    flag: '--disagg-min-uncached-tokens <n>',
    env: 'KVROUTE_DISAGG_MIN_UNCACHED_TOKENS',
    help:
      'P/D fleets: a request whose uncached prompt tokens on its decode worker are at most this is served there alone ' +
      '(no prefill leg); 0 disaggregates every request with an uncached token',
    group: G.routing,
  }),
  decodeOverlapCredit: withDefault(number({ min: 0 }), 0, {
    flag: '--decode-overlap-credit <x>',
    env: 'KVROUTE_DECODE_OVERLAP_CREDIT',
    help: "P/D fleets: blocks credited on the decode leg per block the decode worker holds (when decode workers' caches are reused)",
    group: G.routing,
  }),
  busyKvFraction: optional(number({ min: 0, max: 1, minExclusive: true }), {
    flag: '--busy-kv-fraction <x>',
    env: 'KVROUTE_BUSY_KV_FRACTION',
    help: "a worker is busy above this fraction of its KV blocks in active use (needs the worker's KV capacity)",
    group: G.admission,
  }),
  busyPrefillTokens: optional(integer({ min: 0 }), {
    flag: '--busy-prefill-tokens <n>',
    env: 'KVROUTE_BUSY_PREFILL_TOKENS',
    help: 'a worker is busy with more active prefill tokens than this',
    group: G.admission,
  }),
  queueLimit: withDefault(integer({ min: 0 }), 1024, {
    flag: '--queue-limit <n>',
    env: 'KVROUTE_QUEUE_LIMIT',
    help: 'requests waiting while all workers are busy; beyond: 503 + Retry-After',
    group: G.admission,
  }),
  queueTimeoutMs: withDefault(ms(1), 30_000, {
    flag: '--queue-timeout-ms <ms>',
    env: 'KVROUTE_QUEUE_TIMEOUT_MS',
    help: 'longest wait in the queue before 503 + Retry-After',
    group: G.admission,
  }),
  retries: withDefault(integer({ min: 0 }), 2, {
    flag: '--retries <n>',
    env: 'KVROUTE_RETRIES',
    help: 'retries on the next-best worker after a connection error or 5xx before the first byte',
    group: G.admission,
  }),
  tokenizerDir: optional(text(), {
    flag: '-t, --tokenizer <dir>',
    env: 'KVROUTE_TOKENIZER',
    help: 'directory with tokenizer.json + tokenizer_config.json (chat template) for routing',
    group: G.tokenizer,
  }),
  tokenizerThreads: withDefault(integer({ min: 0, max: 1 }), 1, {
    flag: '--tokenizer-threads <n>',
    env: 'KVROUTE_TOKENIZER_THREADS',
    help: 'tokenize in a worker thread (1) so long prompts never block streaming, or inline (0)',
    group: G.tokenizer,
  }),
  mmPlaceholderTokens: withDefault(integer({ min: 0, max: 65536 }), 0, {
    flag: '--mm-placeholder-tokens <n>',
    env: 'KVROUTE_MM_PLACEHOLDER_TOKENS',
    help:
      'chat requests with image_url / input_audio parts: the placeholder tokens each part becomes in the engine (as its ' +
      'processor expands it), so the router hashes the parts into their blocks (docs/engines.md, "Multimodal block keys"); ' +
      '0: route on the text only (never credits an image, may under-predict)',
    group: G.tokenizer,
  }),
  mmPlaceholderTokenId: optional(integer({ min: 0, max: 2 ** 31 - 1 }), {
    flag: '--mm-placeholder-token-id <id>',
    env: 'KVROUTE_MM_PLACEHOLDER_TOKEN_ID',
    help: "the placeholder's token id (default: the tokenizer's vocabulary size - 1, the mock engine's)",
    group: G.tokenizer,
  }),
  tokenizerMode: optional(choice(['local', 'render', 'remote'] as const), {
    flag: '--tokenizer-mode <mode>',
    env: 'KVROUTE_TOKENIZER_MODE',
    help:
      "routing tokens from: local (--tokenizer's files), render (the engine's /v1/chat/completions/render and " +
      "/v1/completions/render: its exact ids), remote (the engine's /tokenize); default local with --tokenizer, else remote " +
      '(unless --no-remote-tokenize)',
    group: G.tokenizer,
  }),
  remoteTokenize: withDefault(flag(), true, {
    flag: '--no-remote-tokenize',
    env: 'KVROUTE_REMOTE_TOKENIZE',
    help: "without --tokenizer, do not ask the worker's POST /tokenize (route chat/text prompts without prefix affinity)",
    group: G.tokenizer,
  }),
  responsePinLimit: withDefault(integer({ min: 0 }), 100_000, {
    flag: '--response-pin-limit <n>',
    env: 'KVROUTE_RESPONSE_PIN_LIMIT',
    help: 'stored responses remembered with the worker holding them (previous_response_id goes there); 0 disables pinning',
    group: G.routing,
  }),
  responsePinTtlMs: withDefault(ms(1), 3_600_000, {
    flag: '--response-pin-ttl-ms <ms>',
    env: 'KVROUTE_RESPONSE_PIN_TTL_MS',
    help: 'how long a stored response stays pinned to its worker',
    group: G.routing,
  }),
  adminToken: optional(text(), {
    flag: '--admin-token <token>',
    env: 'KVROUTE_ADMIN_TOKEN',
    help: 'enables POST/DELETE /admin/workers for requests with "Authorization: Bearer <token>"',
    group: G.security,
    secret: true,
  }),
  apiKeys: optional(list(z.string().min(1), { accepts: 'API keys separated by commas or spaces' }), {
    flag: '--api-key <key>',
    env: 'KVROUTE_API_KEYS',
    help: 'API key accepted on /v1 as "Authorization: Bearer <key>" (repeatable; the variable: comma/space separated); none = open',
    group: G.security,
    secret: true,
  }),
  apiKeyFile: optional(text(), {
    flag: '--api-key-file <file>',
    env: 'KVROUTE_API_KEY_FILE',
    help: 'file with one API key per line (chmod 600)',
    group: G.security,
  }),
  rateLimit: optional(rateLimit, {
    flag: '--rate-limit <rps[,burst]>',
    env: 'KVROUTE_RATE_LIMIT',
    help: 'per API key (per client address without keys) token bucket; 429 + Retry-After beyond',
    group: G.security,
  }),
  allowWorkerHosts: optional(
    {
      ...hostList,
      schema: hostList.schema.superRefine((hosts, ctx) => {
        try {
          parseAllowList(hosts);
        } catch (err) {
          ctx.addIssue({ code: 'custom', message: (err as Error).message.replace(/^--allow-worker-hosts:\s*/, '') });
        }
      }),
    },
    {
      flag: '--allow-worker-hosts <list>',
      env: 'KVROUTE_ALLOW_WORKER_HOSTS',
      help: 'hosts/CIDRs admin-registered workers must be inside (comma separated)',
      group: G.security,
    },
  ),
  bodyLimitBytes: withDefault(bytes(1), 32 * 1024 * 1024, {
    flag: '--body-limit <size>',
    env: 'KVROUTE_BODY_LIMIT',
    help: 'largest request body (413 beyond)',
    group: G.clients,
  }),
  headerTimeoutMs: withDefault(ms(1), 10_000, {
    flag: '--header-timeout-ms <ms>',
    env: 'KVROUTE_HEADER_TIMEOUT_MS',
    help: 'a client must send its request head within this',
    group: G.clients,
  }),
  bodyTimeoutMs: withDefault(ms(0), 60_000, {
    flag: '--body-timeout-ms <ms>',
    env: 'KVROUTE_BODY_TIMEOUT_MS',
    help: 'a client must send its whole request within this (0 disables; else >= --header-timeout-ms); responses are never cut',
    group: G.clients,
  }),
  maxJsonDepth: withDefault(integer({ min: 1 }), 64, {
    flag: '--max-json-depth <n>',
    env: 'KVROUTE_MAX_JSON_DEPTH',
    help: 'request bodies nesting deeper are refused with 400 before parsing',
    group: G.clients,
  }),
  clientStallTimeoutMs: withDefault(ms(0), 60_000, {
    flag: '--client-stall-timeout-ms <ms>',
    env: 'KVROUTE_CLIENT_STALL_TIMEOUT_MS',
    help: 'a streaming client that reads nothing for this long is dropped and its load freed (0 disables)',
    group: G.clients,
  }),
  upstreamTimeoutMs: withDefault(ms(1), 300_000, {
    flag: '--upstream-timeout-ms <ms>',
    env: 'KVROUTE_UPSTREAM_TIMEOUT_MS',
    help: 'longest silence from a worker (before its response head or between chunks) before the attempt fails',
    group: G.health,
  }),
  healthIntervalMs: withDefault(ms(0), 5_000, {
    flag: '--health-interval-ms <ms>',
    env: 'KVROUTE_HEALTH_INTERVAL_MS',
    help: 'health probe period (GET /health, GET /v1/models); 0 disables',
    group: G.health,
  }),
  healthTimeoutMs: withDefault(ms(1), 2_000, {
    flag: '--health-timeout-ms <ms>',
    env: 'KVROUTE_HEALTH_TIMEOUT_MS',
    help: 'health probe timeout',
    group: G.health,
  }),
  ejectAfter: withDefault(integer({ min: 1 }), 3, {
    flag: '--eject-after <n>',
    env: 'KVROUTE_EJECT_AFTER',
    help: 'consecutive failed probes before a worker is ejected (readmitted on the next success)',
    group: G.health,
  }),
  breakerThreshold: withDefault(integer({ min: 1 }), 5, {
    flag: '--breaker-threshold <n>',
    env: 'KVROUTE_BREAKER_THRESHOLD',
    help: "consecutive request failures that open a worker's circuit breaker",
    group: G.health,
  }),
  breakerCooldownMs: withDefault(ms(0), 10_000, {
    flag: '--breaker-cooldown-ms <ms>',
    env: 'KVROUTE_BREAKER_COOLDOWN_MS',
    help: 'time an open breaker waits before one trial request',
    group: G.health,
  }),
  shutdownGraceMs: withDefault(ms(0), 30_000, {
    flag: '--shutdown-grace-ms <ms>',
    env: 'KVROUTE_SHUTDOWN_GRACE_MS',
    help: 'on SIGTERM/SIGINT, time given to in-flight streams to finish',
    group: G.health,
  }),
  metricsHost: optional(text(), {
    flag: '--metrics-host <addr>',
    env: 'KVROUTE_METRICS_HOST',
    help: 'listen address of the separate /metrics and /dashboard listener (needs --metrics-port; default: --host)',
    group: G.observability,
  }),
  metricsPort: optional(port, {
    flag: '--metrics-port <n>',
    env: 'KVROUTE_METRICS_PORT',
    help: 'serve /metrics and /dashboard on this port instead of the main one (0 = any free port)',
    group: G.observability,
  }),
  metricsPrefix: withDefault(
    text({ allowEmpty: true, pattern: /^([a-zA-Z_:][a-zA-Z0-9_:]*)?$/, accepts: 'empty or a metric name prefix [a-zA-Z_:][a-zA-Z0-9_:]*' }),
    '',
    {
      flag: '--metrics-prefix <prefix>',
      env: 'KVROUTE_METRICS_PREFIX',
      help: 'prefix of every metric name (e.g. dynamo_component_)',
      group: G.observability,
    },
  ),
  engineMetricsIntervalMs: withDefault(ms(0), 5_000, {
    flag: '--engine-metrics-interval-ms <ms>',
    env: 'KVROUTE_ENGINE_METRICS_INTERVAL_MS',
    help: "period of scraping the engines' /metrics into router_engine_* series (0 disables)",
    group: G.observability,
  }),
  logLevel: withDefault(choice(LOG_LEVELS), 'info', {
    flag: '--log-level <level>',
    env: 'KVROUTE_LOG_LEVEL',
    help: 'log level',
    group: G.observability,
  }),
  otlpEndpoint: optional(text(), {
    flag: '--otlp-endpoint <url>',
    env: 'KVROUTE_OTLP_ENDPOINT',
    help: 'send OpenTelemetry traces to this OTLP/HTTP collector (base URL; /v1/traces is added); default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, else tracing is off',
    group: G.observability,
  }),
  otlpProtocol: optional(choice(OTLP_PROTOCOLS), {
    flag: '--otlp-protocol <protocol>',
    env: 'KVROUTE_OTLP_PROTOCOL',
    help: 'OTLP encoding; default: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf',
    group: G.observability,
  }),
  otelServiceName: optional(text(), {
    flag: '--otel-service-name <name>',
    env: 'KVROUTE_OTEL_SERVICE_NAME',
    help: 'service.name of the traces; default: OTEL_SERVICE_NAME, else kvroute',
    group: G.observability,
  }),
  otelTracesSampler: optional(choice(TRACE_SAMPLERS), {
    flag: '--otel-traces-sampler <name>',
    env: 'KVROUTE_OTEL_TRACES_SAMPLER',
    help: 'trace sampler; default: OTEL_TRACES_SAMPLER, else parentbased_always_on',
    group: G.observability,
  }),
  otelTracesSamplerArg: optional(number({ min: 0, max: 1 }), {
    flag: '--otel-traces-sampler-arg <ratio>',
    env: 'KVROUTE_OTEL_TRACES_SAMPLER_ARG',
    help: 'ratio of the traceidratio samplers; default: OTEL_TRACES_SAMPLER_ARG, else 1',
    group: G.observability,
  }),
  nats: optional(list(z.string().min(1), { accepts: 'NATS server URLs separated by commas' }), {
    flag: '--nats <urls>',
    env: 'KVROUTE_NATS',
    help: 'scale out: discover workers and KV events from NATS JetStream (fed by `kvroute relay`) and share load with the other replicas; comma-separated URLs',
    group: G.scaleOut,
  }),
  replicaId: optional(text({ pattern: /^[A-Za-z0-9_-]{1,128}$/, accepts: '1 to 128 characters of [A-Za-z0-9_-]' }), {
    flag: '--replica-id <id>',
    env: 'KVROUTE_REPLICA_ID',
    help: "this replica's id among router replicas (default: random)",
    group: G.scaleOut,
  }),
  disaggMachineId: optional(integer({ min: 0, max: 1023 }), {
    flag: '--disagg-machine-id <n>',
    env: 'KVROUTE_DISAGG_MACHINE_ID',
    help:
      "TensorRT-LLM P/D: this replica's 10-bit part of every disagg_request_id; give each replica its own (default: from " +
      '--replica-id, or random)',
    group: G.scaleOut,
  }),
  snapshotIntervalMs: withDefault(ms(0), 30_000, {
    flag: '--snapshot-interval-ms <ms>',
    env: 'KVROUTE_SNAPSHOT_INTERVAL_MS',
    help: 'with --nats: index snapshot period while this replica holds the snapshot lease; 0 never writes',
    group: G.scaleOut,
  }),
  k8sPool: optional(text({ pattern: /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/, accepts: 'a Kubernetes object name' }), {
    flag: '--k8s-pool <name>',
    env: 'KVROUTE_K8S_POOL',
    help: "discover workers from this InferencePool's ready pods (its selector and target port), watched in --k8s-namespace",
    group: G.k8s,
  }),
  k8sPoolGroup: withDefault(choice(Object.keys(POOL_GROUPS) as [PoolGroup, ...PoolGroup[]]), 'inference.networking.k8s.io', {
    flag: '--k8s-pool-group <group>',
    env: 'KVROUTE_K8S_POOL_GROUP',
    help: "the InferencePool's API group: inference.networking.k8s.io (v1) or the older inference.networking.x-k8s.io (v1alpha2)",
    group: G.k8s,
  }),
  k8sSelector: optional(
    custom(
      z.string().refine(
        (v) => {
          try {
            parseLabelSelector(v);
            return true;
          } catch {
            return false;
          }
        },
        { error: 'bad label selector' },
      ),
      'a label selector of key=value, key!=value, key or !key terms separated by commas (e.g. app=vllm,tier!=batch)',
      { range: 'e.g. app=vllm' },
    ),
    {
      flag: '--k8s-selector <labels>',
      env: 'KVROUTE_K8S_SELECTOR',
      help: 'discover workers from the ready pods matching this label selector, watched in --k8s-namespace',
      group: G.k8s,
    },
  ),
  k8sNamespace: optional(text({ pattern: /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/, accepts: 'a namespace name' }), {
    flag: '--k8s-namespace <ns>',
    env: 'KVROUTE_K8S_NAMESPACE',
    help: "namespace watched (default: the kubeconfig context's, else the pod's own, else default)",
    group: G.k8s,
  }),
  kubeconfig: optional(text(), {
    flag: '--kubeconfig <file>',
    env: 'KVROUTE_KUBECONFIG',
    help: 'kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else the in-cluster service account)',
    group: G.k8s,
  }),
  k8sPort: withDefault(enginePorts, [8000], {
    flag: '--k8s-port <ports>',
    env: 'KVROUTE_K8S_PORT',
    help:
      "with --k8s-selector: the engines' HTTP ports, one worker per podIP:port (a pod's kvroute.io/port annotation names its one " +
      'port instead; a pool gives its target ports)',
    group: G.k8s,
  }),
  k8sEventsPort: withDefault(port, 5557, {
    flag: '--k8s-events-port <n>',
    env: 'KVROUTE_K8S_EVENTS_PORT',
    help: "discovered pods' ZMQ KV-event port (annotation kvroute.io/events-port overrides it; 0: approximate mode)",
    group: G.k8s,
  }),
  k8sReplayPort: withDefault(port, 5558, {
    flag: '--k8s-replay-port <n>',
    env: 'KVROUTE_K8S_REPLAY_PORT',
    help: "discovered pods' ZMQ replay port (annotation kvroute.io/replay-port overrides it; 0: none)",
    group: G.k8s,
  }),
  mockWorkers: withDefault(integer({ min: 0 }), 4, {
    flag: '--mock-workers <n>',
    env: 'KVROUTE_MOCK_WORKERS',
    help: 'size of the embedded mock fleet started when no worker is given (0: start with none)',
    group: G.mock,
  }),
  mockModel: withDefault(text(), 'mock-model', {
    flag: '--mock-model <name>',
    env: 'KVROUTE_MOCK_MODEL',
    help: 'model name served by the embedded mock fleet',
    group: G.mock,
  }),
  bands: withDefault(
    list(bandSchema, {
      accepts: `band specs ${BAND_SPEC_GRAMMAR}`,
      separators: /[\s;]+/,
      detailed: true,
      range: `${BAND_SPEC_GRAMMAR}; the variable: specs separated by spaces or ";"`,
    }),
    [],
    {
      flag: '--band <spec>',
      env: 'KVROUTE_BANDS',
      help:
        'a priority band of the queue (repeatable): requests with priority <= max-priority join it (lower runs first); ' +
        'its own queue TTL; sheddable = 429 at once when the fleet is saturated; order within a tenant fcfs or edf. ' +
        'Default: one band for every priority',
      group: G.flow,
    },
  ),
  queueOrder: withDefault(choice(['fair', 'fifo']), 'fair', {
    flag: '--queue-order <order>',
    env: 'KVROUTE_QUEUE_ORDER',
    help: 'fair: bands, then fair queuing across tenants; fifo: one queue in arrival order',
    group: G.flow,
  }),
  tenantWeights: optional(nameNumberMap('a tenant weight', 0.001), {
    flag: '--tenant-weights <list>',
    env: 'KVROUTE_TENANT_WEIGHTS',
    help: "fair queuing weights, e.g. acme=2,beta=1 (default 1): a tenant's share of contended capacity",
    group: G.flow,
  }),
  tenantTokenBudgets: optional(nameNumberMap('a token budget', 1), {
    flag: '--tenant-token-budgets <list>',
    env: 'KVROUTE_TENANT_TOKEN_BUDGETS',
    help: 'tokens per minute (prompt + output) per tenant, e.g. acme=200000,*=50000; beyond: 429 + Retry-After',
    group: G.flow,
  }),
  prefillTokensPerSecond: optional(number({ min: 0, minExclusive: true }), {
    flag: '--prefill-tokens-per-second <n>',
    env: 'KVROUTE_PREFILL_TOKENS_PER_SECOND',
    help:
      "an engine's prefill throughput, for judging x-kvroute-slo-ttft-ms deadlines before it has been learned from " +
      'first tokens (absent: deadlines are judged once learned)',
    group: G.flow,
  }),
  sessionHeaders: withDefault(list(z.string().regex(/^[A-Za-z0-9_-]{1,64}$/), { accepts: 'header names' }), ['x-session-id'], {
    flag: '--session-header <name>',
    env: 'KVROUTE_SESSION_HEADERS',
    help: 'request headers carrying a session id, first present wins (repeatable)',
    group: G.flow,
  }),
  sessionPresets: withDefault(
    list(z.enum(Object.keys(SESSION_PRESETS) as [keyof typeof SESSION_PRESETS]), {
      accepts: `preset names: ${Object.keys(SESSION_PRESETS).join(', ')}`,
    }),
    [],
    {
      flag: '--session-preset <name>',
      env: 'KVROUTE_SESSION_PRESETS',
      help: `also read the session headers of these clients: ${Object.entries(SESSION_PRESETS)
        .map(([k, v]) => `${k} (${v.join(', ')})`)
        .join('; ')}`,
      group: G.flow,
    },
  ),
  sessionTtlMs: withDefault(ms(1), 600_000, {
    flag: '--session-ttl-ms <ms>',
    env: 'KVROUTE_SESSION_TTL_MS',
    help: 'a session forgets its worker this long after its last request',
    group: G.flow,
  }),
  sessionLoadFactor: withDefault(number({ min: 0 }), 0.5, {
    flag: '--session-load-factor <x>',
    env: 'KVROUTE_SESSION_LOAD_FACTOR',
    help: "a session leaves its worker when that worker's load exceeds (1 + x) x the mean load + the request's blocks",
    group: G.flow,
  }),
});

const EPP_GROUP = 'Endpoint picker (kvroute epp; docs/endpoint-picker.md):';

/**
 * `kvroute epp`'s settings: every serve setting, with the reference endpoint picker's listeners and defaults (ext_proc
 * on 9002 over TLS, gRPC health on 9003 in plaintext, metrics on 9090: llm-d/llm-d-router pkg/epp/server/options.go
 * @ebab6879) and the picker's own bound on its wait.
 */
export const eppSchema = serveSchema.extend({
  port: withDefault(port, 9002, {
    flag: '-p, --port <n>',
    env: 'KVROUTE_PORT',
    help: "the ext_proc gRPC port (the reference picker's --grpc-port, accepted too; 0 = any free port)",
    group: G.listen,
  }),
  metricsPort: withDefault(port, 9090, {
    flag: '--metrics-port <n>',
    env: 'KVROUTE_METRICS_PORT',
    help: 'the port of /metrics and /health (0 = any free port)',
    group: G.observability,
  }),
  grpcHealthPort: withDefault(port, 9003, {
    flag: '--grpc-health-port <n>',
    env: 'KVROUTE_GRPC_HEALTH_PORT',
    help: 'gRPC health checking in plaintext for kubelet probes (services liveness, readiness, inference-extension; 0 = any free port)',
    group: EPP_GROUP,
  }),
  secureServing: withDefault(flag(), true, {
    flag: '--no-secure-serving',
    env: 'KVROUTE_SECURE_SERVING',
    help: 'serve ext_proc over TLS, as the reference picker does (its --secure-serving); --no-secure-serving (or --secure-serving=false): plaintext',
    group: EPP_GROUP,
  }),
  certPath: optional(text(), {
    flag: '--cert-path <dir>',
    env: 'KVROUTE_CERT_PATH',
    help: 'folder holding tls.crt and tls.key for the ext_proc TLS, reloaded when they change (default: a self-signed certificate made at start)',
    group: EPP_GROUP,
  }),
  metricsAuth: withDefault(choice(['auto', 'kubernetes', 'none'] as const), 'auto', {
    flag: '--metrics-auth <mode>',
    env: 'KVROUTE_METRICS_AUTH',
    help:
      'who may read /metrics: kubernetes = a bearer token the Kubernetes API authenticates (TokenReview) and allows to get /metrics ' +
      "(SubjectAccessReview), as the reference picker's --metrics-endpoint-auth; none = anyone; auto = kubernetes with --k8s-pool/--k8s-selector, else none",
    group: EPP_GROUP,
  }),
  metricsCertDir: optional(text(), {
    flag: '--metrics-cert-dir <dir>',
    env: 'KVROUTE_METRICS_CERT_DIR',
    help: 'folder holding tls.crt and tls.key: /metrics and /health are served over HTTPS (reloaded when they change)',
    group: EPP_GROUP,
  }),
  metricsClientCaFile: optional(text(), {
    flag: '--metrics-client-ca-file <file>',
    env: 'KVROUTE_METRICS_CLIENT_CA_FILE',
    help: 'with --metrics-cert-dir: PEM CA bundle; /metrics then requires a client certificate it signed',
    group: EPP_GROUP,
  }),
  // 290 s: below Envoy AI Gateway's 300 s InferencePool message_timeout and the shipped HTTPRoute's 300 s request timeout.
  decisionTimeoutMs: withDefault(ms(1), 290_000, {
    flag: '--decision-timeout-ms <ms>',
    env: 'KVROUTE_DECISION_TIMEOUT_MS',
    help:
      "longest wait from a request's headers to the picker's answer (tokenizing, queue, a prefill leg); past it the request gets an " +
      "immediate 503: keep it below the gateway's ext_proc message_timeout (1000s in the reference setups and deploy/k8s/epp/envoy, " +
      "300s in Envoy AI Gateway's InferencePool filter)",
    group: EPP_GROUP,
  }),
  pickerConfigFile: optional(text(), {
    flag: '--config-file <file>',
    env: 'KVROUTE_PICKER_CONFIG_FILE',
    help:
      "the reference picker's plugin configuration (EndpointPickerConfig YAML, as its Helm chart mounts it): its scorers choose the " +
      'kvroute policy; what has no counterpart is logged in one line, never fatal',
    group: EPP_GROUP,
  }),
});

/** The resolved settings of `kvroute epp`. */
export type EppConfig = z.output<typeof eppSchema>;

/** The resolved settings of `kvroute serve` (what `startServer` takes). */
export type ServeConfig = z.output<typeof serveSchema>;
export type ServeSettingKey = keyof ServeConfig & string;

/** Every default (settings without one are absent). */
export const DEFAULTS: ServeConfig = serveSchema.parse({});

/** Admission settings `kvroute sim` shares with serve: same names, flags, ranges and defaults. */
export const ADMISSION_SETTINGS = [
  'busyPrefillTokens',
  'busyKvFraction',
  'queueLimit',
  'queueTimeoutMs',
  'retries',
] as const satisfies readonly ServeSettingKey[];

/** Kubernetes discovery settings, shared by every command that discovers workers (serve, relay). */
export const K8S_SETTINGS = [
  'k8sPool',
  'k8sPoolGroup',
  'k8sSelector',
  'k8sNamespace',
  'kubeconfig',
  'k8sPort',
  'k8sEventsPort',
  'k8sReplayPort',
] as const satisfies readonly ServeSettingKey[];

/** `--config`: not a setting itself (a config file cannot name another), but read the same ways. */
export const CONFIG_OPTION = { flag: '-c, --config <file>', env: 'KVROUTE_CONFIG' } as const;

/** Adds serve settings' options to any command (all, or `keys`, e.g. `ADMISSION_SETTINGS`; `flagsOnly` for other commands). */
export function addServeOptions(command: Command, keys?: readonly ServeSettingKey[], flagsOnly = false): Command {
  return addSettingsOptions(command, serveSchema, keys, flagsOnly);
}

/** The given serve settings of a parsed command, checked, defaults filled in (for another command: pass `env: {}`). */
export function serveSettingsFrom<const K extends ServeSettingKey>(
  command: Command,
  keys: readonly K[],
  options: { env?: Readonly<Record<string, string | undefined>> } = {},
): Pick<ServeConfig, K> {
  const picked = serveSchema.pick(Object.fromEntries(keys.map((k) => [k, true])) as never) as unknown as SettingsSchema;
  const { config } = resolveSettings(picked, { flags: flagValues(command, serveSchema, keys), env: options.env });
  return config as Pick<ServeConfig, K>;
}

/** Settings no single value can refuse: they refuse combinations. */
function checkCombination(config: ServeConfig, from: Resolved<ServeConfig>['sources']): void {
  const label = (key: ServeSettingKey) => settingLabel(settingsOf(serveSchema, [key])[0].entry);
  const src = (key: ServeSettingKey) => {
    const entry = settingsOf(serveSchema, [key])[0].entry;
    return { flag: longFlag(entry), env: entry.env, file: 'the config file', default: 'the default' }[from[key]];
  };
  if (config.metricsHost !== undefined && config.metricsPort === undefined) {
    throw new SettingError(`${label('metricsHost')} needs ${label('metricsPort')} (from ${src('metricsHost')})`);
  }
  if (config.metricsPort !== undefined && config.metricsPort !== 0 && config.metricsPort === config.port) {
    throw new SettingError(
      `${label('metricsPort')} must differ from ${label('port')}, got ${config.metricsPort} for both (from ${src('metricsPort')} and ${src('port')})`,
    );
  }
  checkK8s(config, label, src);
  if (config.bodyTimeoutMs !== 0 && config.bodyTimeoutMs < config.headerTimeoutMs) {
    throw new SettingError(
      `${label('bodyTimeoutMs')} must be 0 or >= ${label('headerTimeoutMs')}, got ${config.bodyTimeoutMs} < ${config.headerTimeoutMs} ` +
        `(from ${src('bodyTimeoutMs')} and ${src('headerTimeoutMs')})`,
    );
  }
}

/** --k8s-pool and --k8s-selector exclude each other (a pool brings its own selector). */
export function checkK8s(
  config: Partial<Pick<ServeConfig, 'k8sPool' | 'k8sSelector'>>,
  label: (key: ServeSettingKey) => string,
  src: (key: ServeSettingKey) => string,
): void {
  if (config.k8sPool !== undefined && config.k8sSelector !== undefined) {
    throw new SettingError(
      `${label('k8sPool')} and ${label('k8sSelector')} exclude each other: a pool brings its own selector (from ${src('k8sPool')} and ${src('k8sSelector')})`,
    );
  }
}

export interface ServeSources {
  readonly flags?: Readonly<Record<string, unknown>>;
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** --config / KVROUTE_CONFIG, read by `resolveServeConfig`. */
  readonly configPath?: string;
}

export interface ResolvedServe extends Resolved<ServeConfig> {
  /** KVROUTE_* variables that name no setting (typos), for a warning. */
  readonly unknownEnv: string[];
}

/** Flags > KVROUTE_* > config file > defaults, every value checked; throws a one-line SettingError. */
export function resolveServeConfig(sources: ServeSources): Promise<ResolvedServe> {
  return resolveWith(serveSchema, sources);
}

/** The same for `kvroute epp` (serve's settings and the picker's own). */
export function resolveEppConfig(sources: ServeSources): Promise<ResolvedEpp> {
  return resolveWith(eppSchema, sources);
}

export interface ResolvedEpp extends Resolved<EppConfig> {
  readonly unknownEnv: string[];
}

async function resolveWith<T extends typeof serveSchema | typeof eppSchema>(
  schema: T,
  sources: ServeSources,
): Promise<Resolved<z.output<T>> & { readonly unknownEnv: string[] }> {
  const env = sources.env ?? {};
  const path = sources.configPath ?? (env[CONFIG_OPTION.env] || undefined);
  const file = path === undefined ? undefined : await readConfigFile(path);
  const resolved = resolveSettings(schema, { flags: sources.flags, env, file });
  checkCombination(resolved.config as ServeConfig, resolved.sources);
  const known = new Set([...settingsOf(schema).map((s) => s.entry.env), CONFIG_OPTION.env, 'KVROUTE_DEBUG']);
  const unknownEnv = Object.keys(env).filter((k) => k.startsWith('KVROUTE_') && !known.has(k));
  return { ...resolved, unknownEnv };
}

/** The serve settings of a parsed `kvroute serve` command line and the environment. */
export function serveConfigFromCommand(command: Command, env: Readonly<Record<string, string | undefined>>): Promise<ResolvedServe> {
  const configSource = command.getOptionValueSource('config');
  return resolveServeConfig({
    flags: flagValues(command, serveSchema),
    env,
    configPath: configSource === 'cli' ? String(command.getOptionValue('config')) : undefined,
  });
}

/** The settings of a parsed `kvroute epp` command line and the environment. */
export function eppConfigFromCommand(command: Command, env: Readonly<Record<string, string | undefined>>): Promise<ResolvedEpp> {
  const configSource = command.getOptionValueSource('config');
  return resolveEppConfig({
    flags: flagValues(command, eppSchema),
    env,
    configPath: configSource === 'cli' ? String(command.getOptionValue('config')) : undefined,
  });
}

/** Adds `kvroute epp`'s options (serve's settings with the picker's listeners, and the picker's own). */
export function addEppOptions(command: Command): Command {
  return addSettingsOptions(command, eppSchema);
}

/** Reads and checks a YAML or JSON config file alone: the settings it gives (keys as in ServeConfig). */
export async function loadConfigFile(path: string): Promise<Partial<ServeConfig>> {
  const file = await readConfigFile(path);
  const { config, sources } = resolveSettings(serveSchema, { file });
  return Object.fromEntries(Object.entries(config).filter(([k]) => sources[k] === 'file')) as Partial<ServeConfig>;
}
