/**
 * The fleet as the core sees it: each worker's routing facts (ranks, models and adapters, role, health, breaker,
 * requests in flight) and the worker-level filters of the routing pipeline, evaluated at the moment of routing:
 *
 *   model    the worker serves the requested model or adapter (a worker whose list is unknown yet serves anything)
 *   role     the worker's role is one the request's leg accepts (aggregated: both | decode; P/D legs: their role)
 *   health   the worker passed its last health probes
 *   breaker  its circuit breaker is closed, or half-open with the one trial still free
 *   subset   the request named a subset of sources (a gateway's endpoint subset) and the source is in it
 *   pin      the request continues state held by one worker (a stored response): only that worker
 *
 * The shell reports what it learns (probes, model lists, capacity); the core decides.
 */
import { type EngineName, sourceKey } from '../types.ts';
import { Breaker, type BreakerOptions } from './breaker.ts';

export type WorkerRole = 'both' | 'prefill' | 'decode';
export const WORKER_ROLES: readonly WorkerRole[] = ['both', 'prefill', 'decode'];

/** The engine flavour: the handoff protocol of a disaggregated pair follows it (a vLLM decode pulls only from vLLM). */
export type EngineFlavor = EngineName;

/** What the configuration says about a worker (spec, admin API, registry). */
export interface WorkerConfig {
  readonly id: string;
  /** Data-parallel ranks behind the worker; each is a routing source. Default 1. */
  readonly dpRanks?: number;
  /** 'events': the engine publishes KV events; 'approx': the router remembers its own decisions. */
  readonly mode: 'events' | 'approx';
  /** KV capacity per rank in blocks, when configured (then never overridden by what the engine reports). */
  readonly capacityBlocks?: number;
  /** Models served, when configured (then never overridden by discovery). */
  readonly models?: readonly string[];
  readonly role?: WorkerRole;
  /** Engine flavour (default vllm). */
  readonly engine?: EngineFlavor;
}

export class WorkerState {
  readonly id: string;
  readonly sourceKeys: readonly string[];
  readonly role: WorkerRole;
  readonly engine: EngineFlavor;
  readonly fixedModels: boolean;
  readonly fixedCapacity: boolean;
  models: ReadonlySet<string>;
  /** LoRA adapters (listed with a parent model): requests for them hash with the adapter in the seed. */
  adapters: ReadonlySet<string> = new Set();
  healthy = true;
  readonly breaker: Breaker;
  /** Requests dispatched here and not finished. */
  inFlight = 0;

  constructor(
    readonly config: WorkerConfig,
    breaker: BreakerOptions,
  ) {
    this.id = config.id;
    const dp = config.dpRanks ?? 1;
    this.sourceKeys = Array.from({ length: dp }, (_, r) => sourceKey({ workerId: config.id, dpRank: r }));
    this.role = config.role ?? 'both';
    this.engine = config.engine ?? 'vllm';
    this.fixedModels = (config.models?.length ?? 0) > 0;
    this.fixedCapacity = config.capacityBlocks !== undefined;
    this.models = new Set(config.models ?? []);
    this.breaker = new Breaker(breaker);
  }

  /** Whether this worker can serve `model` (an unknown model list accepts anything: discovery may not have run). */
  serves(model: string): boolean {
    return (this.models.size === 0 && this.adapters.size === 0) || this.models.has(model) || this.adapters.has(model);
  }
}

/** Which filter removed the last candidates: the refusal's precise reason. */
export type EligibilityRefusal = 'no_workers' | 'model_not_found' | 'no_workers_for_role' | 'no_healthy_workers' | 'subset_unavailable';

export interface Eligible {
  readonly kind: 'eligible';
  readonly allow: ReadonlySet<string>;
  /** The adapter name to hash with, when the model is a LoRA adapter on the eligible workers. */
  readonly loraName: string | null;
  /** Eligible workers by id, to map the picked source back. */
  readonly workers: ReadonlyMap<string, WorkerState>;
}

export interface Ineligible {
  readonly kind: 'ineligible';
  readonly reason: EligibilityRefusal;
  readonly message: string;
}

export interface EligibilityQuery {
  readonly model: string;
  /** Roles the leg accepts; default both and decode (a request served without disaggregation runs on a decode worker). */
  readonly roles?: ReadonlySet<WorkerRole>;
  /** Source keys the request is restricted to (a gateway's endpoint subset). */
  readonly subset?: ReadonlySet<string>;
  /** Only workers of this engine flavour (the prefill leg must speak its decode worker's handoff protocol). */
  readonly engine?: EngineFlavor;
  /** The worker holding the state this request continues (a pin); only it is eligible. */
  readonly pinned?: string;
  /** Any model will do (a pass-through without a model in its body). */
  readonly anyModel?: boolean;
}

export const AGGREGATED: ReadonlySet<WorkerRole> = new Set<WorkerRole>(['both', 'decode']);

/** Runs the worker-level filters in order; the first that leaves nothing names the refusal. */
export function eligibility(workers: Iterable<WorkerState>, q: EligibilityQuery, now: number): Eligible | Ineligible {
  const roles = q.roles ?? AGGREGATED;
  let any = false;
  let serving = 0;
  let roleOk = 0;
  let healthy = 0;
  let open = 0;
  let loraName: string | null = null;
  const allow = new Set<string>();
  const picked = new Map<string, WorkerState>();
  for (const w of workers) {
    any = true;
    if (q.pinned !== undefined && w.id !== q.pinned) continue;
    if (!q.anyModel && !w.serves(q.model)) continue;
    serving++;
    if (!roles.has(w.role) || (q.engine !== undefined && w.engine !== q.engine)) continue;
    roleOk++;
    if (w.adapters.has(q.model)) loraName = q.model;
    if (!w.healthy) continue;
    healthy++;
    if (!w.breaker.admits(now)) {
      open++;
      continue;
    }
    let added = false;
    for (const k of w.sourceKeys) {
      if (q.subset && !q.subset.has(k)) continue;
      allow.add(k);
      added = true;
    }
    if (added) picked.set(w.id, w);
  }
  if (allow.size > 0) return { kind: 'eligible', allow, loraName, workers: picked };
  if (!any) return { kind: 'ineligible', reason: 'no_workers', message: 'no workers configured' };
  if (serving === 0) {
    const where = q.pinned !== undefined ? `on worker ${q.pinned}, which holds the state this request continues` : 'on any worker';
    return { kind: 'ineligible', reason: 'model_not_found', message: `the model "${q.model}" does not exist ${where}` };
  }
  if (roleOk === 0) {
    return {
      kind: 'ineligible',
      reason: 'no_workers_for_role',
      message: `no worker serving "${q.model}" has the role ${[...roles].join(' or ')}${q.engine ? ` (engine ${q.engine})` : ''}`,
    };
  }
  if (healthy === 0 || open === healthy) {
    const why = healthy === 0 ? 'failed their health checks' : 'have their circuit breaker open';
    return { kind: 'ineligible', reason: 'no_healthy_workers', message: `every worker serving "${q.model}" ${why}; try again shortly` };
  }
  return {
    kind: 'ineligible',
    reason: 'subset_unavailable',
    message: `none of the ${q.subset?.size ?? 0} endpoints the request was restricted to is eligible`,
  };
}
