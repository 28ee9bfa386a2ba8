/**
 * RouterMetrics: the router's Prometheus surface (GET /metrics) and the totals the live dashboard reads.
 *
 * Every hit-rate quantity is exported so that both aggregations can be computed from one scrape (docs/protocols.md §6):
 *   request-weighted (mean of ratios) = rate(router_kv_hit_rate_sum) / rate(router_kv_hit_rate_count)
 *   block-weighted   (ratio of sums)  = rate(router_kv_overlap_blocks_total) / rate(router_kv_isl_blocks_total)
 * Only the second is comparable with the engine's hits/queries counters, mirrored here as router_engine_prefix_cache_*.
 *
 * Per-request series carry one label, `worker` (the router's source key); overall values are `sum without (worker)`.
 * A per-instance Registry keeps tests and several routers in one process from colliding on the global one.
 */
import { type IntervalHistogram, monitorEventLoopDelay } from 'node:perf_hooks';
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';
import { emptyTotals, type ReuseTotals } from '../core/ledger.ts';
import type { FinishedRequest, KvRouter } from '../core/router.ts';
import type { ApplyResult, RouteDecision } from '../core/types.ts';
import { EngineMirror, type EngineTarget } from './scrape.ts';

/** 0, 0.05, ..., 1.0 (21 buckets), rounded so the `le` labels print as 0.05, not 0.05000000000000001. */
export const HIT_RATE_BUCKETS = Array.from({ length: 21 }, (_, i) => Math.round(i * 5) / 100);
/** Seconds, from 10 µs (hashing a short prompt) to 1 s (tokenizing a very long one on a loaded box). */
export const OVERHEAD_BUCKETS = [1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1];
export const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];
export const ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5];
export const LENGTH_BUCKETS = [16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144];
/** Predicted minus delivered cached tokens: symmetric, since the router can be wrong both ways. */
export const PREDICTION_ERROR_BUCKETS = [-65536, -16384, -4096, -1024, -256, -64, -16, -1, 0, 16, 64, 256, 1024, 4096, 16384, 65536];

export const OVERHEAD_PHASES = ['tokenize', 'hash', 'find_matches', 'select', 'total'] as const;
export type OverheadPhase = (typeof OVERHEAD_PHASES)[number];

/** Event-ingestion counters the transport layer reports (sequence gaps, replays, resets, decode errors). */
export interface IngestCounts {
  gaps?: number;
  replays?: number;
  resets?: number;
  /** Undecodable payloads (cause "undecodable") when `decodeErrorsByCause` is absent. */
  decodeErrors?: number;
  /** Decode errors by cause (frame_count, seq_length, undecodable, malformed_event, unknown_event_type). */
  decodeErrorsByCause?: Partial<Record<string, number>>;
}

export interface RouterMetricsOptions {
  /** Prepended to every name, e.g. `dynamo_component_` so dashboards built for Dynamo keep working. */
  readonly prefix?: string;
  readonly router: KvRouter;
  /** Cap on distinct `worker` label values; later workers share the label `_other` (bounded cardinality). */
  readonly maxWorkerLabels?: number;
  /** Window of the dashboard's event-loop delay figures, ms. Default 5 s. */
  readonly eventLoopWindowMs?: number;
}

interface EventTotals {
  events: number;
  appliedBlocks: number;
  rejectedBlocks: number;
  gaps: number;
  replays: number;
  resets: number;
  decodeErrors: number;
}

const emptyEventTotals = (): EventTotals => ({
  events: 0,
  appliedBlocks: 0,
  rejectedBlocks: 0,
  gaps: 0,
  replays: 0,
  resets: 0,
  decodeErrors: 0,
});

interface SumCount {
  sum: number;
  count: number;
}

/** The metrics a request handler records (a shell of `--processes` forwards them to the primary's registry). */
export type RequestMetrics = Pick<RouterMetrics, 'routed' | 'firstToken' | 'token' | 'refused' | 'outcome' | 'apiRequest'>;

