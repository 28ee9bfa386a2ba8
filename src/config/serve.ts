/**
 * Every `kvroute serve` setting, defined once: config-file key (the field name), type, default, range or choices,
 * flag, `KVROUTE_*` variable and help text. The commander options, the environment mapping, config-file validation,
 * the precedence merge (flag > KVROUTE_* > --config file > default) and `ServeConfig` all come from `serveSchema`.
 */
import type { Command } from 'commander';
import { z } from 'zod';
import { MRC_DEFAULTS } from '../core/mrc.ts';
import { GROUPS } from './groups.ts';
import { K8S } from './k8s.ts';
import { LOG_LEVELS } from './parsers.ts';
import { ADMISSION, BREAKER, FLOW, ROUTING } from './routing.ts';
import { parseAllowList, parseRateLimit } from './security.ts';
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
  port,
  readConfigFile,
  resolveSettings,
  type OptionSources,
  type Resolved,
  SettingError,
  settingLabel,
  settingsFrom,
  settingsOf,
  text,
  withDefault,
} from './settings.ts';
import { OTLP_PROTOCOLS, TRACE_SAMPLERS } from './tracing.ts';
import { WORKER_SPEC_GRAMMAR, workerSchema } from './worker-spec.ts';

export { parseWorkerSpec, type WorkerSpec, workerFromUnknown } from './worker-spec.ts';

