/**
 * The fleet as the server sees it: one undici Pool per worker, its data-parallel ranks as router sources, the models
 * it serves (configured or discovered), health from periodic probes, and a circuit breaker fed by request outcomes.
 */
import { Pool, request } from 'undici';
import type { KvRouter } from '../core/router.ts';
import { sourceKey } from '../core/types.ts';
import type { WorkerSpec } from '../config/worker-spec.ts';

export interface ModelCard {
  id: string;
  object: 'model';
  created?: number;
  owned_by?: string;
  root?: string | null;
  parent?: string | null;
  max_model_len?: number;
  [k: string]: unknown;
}

export type BreakerState = 'closed' | 'open' | 'half_open';

export interface HealthOptions {
  readonly intervalMs: number;
  readonly timeoutMs: number;
  /** Consecutive failed probes before a worker is ejected from routing. */
  readonly ejectAfter: number;
  readonly breakerThreshold: number;
  readonly breakerCooldownMs: number;
  /** Longest silence from the worker (before the response head, or between body chunks). Default 300 s. */
  readonly upstreamTimeoutMs?: number;
}

export class Worker {
  readonly id: string;
  readonly url: string;
  readonly pool: Pool;
  readonly sourceKeys: string[];
  /** Configured models; discovery never overrides them. */
  private readonly fixedModels: boolean;
  models = new Set<string>();
  /** LoRA adapters (models whose card names a parent): requests for them hash with the adapter in the seed. */
  adapters = new Set<string>();
  cards: ModelCard[] = [];
  healthy = true;
  probeFailures = 0;
  lastProbeError: string | null = null;
  breaker: BreakerState = 'closed';
  private breakerFailures = 0;
  private openUntil = 0;
  private probeInFlight = false;
  inFlight = 0;

  constructor(
    readonly spec: WorkerSpec,
    private readonly opts: HealthOptions,
  ) {
    const u = new URL(spec.url);
    this.id = spec.id ?? u.host;
    this.url = spec.url;
    // Streams are long-lived; a pool per worker with generous connections keeps them from queueing behind each other.
    const silence = opts.upstreamTimeoutMs ?? 300_000;
    this.pool = new Pool(u.origin, {
      connections: 4096,
      pipelining: 1,
      keepAliveTimeout: 30_000,
      headersTimeout: silence,
      bodyTimeout: silence,
    });
    const dp = spec.dp ?? 1;
    this.sourceKeys = Array.from({ length: dp }, (_, r) => sourceKey({ workerId: this.id, dpRank: r }));
    this.fixedModels = (spec.models?.length ?? 0) > 0;
    for (const m of spec.models ?? []) this.models.add(m);
    this.cards = (spec.models ?? []).map((id) => ({ id, object: 'model', owned_by: 'kvroute' }));
  }

  /** Whether this worker can serve `model` (unknown model lists accept anything: discovery may not have run). */
  serves(model: string): boolean {
    return (this.models.size === 0 && this.adapters.size === 0) || this.models.has(model) || this.adapters.has(model);
  }

  get knowsModels(): boolean {
    return this.models.size > 0 || this.adapters.size > 0;
  }

  /** Eligible for new requests now: healthy and the breaker lets traffic through. */
  routable(now: number): boolean {
    if (!this.healthy) return false;
    if (this.breaker === 'open') {
      if (now < this.openUntil) return false;
      this.breaker = 'half_open';
    }
    return this.breaker === 'closed' || !this.probeInFlight;
  }

  /** Called when a request is sent here; in half-open state only that one trial goes through. */
  dispatched(): void {
    this.inFlight++;
    if (this.breaker === 'half_open') this.probeInFlight = true;
  }

  completed(ok: boolean, now: number): void {
    this.inFlight = Math.max(0, this.inFlight - 1);
    if (ok) {
      this.breakerFailures = 0;
      this.breaker = 'closed';
      this.probeInFlight = false;
      return;
    }
    this.breakerFailures++;
    if (this.breaker === 'half_open' || this.breakerFailures >= this.opts.breakerThreshold) {
      this.breaker = 'open';
      this.openUntil = now + this.opts.breakerCooldownMs;
      this.probeInFlight = false;
    }
  }

  /** Ends a request that never reached the engine's verdict (client abort): neither success nor failure. */
  released(): void {
    this.inFlight = Math.max(0, this.inFlight - 1);
    if (this.breaker === 'half_open') this.probeInFlight = false;
  }

  /** One health probe: GET /health, then (if models are not configured) GET /v1/models. */
  async probe(): Promise<boolean> {
    try {
      const res = await request(new URL('/health', this.url), { signal: AbortSignal.timeout(this.opts.timeoutMs) });
      await res.body.dump();
      if (res.statusCode !== 200) throw new Error(`GET /health returned ${res.statusCode}`);
      if (!this.fixedModels) await this.discoverModels();
      this.probeFailures = 0;
      this.lastProbeError = null;
      return true;
    } catch (err) {
      this.probeFailures++;
      this.lastProbeError = (err as Error).message;
      return false;
    }
  }