export class RouterMetrics {
  readonly registry: Registry;
  readonly contentType: string;
  readonly prefix: string;
  private readonly router: KvRouter;
  private readonly maxWorkers: number;
  private readonly workerLabels = new Set<string>();
  private mirror?: EngineMirror;
  private readonly health = new Map<string, boolean>();
  private readonly blind = new Map<string, boolean>();
  private readonly lastIngestTotals = new Map<string, IngestCounts>();
  /** Decode workers of a P/D fleet (by source key): their engine counters are not prefix-cache truth. */
  private decodeSource: (sourceKey: string) => boolean = () => false;

  // Plain totals for the dashboard (prom-client's async get() is too heavy for a 2 s poll, and these are exact).
  private readonly overhead = new Map<OverheadPhase, SumCount>(OVERHEAD_PHASES.map((p) => [p, { sum: 0, count: 0 }]));
  private readonly outcomes = new Map<string, number>();
  private readonly refusals = new Map<string, number>();
  private readonly events = new Map<string, EventTotals>();
  private readonly ttft: SumCount = { sum: 0, count: 0 };
  private readonly itl: SumCount = { sum: 0, count: 0 };

  private readonly hitRate: Histogram<'worker'>;
  private readonly availableHitRate: Histogram<'worker'>;
  private readonly overlapBlocks: Counter<'worker'>;
  private readonly islBlocks: Counter<'worker'>;
  private readonly bestOverlapBlocks: Counter<'worker'>;
  private readonly engineCachedTokens: Counter<'worker'>;
  private readonly enginePromptTokens: Counter<'worker'>;
  private readonly predictedCachedTokens: Counter<'worker'>;
  private readonly predictionError: Histogram<'worker'>;
  private readonly deliveredHitRate: Histogram<'worker'>;
  private readonly overheadHist: Histogram<'phase'>;
  private readonly requests: Counter<'outcome'>;
  private readonly refusedCounter: Counter<'reason'>;
  private readonly ttftHist: Histogram<'worker'>;
  private readonly itlHist: Histogram<'worker'>;
  private readonly promptTokens: Histogram<'worker'>;
  private readonly outputTokens: Histogram<'worker'>;
  private readonly eventsCounter: Counter<'worker' | 'kind' | 'status'>;
  private readonly eventBlocks: Counter<'worker' | 'kind' | 'status'>;
  private readonly gaps: Counter<'worker'>;
  private readonly replays: Counter<'worker'>;
  private readonly resets: Counter<'worker'>;
  private readonly decodeErrors: Counter<'worker' | 'cause'>;
  private readonly apiRequests: Counter<'api'>;
  private readonly passthroughRequests: Counter<'path' | 'status'>;
  // Event-loop delay for the dashboard: the last complete window's figures (the process metrics have it cumulatively).
  private readonly loopDelay: IntervalHistogram;
  private loopWindow: EventLoopLag = { meanMs: Number.NaN, p99Ms: Number.NaN, maxMs: Number.NaN, windowS: 0 };
  private readonly loopTimer: NodeJS.Timeout;

