/**
 * What a Kubernetes object means for the worker table, as pure functions (no I/O, no clock): a label selector, an
 * InferencePool's selector, target ports and app protocol, and a pod's worker specs (or why it is not a worker). The
 * watch shell (`discovery.ts`) feeds objects in and applies the difference through the admin API's add/remove.
 *
 * An InferencePool (v1) lists up to 8 target ports, "every port treated as a distinctive endpoint ... podIP:port"
 * (kubernetes-sigs/gateway-api-inference-extension api/v1/inferencepool_types.go @84436a96b9e6): a pod is one worker
 * per port (named `<pod>-<port>` when there are several), and `spec.appProtocol` (`http`, `kubernetes.io/h2c`) says
 * whether they speak HTTP/1.1 or HTTP/2 with prior knowledge.
 *
 * Pod conventions (defaults in parentheses; docs/kubernetes.md):
 *   annotation kvroute.io/port          the engine's HTTP port, one worker (the pool's target ports, else --k8s-port's)
 *   annotation kvroute.io/events-port   ZMQ KV-event port of rank 0 (--k8s-events-port; 0 = no events: approximate mode);
 *                                       the engine on the i-th target port uses it + i × dp
 *   annotation kvroute.io/replay-port   ZMQ replay port of rank 0 (--k8s-replay-port; 0 = none), + i × dp likewise
 *   annotation kvroute.io/dp            data-parallel ranks per engine (1)
 *   annotation kvroute.io/engine        an engine of the registry (sglang when sglang.ai/bootstrap-port is set, else vllm)
 *   annotation kvroute.io/model         served model names, comma-separated (discovered from GET /v1/models)
 *   annotation kvroute.io/blocks        KV capacity in blocks per rank (learned from the engine's metrics)
 *   annotation kvroute.io/disagg-id     TensorRT-LLM P/D: auto, on or off (the worker option disagg-id=)
 *   annotation kvroute.io/ctx-usage     TensorRT-LLM P/D: auto, on or off (the worker option ctx-usage=)
 *   label      llm-d.ai/role            llm-d's roles (llm-d-inference-scheduler docs/disaggregation.md @520af47896e5):
 *                                       prefill, decode, prefill-decode (and the deprecated both: aggregated), the
 *                                       encode-* combinations as their prefill/decode part; encode alone is no routing
 *                                       target (absent, reason encode_only); no label: aggregated serving
 *   annotation sglang.ai/bootstrap-port SGLang prefill's bootstrap port (SGLang's convention; 8998), + i per target port
 */
import {
  LABEL_KEY,
  LABEL_VALUE,
  type LabelSelector,
  MAX_TARGET_PORTS,
  matchesSelector,
  type PoolGroup,
  selectorFromLabels,
} from '../../config/k8s.ts';
export { MAX_TARGET_PORTS };
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
  disaggId: 'kvroute.io/disagg-id',
  ctxUsage: 'kvroute.io/ctx-usage',
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
// InferencePool

export interface PoolTarget {
  readonly selector: LabelSelector;
  /** The model servers' ports (targetPorts[].number in v1, up to 8; targetPortNumber in v1alpha2): one worker each. */
  readonly ports: readonly number[];
  /** How they speak (spec.appProtocol: kubernetes.io/h2c is HTTP/2 with prior knowledge). Default http. */
  readonly appProtocol?: 'http' | 'h2c';
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
    if (!Array.isArray(ports) || ports.length === 0 || !ports.every((p) => isRecord(p) && isPort(p.number))) {
      throw new BadObject('bad_pool_spec', 'spec.targetPorts must be [{number: 1-65535}, ...]');
    }
    if (ports.length > MAX_TARGET_PORTS) throw new BadObject('bad_pool_spec', `spec.targetPorts lists more than ${MAX_TARGET_PORTS} ports`);
    const numbers = ports.map((p) => (p as { number: number }).number);
    if (new Set(numbers).size !== numbers.length) throw new BadObject('bad_pool_spec', 'spec.targetPorts lists a port twice');
    const ap = spec.appProtocol;
    if (ap !== undefined && ap !== null && ap !== 'http' && ap !== 'kubernetes.io/h2c') {
      throw new BadObject('bad_pool_spec', `spec.appProtocol ${JSON.stringify(ap)} must be http or kubernetes.io/h2c`);
    }
    return { selector: selectorFromLabels(labels), ports: numbers, appProtocol: ap === 'kubernetes.io/h2c' ? 'h2c' : 'http' };
  }
  const labels = stringMap(spec.selector, 'spec.selector');
  if (!isPort(spec.targetPortNumber)) throw new BadObject('bad_pool_spec', 'spec.targetPortNumber must be 1-65535');
  return { selector: selectorFromLabels(labels), ports: [spec.targetPortNumber] };
}

