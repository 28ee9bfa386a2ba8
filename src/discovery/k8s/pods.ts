/**
 * What a Kubernetes object means for the worker table, as pure functions (no I/O, no clock): a label selector, an
 * InferencePool's selector and target port, and a pod's worker spec (or why it is not a worker). The watch shell
 * (`discovery.ts`) feeds objects in and applies the difference through the admin API's add/remove.
 *
 * Pod conventions (defaults in parentheses; docs/kubernetes.md):
 *   annotation kvroute.io/port          the engine's HTTP port (the pool's target port, else --k8s-port)
 *   annotation kvroute.io/events-port   ZMQ KV-event port of rank 0 (--k8s-events-port; 0 = no events: approximate mode)
 *   annotation kvroute.io/replay-port   ZMQ replay port of rank 0 (--k8s-replay-port; 0 = none)
 *   annotation kvroute.io/dp            data-parallel ranks (1)
 *   annotation kvroute.io/engine        an engine of the registry (sglang when sglang.ai/bootstrap-port is set, else vllm)
 *   annotation kvroute.io/model         served model names, comma-separated (discovered from GET /v1/models)
 *   annotation kvroute.io/blocks        KV capacity in blocks per rank (learned from the engine's metrics)
 *   label      llm-d.ai/role            prefill, decode or both (llm-d's convention; absent: aggregated serving)
 *   annotation sglang.ai/bootstrap-port SGLang prefill's bootstrap port (SGLang's convention; 8998)
 */
import type { WorkerSpec } from '../../config/worker-spec.ts';
import { engineNamesText, isEngineName } from '../../engines/index.ts';

export const POD_KEYS = {
  port: 'kvroute.io/port',
  eventsPort: 'kvroute.io/events-port',
  replayPort: 'kvroute.io/replay-port',
  dp: 'kvroute.io/dp',
  engine: 'kvroute.io/engine',
  model: 'kvroute.io/model',
  blocks: 'kvroute.io/blocks',
  role: 'llm-d.ai/role',
  bootstrapPort: 'sglang.ai/bootstrap-port',
} as const;

/** Why an object was dropped as malformed (a bounded label set for the counter). */
export type BadObjectReason = 'not_an_object' | 'no_name' | 'bad_annotation' | 'bad_label' | 'bad_pool_spec';

