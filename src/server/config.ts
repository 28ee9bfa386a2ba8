/**
 * Serve configuration: the resolved settings of `kvroute serve`, worker spec parsing and config files.
 * Precedence (applied by the CLI): flag > KVROUTE_* env > config file > default.
 */
import { readFile } from 'node:fs/promises';
import { parse as parseYaml } from 'yaml';

export interface WorkerSpec {
  /** Base URL of the engine's OpenAI server, e.g. http://10.0.0.5:8000. */
  readonly url: string;
  /** Stable id (default host:port). Metrics and /debug/state use it. */
  readonly id?: string;
  /** ZMQ endpoint of the engine's KV events (rank 0; rank r uses port + r). Absent: approximate mode. */
  readonly events?: string;
  /** ZMQ replay endpoint (rank 0), for recovering event gaps. */
  readonly replay?: string;
  /** Data-parallel ranks behind this URL (each is a routing target). Default 1. */
  readonly dp?: number;
  /** Models served; discovered from GET /v1/models when absent. */
  readonly models?: readonly string[];
  /** KV capacity in blocks per rank (for the busy fraction). */
  readonly blocks?: number;
  /** Event wire flavour of the engine (default vllm). */
  readonly engine?: 'vllm' | 'sglang';
}

export interface ServeConfig {
  host: string;
  port: number;
  workers: WorkerSpec[];
  blockSize: number;
  policy: string;
  prefillLoadScale: number;
  overlapCredit: number;
  temperature: number;
  seed: number;
  busyKvFraction?: number;
  busyPrefillTokens?: number;
  queueLimit: number;
  queueTimeoutMs: number;
  retries: number;
  bodyLimitBytes: number;
  tokenizerDir?: string;
  /** Tokenize in a worker thread (1) so long prompts do not block the event loop, or inline (0). */
  tokenizerThreads: number;
  /** Tokenize through the worker's POST /tokenize when there is no local tokenizer. */
  remoteTokenize: boolean;
  adminToken?: string;
  healthIntervalMs: number;
  healthTimeoutMs: number;
  ejectAfter: number;
  breakerThreshold: number;
  breakerCooldownMs: number;
  /** Longest silence from a worker (before its response head, or between body chunks) before the attempt fails. */
  upstreamTimeoutMs: number;
  shutdownGraceMs: number;
  metricsPrefix: string;
  logLevel: string;
  /** Period of the engine /metrics mirror (router_engine_* series next to the router's own); 0 disables it. */
  engineMetricsIntervalMs: number;
  /** API keys accepted on /v1 (Authorization: Bearer); none = open. */
  apiKeys?: string[];
  /** File with one API key per line. */
  apiKeyFile?: string;
  /** `<rps>[,<burst>]` per API key (per client address without keys). */
  rateLimit?: string;
  /** Hosts/CIDRs that admin-registered workers must be inside. */
  allowWorkerHosts?: string[];
  /** Slow clients: the request head must arrive within this. */
  headerTimeoutMs: number;
  /** Slow clients: the whole request (head + body) must arrive within this; 0 disables. Responses are not cut. */
  bodyTimeoutMs: number;
  /** Request bodies nesting deeper than this are refused (400) before parsing. */
  maxJsonDepth: number;
  /** A streaming client that reads nothing for this long is dropped (its load freed); 0 disables. */
  clientStallTimeoutMs: number;
  /** Credit offload-tier blocks (host 0.75, disk 0.25 of a GPU block) in the kv policy. */
  tierCredit: boolean;
  /** A separate listener for /metrics and /dashboard (absent: served on the main port). */
  metricsHost?: string;
  metricsPort?: number;
}

/** Keys a config file may set (optional ones included). */
export const CONFIG_KEYS = [
  'host',
  'port',
  'workers',
  'blockSize',
  'policy',
  'prefillLoadScale',
  'overlapCredit',
  'temperature',
  'seed',
  'busyKvFraction',
  'busyPrefillTokens',
  'queueLimit',
  'queueTimeoutMs',
  'retries',
  'bodyLimitBytes',
  'tokenizerDir',
  'tokenizerThreads',
  'remoteTokenize',
  'adminToken',
  'healthIntervalMs',
  'healthTimeoutMs',
  'ejectAfter',
  'breakerThreshold',
  'breakerCooldownMs',
  'upstreamTimeoutMs',
  'shutdownGraceMs',
  'metricsPrefix',
  'logLevel',
  'engineMetricsIntervalMs',
  'apiKeys',
  'apiKeyFile',
  'rateLimit',
  'allowWorkerHosts',
  'headerTimeoutMs',
  'bodyTimeoutMs',
  'maxJsonDepth',
  'clientStallTimeoutMs',
  'tierCredit',
] as const;

export const DEFAULTS: ServeConfig = {
  host: '127.0.0.1',
  port: 8080,
  workers: [],
  blockSize: 16,
  policy: 'kv-pressure',
  prefillLoadScale: 1,
  overlapCredit: 1,
  temperature: 0,
  seed: 0,
  queueLimit: 1024,
  queueTimeoutMs: 30_000,
  retries: 2,
  bodyLimitBytes: 32 * 1024 * 1024,
  remoteTokenize: true,
  tokenizerThreads: 1,
  healthIntervalMs: 5_000,
  healthTimeoutMs: 2_000,
  ejectAfter: 3,
  breakerThreshold: 5,
  breakerCooldownMs: 10_000,
  upstreamTimeoutMs: 300_000,
  shutdownGraceMs: 30_000,
  metricsPrefix: '',
  logLevel: 'info',
  engineMetricsIntervalMs: 5_000,
  headerTimeoutMs: 10_000,
  bodyTimeoutMs: 60_000,
  maxJsonDepth: 64,
  clientStallTimeoutMs: 60_000,
  tierCredit: false,
};