// ---------------------------------------------------------------------------------------------------------------
// Pods

export interface PodDefaults {
  /** The engines' HTTP ports (one worker each) when neither the pool nor the pod's annotation gives them. */
  readonly ports: readonly number[];
  /** Rank 0's KV-event port; 0 = no events (approximate mode). */
  readonly eventsPort: number;
  /** Rank 0's replay port; 0 = no replay. */
  readonly replayPort: number;
}

export type PodVerdict =
  /** One worker per target port. */
  | {
      readonly kind: 'worker';
      readonly specs: readonly WorkerSpec[];
      /** Something the pod's ports get wrong that discovery worked around (logged once per pod). */
      readonly warning?: string;
    }
  | { readonly kind: 'absent'; readonly reason: 'not_selected' | 'not_ready' | 'terminating' | 'no_ip' | 'encode_only' };

/**
 * llm-d's role label as a worker role: the prefill and decode parts of the combination; null for encode alone (it
 * embeds media for others and serves no generation), undefined when the value is none of llm-d's.
 */
export function roleOfLabel(value: string): 'prefill' | 'decode' | 'both' | null | undefined {
  const parts = value.split('-');
  if (!parts.every((p) => p === 'encode' || p === 'prefill' || p === 'decode') || new Set(parts).size !== parts.length) {
    return value === 'both' ? 'both' : undefined;
  }
  const prefill = parts.includes('prefill');
  const decode = parts.includes('decode');
  if (prefill && decode) return 'both';
  if (prefill) return 'prefill';
  if (decode) return 'decode';
  return null;
}

const SETTINGS = new Set(['auto', 'on', 'off']);
function settingAnnotation(annotations: Record<string, string>, key: string): 'auto' | 'on' | 'off' | undefined {
  const raw = annotations[key];
  if (raw === undefined) return undefined;
  if (!SETTINGS.has(raw.trim())) throw new BadObject('bad_annotation', `annotation ${key}=${JSON.stringify(raw)} must be auto, on or off`);
  return raw.trim() as 'auto' | 'on' | 'off';
}

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
 * What one pod is for the router: workers (Running, Ready, with an IP, not being deleted, selected: one per target
 * port) or absent and why. Throws BadObject when its labels or kvroute annotations are malformed (the pod is then not
 * a worker).
 */
