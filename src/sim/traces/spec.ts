/**
 * Generated traces by name: `KIND[:key=value,...]`, e.g. `agentic`, `agentic:requests=5000,mean-turns=4`,
 * `shared-prefix:groups=8,rate=inf`. `kvroute sim --trace` and the league take such a name where a file would go, so
 * a generated trace needs no file in between. Keys are the generator's options in kebab case; values are numbers
 * (`inf` for an unbounded rate) except the few string options.
 */
import type { TraceRequest } from './format.ts';
import {
  AGENTIC_DEFAULTS,
  generateAgentic,
  generateMultiTurn,
  generateNoisyNeighbour,
  generateSharedPrefix,
  generateSkewed,
  MULTI_TURN_DEFAULTS,
  NOISY_NEIGHBOUR_DEFAULTS,
  SHARED_PREFIX_DEFAULTS,
  SKEWED_DEFAULTS,
  TRACE_KINDS,
  type TraceKind,
} from './generate.ts';

/** Each kind's options and defaults: the keys a spec may set, and their types. */
const DEFAULTS: Record<TraceKind, Readonly<Record<string, number | string>>> = {
  skewed: SKEWED_DEFAULTS as unknown as Record<string, number>,
  'shared-prefix': { requests: 0, ...SHARED_PREFIX_DEFAULTS },
  'multi-turn': MULTI_TURN_DEFAULTS as unknown as Record<string, number | string>,
  'noisy-neighbour': NOISY_NEIGHBOUR_DEFAULTS as unknown as Record<string, number>,
  agentic: AGENTIC_DEFAULTS as unknown as Record<string, number>,
};

export interface TraceSpec {
  readonly kind: TraceKind;
  /** The options given, camel-cased and typed. */
  readonly options: Readonly<Record<string, number | string>>;
}

const kebab = (camel: string) => camel.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
const camel = (k: string) => k.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());

/** True when `text` names a generated trace (a known kind, alone or followed by `:`). */
export function isTraceSpec(text: string): boolean {
  const kind = text.split(':', 1)[0];
  return (TRACE_KINDS as readonly string[]).includes(kind) && (text === kind || text[kind.length] === ':');
}

/** Parses `KIND[:key=value,...]`; throws an Error whose message names the bad part and what is accepted. */
export function parseTraceSpec(text: string): TraceSpec {
  const colon = text.indexOf(':');
  const kind = (colon < 0 ? text : text.slice(0, colon)) as TraceKind;
  if (!(TRACE_KINDS as readonly string[]).includes(kind)) {
    throw new Error(`unknown trace kind "${kind}"; known: ${TRACE_KINDS.join(', ')}`);
  }
  const defaults = DEFAULTS[kind];
  const known = Object.keys(defaults).map(kebab);
  const options: Record<string, number | string> = {};
  const body = colon < 0 ? '' : text.slice(colon + 1);
  for (const part of body.split(',')) {
    if (part.trim() === '') continue;
    const eq = part.indexOf('=');
    if (eq <= 0) throw new Error(`trace "${text}": "${part}" is not key=value`);
    const key = part.slice(0, eq).trim();
    const raw = part.slice(eq + 1).trim();
    const name = camel(key);
    if (!(name in defaults)) throw new Error(`trace kind ${kind} has no option "${key}"; known: ${known.join(', ')}`);
    if (typeof defaults[name] === 'string') {
      options[name] = raw;
      continue;
    }
    const value = raw === 'inf' ? Infinity : Number(raw);
    // Only shared-prefix can send everything at once; the session generators need a finite rate to space sessions.
    const infOk = name === 'rate' && kind === 'shared-prefix';
    if (raw === '' || Number.isNaN(value) || value < 0 || (value === Infinity && !infOk)) {
      throw new Error(`trace "${text}": ${key} must be a non-negative number${infOk ? ' or inf' : ''}, got "${raw}"`);
    }
    options[name] = value;
  }
  return { kind, options };
}

/**
 * Generates the trace a spec names. `seed` is the generator's seed unless the spec sets one, so `kvroute sim --seed N`
 * draws a different trace per seed.
 */
export function generateFromSpec(spec: TraceSpec | string, seed?: number): TraceRequest[] {
  const s = typeof spec === 'string' ? parseTraceSpec(spec) : spec;
  const o = { ...(seed !== undefined ? { seed } : {}), ...s.options } as Record<string, number | string>;
  switch (s.kind) {
    case 'skewed':
      return generateSkewed(o);
    case 'shared-prefix':
      // requests=0 (its placeholder default) means "all groups x prompts", as the generator's own default.
      return generateSharedPrefix(o.requests ? o : { ...o, requests: undefined });
    case 'multi-turn':
      return generateMultiTurn(o);
    case 'noisy-neighbour':
      return generateNoisyNeighbour(o);
    case 'agentic':
      return generateAgentic(o);
  }
}
