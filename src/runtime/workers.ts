/**
 * The fleet's I/O side: one undici Pool per worker, periodic health probes (GET /health, then GET /v1/models when the
 * models are not configured). What a probe learns goes to the core dispatcher (health verdicts, model lists), which
 * owns eligibility, breakers and routing; this module only talks to engines.
 */
import { buildConnector, Pool, request } from 'undici';
import type { BreakerState } from '../core/dispatch/breaker.ts';
import type { DispatchEffect, Dispatcher } from '../core/dispatch/dispatcher.ts';
import type { WorkerState } from '../core/dispatch/worker-state.ts';
import { DEFAULT_BOOTSTRAP_PORT, type WorkerSpec } from '../config/worker-spec.ts';
import type { HandoffFields } from '../engines/handoff.ts';
import { engineAdapter } from '../engines/index.ts';

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

export interface HealthOptions {
  readonly intervalMs: number;
  readonly timeoutMs: number;
  /** Consecutive failed probes before a worker is ejected from routing. */
  readonly ejectAfter: number;
  /** Longest silence from the worker (before the response head, or between body chunks). Default 300 s. */
  readonly upstreamTimeoutMs?: number;
}

/**
 * The connection pool to one worker (the router's and every HTTP shell's): streams are long-lived, so generous
 * connections keep them from queueing behind each other; `upstreamTimeoutMs` of silence ends one.
 */
/** undici's connector for h2c (its types lack useH2c, which connect.js reads: prior knowledge on a cleartext socket). */
const H2C_CONNECTOR = { allowH2: true, useH2c: true } as buildConnector.BuildOptions;

export function workerPool(origin: string, upstreamTimeoutMs: number | undefined, appProtocol: 'http' | 'h2c' = 'http'): Pool {
  const silence = upstreamTimeoutMs ?? 300_000;
  return new Pool(origin, {
    connections: 4096,
    keepAliveTimeout: 30_000,
    headersTimeout: silence,
    bodyTimeout: silence,
    // h2c: HTTP/2 with prior knowledge on a cleartext connection (undici's useH2c), streams sharing a connection.
    // Pool builds its connector from allowH2 alone (undici 7.30 passes useH2c only to a Client's own), so it is given one.
    ...(appProtocol === 'h2c' ? { allowH2: true, pipelining: 100, connect: buildConnector(H2C_CONNECTOR) } : { pipelining: 1 }),
  });
}

export class Worker {
  readonly id: string;
  readonly url: string;
  readonly pool: Pool;
  readonly sourceKeys: readonly string[];
  cards: ModelCard[] = [];
  /** TensorRT-LLM's optional handoff fields: the spec's settings, and the fields this worker's server refused. */
  readonly handoffFields: HandoffFields;
  probeFailures = 0;
  lastProbeError: string | null = null;

  constructor(
    readonly spec: WorkerSpec,
    private readonly core: WorkerState,
    private readonly dispatcher: Dispatcher,
    private readonly opts: HealthOptions,
  ) {
    const u = new URL(spec.url);
    this.id = core.id;
    this.url = spec.url;
    this.pool = workerPool(u.origin, opts.upstreamTimeoutMs, spec.appProtocol);
    this.sourceKeys = core.sourceKeys;
    this.cards = (spec.models ?? []).map((id) => ({ id, object: 'model', owned_by: 'kvroute' }));
    this.handoffFields = {
      settings: { disagg_request_id: spec.disaggId ?? 'auto', ctx_usage: spec.ctxUsage ?? 'auto' },
      refused: new Set(),
    };
  }

  /** Probes go through the worker's pool when it speaks h2c (a plain HTTP/1.1 request would be refused). */
  private get probeDispatcher(): Pool | undefined {
    return this.spec.appProtocol === 'h2c' ? this.pool : undefined;
  }

  get healthy(): boolean {
    return this.core.healthy;
  }

  get role(): 'prefill' | 'decode' | 'both' {
    return this.core.role;
  }

  /** SGLang prefill: the bootstrap server's port (the spec's bootstrap=, default 8998). */
  get bootstrapPort(): number {
    return this.spec.bootstrap ?? DEFAULT_BOOTSTRAP_PORT;
  }

  get breaker(): BreakerState {
    return this.dispatcher.breakerState(this.id, Date.now()) ?? 'closed';
  }

  get inFlight(): number {
    return this.core.inFlight;
  }

  /** One health probe: GET /health, then (if models are not configured) GET /v1/models. */
  async probe(): Promise<{ ok: boolean; models?: string[]; adapters?: string[] }> {
    try {
      const res = await request(new URL('/health', this.url), {
        dispatcher: this.probeDispatcher,
        signal: AbortSignal.timeout(this.opts.timeoutMs),
      });
      await res.body.dump();
      if (res.statusCode !== 200) throw new Error(`GET /health returned ${res.statusCode}`);
      // The engine's cards are read even when the configuration names the models: /v1/models shows what the engine says.
      const discovered = await this.discoverModels().catch(() => null);
      this.probeFailures = 0;
      this.lastProbeError = null;
      return { ok: true, ...(this.core.fixedModels ? {} : discovered) };
    } catch (err) {
      this.probeFailures++;
      this.lastProbeError = (err as Error).message;
      return { ok: false };
    }
  }

