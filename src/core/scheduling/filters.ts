/**
 * The filter stage: which sources may take a request at all. Two levels, each an ordered list of named filters; the
 * first filter that leaves nothing names the refusal.
 *
 * Worker-level (the Dispatcher, at the moment of routing; a worker passes or fails with all its ranks):
 *   pin      the request continues state held by one worker (a stored response): only that worker
 *   model    the worker serves the requested model or adapter (a worker whose list is unknown yet serves anything)
 *   role     the worker's role is one the request's leg accepts (aggregated: both | decode; P/D legs: their role),
 *            and its engine is the one the leg needs (the prefill leg speaks its decode worker's handoff protocol)
 *   health   the worker passed its last health probes
 *   breaker  its circuit breaker is closed, or half-open with the one trial still free
 *   subset   the request named a subset of sources (a gateway's endpoint subset) and one of the worker's ranks is in it
 *
 * Source-level (KvRouter.route, per data-parallel rank; `busy` reads the source's load facts, facts.ts):
 *   allow    the source is in the eligible set the worker-level filters produced
 *   exclude  the source is not one a retry moves away from
 *   busy     active blocks within activeBlockFraction of capacity and active prefill tokens within the threshold
 */

export type WorkerRole = 'both' | 'prefill' | 'decode';

/** What the worker-level filters read of a worker (the Dispatcher's WorkerState). */
export interface FilterableWorker {
  readonly id: string;
  readonly role: WorkerRole;
  readonly engine: string;
  readonly sourceKeys: readonly string[];
  readonly healthy: boolean;
  readonly adapters: ReadonlySet<string>;
  readonly breaker: { admits(now: number): boolean };
  serves(model: string): boolean;
}

/** Which filter removed the last candidates: the refusal's precise reason. */
export type EligibilityRefusal = 'no_workers' | 'model_not_found' | 'no_workers_for_role' | 'no_healthy_workers' | 'subset_unavailable';

export interface EligibilityQuery {
  readonly model: string;
  /** Roles the leg accepts; default both and decode (a request served without disaggregation runs on a decode worker). */
  readonly roles?: ReadonlySet<WorkerRole>;
  /** Source keys the request is restricted to (a gateway's endpoint subset). */
  readonly subset?: ReadonlySet<string>;
  /** Only workers of this engine flavour (the prefill leg must speak its decode worker's handoff protocol). */
  readonly engine?: string;
  /** The worker holding the state this request continues (a pin); only it is eligible. */
  readonly pinned?: string;
  /** Any model will do (a pass-through without a model in its body). */
  readonly anyModel?: boolean;
}

export const AGGREGATED: ReadonlySet<WorkerRole> = new Set<WorkerRole>(['both', 'decode']);

export interface WorkerFilter {
  readonly name: string;
  readonly description: string;
  readonly refusal: EligibilityRefusal;
  admits(w: FilterableWorker, q: EligibilityQuery, now: number): boolean;
  /** The refusal's message when this filter left nothing. */
  message(q: EligibilityQuery): string;
}

const modelMessage = (q: EligibilityQuery) =>
  `the model "${q.model}" does not exist ${q.pinned !== undefined ? `on worker ${q.pinned}, which holds the state this request continues` : 'on any worker'}`;
const unhealthy = (why: string) => (q: EligibilityQuery) => `every worker serving "${q.model}" ${why}; try again shortly`;

/** The worker-level filters, in the order they run. */
export const WORKER_FILTERS: readonly WorkerFilter[] = [
  {
    name: 'pin',
    description: 'only the worker holding the state the request continues',
    refusal: 'model_not_found',
    admits: (w, q) => q.pinned === undefined || w.id === q.pinned,
    message: modelMessage,
  },
  {
    name: 'model',
    description: 'serves the requested model or adapter (an unknown model list serves anything)',
    refusal: 'model_not_found',
    admits: (w, q) => q.anyModel === true || w.serves(q.model),
    message: modelMessage,
  },
  {
    name: 'role',
    description: "the leg's roles (aggregated: both | decode) and engine",
    refusal: 'no_workers_for_role',
    admits: (w, q) => (q.roles ?? AGGREGATED).has(w.role) && (q.engine === undefined || w.engine === q.engine),
    message: (q) =>
      `no worker serving "${q.model}" has the role ${[...(q.roles ?? AGGREGATED)].join(' or ')}${q.engine ? ` (engine ${q.engine})` : ''}`,
  },
  {
    name: 'health',
    description: 'passed its last health probes',
    refusal: 'no_healthy_workers',
    admits: (w) => w.healthy,
    message: unhealthy('failed their health checks'),
  },
  {
    name: 'breaker',
    description: 'circuit breaker closed, or half-open with its trial free',
    refusal: 'no_healthy_workers',
    admits: (w, _q, now) => w.breaker.admits(now),
    message: unhealthy('have their circuit breaker open'),
  },
  {
    name: 'subset',
    description: 'one of its ranks is in the endpoint subset the request named',
    refusal: 'subset_unavailable',
    admits: (w, q) => q.subset === undefined || w.sourceKeys.some((k) => q.subset!.has(k)),
    message: (q) => `none of the ${q.subset?.size ?? 0} endpoints the request was restricted to is eligible`,
  },
];

const ROLE_FILTER = WORKER_FILTERS.findIndex((f) => f.name === 'role');