function positiveInt(name: string, v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n <= 0) throw new Error(`${name} must be a positive integer, got "${v}"`);
  return n;
}

/**
 * Parses `URL[,events=tcp://host:port][,replay=tcp://host:port][,dp=N][,model=NAME][,id=NAME][,blocks=N][,engine=vllm|sglang]`.
 * `model` may repeat. Throws an Error with an actionable message.
 */
export function parseWorkerSpec(spec: string): WorkerSpec {
  const parts = spec
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
  if (parts.length === 0) throw new Error('empty --worker spec; expected URL[,events=tcp://host:port][,dp=N][,model=NAME]');
  const url = parts[0];
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new Error(`worker URL "${url}" is not a valid URL (expected http://host:port)`);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
    throw new Error(`worker URL "${url}" must be http:// or https://`);
  }
  const out: {
    url: string;
    id?: string;
    events?: string;
    replay?: string;
    dp?: number;
    models?: string[];
    blocks?: number;
    engine?: 'vllm' | 'sglang';
  } = {
    url: parsed.origin + parsed.pathname.replace(/\/+$/, ''),
  };
  for (const kv of parts.slice(1)) {
    const eq = kv.indexOf('=');
    if (eq < 0) throw new Error(`worker option "${kv}" in "${spec}" must be key=value`);
    const key = kv.slice(0, eq);
    const value = kv.slice(eq + 1);
    switch (key) {
      case 'events':
      case 'replay':
        if (!/^(tcp|ipc|inproc):\/\/.+/.test(value)) {
          throw new Error(`worker option ${key}="${value}" must be a ZMQ endpoint like tcp://host:5557`);
        }
        out[key] = value;
        break;
      case 'dp':
        out.dp = positiveInt('dp', value);
        break;
      case 'blocks':
        out.blocks = positiveInt('blocks', value);
        break;
      case 'model':
        if (!value) throw new Error(`worker option model= needs a name in "${spec}"`);
        out.models = [...(out.models ?? []), value];
        break;
      case 'engine':
        if (value !== 'vllm' && value !== 'sglang') throw new Error(`worker option engine="${value}" must be vllm or sglang`);
        out.engine = value;
        break;
      case 'id':
        if (!/^[A-Za-z0-9_.:@-]+$/.test(value)) throw new Error(`worker id "${value}" may use only [A-Za-z0-9_.:@-]`);
        out.id = value;
        break;
      default:
        throw new Error(`unknown worker option "${key}" in "${spec}" (known: events, replay, dp, model, id, blocks, engine)`);
    }
  }
  return out;
}

/** A worker given as an object (config file, admin API) or as a spec string. */
export function workerFromUnknown(value: unknown): WorkerSpec {
  if (typeof value === 'string') return parseWorkerSpec(value);
  if (!value || typeof value !== 'object') throw new Error('a worker must be a spec string or an object with "url"');
  const v = value as Record<string, unknown>;
  if (typeof v.url !== 'string') throw new Error('a worker object needs a string "url"');
  const parts = [v.url];
  for (const k of ['events', 'replay', 'id', 'engine'] as const) if (v[k] !== undefined) parts.push(`${k}=${String(v[k])}`);
  for (const k of ['dp', 'blocks'] as const) if (v[k] !== undefined) parts.push(`${k}=${String(v[k])}`);
  const models = v.models ?? v.model;
  if (Array.isArray(models)) for (const m of models) parts.push(`model=${String(m)}`);
  else if (models !== undefined) parts.push(`model=${String(models)}`);
  return parseWorkerSpec(parts.join(','));
}

/** Reads a YAML or JSON config file: `{workers: [...], policy: ..., blockSize: ..., ...}` (keys as in ServeConfig). */
export async function loadConfigFile(path: string): Promise<Partial<ServeConfig> & { workers?: WorkerSpec[] }> {
  const text = await readFile(path, 'utf8');
  let raw: unknown;
  try {
    raw = path.endsWith('.json') ? JSON.parse(text) : parseYaml(text);
  } catch (err) {
    throw new Error(`config file ${path}: ${(err as Error).message}`);
  }
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) throw new Error(`config file ${path}: expected a mapping at the top`);
  const obj = { ...(raw as Record<string, unknown>) };
  const known = new Set<string>(CONFIG_KEYS);
  for (const k of Object.keys(obj)) {
    if (!known.has(k)) throw new Error(`config file ${path}: unknown key "${k}" (known: ${[...known].join(', ')})`);
  }
  if (obj.workers !== undefined) {
    if (!Array.isArray(obj.workers)) throw new Error(`config file ${path}: "workers" must be a list`);
    obj.workers = obj.workers.map((w, i) => {
      try {
        return workerFromUnknown(w);
      } catch (err) {
        throw new Error(`config file ${path}: workers[${i}]: ${(err as Error).message}`);
      }
    });
  }
  return obj as Partial<ServeConfig>;
}