  private async discoverModels(): Promise<void> {
    const res = await request(new URL('/v1/models', this.url), { signal: AbortSignal.timeout(this.opts.timeoutMs) });
    if (res.statusCode !== 200) {
      await res.body.dump();
      return;
    }
    const body = (await res.body.json()) as { data?: unknown };
    if (!Array.isArray(body.data)) return;
    const models = new Set<string>();
    const adapters = new Set<string>();
    const cards: ModelCard[] = [];
    for (const c of body.data) {
      if (!c || typeof c !== 'object' || typeof (c as ModelCard).id !== 'string') continue;
      const card = c as ModelCard;
      cards.push(card);
      // vLLM lists LoRA adapters as models whose parent is the base model.
      if (card.parent && card.parent !== card.id) adapters.add(card.id);
      else models.add(card.id);
    }
    this.models = models;
    this.adapters = adapters;
    this.cards = cards;
  }

  async close(): Promise<void> {
    await this.pool.close().catch(() => undefined);
  }

  async destroy(): Promise<void> {
    await this.pool.destroy().catch(() => undefined);
  }

  toJSON(): Record<string, unknown> {
    return {
      id: this.id,
      url: this.url,
      events: this.spec.events ?? null,
      mode: this.spec.events ? 'events' : 'approx',
      dp: this.spec.dp ?? 1,
      sources: this.sourceKeys,
      healthy: this.healthy,
      probeFailures: this.probeFailures,
      lastProbeError: this.lastProbeError,
      breaker: this.breaker,
      inFlight: this.inFlight,
      models: [...this.models],
      adapters: [...this.adapters],
    };
  }
}

export interface WorkerSetEvents {
  onHealthChange?(worker: Worker, healthy: boolean): void;
  onAdded?(worker: Worker): Promise<void> | void;
  onRemoved?(worker: Worker): Promise<void> | void;
}

export class WorkerSet {
  private readonly workers = new Map<string, Worker>();
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly router: KvRouter,
    private readonly opts: HealthOptions,
    private readonly hooks: WorkerSetEvents = {},
  ) {}

  list(): Worker[] {
    return [...this.workers.values()];
  }

  get(id: string): Worker | undefined {
    return this.workers.get(id);
  }

  /** Adds a worker: its sources join the router (events mode when it publishes KV events), then one probe. */
  async add(spec: WorkerSpec): Promise<Worker> {
    const worker = new Worker(spec, this.opts);
    if (this.workers.has(worker.id)) throw new Error(`worker "${worker.id}" already exists`);
    this.workers.set(worker.id, worker);
    const dp = spec.dp ?? 1;
    for (let r = 0; r < dp; r++) {
      this.router.addSource({ workerId: worker.id, dpRank: r }, { mode: spec.events ? 'events' : 'approx', capacityBlocks: spec.blocks });
    }
    await this.hooks.onAdded?.(worker);
    await this.probeOne(worker);
    return worker;
  }

  async remove(id: string): Promise<boolean> {
    const worker = this.workers.get(id);
    if (!worker) return false;
    this.workers.delete(id);
    this.router.removeWorker(id);
    await this.hooks.onRemoved?.(worker);
    // In-flight streams to a removed worker finish on their own connections; new ones cannot pick it.
    void worker.close();
    return true;
  }

  private async probeOne(worker: Worker): Promise<void> {
    const ok = await worker.probe();
    if (!this.workers.has(worker.id)) return;
    if (ok && !worker.healthy) {
      worker.healthy = true;
      this.hooks.onHealthChange?.(worker, true);
    } else if (!ok && worker.healthy && worker.probeFailures >= this.opts.ejectAfter) {
      worker.healthy = false;
      this.hooks.onHealthChange?.(worker, false);
    }
  }

  async probeAll(): Promise<void> {
    await Promise.all(this.list().map((w) => this.probeOne(w)));
  }

  startHealthChecks(): void {
    if (this.timer || this.opts.intervalMs <= 0) return;
    let running = false;
    this.timer = setInterval(() => {
      if (running) return;
      running = true;
      void this.probeAll().finally(() => (running = false));
    }, this.opts.intervalMs);
    this.timer.unref();
  }

  stopHealthChecks(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  healthyCount(): number {
    let n = 0;
    for (const w of this.workers.values()) if (w.healthy) n++;
    return n;
  }

  /** Union of model cards over healthy workers, first card per id. */
  models(): ModelCard[] {
    const seen = new Map<string, ModelCard>();
    for (const w of this.workers.values()) {
      if (!w.healthy) continue;
      for (const c of w.cards) if (!seen.has(c.id)) seen.set(c.id, c);
    }
    return [...seen.values()];
  }

  async close(): Promise<void> {
    this.stopHealthChecks();
    await Promise.all(this.list().map((w) => w.close()));
  }

  async destroy(): Promise<void> {
    this.stopHealthChecks();
    await Promise.all(this.list().map((w) => w.destroy()));
  }
}