  private async discoverModels(): Promise<{ models: string[]; adapters: string[] } | null> {
    const res = await request(new URL('/v1/models', this.url), {
      dispatcher: this.probeDispatcher,
      signal: AbortSignal.timeout(this.opts.timeoutMs),
    });
    if (res.statusCode !== 200) {
      await res.body.dump();
      return null;
    }
    const body = (await res.body.json()) as { data?: unknown };
    if (!Array.isArray(body.data)) return null;
    const models: string[] = [];
    const adapters: string[] = [];
    const cards: ModelCard[] = [];
    for (const c of body.data) {
      if (!c || typeof c !== 'object' || typeof (c as ModelCard).id !== 'string') continue;
      const card = c as ModelCard;
      cards.push(card);
      // vLLM lists LoRA adapters as models whose parent is the base model.
      if (card.parent && card.parent !== card.id) adapters.push(card.id);
      else models.push(card.id);
    }
    if (this.core.fixedModels) {
      // Configured models only (the router routes nothing else here), each with the engine's card when it has one.
      const byId = new Map(cards.map((c) => [c.id, c]));
      this.cards = (this.spec.models ?? []).map((id) => byId.get(id) ?? { id, object: 'model', owned_by: 'kvroute' });
    } else this.cards = cards;
    return { models, adapters };
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
      mode: this.core.config.mode,
      role: this.core.role,
      engine: this.core.engine,
      ...(this.core.role === 'prefill' && engineAdapter(this.core.engine).pd.flow === 'bootstrap' ? { bootstrap: this.bootstrapPort } : {}),
      ...(this.handoffFields.refused.size > 0 ? { refusedHandoffFields: [...this.handoffFields.refused] } : {}),
      dp: this.sourceKeys.length,
      sources: this.sourceKeys,
      healthy: this.healthy,
      probeFailures: this.probeFailures,
      lastProbeError: this.lastProbeError,
      breaker: this.breaker,
      inFlight: this.inFlight,
      models: [...this.core.models],
      adapters: [...this.core.adapters],
    };
  }
}

export interface WorkerSetEvents {
  /** Effects of fleet changes (queued requests that can now route, or can no longer be served). */
  onEffects(effects: readonly DispatchEffect[]): void;
  onHealthChange?(worker: Worker, healthy: boolean): void;
  onAdded?(worker: Worker): Promise<void> | void;
  onRemoved?(worker: Worker): Promise<void> | void;
}

export interface AddOptions {
  /** Overrides the mode the spec implies (a NATS replica's workers are fed events from the stream, not from ZMQ). */
  readonly mode?: 'events' | 'approx';
}

export class WorkerSet {
  private readonly workers = new Map<string, Worker>();
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly dispatcher: Dispatcher,
    private readonly opts: HealthOptions,
    private readonly hooks: WorkerSetEvents,
  ) {}

  list(): Worker[] {
    return [...this.workers.values()];
  }

  get(id: string): Worker | undefined {
    return this.workers.get(id);
  }

  /** Adds a worker: its ranks join the core's fleet (events mode when it publishes KV events), then one probe. */
  async add(spec: WorkerSpec, options: AddOptions = {}): Promise<Worker> {
    const id = spec.id ?? new URL(spec.url).host;
    if (this.workers.has(id)) throw new Error(`worker "${id}" already exists`);
    const effects = this.dispatcher.addWorker(
      {
        id,
        dpRanks: spec.dp ?? 1,
        mode: options.mode ?? (spec.events || engineAdapter(spec.engine).events.httpPoll ? 'events' : 'approx'),
        capacityBlocks: spec.blocks,
        models: spec.models,
        role: spec.role,
        engine: spec.engine,
      },
      Date.now(),
    );
    const worker = new Worker(spec, this.dispatcher.worker(id)!, this.dispatcher, this.opts);
    this.workers.set(id, worker);
    this.hooks.onEffects(effects);
    await this.hooks.onAdded?.(worker);
    await this.probeOne(worker);
    return worker;
  }

  async remove(id: string): Promise<boolean> {
    const worker = this.workers.get(id);
    if (!worker) return false;
    this.workers.delete(id);
    this.hooks.onEffects(this.dispatcher.removeWorker(id, Date.now()) ?? []);
    await this.hooks.onRemoved?.(worker);
    // In-flight streams to a removed worker finish on their own connections; new ones cannot pick it.
    void worker.close();
    return true;
  }

  private async probeOne(worker: Worker): Promise<void> {
    const r = await worker.probe();
    if (!this.workers.has(worker.id)) return;
    const now = Date.now();
    if (r.models) this.hooks.onEffects(this.dispatcher.setModels(worker.id, r.models, r.adapters ?? [], now));
    if (r.ok && !worker.healthy) {
      this.hooks.onEffects(this.dispatcher.setHealthy(worker.id, true, now));
      this.hooks.onHealthChange?.(worker, true);
    } else if (!r.ok && worker.healthy && worker.probeFailures >= this.opts.ejectAfter) {
      this.hooks.onEffects(this.dispatcher.setHealthy(worker.id, false, now));
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
      void this.probeAll().finally(() => {
        running = false;
      });
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

  /**
   * The models of the healthy workers, one card per id: the engine's own card (owned_by, root, parent: LoRA adapters
   * keep their base model as parent), with max_model_len the smallest any worker serving it reports, since a request
   * may be routed to any of them.
   */
  models(): ModelCard[] {
    const seen = new Map<string, ModelCard>();
    for (const w of this.workers.values()) {
      if (!w.healthy) continue;
      for (const c of w.cards) {
        const prev = seen.get(c.id);
        if (!prev) {
          seen.set(c.id, { ...c });
          continue;
        }
        if (typeof c.max_model_len === 'number' && !(typeof prev.max_model_len === 'number' && prev.max_model_len <= c.max_model_len)) {
          prev.max_model_len = c.max_model_len;
        }
      }
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
