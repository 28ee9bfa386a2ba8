/**
 * The reference picker's plugin configuration (`--config-file`, an EndpointPickerConfig: `plugins` with a `type`, an
 * optional `name` and `parameters`; `schedulingProfiles` naming them with `pluginRef` and a `weight`) read for what
 * kvroute has: the scorers of its scheduling profile choose the kvroute policy. Field names from llm-d/llm-d-router
 * pkg/epp/config (EndpointPickerConfig) and the chart's default-plugins.yaml (config/charts/routerlib/templates/
 * _config.yaml) @ebab6879; the known configurations (the built-in default, the optimized baseline, the precise-prefix
 * guide) as read in llm-d's repositories (docs/endpoint-picker.md lists them).
 *
 * A configuration that names llm-d's own decision maps to the peer policy of that name when kvroute's registry has it
 * (`llmd`, `llmd-baseline`), else to the closest kvroute policy. Nothing here fails: what cannot be read or has no
 * counterpart is listed for one log line.
 */
import { parse as parseYaml } from 'yaml';

export interface PickerConfigMapping {
  /** The kvroute policy the configuration maps to; undefined: nothing recognised (kvroute's --policy stays). */
  readonly policy?: string;
  /** Which known configuration it is, in words, for the log. */
  readonly matched: string;
  /** What has no counterpart in kvroute, for one log line. */
  readonly ignored: string[];
}

interface Plugin {
  readonly type: string;
  readonly name: string;
  readonly parameters?: unknown;
}

interface ProfileEntry {
  readonly type: string;
  readonly weight: number;
}

const PREFIX = new Set(['prefix-cache-scorer', 'precise-prefix-cache-scorer']);
const LOAD = new Set(['queue-scorer', 'active-request-scorer', 'load-aware-scorer', 'token-load-scorer']);
const KV_UTILIZATION = 'kv-cache-utilization-scorer';
/** Plugins that carry data, parse or pick, whose work kvroute's own pipeline does: not worth a note. */
const QUIET = new Set([
  'max-score-picker',
  'metrics-data-source',
  'core-metrics-extractor',
  'openai-parser',
  'anthropic-parser',
  'vllmhttp-parser',
  'passthrough-parser',
  'approx-prefix-cache-producer',
  'token-producer',
  'inflight-load-producer',
  'single-profile-handler',
  'session-id-producer',
]);

const obj = (v: unknown): Record<string, unknown> | undefined =>
  v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;

/** The peer policy when the registry has it, else kvroute's closest. */
function peer(name: string, closest: string, policies: readonly string[]): string {
  return policies.includes(name) ? name : closest;
}

/** Reads an EndpointPickerConfig's text; `policies` are the names kvroute's scheduling registry knows. */
export function mapPickerConfig(text: string, policies: readonly string[]): PickerConfigMapping {
  let doc: Record<string, unknown> | undefined;
  try {
    doc = obj(parseYaml(text));
  } catch (err) {
    return { matched: 'unreadable', ignored: [`the whole file (${(err as Error).message.split('\n')[0]})`] };
  }
  if (!doc) return { matched: 'empty', ignored: ['the whole file (not a mapping)'] };
  const ignored: string[] = [];
  if (doc.kind !== undefined && doc.kind !== 'EndpointPickerConfig') ignored.push(`kind ${String(doc.kind)}`);
  const plugins = new Map<string, Plugin>();
  for (const p of Array.isArray(doc.plugins) ? doc.plugins : []) {
    const o = obj(p);
    if (!o || typeof o.type !== 'string') continue;
    const name = typeof o.name === 'string' ? o.name : o.type;
    plugins.set(name, { type: o.type, name, parameters: o.parameters });
  }
  const profiles = (Array.isArray(doc.schedulingProfiles) ? doc.schedulingProfiles : []).map(obj).filter((p) => p !== undefined);
  if (profiles.length > 1) {
    ignored.push(
      `scheduling profiles other than the first (${profiles
        .slice(1)
        .map((p) => String(p.name))
        .join(', ')}; P/D comes from worker roles)`,
    );
  }
  // Without profiles, the reference runs every plugin in one default profile.
  const entries: ProfileEntry[] = [];
  const refs = profiles[0]
    ? Array.isArray(profiles[0].plugins)
      ? profiles[0].plugins
      : []
    : [...plugins.keys()].map((pluginRef) => ({ pluginRef }));
  for (const r of refs) {
    const o = obj(r);
    const ref = o && typeof o.pluginRef === 'string' ? o.pluginRef : undefined;
    if (!ref) continue;
    const type = plugins.get(ref)?.type ?? ref;
    const weight = typeof o?.weight === 'number' ? o.weight : 1;
    entries.push({ type, weight });
  }
  const types = new Set(entries.map((e) => e.type));
  for (const p of plugins.values()) types.add(p.type);
  const weightOf = (t: string) => entries.find((e) => e.type === t)?.weight;
  const scorers = entries.filter((e) => e.type.endsWith('-scorer'));
  const known = new Set<string>([...PREFIX, ...LOAD, KV_UTILIZATION, 'prefix-cache-affinity-filter', 'random-picker', ...QUIET]);
  for (const t of types) if (!known.has(t)) ignored.push(`plugin ${t}`);
  for (const p of plugins.values()) {
    if (p.parameters !== undefined && known.has(p.type) && !QUIET.has(p.type)) ignored.push(`${p.name} parameters`);
  }

  const hasPrefix = [...PREFIX].some((t) => types.has(t));
  const hasLoad = [...LOAD].some((t) => types.has(t));
  let policy: string | undefined;
  let matched: string;
  if (types.has('prefix-cache-affinity-filter') && types.has('token-load-scorer')) {
    policy = peer('llmd-baseline', 'kv', policies);
    matched = "llm-d's optimized baseline (prefix-cache affinity filter + token-load scorer)";
  } else if (
    scorers.length === 3 &&
    weightOf('queue-scorer') === 2 &&
    weightOf(KV_UTILIZATION) === 2 &&
    weightOf('prefix-cache-scorer') === 3
  ) {
    policy = peer('llmd', 'kv-pressure', policies);
    matched = "llm-d's built-in default (queue 2, kv-cache utilization 2, prefix cache 3)";
  } else if (hasPrefix && (hasLoad || types.has(KV_UTILIZATION))) {
    // Overlap against load (and KV memory): kvroute's kv-pressure weighs the same three things.
    policy = types.has(KV_UTILIZATION) ? 'kv-pressure' : 'kv';
    matched = types.has('precise-prefix-cache-scorer') ? 'a precise-prefix configuration' : 'a prefix + load configuration';
  } else if (hasPrefix) {
    policy = 'kv';
    matched = 'a prefix-only configuration';
  } else if (hasLoad || types.has(KV_UTILIZATION)) {
    policy = 'least-loaded';
    matched = 'a load-only configuration';
  } else if (types.has('random-picker')) {
    policy = 'random';
    matched = 'a random picker';
  } else matched = 'no scorer kvroute knows';
  if (policy !== undefined && scorers.length > 0 && policy !== 'llmd' && policy !== 'llmd-baseline') {
    ignored.push(`scorer weights (${scorers.map((s) => `${s.type} ${s.weight}`).join(', ')}: the ${policy} policy has its own balance)`);
  }
  return { ...(policy !== undefined ? { policy } : {}), matched, ignored };
}
