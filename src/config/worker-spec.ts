/**
 * Worker specs: the one definition of a worker, whether it comes as a `--worker` / KVROUTE_WORKERS string (the grammar
 * is WORKER_SPEC_GRAMMAR below; the engine names are the core's list, src/core/types.ts, which the engine registry src/engines/index.ts covers), as an item of
 * a config file's `workers` list, or as the body of POST /admin/workers. The string grammar is split into fields here
 * and every form is then checked by the same zod object schema.
 */
import { z } from 'zod';
import { ENGINE_NAMES, type EngineName } from '../core/types.ts';
import { intText, namesText, ZMQ_ENDPOINT } from './parsers.ts';

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
  /**
   * Event wire flavour of the engine and, for disaggregated serving, its handoff protocol (default vllm). trtllm: the
   * router polls the engine's POST /kv_cache_events unless events= names a ZMQ publisher (vLLM's fields).
   */
  readonly engine?: EngineName;
  /** Disaggregated serving: prefill, decode, or both (default: aggregated serving). */
  readonly role?: 'prefill' | 'decode' | 'both';
  /** SGLang prefill workers: the engine's --disaggregation-bootstrap-port (default 8998). */
  readonly bootstrap?: number;
  /**
   * TensorRT-LLM P/D: whether the legs carry disaggregated_params.disagg_request_id (auto: yes, until the server
   * refuses the field; releases before it have none: docs/engines.md). Default auto.
   */
  readonly disaggId?: OptionalFieldSetting;
  /** TensorRT-LLM P/D: whether the generation leg carries disaggregated_params.ctx_usage (as disaggId). Default auto. */
  readonly ctxUsage?: OptionalFieldSetting;
  /**
   * How the engine's HTTP server speaks: http (HTTP/1.1, the default) or h2c (HTTP/2 with prior knowledge, an
   * InferencePool's appProtocol kubernetes.io/h2c).
   */
  readonly appProtocol?: 'http' | 'h2c';
}

/** A setting for an optional handoff field: send it and drop it once the server refuses it, always, or never. */
export type OptionalFieldSetting = 'auto' | 'on' | 'off';

/** SGLang's default --disaggregation-bootstrap-port. */
export const DEFAULT_BOOTSTRAP_PORT = 8998;

export const WORKER_SPEC_GRAMMAR =
  `URL[,events=tcp://host:port][,replay=tcp://host:port][,dp=N][,model=NAME][,id=NAME][,blocks=N][,engine=${ENGINE_NAMES.join('|')}]` +
  '[,role=prefill|decode|both][,bootstrap=PORT][,disagg-id=auto|on|off][,ctx-usage=auto|on|off][,app-protocol=http|h2c]';
const OPTIONS = [
  'events',
  'replay',
  'dp',
  'model',
  'id',
  'blocks',
  'engine',
  'role',
  'bootstrap',
  'disagg-id',
  'ctx-usage',
  'app-protocol',
] as const;
const SETTINGS = ['auto', 'on', 'off'] as const;
/** The string grammar's option names as the object form (WorkerSpec) spells them. */
const KEY_OF: Readonly<Record<string, string>> = { 'disagg-id': 'disaggId', 'ctx-usage': 'ctxUsage', 'app-protocol': 'appProtocol' };
const OBJECT_KEYS = OPTIONS.map((o) => KEY_OF[o] ?? o);
const show = (v: unknown) => (typeof v === 'string' ? `"${v}"` : JSON.stringify(v));

const url = z
  .string({ error: 'a worker needs a string "url"' })
  .refine((u) => URL.canParse(u), { error: (iss) => `worker URL ${show(iss.input)} is not a valid URL (expected http://host:port)` })
  .transform((u) => new URL(u))
  .refine((u) => u.protocol === 'http:' || u.protocol === 'https:', {
    error: (iss) => `worker URL "${(iss.input as URL).href}" must be http:// or https://`,
  })
  .transform((u) => u.origin + u.pathname.replace(/\/+$/, ''));

const endpoint = (key: string) =>
  z.string().regex(ZMQ_ENDPOINT, { error: (iss) => `worker option ${key}=${show(iss.input)} must be a ZMQ endpoint like tcp://host:5557` });

const positive = (key: string) =>
  z.int({ error: (iss) => `${key} must be a positive integer, got ${show(iss.input)}` }).min(1, {
    error: (iss) => `${key} must be a positive integer, got ${show(iss.input)}`,
  });

const modelName = z.string({ error: 'worker option model= needs a name' }).min(1, { error: 'worker option model= needs a name' });