  constructor(opts: RouterMetricsOptions) {
    this.router = opts.router;
    this.prefix = opts.prefix ?? '';
    this.maxWorkers = opts.maxWorkerLabels ?? 256;
    if (this.prefix !== '' && !/^[a-zA-Z_:][a-zA-Z0-9_:]*$/.test(this.prefix)) {
      throw new RangeError(`metrics prefix "${this.prefix}" is not a valid Prometheus name prefix ([a-zA-Z_:][a-zA-Z0-9_:]*)`);
    }
    const registry = new Registry();
    this.registry = registry;
    this.contentType = registry.contentType;
    const p = this.prefix;
    const registers = [registry];
    const w = ['worker'] as const;
    // The standard process and Node.js series (resident memory, heap, handles, event-loop lag, GC), with our prefix.
    collectDefaultMetrics({ register: registry, prefix: p, eventLoopMonitoringPrecision: 10 });
    this.apiRequests = new Counter({
      name: `${p}router_api_requests_total`,
      help: 'Routed requests accepted for routing, by API (chat, completions, responses, messages, embeddings, pooling, score, rerank).',
      labelNames: ['api'],
      registers,
    });
    this.passthroughRequests = new Counter({
      name: `${p}router_passthrough_requests_total`,
      help: 'Requests passed through to a worker without routing (/tokenize, /detokenize, other engine paths), by path and status.',
      labelNames: ['path', 'status'],
      registers,
    });
    this.loopDelay = monitorEventLoopDelay({ resolution: 10 });
    this.loopDelay.enable();
    const windowMs = opts.eventLoopWindowMs ?? 5000;
    this.loopTimer = setInterval(() => {
      const h = this.loopDelay;
      this.loopWindow = { meanMs: h.mean / 1e6, p99Ms: h.percentile(99) / 1e6, maxMs: h.max / 1e6, windowS: windowMs / 1000 };
      h.reset();
    }, windowMs);
    this.loopTimer.unref();

    this.hitRate = new Histogram({
      name: `${p}router_kv_hit_rate`,
      help:
        'Predicted hit rate per request: overlap blocks on the chosen worker / isl blocks. _sum/_count is a MEAN OF ' +
        "RATIOS (request-weighted), dragged down by many short cold requests; not comparable with the engine's " +
        'hits/queries. For that use router_kv_overlap_blocks_total / router_kv_isl_blocks_total.',
      buckets: HIT_RATE_BUCKETS,
      labelNames: w,
      registers,
      // Registered first, so this runs before the other series are read: every known worker gets zeroed series.
      collect: () => {
        for (const key of this.router.sourceKeys()) this.label(key);
      },
    });
    this.availableHitRate = new Histogram({
      name: `${p}router_kv_available_hit_rate`,
      help:
        'Reuse available per request: best overlap over eligible workers / isl blocks (request-weighted when read as ' +
        '_sum/_count). Block-weighted: router_kv_best_overlap_blocks_total / router_kv_isl_blocks_total.',
      buckets: HIT_RATE_BUCKETS,
      labelNames: w,
      registers,
    });
    this.overlapBlocks = new Counter({
      name: `${p}router_kv_overlap_blocks_total`,
      help:
        'Prompt blocks the chosen worker already held, summed at routing time. rate(this)/rate(router_kv_isl_blocks_total) ' +
        "is the block-weighted predicted hit rate (a ratio of sums), directly comparable with the engine's hits/queries.",
      labelNames: w,
      registers,
    });
    this.islBlocks = new Counter({
      name: `${p}router_kv_isl_blocks_total`,
      help: 'Prompt blocks routed (ceil(prompt tokens / block size) per request), summed at routing time.',
      labelNames: w,
      registers,
    });
    this.bestOverlapBlocks = new Counter({
      name: `${p}router_kv_best_overlap_blocks_total`,
      help:
        'Best overlap among eligible workers, summed at routing time (reuse available in the fleet). The gap to ' +
        'router_kv_overlap_blocks_total is reuse traded for load balance. Labelled by the chosen worker.',
      labelNames: w,
      registers,
    });
    this.engineCachedTokens = new Counter({
      name: `${p}router_kv_engine_cached_tokens_total`,
      help:
        'Delivered reuse: usage.prompt_tokens_details.cached_tokens the engine reported, summed over requests that ' +
        'reported it (absent is unknown, not zero, and is not counted).',
      labelNames: w,
      registers,
    });
    this.enginePromptTokens = new Counter({
      name: `${p}router_kv_engine_prompt_tokens_total`,
      help: 'Prompt tokens of the same requests as router_kv_engine_cached_tokens_total (the delivered denominator).',
      labelNames: w,
      registers,
    });
    this.predictedCachedTokens = new Counter({
      name: `${p}router_kv_predicted_cached_tokens_total`,
      help:
        'Cached tokens the router predicted, for the same requests as router_kv_engine_cached_tokens_total ' +
        '(overlap in tokens, never the last prompt token).',
      labelNames: w,
      registers,
    });
    this.predictionError = new Histogram({
      name: `${p}router_kv_prediction_error_tokens`,
      help: 'Per request with an engine report: predicted minus delivered cached tokens (>0 the router over-predicted).',
      buckets: PREDICTION_ERROR_BUCKETS,
      labelNames: w,
      registers,
    });
    this.deliveredHitRate = new Histogram({
      name: `${p}router_kv_delivered_hit_rate`,
      help:
        'Per request with an engine report: cached tokens / prompt tokens. _sum/_count is request-weighted; the ' +
        'token-weighted delivered rate is router_kv_engine_cached_tokens_total / router_kv_engine_prompt_tokens_total.',
      buckets: HIT_RATE_BUCKETS,
      labelNames: w,
      registers,
    });
    this.overheadHist = new Histogram({
      name: `${p}router_routing_overhead_seconds`,
      help: 'Time the router spent per request, by phase: tokenize, hash, find_matches, select, total (their sum).',
      buckets: OVERHEAD_BUCKETS,
      labelNames: ['phase'],
      registers,
    });
    this.requests = new Counter({
      name: `${p}router_requests_total`,
      help: 'Requests handled by the router, by outcome.',
      labelNames: ['outcome'],
      registers,
    });
    this.refusedCounter = new Counter({
      name: `${p}router_requests_refused_total`,
      help: 'Requests the router could not place, by reason (no_sources, all_busy, duplicate_request, ...).',
      labelNames: ['reason'],
      registers,
    });
    this.ttftHist = new Histogram({
      name: `${p}router_time_to_first_token_seconds`,
      help: 'Time to first token as seen at the router (request received to first streamed token).',
      buckets: LATENCY_BUCKETS,
      labelNames: w,
      registers,
    });
    this.itlHist = new Histogram({
      name: `${p}router_inter_token_latency_seconds`,
      help: 'Time between consecutive streamed tokens (chunks) as seen at the router.',
      buckets: ITL_BUCKETS,
      labelNames: w,
      registers,
    });
    this.promptTokens = new Histogram({
      name: `${p}router_prompt_tokens`,
      help: 'Prompt length in tokens per routed request.',
      buckets: LENGTH_BUCKETS,
      labelNames: w,
      registers,
    });
    this.outputTokens = new Histogram({
      name: `${p}router_output_tokens`,
      help: 'Output length in tokens per finished request (when known).',
      buckets: LENGTH_BUCKETS,
      labelNames: w,
      registers,
    });
    this.eventsCounter = new Counter({
      name: `${p}router_kv_events_total`,
      help: 'KV events applied to the index, by worker, kind (stored/removed/cleared) and status (applied or the reject reason).',
      labelNames: ['worker', 'kind', 'status'],
      registers,
    });
    this.eventBlocks = new Counter({
      name: `${p}router_kv_event_blocks_total`,
      help: 'Blocks carried by KV events, by worker, kind and status (applied/rejected).',
      labelNames: ['worker', 'kind', 'status'],
      registers,
    });
    this.gaps = new Counter({
      name: `${p}router_kv_event_gaps_total`,
      help: 'Sequence-number gaps detected in a KV event stream (events lost between engine and router).',
      labelNames: w,
      registers,
    });
    this.replays = new Counter({
      name: `${p}router_kv_event_replays_total`,
      help: 'Replays requested from an engine to repair a gap.',
      labelNames: w,
      registers,
    });
    this.resets = new Counter({
      name: `${p}router_kv_event_resets_total`,
      help: "Times a source's index was cleared (engine restart or a gap that could not be repaired).",
      labelNames: w,
      registers,
    });
    this.decodeErrors = new Counter({
      name: `${p}router_kv_event_decode_errors_total`,
      help:
        'KV event messages or events that could not be decoded (dropped, counted), by cause: frame_count, seq_length, ' +
        'undecodable (payload not a batch), malformed_event, unknown_event_type.',
      labelNames: ['worker', 'cause'],
      registers,
    });

    // Per-worker gauges, read from the router at scrape time so they can never go stale.
    const router = this.router;
    const self = this;
    const sourceGauge = (name: string, help: string, read: (s: ReturnType<KvRouter['state']>['sources'][number]) => number) =>
      new Gauge({
        name: `${p}${name}`,
        help,
        labelNames: w,
        registers,
        collect() {
          this.reset();
          for (const s of router.state().sources) this.set({ worker: self.label(s.source) }, read(s));
        },
      });
    sourceGauge(
      'router_worker_active_prefill_tokens',
      'Prompt tokens routed to the worker whose prefill has not finished (uncached part).',
      (s) => s.activePrefillTokens,
    );
    sourceGauge(
      'router_worker_active_blocks',
      'KV blocks held by requests in flight on the worker, as the router accounts them.',
      (s) => s.activeBlocks,
    );
    sourceGauge('router_worker_active_requests', 'Requests in flight on the worker.', (s) => s.activeRequests);
    sourceGauge(
      'router_worker_indexed_blocks',
      "Blocks the router's event index holds for the worker (its view of the worker's cache).",
      (s) => s.cachedBlocks,
    );
    sourceGauge(
      'router_worker_approx_blocks',
      'Blocks the approximate index (workers without events) holds for the worker.',
      (s) => s.approxBlocks,
    );
    sourceGauge('router_worker_healthy', '1 when the worker is routable (healthy), 0 when marked unhealthy.', (s) =>
      (self.health.get(s.source) ?? true) ? 1 : 0,
    );
    sourceGauge(
      'router_kv_event_source_blind',
      '1 when the worker publishes no usable KV events (the router is blind to its cache).',
      (s) => (self.blind.get(s.source) ? 1 : 0),
    );
    new Gauge({
      name: `${p}router_kv_index_blocks`,
      help: 'Distinct blocks in the event index (all workers).',
      registers,
      collect() {
        this.set(router.index.stats().blocks);
      },
    });
    new Gauge({
      name: `${p}router_kv_index_bytes`,
      help: 'Approximate memory of the event index in bytes.',
      registers,
      collect() {
        this.set(router.index.stats().bytes);
      },
    });
    new Gauge({
      name: `${p}router_requests_in_flight`,
      help: 'Requests routed and not yet finished.',
      registers,
      collect() {
        this.set(router.state().inFlight);
      },
    });
    new Gauge({
      name: `${p}router_kv_event_sources_blind`,
      help: 'Workers the router is currently blind to (no usable KV events).',
      registers,
      collect() {
        let n = 0;
        for (const b of self.blind.values()) if (b) n++;
        this.set(n);
      },
    });
  }