export class BadObject extends Error {
  constructor(
    readonly reason: BadObjectReason,
    message: string,
  ) {
    super(message);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Label selectors: the equality-based and existence forms (`a=b`, `a==b`, `a!=b`, `a`, `!a`), comma-separated.

export interface SelectorTerm {
  readonly key: string;
  readonly op: '=' | '!=' | 'exists' | '!exists';
  readonly value?: string;
}

export interface LabelSelector {
  readonly terms: readonly SelectorTerm[];
  /** The canonical text, as sent in the API's labelSelector parameter. */
  readonly text: string;
}

const LABEL_KEY = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$/;

/** Parses `app=vllm,tier!=batch,gpu`; throws an Error naming the bad term. Set-based terms (`in`, `notin`) are refused. */
export function parseLabelSelector(text: string): LabelSelector {
  const terms: SelectorTerm[] = [];
  for (const raw of text.split(',')) {
    const t = raw.trim();
    if (!t) throw new Error(`empty term in label selector "${text}"`);
    if (/\s(in|notin)\s*\(/.test(t)) throw new Error(`set-based term "${t}" is not supported: use key=value, key!=value, key or !key`);
    const m = /^(!?)([^=!\s]+)\s*(?:(==|=|!=)\s*(\S*))?$/.exec(t);
    if (!m) throw new Error(`bad label selector term "${t}": use key=value, key!=value, key or !key`);
    const [, not, key, op, value] = m;
    if (!LABEL_KEY.test(key)) throw new Error(`bad label key "${key}" in selector "${text}"`);
    if (op !== undefined) {
      if (not) throw new Error(`bad label selector term "${t}"`);
      if (!LABEL_VALUE.test(value)) throw new Error(`bad label value "${value}" in selector "${text}"`);
      terms.push({ key, op: op === '!=' ? '!=' : '=', value });
    } else terms.push({ key, op: not ? '!exists' : 'exists' });
  }
  return { terms, text: terms.map(termText).join(',') };
}

function termText(t: SelectorTerm): string {
  if (t.op === 'exists') return t.key;
  if (t.op === '!exists') return `!${t.key}`;
  return `${t.key}${t.op}${t.value}`;
}

/** The selector of an InferencePool's matchLabels (every pair must match). */
export function selectorFromLabels(labels: Readonly<Record<string, string>>): LabelSelector {
  const terms = Object.keys(labels)
    .sort()
    .map((key): SelectorTerm => ({ key, op: '=', value: labels[key] }));
  return { terms, text: terms.map(termText).join(',') };
}

export function matchesSelector(selector: LabelSelector, labels: Readonly<Record<string, string>>): boolean {
  for (const t of selector.terms) {
    const has = Object.hasOwn(labels, t.key);
    if (t.op === 'exists' && !has) return false;
    if (t.op === '!exists' && has) return false;
    if (t.op === '=' && labels[t.key] !== t.value) return false;
    if (t.op === '!=' && has && labels[t.key] === t.value) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------------------
// InferencePool

/** The InferencePool API groups read: the GA group (v1) and the older alpha group (v1alpha2). */
export const POOL_GROUPS = {
  'inference.networking.k8s.io': { version: 'v1' },
  'inference.networking.x-k8s.io': { version: 'v1alpha2' },
} as const;
export type PoolGroup = keyof typeof POOL_GROUPS;

export interface PoolTarget {
  readonly selector: LabelSelector;
  /** The model servers' port (targetPorts[0].number in v1, targetPortNumber in v1alpha2). */
  readonly port: number;
}

const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const isPort = (v: unknown): v is number => Number.isInteger(v) && (v as number) >= 1 && (v as number) <= 65535;

function stringMap(v: unknown, what: string): Record<string, string> {
  if (!isRecord(v)) throw new BadObject('bad_pool_spec', `${what} must be a map of labels`);
  const out: Record<string, string> = {};
  for (const [k, val] of Object.entries(v)) {
    if (typeof val !== 'string' || !LABEL_KEY.test(k) || !LABEL_VALUE.test(val)) {
      throw new BadObject('bad_pool_spec', `${what} has a bad label ${JSON.stringify(k)}: ${JSON.stringify(val)}`);
    }
    out[k] = val;
  }
  return out;
}

/** The pods and port an InferencePool names; throws BadObject when its spec is not the CRD's shape. */
export function poolTarget(obj: unknown, group: PoolGroup): PoolTarget {
  if (!isRecord(obj)) throw new BadObject('not_an_object', 'the InferencePool is not an object');
  const spec = obj.spec;
  if (!isRecord(spec)) throw new BadObject('bad_pool_spec', 'the InferencePool has no spec');
  if (group === 'inference.networking.k8s.io') {
    if (!isRecord(spec.selector)) throw new BadObject('bad_pool_spec', 'spec.selector must be {matchLabels: {...}}');
    const labels = stringMap(spec.selector.matchLabels, 'spec.selector.matchLabels');
    const ports = spec.targetPorts;
    if (!Array.isArray(ports) || ports.length === 0 || !isRecord(ports[0]) || !isPort(ports[0].number)) {
      throw new BadObject('bad_pool_spec', 'spec.targetPorts must be [{number: 1-65535}]');
    }
    return { selector: selectorFromLabels(labels), port: ports[0].number };
  }
  const labels = stringMap(spec.selector, 'spec.selector');
  if (!isPort(spec.targetPortNumber)) throw new BadObject('bad_pool_spec', 'spec.targetPortNumber must be 1-65535');
  return { selector: selectorFromLabels(labels), port: spec.targetPortNumber };
}

// ---------------------------------------------------------------------------------------------------------------
// Pods

export interface PodDefaults {
  /** The engines' HTTP port when neither the pool nor the pod's annotation gives one. */
  readonly port: number;
  /** Rank 0's KV-event port; 0 = no events (approximate mode). */
  readonly eventsPort: number;
  /** Rank 0's replay port; 0 = no replay. */
  readonly replayPort: number;
}

export type PodVerdict =
  | { readonly kind: 'worker'; readonly spec: WorkerSpec }
  | { readonly kind: 'absent'; readonly reason: 'not_selected' | 'not_ready' | 'terminating' | 'no_ip' };

/** A pod's name (the worker id); throws BadObject for an object without one. */
export function podName(obj: unknown): string {
  if (!isRecord(obj) || !isRecord(obj.metadata)) throw new BadObject('not_an_object', 'the pod has no metadata');
  const name = obj.metadata.name;
  if (typeof name !== 'string' || !/^[A-Za-z0-9_.:@-]{1,253}$/.test(name)) throw new BadObject('no_name', 'the pod has no usable name');
  return name;
}

function strings(v: unknown, what: string, reason: BadObjectReason): Record<string, string> {
  if (v === undefined || v === null) return {};
  if (!isRecord(v)) throw new BadObject(reason, `${what} must be a map`);
  const out: Record<string, string> = {};
  for (const [k, val] of Object.entries(v)) {
    if (typeof val !== 'string') throw new BadObject(reason, `${what} ${k} must be a string`);
    out[k] = val;
  }
  return out;
}

function portAnnotation(annotations: Record<string, string>, key: string, fallback: number, allowZero: boolean): number {
  const raw = annotations[key];
  if (raw === undefined) return fallback;
  const n = /^\d{1,5}$/.test(raw.trim()) ? Number(raw.trim()) : Number.NaN;
  if (!(n <= 65535 && (n >= 1 || (allowZero && n === 0)))) {
    throw new BadObject('bad_annotation', `annotation ${key}=${JSON.stringify(raw)} must be a port number${allowZero ? ' (or 0)' : ''}`);
  }
  return n;
}

function positiveAnnotation(annotations: Record<string, string>, key: string): number | undefined {
  const raw = annotations[key];
  if (raw === undefined) return undefined;
  const n = /^\d{1,9}$/.test(raw.trim()) ? Number(raw.trim()) : 0;
  if (n < 1) throw new BadObject('bad_annotation', `annotation ${key}=${JSON.stringify(raw)} must be a positive integer`);
  return n;
}

function isReady(status: Record<string, unknown>): boolean {
  if (status.phase !== 'Running') return false;
  const conditions = Array.isArray(status.conditions) ? status.conditions : [];
  return conditions.some((c) => isRecord(c) && c.type === 'Ready' && c.status === 'True');
}

/**
 * What one pod is for the router: a worker (Running, Ready, with an IP, not being deleted, selected) or absent and
 * why. Throws BadObject when its labels or kvroute annotations are malformed (the pod is then not a worker).
 */
export function podVerdict(obj: unknown, selector: LabelSelector, defaults: PodDefaults, poolPort?: number): PodVerdict {
  const name = podName(obj);
  const pod = obj as Record<string, Record<string, unknown>>;
  const labels = strings(pod.metadata.labels, 'label', 'bad_label');
  const annotations = strings(pod.metadata.annotations, 'annotation', 'bad_annotation');
  if (!matchesSelector(selector, labels)) return { kind: 'absent', reason: 'not_selected' };
  if (pod.metadata.deletionTimestamp) return { kind: 'absent', reason: 'terminating' };
  const status = isRecord(pod.status) ? pod.status : {};
  if (!isReady(status)) return { kind: 'absent', reason: 'not_ready' };
  const ip = typeof status.podIP === 'string' ? status.podIP : '';
  if (!ip) return { kind: 'absent', reason: 'no_ip' };

  const port = portAnnotation(annotations, POD_KEYS.port, poolPort ?? defaults.port, false);
  const eventsPort = portAnnotation(annotations, POD_KEYS.eventsPort, defaults.eventsPort, true);
  const replayPort = portAnnotation(annotations, POD_KEYS.replayPort, defaults.replayPort, true);
  const bootstrap =
    annotations[POD_KEYS.bootstrapPort] === undefined ? undefined : portAnnotation(annotations, POD_KEYS.bootstrapPort, 0, false);
  const engine = annotations[POD_KEYS.engine] ?? (bootstrap !== undefined ? 'sglang' : undefined);
  if (engine !== undefined && !isEngineName(engine)) {
    throw new BadObject('bad_annotation', `annotation ${POD_KEYS.engine}=${JSON.stringify(engine)} must be ${engineNamesText()}`);
  }
  const role = labels[POD_KEYS.role];
  if (role !== undefined && role !== 'prefill' && role !== 'decode' && role !== 'both') {
    throw new BadObject('bad_label', `label ${POD_KEYS.role}=${JSON.stringify(role)} must be prefill, decode or both`);
  }
  const models = annotations[POD_KEYS.model]
    ?.split(',')
    .map((m) => m.trim())
    .filter(Boolean);
  const host = ip.includes(':') ? `[${ip}]` : ip;
  const spec: WorkerSpec = {
    id: name,
    url: `http://${host}:${port}`,
    ...(eventsPort > 0 ? { events: `tcp://${host}:${eventsPort}` } : {}),
    ...(eventsPort > 0 && replayPort > 0 ? { replay: `tcp://${host}:${replayPort}` } : {}),
    ...(positiveAnnotation(annotations, POD_KEYS.dp) !== undefined ? { dp: positiveAnnotation(annotations, POD_KEYS.dp) } : {}),
    ...(models?.length ? { models } : {}),
    ...(positiveAnnotation(annotations, POD_KEYS.blocks) !== undefined ? { blocks: positiveAnnotation(annotations, POD_KEYS.blocks) } : {}),
    ...(engine ? { engine } : {}),
    ...(role ? { role } : {}),
    ...(bootstrap !== undefined ? { bootstrap } : {}),
  };
  return { kind: 'worker', spec };
}

/** A spec's identity for change detection: a worker whose spec changes is removed and added again. */
export function specKey(spec: WorkerSpec): string {
  return JSON.stringify([spec.url, spec.events, spec.replay, spec.dp, spec.models, spec.blocks, spec.engine, spec.role, spec.bootstrap]);
}

export interface WorkerDiff {
  readonly remove: readonly string[];
  readonly add: readonly WorkerSpec[];
}

/** The changes that turn the applied worker set (id -> specKey) into the desired one (a changed spec: remove, add). */
export function diffWorkers(applied: ReadonlyMap<string, string>, desired: ReadonlyMap<string, WorkerSpec>): WorkerDiff {
  const remove: string[] = [];
  const add: WorkerSpec[] = [];
  for (const [id, key] of applied) {
    const want = desired.get(id);
    if (!want || specKey(want) !== key) remove.push(id);
  }
  for (const [id, spec] of desired) {
    if (applied.get(id) !== specKey(spec)) add.push(spec);
  }
  return { remove, add };
}