const anyPort = port();
const ms = (min = 0) => integer({ min });

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
      group: GROUPS.listen,
    },
  ),
  host: withDefault(text(), '127.0.0.1', { flag: '--host <addr>', env: 'KVROUTE_HOST', help: 'listen address', group: GROUPS.listen }),
  port: withDefault(anyPort, 8080, {
    flag: '-p, --port <n>',
    env: 'KVROUTE_PORT',
    help: 'listen port (0 = any free port)',
    group: GROUPS.listen,
  }),
  processes: withDefault(integer({ min: 1, max: 256 }), 1, {
    flag: '--processes <n>',
    env: 'KVROUTE_PROCESSES',
    help:
      'HTTP processes sharing the port (node:cluster): each parses, tokenizes and proxies; one routing core in the primary ' +
      'makes every decision (docs/architecture.md "Every core"). 1 = one process',
    group: GROUPS.listen,
  }),
  shellReportMs: withDefault(ms(0), 1000, {
    flag: '--shell-report-ms <ms>',
    env: 'KVROUTE_SHELL_REPORT_MS',
    help:
      'with --processes: a shell sends its request metrics to the primary this long after they change (also when asked at ' +
      'scrape time and when it stops); the most a shell killed outright loses. 0 = only when asked or stopping',
    group: GROUPS.listen,
  }),
  ...ROUTING,
  ...ADMISSION,
  tokenizerDir: optional(text(), {
    flag: '-t, --tokenizer <dir>',
    env: 'KVROUTE_TOKENIZER',
    help: 'directory with tokenizer.json + tokenizer_config.json (chat template) for routing',
    group: GROUPS.tokenizer,
  }),
  tokenizerThreads: withDefault(integer({ min: 0, max: 1 }), 1, {
    flag: '--tokenizer-threads <n>',
    env: 'KVROUTE_TOKENIZER_THREADS',
    help: 'tokenize in a worker thread (1) so long prompts never block streaming, or inline (0)',
    group: GROUPS.tokenizer,
  }),
  tokenizerCacheMb: withDefault(number({ min: 0, max: 1_048_576 }), 64, {
    flag: '--tokenizer-cache-mb <mb>',
    env: 'KVROUTE_TOKENIZER_CACHE_MB',
    help:
      "memory budget (MiB, estimated bytes) of the tokenizer's cache: the local tokenizer's segment cache (about 1.2 bytes " +
      'per cached character plus 400 per segment, docs/operations.md "Memory model"), or the engine-tokenizer answer ' +
      'cache with --tokenizer-mode render|remote; 0 turns it off',
    group: GROUPS.tokenizer,
  }),
  mmPlaceholderTokens: withDefault(integer({ min: 0, max: 65536 }), 0, {
    flag: '--mm-placeholder-tokens <n>',
    env: 'KVROUTE_MM_PLACEHOLDER_TOKENS',
    help:
      'chat requests with image_url / input_audio parts: the placeholder tokens each part becomes in the engine (as its ' +
      'processor expands it), so the router hashes the parts into their blocks (docs/engines.md, "Multimodal block keys"); ' +
      '0: route on the text only (never credits an image, may under-predict)',
    group: GROUPS.tokenizer,
  }),
  mmPlaceholderTokenId: optional(integer({ min: 0, max: 2 ** 31 - 1 }), {
    flag: '--mm-placeholder-token-id <id>',
    env: 'KVROUTE_MM_PLACEHOLDER_TOKEN_ID',
    help: "the placeholder's token id (default: the tokenizer's vocabulary size - 1, the mock engine's)",
    group: GROUPS.tokenizer,
  }),
  tokenizerMode: optional(choice(['local', 'render', 'remote'] as const), {
    flag: '--tokenizer-mode <mode>',
    env: 'KVROUTE_TOKENIZER_MODE',
    help:
      "routing tokens from: local (--tokenizer's files), render (the engine's /v1/chat/completions/render and " +
      "/v1/completions/render: its exact ids), remote (the engine's /tokenize); default local with --tokenizer, else remote " +
      '(unless --no-remote-tokenize)',
    group: GROUPS.tokenizer,
  }),
  remoteTokenize: withDefault(flag(), true, {
    flag: '--no-remote-tokenize',
    env: 'KVROUTE_REMOTE_TOKENIZE',
    help: "without --tokenizer, do not ask the worker's POST /tokenize (route chat/text prompts without prefix affinity)",
    group: GROUPS.tokenizer,
  }),
  adminToken: optional(text(), {
    flag: '--admin-token <token>',
    env: 'KVROUTE_ADMIN_TOKEN',
    help: 'enables POST/DELETE /admin/workers for requests with "Authorization: Bearer <token>"',
    group: GROUPS.security,
    secret: true,
  }),
  apiKeys: optional(list(z.string().min(1), { accepts: 'API keys separated by commas or spaces' }), {
    flag: '--api-key <key>',
    env: 'KVROUTE_API_KEYS',
    help: 'API key accepted on /v1 as "Authorization: Bearer <key>" (repeatable; the variable: comma/space separated); none = open',
    group: GROUPS.security,
    secret: true,
  }),
  apiKeyFile: optional(text(), {
    flag: '--api-key-file <file>',
    env: 'KVROUTE_API_KEY_FILE',
    help: 'file with one API key per line (chmod 600)',
    group: GROUPS.security,
  }),
  rateLimit: optional(rateLimit, {
    flag: '--rate-limit <rps[,burst]>',
    env: 'KVROUTE_RATE_LIMIT',
    help: 'per API key (per client address without keys) token bucket; 429 + Retry-After beyond',
    group: GROUPS.security,
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
      group: GROUPS.security,
    },
  ),
  bodyLimitBytes: withDefault(bytes(1), 32 * 1024 * 1024, {
    flag: '--body-limit <size>',
    env: 'KVROUTE_BODY_LIMIT',
    help: 'largest request body (413 beyond)',
    group: GROUPS.clients,
  }),
  headerTimeoutMs: withDefault(ms(1), 10_000, {
    flag: '--header-timeout-ms <ms>',
    env: 'KVROUTE_HEADER_TIMEOUT_MS',
    help: 'a client must send its request head within this',
    group: GROUPS.clients,
  }),
  bodyTimeoutMs: withDefault(ms(0), 60_000, {
    flag: '--body-timeout-ms <ms>',
    env: 'KVROUTE_BODY_TIMEOUT_MS',
    help: 'a client must send its whole request within this (0 disables; else >= --header-timeout-ms); responses are never cut',
    group: GROUPS.clients,
  }),
  maxJsonDepth: withDefault(integer({ min: 1 }), 64, {
    flag: '--max-json-depth <n>',
    env: 'KVROUTE_MAX_JSON_DEPTH',
    help: 'request bodies nesting deeper are refused with 400 before parsing',
    group: GROUPS.clients,
  }),
  clientStallTimeoutMs: withDefault(ms(0), 60_000, {
    flag: '--client-stall-timeout-ms <ms>',
    env: 'KVROUTE_CLIENT_STALL_TIMEOUT_MS',
    help: 'a streaming client that reads nothing for this long is dropped and its load freed (0 disables)',
    group: GROUPS.clients,
  }),
  upstreamTimeoutMs: withDefault(ms(1), 300_000, {
    flag: '--upstream-timeout-ms <ms>',
    env: 'KVROUTE_UPSTREAM_TIMEOUT_MS',
    help: 'longest silence from a worker (before its response head or between chunks) before the attempt fails',
    group: GROUPS.health,
  }),
  healthIntervalMs: withDefault(ms(0), 5_000, {
    flag: '--health-interval-ms <ms>',
    env: 'KVROUTE_HEALTH_INTERVAL_MS',
    help: 'health probe period (GET /health, GET /v1/models); 0 disables',
    group: GROUPS.health,
  }),
  healthTimeoutMs: withDefault(ms(1), 2_000, {
    flag: '--health-timeout-ms <ms>',
    env: 'KVROUTE_HEALTH_TIMEOUT_MS',
    help: 'health probe timeout',
    group: GROUPS.health,
  }),
  ejectAfter: withDefault(integer({ min: 1 }), 3, {
    flag: '--eject-after <n>',
    env: 'KVROUTE_EJECT_AFTER',
    help: 'consecutive failed probes before a worker is ejected (readmitted on the next success)',
    group: GROUPS.health,
  }),
  ...BREAKER,
  shutdownGraceMs: withDefault(ms(0), 30_000, {
    flag: '--shutdown-grace-ms <ms>',
    env: 'KVROUTE_SHUTDOWN_GRACE_MS',
    help: 'on SIGTERM/SIGINT, time given to in-flight streams to finish',
    group: GROUPS.health,
  }),
  metricsHost: optional(text(), {
    flag: '--metrics-host <addr>',
    env: 'KVROUTE_METRICS_HOST',
    help: 'listen address of the separate /metrics and /dashboard listener (needs --metrics-port; default: --host)',
    group: GROUPS.observability,
  }),
  metricsPort: optional(anyPort, {
    flag: '--metrics-port <n>',
    env: 'KVROUTE_METRICS_PORT',
    help: 'serve /metrics and /dashboard on this port instead of the main one (0 = any free port)',
    group: GROUPS.observability,
  }),
  metricsPrefix: withDefault(
    text({ allowEmpty: true, pattern: /^([a-zA-Z_:][a-zA-Z0-9_:]*)?$/, accepts: 'empty or a metric name prefix [a-zA-Z_:][a-zA-Z0-9_:]*' }),
    '',
    {
      flag: '--metrics-prefix <prefix>',
      env: 'KVROUTE_METRICS_PREFIX',
      help: 'prefix of every metric name (e.g. dynamo_component_)',
      group: GROUPS.observability,
    },
  ),
  engineMetricsIntervalMs: withDefault(ms(0), 5_000, {
    flag: '--engine-metrics-interval-ms <ms>',
    env: 'KVROUTE_ENGINE_METRICS_INTERVAL_MS',
    help: "period of scraping the engines' /metrics into router_engine_* series (0 disables)",
    group: GROUPS.observability,
  }),
  mrcSampleRate: withDefault(number({ min: 0, max: 1 }), MRC_DEFAULTS.sampleRate, {
    flag: '--mrc-sample-rate <x>',
    env: 'KVROUTE_MRC_SAMPLE_RATE',
    help:
      'miss-ratio curve (what more KV cache would buy, docs/cache-sizing.md): starting rate of SHARDS block sampling; it ' +
      'falls when a curve holds --mrc-max-samples; 0 turns the curves off',
    group: GROUPS.observability,
  }),
  mrcMaxSamples: withDefault(integer({ min: 16, max: 16_777_216 }), MRC_DEFAULTS.maxSamples, {
    flag: '--mrc-max-samples <n>',
    env: 'KVROUTE_MRC_MAX_SAMPLES',
    help: 'miss-ratio curve: sampled blocks per curve (fleet, each model, each engine), about 150 bytes each; the memory bound',
    group: GROUPS.observability,
  }),
  record: optional(text(), {
    flag: '--record <file>',
    env: 'KVROUTE_RECORD',
    help:
      'record the traffic as a replayable trace without text (docs/cache-sizing.md#record-and-replay): per request the ' +
      "arrival time, the router's block hash chain, input and output lengths, tenant, priority, session, model; a name " +
      'ending in .gz is gzip-compressed; replay with kvroute sim --trace FILE. Off unless given',
    group: GROUPS.record,
  }),
  recordMaxBytes: withDefault(bytes(4096), 256 * 1024 * 1024, {
    flag: '--record-max-bytes <size>',
    env: 'KVROUTE_RECORD_MAX_BYTES',
    help: 'recording: bytes written to one file (after compression) before it is rotated: FILE becomes FILE.1, FILE.1 FILE.2, ...',
    group: GROUPS.record,
  }),
  recordFiles: withDefault(integer({ min: 1, max: 1000 }), 4, {
    flag: '--record-files <n>',
    env: 'KVROUTE_RECORD_FILES',
    help: 'recording: files kept, FILE included; the oldest is deleted at rotation, so the disk held is at most n x --record-max-bytes',
    group: GROUPS.record,
  }),
  recordBufferBytes: withDefault(bytes(1024), 8 * 1024 * 1024, {
    flag: '--record-buffer-bytes <size>',
    env: 'KVROUTE_RECORD_BUFFER_BYTES',
    help:
      'recording: lines waiting for the disk at most; past it a request is not recorded and counted in ' +
      'router_record_dropped_total{reason="buffer_full"} (the request itself never waits for the disk)',
    group: GROUPS.record,
  }),
  mrcHalfLife: withDefault(integer({ min: 0, max: 1_000_000_000 }), MRC_DEFAULTS.halfLifeRequests, {
    flag: '--mrc-half-life <requests>',
    env: 'KVROUTE_MRC_HALF_LIFE',
    help:
      'miss-ratio curve: older traffic weighs half as much every this many routed requests (in 16 steps), so the curves ' +
      'follow traffic that changes; 0 = every request counts alike',
    group: GROUPS.observability,
  }),
  logLevel: withDefault(choice(LOG_LEVELS), 'info', {
    flag: '--log-level <level>',
    env: 'KVROUTE_LOG_LEVEL',
    help: 'log level',
    group: GROUPS.observability,
  }),
  otlpEndpoint: optional(text(), {
    flag: '--otlp-endpoint <url>',
    env: 'KVROUTE_OTLP_ENDPOINT',
    help: 'send OpenTelemetry traces to this OTLP/HTTP collector (base URL; /v1/traces is added); default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, else tracing is off',
    group: GROUPS.observability,
  }),
  otlpProtocol: optional(choice(OTLP_PROTOCOLS), {
    flag: '--otlp-protocol <protocol>',
    env: 'KVROUTE_OTLP_PROTOCOL',
    help: 'OTLP encoding; default: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf',
    group: GROUPS.observability,
  }),
  otelServiceName: optional(text(), {
    flag: '--otel-service-name <name>',
    env: 'KVROUTE_OTEL_SERVICE_NAME',
    help: 'service.name of the traces; default: OTEL_SERVICE_NAME, else kvroute',
    group: GROUPS.observability,
  }),
  otelTracesSampler: optional(choice(TRACE_SAMPLERS), {
    flag: '--otel-traces-sampler <name>',
    env: 'KVROUTE_OTEL_TRACES_SAMPLER',
    help: 'trace sampler; default: OTEL_TRACES_SAMPLER, else parentbased_always_on',
    group: GROUPS.observability,
  }),
  otelTracesSamplerArg: optional(number({ min: 0, max: 1 }), {
    flag: '--otel-traces-sampler-arg <ratio>',
    env: 'KVROUTE_OTEL_TRACES_SAMPLER_ARG',
    help: 'ratio of the traceidratio samplers; default: OTEL_TRACES_SAMPLER_ARG, else 1',
    group: GROUPS.observability,
  }),
  nats: optional(list(z.string().min(1), { accepts: 'NATS server URLs separated by commas' }), {
    flag: '--nats <urls>',
    env: 'KVROUTE_NATS',
    help: 'scale out: discover workers and KV events from NATS JetStream (fed by `kvroute relay`) and share load with the other replicas; comma-separated URLs',
    group: GROUPS.scaleOut,
  }),
  replicaId: optional(text({ pattern: /^[A-Za-z0-9_-]{1,128}$/, accepts: '1 to 128 characters of [A-Za-z0-9_-]' }), {
    flag: '--replica-id <id>',
    env: 'KVROUTE_REPLICA_ID',
    help: "this replica's id among router replicas (default: random)",
    group: GROUPS.scaleOut,
  }),
  disaggMachineId: optional(integer({ min: 0, max: 1023 }), {
    flag: '--disagg-machine-id <n>',
    env: 'KVROUTE_DISAGG_MACHINE_ID',
    help:
      "TensorRT-LLM P/D: this replica's 10-bit part of every disagg_request_id; give each replica its own (default: from " +
      '--replica-id, or random)',
    group: GROUPS.scaleOut,
  }),
  snapshotIntervalMs: withDefault(ms(0), 30_000, {
    flag: '--snapshot-interval-ms <ms>',
    env: 'KVROUTE_SNAPSHOT_INTERVAL_MS',
    help: 'with --nats: index snapshot period while this replica holds the snapshot lease; 0 never writes',
    group: GROUPS.scaleOut,
  }),
  ...K8S,
  mockWorkers: withDefault(integer({ min: 0 }), 4, {
    flag: '--mock-workers <n>',
    env: 'KVROUTE_MOCK_WORKERS',
    help: 'size of the embedded mock fleet started when no worker is given (0: start with none)',
    group: GROUPS.mock,
  }),
  mockModel: withDefault(text(), 'mock-model', {
    flag: '--mock-model <name>',
    env: 'KVROUTE_MOCK_MODEL',
    help: 'model name served by the embedded mock fleet',
    group: GROUPS.mock,
  }),
  ...FLOW,
  sessionHeaders: withDefault(list(z.string().regex(/^[A-Za-z0-9_-]{1,64}$/), { accepts: 'header names' }), ['x-session-id'], {
    flag: '--session-header <name>',
    env: 'KVROUTE_SESSION_HEADERS',
    help: 'request headers carrying a session id, first present wins (repeatable)',
    group: GROUPS.flow,
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
      group: GROUPS.flow,
    },
  ),
});