  /** Bounded cardinality: the first `maxWorkerLabels` workers get their own label, the rest share `_other`. */
  private label(sourceKey: string): string {
    if (this.workerLabels.has(sourceKey)) return sourceKey;
    const label = this.workerLabels.size < this.maxWorkers ? sourceKey : '_other';
    if (!this.workerLabels.has(label)) {
      this.workerLabels.add(label);
      this.zeroWorker(label);
    }
    return label;
  }

  /** Series exist at 0 from the moment a worker is known, so rate() sees the first request instead of a new series. */
  private zeroWorker(worker: string): void {
    const l = { worker };
    for (const c of [
      this.overlapBlocks,
      this.islBlocks,
      this.bestOverlapBlocks,
      this.engineCachedTokens,
      this.enginePromptTokens,
      this.predictedCachedTokens,
    ]) {
      c.inc(l, 0);
    }
    for (const h of [this.hitRate, this.availableHitRate, this.predictionError, this.deliveredHitRate]) h.zero(l);
  }

  /** At routing time. timingsS.tokenize is measured by the shell; hash/find/select come from the decision. */
  routed(decision: RouteDecision, timingsS: { tokenize: number }): void {
    const worker = { worker: this.label(decision.sourceKey) };
    const isl = decision.islBlocks;
    this.islBlocks.inc(worker, isl);
    this.overlapBlocks.inc(worker, decision.overlapBlocks);
    this.bestOverlapBlocks.inc(worker, decision.bestOverlapBlocks);
    // A zero-block prompt has no ratio; the ledger skips it too, so histogram and ledger agree.
    if (isl > 0) {
      this.hitRate.observe(worker, decision.overlapBlocks / isl);
      this.availableHitRate.observe(worker, decision.bestOverlapBlocks / isl);
    }
    this.promptTokens.observe(worker, decision.promptTokens);
    const t = decision.timingsMs;
    const phases: [OverheadPhase, number | undefined][] = [
      ['tokenize', timingsS.tokenize],
      ['hash', t ? t.hash / 1000 : undefined],
      ['find_matches', t ? t.find / 1000 : undefined],
      ['select', t ? t.select / 1000 : undefined],
    ];
    let total = 0;
    for (const [phase, s] of phases) {
      if (s === undefined || !Number.isFinite(s) || s < 0) continue;
      total += s;
      this.observeOverhead(phase, s);
    }
    this.observeOverhead('total', total);
  }

