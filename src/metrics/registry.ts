/**
 * RouterMetrics: the router's Prometheus surface (GET /metrics) and the totals the live dashboard reads, one file per
 * metric family: requests.ts (requests, refusals, overhead, latencies), reuse.ts (predicted, available and delivered
 * hit rates), events.ts (KV events and stream health), worker-gauges.ts (load and cache per worker, read at scrape
 * time), process.ts (Node.js and the event loop); flow.ts, disagg.ts and epp.ts are registered by their users, and
 * scrape.ts mirrors the engines' own counters. This class owns the registry, the `worker` label and the dashboard.
 *
 * Per-request series carry one label, `worker` (the router's source key); overall values are `sum without (worker)`.
 * A per-instance Registry keeps tests and several routers in one process from colliding on the global one.
 */
import { AggregatorRegistry, Registry } from 'prom-client';
import { emptyTotals, type ReuseTotals } from '../core/ledger.ts';
import type { FinishedRequest, KvRouter } from '../core/router.ts';
import type { ApplyResult, RouteDecision } from '../core/types.ts';
import { WorkerLabels } from './bound.ts';
import type { SumCount } from './buckets.ts';
import { emptyEventTotals, type EventTotals, EventSeries, type IngestCounts } from './events.ts';
import { type EventLoopLag, ProcessSeries } from './process.ts';
import { addTotals, type OverheadPhase, RequestSeries, type RequestTotalsJson } from './requests.ts';
import { ReuseSeries } from './reuse.ts';
import { EngineMirror, type EngineTarget } from './scrape.ts';
import { registerWorkerGauges } from './worker-gauges.ts';

export interface RouterMetricsOptions {
  /** Prepended to every name, e.g. `dynamo_component_` so dashboards built for Dynamo keep working. */
  readonly prefix?: string;
  readonly router: KvRouter;
  /** Cap on distinct `worker` label values; later workers share the label `_other` (bounded cardinality). */
  readonly maxWorkerLabels?: number;
  /** Window of the dashboard's event-loop delay figures, ms. Default 5 s. */
  readonly eventLoopWindowMs?: number;
}

/** The metrics a request handler records (a shell of `--processes` records them in its own registry: shell-metrics.ts). */
export type RequestMetrics = Pick<RouterMetrics, 'routed' | 'firstToken' | 'token' | 'refused' | 'outcome' | 'apiRequest'>;

/** prom-client's metric JSON (Registry.getMetricsAsJSON()), what AggregatorRegistry.aggregate() sums. */
export type MetricJson = Awaited<ReturnType<Registry['getMetricsAsJSON']>>[number];

/**
 * Registries kept in other processes (the HTTP shells of `--processes`) whose request metrics /metrics and the
 * dashboard add to this one's: `metrics()` at scrape time, `totals()` (the dashboard's, synchronous) as last reported.
 */
export interface RemoteRequestMetrics {
  metrics(): Promise<readonly (readonly MetricJson[])[]>;
  totals(): readonly RequestTotalsJson[];
}

export class RouterMetrics {
  readonly registry: Registry;
  readonly contentType: string;
  readonly prefix: string;
  private readonly router: KvRouter;
  private readonly workers: WorkerLabels;
  private mirror?: EngineMirror;
  private readonly health = new Map<string, boolean>();
  /** Decode workers of a P/D fleet (by source key): their engine counters are not prefix-cache truth. */
  private decodeSource: (sourceKey: string) => boolean = () => false;
  private readonly process: ProcessSeries;
  private readonly requests: RequestSeries;
  private readonly reuse: ReuseSeries;
  private readonly events: EventSeries;
  private readonly remotes = new Set<RemoteRequestMetrics>();

  constructor(opts: RouterMetricsOptions) {
    this.router = opts.router;
    this.prefix = opts.prefix ?? '';
    if (this.prefix !== '' && !/^[a-zA-Z_:][a-zA-Z0-9_:]*$/.test(this.prefix)) {
      throw new RangeError(`metrics prefix "${this.prefix}" is not a valid Prometheus name prefix ([a-zA-Z_:][a-zA-Z0-9_:]*)`);
    }
    const registry = new Registry();
    this.registry = registry;
    this.contentType = registry.contentType;
    const p = this.prefix;
    const label = (sourceKey: string) => this.label(sourceKey);
    this.process = new ProcessSeries(registry, p, opts.eventLoopWindowMs ?? 5000);
    this.requests = new RequestSeries(registry, p);
    this.reuse = new ReuseSeries(registry, p, () => {
      for (const key of this.router.sourceKeys()) this.label(key);
    });
    this.workers = new WorkerLabels(opts.maxWorkerLabels ?? 256, (labels) => this.reuse.zero(labels));
    this.events = new EventSeries(registry, p, label);
    registerWorkerGauges(registry, p, { router: this.router, label, health: this.health, blind: this.events.blind });
    this.events.registerBlindCount(registry, p);
  }