/**
 * `kvroute epp`'s settings: every serve setting, with the reference endpoint picker's listeners and defaults (ext_proc
 * on 9002 over TLS, gRPC health on 9003 in plaintext, metrics on 9090: llm-d/llm-d-router pkg/epp/server/options.go
 * @ebab6879) and the picker's own bound on its wait.
 */
export const eppSchema = serveSchema.extend({
  port: withDefault(anyPort, 9002, {
    flag: '-p, --port <n>',
    env: 'KVROUTE_PORT',
    help: "the ext_proc gRPC port (the reference picker's --grpc-port, accepted too; 0 = any free port)",
    group: GROUPS.listen,
  }),
  metricsPort: withDefault(anyPort, 9090, {
    flag: '--metrics-port <n>',
    env: 'KVROUTE_METRICS_PORT',
    help: 'the port of /metrics and /health (0 = any free port)',
    group: GROUPS.observability,
  }),
  grpcHealthPort: withDefault(anyPort, 9003, {
    flag: '--grpc-health-port <n>',
    env: 'KVROUTE_GRPC_HEALTH_PORT',
    help: 'gRPC health checking in plaintext for kubelet probes (services liveness, readiness, inference-extension; 0 = any free port)',
    group: GROUPS.epp,
  }),
  secureServing: withDefault(flag(), true, {
    flag: '--no-secure-serving',
    env: 'KVROUTE_SECURE_SERVING',
    help: 'serve ext_proc over TLS, as the reference picker does (its --secure-serving); --no-secure-serving (or --secure-serving=false): plaintext',
    group: GROUPS.epp,
  }),
  certPath: optional(text(), {
    flag: '--cert-path <dir>',
    env: 'KVROUTE_CERT_PATH',
    help: 'folder holding tls.crt and tls.key for the ext_proc TLS, reloaded when they change (default: a self-signed certificate made at start)',
    group: GROUPS.epp,
  }),
  metricsAuth: withDefault(choice(['auto', 'kubernetes', 'none'] as const), 'auto', {
    flag: '--metrics-auth <mode>',
    env: 'KVROUTE_METRICS_AUTH',
    help:
      'who may read /metrics: kubernetes = a bearer token the Kubernetes API authenticates (TokenReview) and allows to get /metrics ' +
      "(SubjectAccessReview), as the reference picker's --metrics-endpoint-auth; none = anyone; auto = kubernetes with --k8s-pool/--k8s-selector, else none",
    group: GROUPS.epp,
  }),
  metricsCertDir: optional(text(), {
    flag: '--metrics-cert-dir <dir>',
    env: 'KVROUTE_METRICS_CERT_DIR',
    help: 'folder holding tls.crt and tls.key: /metrics and /health are served over HTTPS (reloaded when they change)',
    group: GROUPS.epp,
  }),
  metricsClientCaFile: optional(text(), {
    flag: '--metrics-client-ca-file <file>',
    env: 'KVROUTE_METRICS_CLIENT_CA_FILE',
    help: 'with --metrics-cert-dir: PEM CA bundle; /metrics then requires a client certificate it signed',
    group: GROUPS.epp,
  }),
  // 290 s: below Envoy AI Gateway's 300 s InferencePool message_timeout and the shipped HTTPRoute's 300 s request timeout.
  decisionTimeoutMs: withDefault(ms(1), 290_000, {
    flag: '--decision-timeout-ms <ms>',
    env: 'KVROUTE_DECISION_TIMEOUT_MS',
    help:
      "longest wait from a request's headers to the picker's answer (tokenizing, queue, a prefill leg); past it the request gets an " +
      "immediate 503: keep it below the gateway's ext_proc message_timeout (1000s in the reference setups and deploy/k8s/epp/envoy, " +
      "300s in Envoy AI Gateway's InferencePool filter)",
    group: GROUPS.epp,
  }),
  pickerConfigFile: optional(text(), {
    flag: '--config-file <file>',
    env: 'KVROUTE_PICKER_CONFIG_FILE',
    help:
      "the reference picker's plugin configuration (EndpointPickerConfig YAML, as its Helm chart mounts it): its scorers choose the " +
      'kvroute policy; what has no counterpart is logged in one line, never fatal',
    group: GROUPS.epp,
  }),
});