  private observeOverhead(phase: OverheadPhase, s: number): void {
    this.overheadHist.observe({ phase }, s);
    const sc = this.overhead.get(phase)!;
    sc.sum += s;
    sc.count++;
  }

  refused(reason: string): void {
    this.refusedCounter.inc({ reason });
    this.refusals.set(reason, (this.refusals.get(reason) ?? 0) + 1);
  }

  firstToken(sourceKey: string, ttftS: number): void {
    if (!Number.isFinite(ttftS) || ttftS < 0) return;
    this.ttftHist.observe({ worker: this.label(sourceKey) }, ttftS);
    this.ttft.sum += ttftS;
    this.ttft.count++;
  }

  token(sourceKey: string, interTokenS: number): void {
    if (!Number.isFinite(interTokenS) || interTokenS < 0) return;
    this.itlHist.observe({ worker: this.label(sourceKey) }, interTokenS);
    this.itl.sum += interTokenS;
    this.itl.count++;
  }

  /**
   * When KvRouter.finish() returned a record. Delivered reuse is counted only when the engine reported cached tokens
   * (the same condition the ledger uses). Does not count the request's outcome: call outcome() for that, once.
   */
  finished(f: FinishedRequest, extra?: { outputTokens?: number }): void {
    const worker = { worker: this.label(f.sourceKey) };
    const cached = f.cachedTokens;
    // The decode leg of a disaggregated request reports the transferred KV as cached: not a prefix hit, not counted.
    if (f.accounted && cached !== undefined && Number.isFinite(cached) && cached >= 0 && f.promptTokens > 0) {
      this.engineCachedTokens.inc(worker, cached);
      this.enginePromptTokens.inc(worker, f.promptTokens);
      this.predictedCachedTokens.inc(worker, f.predictedCachedTokens);
      this.predictionError.observe(worker, f.predictedCachedTokens - cached);
      this.deliveredHitRate.observe(worker, cached / f.promptTokens);
    }
    const out = extra?.outputTokens;
    if (out !== undefined && Number.isFinite(out) && out >= 0) this.outputTokens.observe(worker, out);
  }