export function podVerdict(obj: unknown, selector: LabelSelector, defaults: PodDefaults, pool?: Omit<PoolTarget, 'selector'>): PodVerdict {
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

  // The pod's own port annotation names its one engine; otherwise the pool's ports (or the default) do.
  const ports =
    annotations[POD_KEYS.port] !== undefined ? [portAnnotation(annotations, POD_KEYS.port, 0, false)] : (pool?.ports ?? defaults.ports);
  const eventsPort = portAnnotation(annotations, POD_KEYS.eventsPort, defaults.eventsPort, true);
  const replayPort = portAnnotation(annotations, POD_KEYS.replayPort, defaults.replayPort, true);
  const bootstrap =
    annotations[POD_KEYS.bootstrapPort] === undefined ? undefined : portAnnotation(annotations, POD_KEYS.bootstrapPort, 0, false);
  const engine = annotations[POD_KEYS.engine] ?? (bootstrap !== undefined ? 'sglang' : undefined);
  if (engine !== undefined && !isEngineName(engine)) {
    throw new BadObject('bad_annotation', `annotation ${POD_KEYS.engine}=${JSON.stringify(engine)} must be ${engineNamesText()}`);
  }
  const roleLabel = labels[POD_KEYS.role];
  const role = roleLabel === undefined ? undefined : roleOfLabel(roleLabel);
  if (role === undefined && roleLabel !== undefined) {
    throw new BadObject(
      'bad_label',
      `label ${POD_KEYS.role}=${JSON.stringify(roleLabel)} must be one of llm-d's roles (prefill, decode, prefill-decode, encode-*)`,
    );
  }
  if (role === null) return { kind: 'absent', reason: 'encode_only' };
  const disaggId = settingAnnotation(annotations, POD_KEYS.disaggId);
  const ctxUsage = settingAnnotation(annotations, POD_KEYS.ctxUsage);
  const models = annotations[POD_KEYS.model]
    ?.split(',')
    .map((m) => m.trim())
    .filter(Boolean);
  const host = ip.includes(':') ? `[${ip}]` : ip;
  const dp = positiveAnnotation(annotations, POD_KEYS.dp);
  const blocks = positiveAnnotation(annotations, POD_KEYS.blocks);
  const stride = dp ?? 1;
  // Every rank of every engine publishes on events + its index and replays on replay + its index (vLLM offsets both
  // endpoints by rank: ZmqEventPublisher). If the two ranges meet, some rank's events port is another's replay port:
  // the replay cannot be what the pod runs (vLLM's replay endpoint is off unless set), so it is dropped, with a warning.
  const span = ports.length * stride;
  const overlap = eventsPort > 0 && replayPort > 0 && replayPort < eventsPort + span && eventsPort < replayPort + span;
  const useReplay = replayPort > 0 && !overlap;
  const specs = ports.map((port, i): WorkerSpec => {
    const offset = (p: number) => p + i * stride;
    if (eventsPort > 0 && offset(eventsPort) > 65535)
      throw new BadObject('bad_annotation', `the events port of target port ${port} is past 65535`);
    return {
      id: ports.length > 1 ? `${name}-${port}` : name,
      url: `http://${host}:${port}`,
      ...(eventsPort > 0 ? { events: `tcp://${host}:${offset(eventsPort)}` } : {}),
      ...(eventsPort > 0 && useReplay ? { replay: `tcp://${host}:${offset(replayPort)}` } : {}),
      ...(dp !== undefined ? { dp } : {}),
      ...(models?.length ? { models } : {}),
      ...(blocks !== undefined ? { blocks } : {}),
      ...(engine ? { engine } : {}),
      ...(role ? { role } : {}),
      ...(bootstrap !== undefined ? { bootstrap: bootstrap + i } : {}),
      ...(pool?.appProtocol === 'h2c' ? { appProtocol: 'h2c' as const } : {}),
      ...(disaggId !== undefined ? { disaggId } : {}),
      ...(ctxUsage !== undefined ? { ctxUsage } : {}),
    };
  });
  if (!overlap) return { kind: 'worker', specs };
  const range = (p: number) => (span > 1 ? `${p}-${p + span - 1}` : `${p}`);
  return {
    kind: 'worker',
    specs,
    warning:
      `its ${span} events ports (${range(eventsPort)}) and replay ports (${range(replayPort)}) overlap: replay is off for it; ` +
      `set ${POD_KEYS.replayPort} (or --k8s-replay-port) to ${eventsPort + span} or more, or 0`,
  };
}

/** A spec's identity for change detection: a worker whose spec changes is removed and added again. */
export function specKey(spec: WorkerSpec): string {
  return JSON.stringify([
    spec.url,
    spec.events,
    spec.replay,
    spec.dp,
    spec.models,
    spec.blocks,
    spec.engine,
    spec.role,
    spec.bootstrap,
    spec.appProtocol,
    spec.disaggId,
    spec.ctxUsage,
  ]);
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
