/**
 * Kubernetes discovery's settings, and the two kinds of value they hold: a label selector (`--k8s-selector`) and an
 * InferencePool API group (`--k8s-pool-group`). Every command that discovers workers (serve, epp, relay) takes the
 * keys of `K8S`; src/discovery/k8s reads the parsed values.
 */
import { z } from 'zod';
import { GROUPS } from './groups.ts';
import { choice, custom, list, optional, port, text, withDefault } from './settings.ts';

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

export const LABEL_KEY =
  /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
export const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$/;

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

// InferencePool API groups

/** The InferencePool API groups read: the GA group (v1) and the older alpha group (v1alpha2). */
export const POOL_GROUPS = {
  'inference.networking.k8s.io': { version: 'v1' },
  'inference.networking.x-k8s.io': { version: 'v1alpha2' },
} as const;
export type PoolGroup = keyof typeof POOL_GROUPS;

const anyPort = port();

/** An InferencePool's spec.targetPorts holds at most this many ports (api/v1/inferencepool_types.go). */
export const MAX_TARGET_PORTS = 8;

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

/** The Kubernetes discovery settings: shared by every command that discovers workers (serve, epp, relay). */
export const K8S = {
  k8sPool: optional(text({ pattern: /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/, accepts: 'a Kubernetes object name' }), {
    flag: '--k8s-pool <name>',
    env: 'KVROUTE_K8S_POOL',
    help: "discover workers from this InferencePool's ready pods (its selector and target port), watched in --k8s-namespace",
    group: GROUPS.k8s,
  }),
  k8sPoolGroup: withDefault(choice(Object.keys(POOL_GROUPS) as [PoolGroup, ...PoolGroup[]]), 'inference.networking.k8s.io', {
    flag: '--k8s-pool-group <group>',
    env: 'KVROUTE_K8S_POOL_GROUP',
    help: "the InferencePool's API group: inference.networking.k8s.io (v1) or the older inference.networking.x-k8s.io (v1alpha2)",
    group: GROUPS.k8s,
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
      group: GROUPS.k8s,
    },
  ),
  k8sNamespace: optional(text({ pattern: /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/, accepts: 'a namespace name' }), {
    flag: '--k8s-namespace <ns>',
    env: 'KVROUTE_K8S_NAMESPACE',
    help: "namespace watched (default: the kubeconfig context's, else the pod's own, else default)",
    group: GROUPS.k8s,
  }),
  kubeconfig: optional(text(), {
    flag: '--kubeconfig <file>',
    env: 'KVROUTE_KUBECONFIG',
    help: 'kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else the in-cluster service account)',
    group: GROUPS.k8s,
  }),
  k8sPort: withDefault(enginePorts, [8000], {
    flag: '--k8s-port <ports>',
    env: 'KVROUTE_K8S_PORT',
    help:
      "with --k8s-selector: the engines' HTTP ports, one worker per podIP:port (a pod's kvroute.io/port annotation names its one " +
      'port instead; a pool gives its target ports)',
    group: GROUPS.k8s,
  }),
  k8sEventsPort: withDefault(anyPort, 5557, {
    flag: '--k8s-events-port <n>',
    env: 'KVROUTE_K8S_EVENTS_PORT',
    help: "discovered pods' ZMQ KV-event port (annotation kvroute.io/events-port overrides it; 0: approximate mode)",
    group: GROUPS.k8s,
  }),
  k8sReplayPort: withDefault(anyPort, 5558, {
    flag: '--k8s-replay-port <n>',
    env: 'KVROUTE_K8S_REPLAY_PORT',
    help: "discovered pods' ZMQ replay port (annotation kvroute.io/replay-port overrides it; 0: none)",
    group: GROUPS.k8s,
  }),
};

/** The resolved Kubernetes discovery settings. */
export type K8sSettings = z.output<z.ZodObject<typeof K8S>>;

/** The keys of the Kubernetes discovery settings. */
export const K8S_SETTINGS = Object.keys(K8S) as Array<keyof typeof K8S>;