  /** Bounded cardinality: the first `maxWorkerLabels` workers get their own label, the rest share `_other`. */
  private label(sourceKey: string): string {
    return this.workers.label(sourceKey);
  }

  /** The labels object of a worker's series: one per label, so the metrics' fast path (bound.ts) finds its series. */
  private workerLabelsOf(sourceKey: string): { worker: string } {
    return this.workers.of(sourceKey);
  }

  /** At routing time. timingsS.tokenize is measured by the shell; hash/find/select come from the decision. */
  routed(decision: RouteDecision, timingsS: { tokenize: number }): void {
    const worker = this.workerLabelsOf(decision.sourceKey);
    this.reuse.routed(worker, decision);
    this.requests.routed(worker, decision, timingsS);
  }

  refused(reason: string): void {
    this.requests.refused(reason);
  }

  firstToken(sourceKey: string, ttftS: number): void {
    this.requests.firstToken(this.workerLabelsOf(sourceKey), ttftS);
  }

  token(sourceKey: string, interTokenS: number): void {
    this.requests.token(this.workerLabelsOf(sourceKey), interTokenS);
  }

  /**
   * When KvRouter.finish() returned a record. Delivered reuse is counted only when the engine reported cached tokens
   * (the same condition the ledger uses). Does not count the request's outcome: call outcome() for that, once.
   */
  finished(f: FinishedRequest, extra?: { outputTokens?: number }): void {
    const worker = this.workerLabelsOf(f.sourceKey);
    this.reuse.finished(worker, f);
    this.requests.outputLength(worker, extra?.outputTokens);
  }

  outcome(outcome: string): void {
    this.requests.outcome(outcome);
  }

  /** A request accepted by one of the routed APIs. */
  apiRequest(api: string): void {
    this.requests.apiRequest(api);
  }

  /** A pass-through answered; `path` must come from a bounded set (the caller maps the rest to "other"). */
  passthrough(path: string, status: number): void {
    this.requests.passthrough(path, status);
  }

  /** After router.applyEvents() (one call per event or per batch; eventKind labels the batch, 'batch' when mixed). */
  eventsApplied(sourceKey: string, result: ApplyResult, eventKind = 'batch'): void {
    this.events.applied(sourceKey, result, eventKind);
  }

  /** Transport-level event health: increments, plus whether the source is currently blind. */
  ingestCounters(sourceKey: string, counts: IngestCounts & { blind?: boolean }): void {
    this.events.ingestCounters(sourceKey, counts);
  }

  /** The same from cumulative totals (the ingest layer's per-source health): the increase since the last call. */
  ingestTotals(sourceKey: string, totals: IngestCounts & { blind?: boolean }): void {
    this.events.ingestTotals(sourceKey, totals);
  }

  /** Health as the shell's prober sees it; workers never marked are reported healthy. */
  setHealthy(sourceKey: string, healthy: boolean): void {
    this.health.set(sourceKey, healthy);
  }

  /** Starts the engine mirror on this registry (router_engine_prefix_cache_*), returned so the shell can stop it. */
  mirrorEngines(opts: {
    targets: () => readonly EngineTarget[];
    intervalMs?: number;
    fetch?: typeof fetch;
    onCapacity?: (workerId: string, numGpuBlocks: number) => void;
  }): EngineMirror {
    this.mirror = new EngineMirror({ ...opts, registry: this.registry, prefix: this.prefix });
    return this.mirror.start();
  }

  /**
   * Marks the decode workers of a disaggregated fleet: a decode engine counts every prompt whose KV it received as a
   * prefix-cache query, so the dashboard's engine hit rate leaves them out (the prefill pool is the truth).
   */
  setDecodeSources(isDecode: (sourceKey: string) => boolean): void {
    this.decodeSource = isDecode;
  }

