/**
 * The fleet as the core sees it: each worker's routing facts (ranks, models and adapters, role, health, breaker,
 * requests in flight). The worker-level filters that read them are the pipeline's filter stage
 * (src/core/scheduling/filters.ts). The shell reports what it learns (probes, model lists, capacity); the core decides.
 */
import type { FilterableWorker, WorkerRole } from '../scheduling/filters.ts';
import { type EngineName, sourceKey } from '../types.ts';
import { Breaker, type BreakerOptions } from './breaker.ts';

export type { WorkerRole } from '../scheduling/filters.ts';
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

export class WorkerState implements FilterableWorker {
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