  outcome(outcome: string): void {
    this.requests.inc({ outcome });
    this.outcomes.set(outcome, (this.outcomes.get(outcome) ?? 0) + 1);
  }

  private eventTotals(sourceKey: string): EventTotals {
    let t = this.events.get(sourceKey);
    if (!t) {
      t = emptyEventTotals();
      this.events.set(sourceKey, t);
    }
    return t;
  }

  /** After router.applyEvents() (one call per event or per batch; eventKind labels the batch, 'batch' when mixed). */
  eventsApplied(sourceKey: string, result: ApplyResult, eventKind = 'batch'): void {
    const worker = this.label(sourceKey);
    const status = result.reason ?? 'applied';
    this.eventsCounter.inc({ worker, kind: eventKind, status });
    if (result.applied > 0) this.eventBlocks.inc({ worker, kind: eventKind, status: 'applied' }, result.applied);
    if (result.rejected > 0) this.eventBlocks.inc({ worker, kind: eventKind, status: 'rejected' }, result.rejected);
    const t = this.eventTotals(sourceKey);
    t.events++;
    t.appliedBlocks += result.applied;
    t.rejectedBlocks += result.rejected;
  }

  /** Transport-level event health: increments, plus whether the source is currently blind. */
  ingestCounters(sourceKey: string, counts: IngestCounts & { blind?: boolean }): void {
    const worker = { worker: this.label(sourceKey) };
    const t = this.eventTotals(sourceKey);
    const add = (c: Counter<'worker'>, n: number | undefined, field: 'gaps' | 'replays' | 'resets') => {
      if (n === undefined || !Number.isFinite(n) || n <= 0) return;
      c.inc(worker, n);
      t[field] += n;
    };
    add(this.gaps, counts.gaps, 'gaps');
    add(this.replays, counts.replays, 'replays');
    add(this.resets, counts.resets, 'resets');
    const causes = counts.decodeErrorsByCause ?? (counts.decodeErrors !== undefined ? { undecodable: counts.decodeErrors } : {});
    for (const [cause, n] of Object.entries(causes)) {
      if (n === undefined || !Number.isFinite(n) || n <= 0) continue;
      this.decodeErrors.inc({ ...worker, cause }, n);
      t.decodeErrors += n;
    }
    if (counts.blind !== undefined) this.blind.set(sourceKey, counts.blind);
  }