/** The resolved settings of `kvroute epp`. */
export type EppConfig = z.output<typeof eppSchema>;

/** The resolved settings of `kvroute serve` (what `startServer` takes). */
export type ServeConfig = z.output<typeof serveSchema>;
export type ServeSettingKey = keyof ServeConfig & string;

/** Every default (settings without one are absent). */
export const DEFAULTS: ServeConfig = serveSchema.parse({});

/** `--config`: not a setting itself (a config file cannot name another), but read the same ways. */
export const CONFIG_OPTION = { flag: '-c, --config <file>', env: 'KVROUTE_CONFIG' } as const;

/**
 * Adds serve settings' options to any command: all (serve), or the `keys` another command takes (relay the block
 * size and `K8S_SETTINGS`, mocker and hash the block size); `sources` says what it reads besides flags.
 */
export function addServeOptions(command: Command, keys?: readonly ServeSettingKey[], sources?: OptionSources): Command {
  return addSettingsOptions(command, serveSchema, keys, sources);
}

/** The given serve settings of a parsed command, checked, defaults filled in (`env`: the KVROUTE_* it reads, if any). */
export function serveSettingsFrom<const K extends ServeSettingKey>(
  command: Command,
  keys: readonly K[],
  options: { env?: Readonly<Record<string, string | undefined>> } = {},
): Pick<ServeConfig, K> {
  return settingsFrom(command, serveSchema, keys, options).config;
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
  // The router reads KVROUTE_* variables too, so its messages name them (`--retries (KVROUTE_RETRIES)`); none is read here.
  const { config, sources } = resolveSettings(serveSchema, { file, env: {} });
  return Object.fromEntries(Object.entries(config).filter(([k]) => sources[k] === 'file')) as Partial<ServeConfig>;
}