  /** Use an already constructed mirror (tests, or a shell that starts it itself) for the dashboard's engine series. */
  attachMirror(mirror: EngineMirror): void {
    this.mirror = mirror;
  }

  /** Request metrics recorded in other processes: /metrics and the dashboard add them up with this registry's. */
  addRemote(remote: RemoteRequestMetrics): void {
    this.remotes.add(remote);
  }

  async render(): Promise<string> {
    if (this.remotes.size === 0) return this.registry.metrics();
    // The remotes are asked first: a collect of this registry may ask the same processes (tokenizer caches) meanwhile.
    const remote = Promise.all([...this.remotes].map((r) => r.metrics()));
    const own = await this.registry.getMetricsAsJSON();
    // Series of the same name and labels are summed (counters and histograms: the shells record the request
    // metrics, this registry everything else); this registry's first, so its order of families is kept, and each of
    // its families by 'sum' (a family only it has shows as it is: prom-client's defaults would average or omit some).
    const mine = own.map((m) => ({ ...m, aggregator: 'sum' as const }));
    return AggregatorRegistry.aggregate([mine, ...(await remote).flat()]).metrics();
  }

  /** Stops the event-loop monitor. */
  stop(): void {
    this.process.stop();
  }

  /**
   * Cumulative totals for the live dashboard (GET /dashboard/data.json). The page differences successive polls, so
   * this stays stateless and cheap: plain numbers, no histogram buckets.
   */
  dashboardState(now: number = Date.now()): DashboardState {
    const st = this.router.state();
    const ledger = this.router.ledger;
    const totals = this.requests.totalsJson();
    for (const r of this.remotes) for (const t of r.totals()) addTotals(totals, t);
    const workers: DashboardState['workers'] = {};
    for (const s of st.sources) {
      const ev = this.events.totals.get(s.source) ?? emptyEventTotals();
      const eng = this.mirror?.sources.get(s.source);
      workers[s.source] = {
        reuse: { ...(ledger.bySource.get(s.source) ?? emptyTotals()) },
        activePrefillTokens: s.activePrefillTokens,
        activeBlocks: s.activeBlocks,
        activeRequests: s.activeRequests,
        indexedBlocks: s.cachedBlocks,
        approxBlocks: s.approxBlocks,
        mode: s.mode,
        healthy: this.health.get(s.source) ?? true,
        blind: this.events.blind.get(s.source) ?? false,
        events: { ...ev },
        engine: eng ? { queries: eng.queries, hits: eng.hits, hitRateGauge: eng.hitRateGauge ?? null } : null,
      };
    }
    const events = emptyEventTotals();
    for (const t of this.events.totals.values()) for (const k of Object.keys(events) as (keyof EventTotals)[]) events[k] += t[k];
    return {
      time: now,
      prefix: this.prefix,
      blockSize: st.blockSize,
      policy: st.policy,
      inFlight: st.inFlight,
      index: { blocks: st.index.blocks, pairs: st.index.pairs, bytes: st.index.bytes },
      reuse: { ...ledger.total },
      engine: this.mirror ? this.mirror.totals(this.decodeSource) : null,
      overhead: totals.overhead as DashboardState['overhead'],
      ttft: totals.ttft,
      itl: totals.itl,
      outcomes: totals.outcomes,
      refusals: totals.refusals,
      events: { ...events, blindSources: [...this.events.blind.values()].filter(Boolean).length },
      eventLoop: this.process.eventLoop(),
      workers,
    };
  }
}

export interface DashboardState {
  time: number;
  prefix: string;
  blockSize: number;
  policy: string;
  inFlight: number;
  index: { blocks: number; pairs: number; bytes: number };
  reuse: ReuseTotals;
  engine: { queries: number; hits: number } | null;
  overhead: Record<OverheadPhase, SumCount>;
  ttft: SumCount;
  itl: SumCount;
  outcomes: Record<string, number>;
  refusals: Record<string, number>;
  events: EventTotals & { blindSources: number };
  eventLoop: EventLoopLag;
  workers: Record<
    string,
    {
      reuse: ReuseTotals;
      activePrefillTokens: number;
      activeBlocks: number;
      activeRequests: number;
      indexedBlocks: number;
      approxBlocks: number;
      mode: 'events' | 'approx';
      healthy: boolean;
      blind: boolean;
      events: EventTotals;
      engine: { queries: number; hits: number; hitRateGauge: number | null } | null;
    }
  >;
}