/** The object form, shared by every source. */
const workerObject = z
  .strictObject(
    {
      url,
      id: z
        .string()
        .regex(/^[A-Za-z0-9_.:@-]+$/, { error: (iss) => `worker id ${show(iss.input)} may use only [A-Za-z0-9_.:@-]` })
        .optional(),
      events: endpoint('events').optional(),
      replay: endpoint('replay').optional(),
      dp: positive('dp').optional(),
      blocks: positive('blocks').optional(),
      model: z.union([modelName, z.array(modelName)]).optional(),
      models: z.union([modelName, z.array(modelName)]).optional(),
      engine: z
        .enum(ENGINE_NAMES, { error: (iss) => `worker option engine=${show(iss.input)} must be ${namesText(ENGINE_NAMES)}` })
        .optional(),
      role: z
        .enum(['prefill', 'decode', 'both'], { error: (iss) => `worker option role=${show(iss.input)} must be prefill, decode or both` })
        .optional(),
      bootstrap: z
        .int({ error: (iss) => `worker option bootstrap=${show(iss.input)} must be a port in [1, 65535]` })
        .min(1, { error: (iss) => `worker option bootstrap=${show(iss.input)} must be a port in [1, 65535]` })
        .max(65535, { error: (iss) => `worker option bootstrap=${show(iss.input)} must be a port in [1, 65535]` })
        .optional(),
      disaggId: z.enum(SETTINGS, { error: (iss) => `worker option disagg-id=${show(iss.input)} must be auto, on or off` }).optional(),
      ctxUsage: z.enum(SETTINGS, { error: (iss) => `worker option ctx-usage=${show(iss.input)} must be auto, on or off` }).optional(),
      appProtocol: z
        .enum(['http', 'h2c'], { error: (iss) => `worker option app-protocol=${show(iss.input)} must be http or h2c` })
        .optional(),
    },
    {
      error: (iss) =>
        iss.code === 'unrecognized_keys'
          ? `unknown worker option ${iss.keys.map((k) => `"${k}"`).join(', ')} (known: url, ${OBJECT_KEYS.join(', ')}, models)`
          : 'a worker must be a spec string or an object with "url"',
    },
  )
  .transform((o): WorkerSpec => {
    const models = [o.models ?? [], o.model ?? []].flat();
    const out: { -readonly [K in keyof WorkerSpec]: WorkerSpec[K] } = { url: o.url };
    if (o.id !== undefined) out.id = o.id;
    if (o.events !== undefined) out.events = o.events;
    if (o.replay !== undefined) out.replay = o.replay;
    if (o.dp !== undefined) out.dp = o.dp;
    if (models.length > 0) out.models = models;
    if (o.blocks !== undefined) out.blocks = o.blocks;
    if (o.engine !== undefined) out.engine = o.engine;
    if (o.role !== undefined) out.role = o.role;
    if (o.bootstrap !== undefined) out.bootstrap = o.bootstrap;
    if (o.disaggId !== undefined) out.disaggId = o.disaggId;
    if (o.ctxUsage !== undefined) out.ctxUsage = o.ctxUsage;
    if (o.appProtocol !== undefined) out.appProtocol = o.appProtocol;
    return out;
  });

/** The string grammar -> the object form (values still unchecked), or a message. */
function specFields(spec: string): Record<string, unknown> | string {
  const parts = spec
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
  if (parts.length === 0) return `empty worker spec; expected ${WORKER_SPEC_GRAMMAR}`;
  const out: Record<string, unknown> = { url: parts[0] };
  for (const kv of parts.slice(1)) {
    const eq = kv.indexOf('=');
    if (eq < 0) return `worker option "${kv}" in "${spec}" must be key=value`;
    const key = kv.slice(0, eq);
    const value = kv.slice(eq + 1);
    if (!(OPTIONS as readonly string[]).includes(key)) return `unknown worker option "${key}" in "${spec}" (known: ${OPTIONS.join(', ')})`;
    if (key === 'model') out.models = [...((out.models as string[] | undefined) ?? []), value];
    else if (key === 'dp' || key === 'blocks' || key === 'bootstrap') out[key] = intText(value) ?? value;
    else out[KEY_OF[key] ?? key] = value;
  }
  return out;
}

/** A worker in any form: a spec string or an object. Issues carry the messages above. */
export const workerSchema = z.preprocess((value, ctx) => {
  if (typeof value !== 'string') return value;
  const fields = specFields(value);
  if (typeof fields === 'string') {
    ctx.issues.push({ code: 'custom', message: fields, input: value });
    return z.NEVER;
  }
  return fields;
}, workerObject);

function parse(value: unknown): WorkerSpec {
  const r = workerSchema.safeParse(value);
  if (!r.success) throw new Error(r.error.issues[0].message);
  return r.data;
}

/** Parses one `--worker` spec string. Throws an Error with an actionable message. */
export function parseWorkerSpec(spec: string): WorkerSpec {
  return parse(spec);
}

/** A worker given as an object (config file, admin API) or as a spec string. Throws an Error with an actionable message. */
export function workerFromUnknown(value: unknown): WorkerSpec {
  return parse(value);
}