export interface Eligible<W extends FilterableWorker> {
  readonly kind: 'eligible';
  readonly allow: ReadonlySet<string>;
  /** The adapter name to hash with, when the model is a LoRA adapter on the eligible workers. */
  readonly loraName: string | null;
  /** Eligible workers by id, to map the picked source back. */
  readonly workers: ReadonlyMap<string, W>;
}

export interface Ineligible {
  readonly kind: 'ineligible';
  readonly reason: EligibilityRefusal;
  readonly message: string;
}

/**
 * The adapter name a request's blocks are hashed with (eligibility's `loraName`): the model, once a worker passing the
 * filters up to the role lists it as a LoRA adapter (healthy or not); otherwise null. What an HTTP shell of
 * `serve --processes` that hashes ahead of the routing core must have seeded its hashes with.
 */
export function hashLoraOf(workers: Iterable<FilterableWorker>, q: EligibilityQuery, now: number): string | null {
  for (const w of workers) {
    if (!w.adapters.has(q.model)) continue;
    let k = 0;
    while (k <= ROLE_FILTER && WORKER_FILTERS[k].admits(w, q, now)) k++;
    if (k > ROLE_FILTER) return q.model;
  }
  return null;
}

/** Runs the worker-level filters in order on each worker; the first filter that leaves nothing names the refusal. */
export function eligibility<W extends FilterableWorker>(workers: Iterable<W>, q: EligibilityQuery, now: number): Eligible<W> | Ineligible {
  const passed = new Array<number>(WORKER_FILTERS.length).fill(0);
  let any = false;
  let loraName: string | null = null;
  const allow = new Set<string>();
  const picked = new Map<string, W>();
  for (const w of workers) {
    any = true;
    let k = 0;
    for (; k < WORKER_FILTERS.length; k++) {
      if (!WORKER_FILTERS[k].admits(w, q, now)) break;
      passed[k]++;
      // A LoRA adapter is hashed with its name once a worker of the right role lists it, healthy or not (hashLoraOf).
      if (k === ROLE_FILTER && w.adapters.has(q.model)) loraName = q.model;
    }
    if (k < WORKER_FILTERS.length) continue;
    for (const key of w.sourceKeys) if (q.subset === undefined || q.subset.has(key)) allow.add(key);
    picked.set(w.id, w);
  }
  if (allow.size > 0) return { kind: 'eligible', allow, loraName, workers: picked };
  if (!any) return { kind: 'ineligible', reason: 'no_workers', message: 'no workers configured' };
  const k = passed.indexOf(0);
  const f = WORKER_FILTERS[k < 0 ? WORKER_FILTERS.length - 1 : k];
  return { kind: 'ineligible', reason: f.refusal, message: f.message(q) };
}

// ------------------------------------------------------------------------------------------------ source level

/** Why route() found no candidate: the first source-level filter that left nothing. */
export type SourceRefusal = 'no_sources' | 'all_excluded' | 'all_busy';

export interface BusyThresholds {
  /** Exclude a source whose active blocks exceed this fraction of its capacity (needs `capacityBlocks`). */
  readonly activeBlockFraction?: number;
  /** Exclude a source with more active prefill tokens than this. */
  readonly activePrefillTokens?: number;
}

export interface SourceFilterQuery {
  readonly allow?: ReadonlySet<string>;
  readonly exclude?: ReadonlySet<string>;
  readonly busy: BusyThresholds;
}

/** The load facts the busy filter reads. */
export interface SourceLoad {
  readonly key: string;
  readonly capacityBlocks?: number;
  readonly activeBlocks: number;
  readonly activePrefillTokens: number;
}

interface SourceFilterBase {
  readonly name: string;
  readonly description: string;
  readonly refusal: SourceRefusal;
}

/** Decided from the source key alone, before any facts are read. */
export interface KeyFilter extends SourceFilterBase {
  readonly reads: 'key';
  admits(key: string, q: SourceFilterQuery): boolean;
}

/** Reads the source's load facts. */
export interface LoadFilter extends SourceFilterBase {
  readonly reads: 'load';
  admits(s: SourceLoad, q: SourceFilterQuery): boolean;
}

export type SourceFilter = KeyFilter | LoadFilter;

export const ALLOW_FILTER: KeyFilter = {
  name: 'allow',
  description: 'in the eligible set of the worker-level filters',
  refusal: 'no_sources',
  reads: 'key',
  admits: (key, q) => q.allow === undefined || q.allow.has(key),
};

export const EXCLUDE_FILTER: KeyFilter = {
  name: 'exclude',
  description: 'not a source a retry moves away from',
  refusal: 'all_excluded',
  reads: 'key',
  admits: (key, q) => q.exclude === undefined || !q.exclude.has(key),
};

export const BUSY_FILTER: LoadFilter = {
  name: 'busy',
  description: 'active blocks <= activeBlockFraction * capacity and active prefill tokens <= the threshold',
  refusal: 'all_busy',
  reads: 'load',
  admits(s, { busy }) {
    const { activeBlockFraction, activePrefillTokens: maxPrefill } = busy;
    if (activeBlockFraction !== undefined && s.capacityBlocks && s.activeBlocks > activeBlockFraction * s.capacityBlocks) return false;
    return maxPrefill === undefined || s.activePrefillTokens <= maxPrefill;
  },
};

/** The source-level filters, in the order they run. */
export const SOURCE_FILTERS: readonly SourceFilter[] = [ALLOW_FILTER, EXCLUDE_FILTER, BUSY_FILTER];