  /**
   * Same counters from cumulative totals (e.g. the ingest layer's per-source health, synced before each scrape): the
   * increase since the last call is added. A total that went down (the source's ingest was recreated) counts from 0.
   * Use either this or ingestCounters() for a given counter, not both.
   */
  ingestTotals(sourceKey: string, totals: IngestCounts & { blind?: boolean }): void {
    let last = this.lastIngestTotals.get(sourceKey);
    if (!last) {
      last = {};
      this.lastIngestTotals.set(sourceKey, last);
    }
    const inc: IngestCounts & { blind?: boolean } = { blind: totals.blind };
    for (const k of ['gaps', 'replays', 'resets', 'decodeErrors'] as const) {
      const now = totals[k];
      if (now === undefined || !Number.isFinite(now)) continue;
      const prev = last[k] ?? 0;
      inc[k] = now >= prev ? now - prev : now;
      last[k] = now;
    }
    if (totals.decodeErrorsByCause) {
      const prevByCause = last.decodeErrorsByCause ?? {};
      const incByCause: Record<string, number> = {};
      const nowByCause: Record<string, number> = {};
      for (const [cause, now] of Object.entries(totals.decodeErrorsByCause)) {
        if (now === undefined || !Number.isFinite(now)) continue;
        const prev = prevByCause[cause] ?? 0;
        incByCause[cause] = now >= prev ? now - prev : now;
        nowByCause[cause] = now;
      }
      inc.decodeErrorsByCause = incByCause;
      last.decodeErrorsByCause = nowByCause;
    }
    this.ingestCounters(sourceKey, inc);
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

  render(): Promise<string> {
    return this.registry.metrics();
  }

  /** A request accepted by one of the routed APIs. */
  apiRequest(api: string): void {
    this.apiRequests.inc({ api });
  }

  /** A pass-through answered; `path` must come from a bounded set (the caller maps the rest to "other"). */
  passthrough(path: string, status: number): void {
    this.passthroughRequests.inc({ path, status: String(status) });
  }

  /** Stops the event-loop monitor. */
  stop(): void {
    clearInterval(this.loopTimer);
    this.loopDelay.disable();
  }

  /**
   * Cumulative totals for the live dashboard (GET /dashboard/data.json). The page differences successive polls, so
   * this stays stateless and cheap: plain numbers, no histogram buckets.
   */
  dashboardState(now: number = Date.now()): DashboardState {
    const st = this.router.state();
    const ledger = this.router.ledger;
    const workers: DashboardState['workers'] = {};
    for (const s of st.sources) {
      const ev = this.events.get(s.source) ?? emptyEventTotals();
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
        blind: this.blind.get(s.source) ?? false,
        events: { ...ev },
        engine: eng ? { queries: eng.queries, hits: eng.hits, hitRateGauge: eng.hitRateGauge ?? null } : null,
      };
    }
    const events = emptyEventTotals();
    for (const t of this.events.values()) for (const k of Object.keys(events) as (keyof EventTotals)[]) events[k] += t[k];
    return {
      time: now,
      prefix: this.prefix,
      blockSize: st.blockSize,
      policy: st.policy,
      inFlight: st.inFlight,
      index: { blocks: st.index.blocks, pairs: st.index.pairs, bytes: st.index.bytes },
      reuse: { ...ledger.total },
      engine: this.mirror ? this.mirror.totals(this.decodeSource) : null,
      overhead: Object.fromEntries([...this.overhead].map(([k, v]) => [k, { ...v }])) as DashboardState['overhead'],
      ttft: { ...this.ttft },
      itl: { ...this.itl },
      outcomes: Object.fromEntries(this.outcomes),
      refusals: Object.fromEntries(this.refusals),
      events: { ...events, blindSources: [...this.blind.values()].filter(Boolean).length },
      eventLoop: { ...this.loopWindow },
      workers,
    };
  }
}

/** Event-loop delay over the last window (NaN until the first window closes). */
export interface EventLoopLag {
  meanMs: number;
  p99Ms: number;
  maxMs: number;
  windowS: number;
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
