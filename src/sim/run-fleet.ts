/**
 * The fleet simulator: a trace replayed on a virtual clock through N engine models (src/mocker/engine, unchanged)
 * behind the same core the server runs: the Dispatcher (eligibility, busy thresholds, queue, retries, breakers) around
 * the KvRouter. No sleeps, no timers: a heap of timed events drives everything.
 *
 *   arrival    dispatcher.submit() -> dispatch: engine.addRequest() (an idle engine starts a step at once)
 *                                   | queued (every source busy) | refused (counted by reason)
 *   step end   outputs become visible: first token -> dispatcher.firstToken(), finish -> dispatcher.finish(cached
 *              tokens); both free load, so queued requests may be dispatched; the step's KV events are queued for the
 *              router, delivered `eventDelayMs` later (as over ZMQ); the engine starts its next step if it has work
 *   delivery   router.applyEvents() with the engine's events, exactly as live mode feeds them
 *   failure    with `engineFailures` > 0, an attempt fails before its engine answers (as a 500 would) and is reported
 *              `failureLatencyMs` later: the dispatcher retries it elsewhere or refuses it, and breakers open
 *   wake       dispatcher.tick() at the time it asks for (queue timeouts, sweeps)
 *
 * Engine events are core-shaped already (Stored carries the new blocks' tokens; the router hashes them itself and maps
 * the engine's sha256-chain ids to its own hashes), so no conversion is needed at this edge.
 */
import { dispatchOptionsFrom, ROUTING_DEFAULTS } from '../config/routing.ts';
import {
  DEFAULT_TENANT,
  type DispatchAttempt,
  type DispatchEffect,
  Dispatcher,
  type DispatchOptions,
  type DispatchRefusal,
  type PrefillLeg,
  type RefusalCode,
} from '../core/dispatch/dispatcher.ts';
import type { MrcBook } from '../core/mrc.ts';
import { createRng } from '../core/rng.ts';
import { KvRouter, type KvRouterOptions } from '../core/router.ts';
import type { Policy } from '../core/scheduling/policy.ts';
import { createPolicy } from '../core/scheduling/registry.ts';
import type { KvEvent } from '../core/types.ts';
import {
  EngineInputError,
  MockEngine,
  type EngineConfig,
  type EngineEvent,
  type RequestOutput,
  type StepResult,
} from '../mocker/engine/index.ts';
import { EventHeap } from './heap.ts';
import { expandTokensArray, RecordedPrompts, TraceHasher } from './traces/expand.ts';
import type { TraceRequest } from './traces/format.ts';
import { percentileSorted } from './traces/stats.ts';

export interface FleetOptions {
  readonly workers: number;
  /** Policy name (src/core/scheduling), or the name of `customPolicy`. */
  readonly policy: string;
  /** Router and engine block size in tokens. */
  readonly blockSize: number;
  /** KV capacity per worker in blocks. */
  readonly gpuBlocks: number;
  /** Arrival times are divided by this: 2 = twice the trace's load. */
  readonly rateScale?: number;
  /** Delay between the end of an engine step and the router applying its KV events. */
  readonly eventDelayMs?: number;
  readonly seed?: number;
  readonly engine?: Partial<EngineConfig>;
  readonly router?: Partial<KvRouterOptions>;
  /** A policy object to try (prototypes): registered with the router under its own name. */
  readonly customPolicy?: Policy;
  /** Keep per-request records (tests, brute-force checks). */
  readonly keepRequests?: boolean;
  /** Window for the time-resolved imbalance, ms of simulated time. */
  readonly imbalanceWindowMs?: number;
  readonly onProgress?: (done: number, total: number) => void;
  /** A hasher to share between runs at the same block size (its memo makes later runs cheaper). */
  readonly hasher?: TraceHasher;
  /** Admission as `kvroute serve` has it (queue, retries, breaker); busy thresholds go in `router.busy`. */
  readonly dispatch?: Partial<DispatchOptions>;
  /** Fraction of attempts that fail before their engine answers (seeded). Default 0. */
  readonly engineFailures?: number;
  /** Delay before a failed attempt is noticed, ms. Default 2. */
  readonly failureLatencyMs?: number;
  /**
   * Disaggregated prefill/decode: this many prefill workers and `decodeWorkers` decode workers (vLLM flavour) replace
   * `workers`. A disaggregated request prefills one token on its prefill worker, whose blocks stay held while the KV
   * moves (bytes per token × tokens the decode worker lacks / bandwidth), then decodes on its decode worker.
   */
  readonly prefillWorkers?: number;
  readonly decodeWorkers?: number;
  readonly transfer?: { readonly bytesPerToken: number; readonly bytesPerS: number };
  /**
   * Closed loop: ignore the trace's timestamps and keep this many requests in flight, released in trace order as
   * earlier ones finish or are refused (Dynamo replay's `--replay-concurrency`); TTFT counts from the release.
   */
  readonly concurrency?: number;
  /** The SLO that goodput counts against (defaults: TTFT <= 2 s, ITL <= 50 ms). */
  readonly slo?: { readonly ttftMs: number; readonly itlMs: number };
  /**
   * Miss-ratio curves to feed as the live router's tap does (src/runtime/mrc-feed.ts): each request's first attempt,
   * at dispatch, with the engine chosen and the router's own hashes (`kvroute sim --what-if`).
   */
  readonly mrc?: MrcBook;
}

/** The KV of an 8B model (2 · 36 layers · 8 KV heads · 128 · 2 bytes) over 400 Gb/s RDMA. */
export const DEFAULT_TRANSFER = { bytesPerToken: 147_456, bytesPerS: 50e9 } as const;

/** Serve's admission defaults (src/config/routing.ts) for a run given no `dispatch`, so it admits as the live router does. */
const SERVE_DISPATCH = dispatchOptionsFrom(ROUTING_DEFAULTS);
const SIM_DISPATCH_DEFAULTS: DispatchOptions = {
  queueLimit: SERVE_DISPATCH.queueLimit,
  queueTimeoutMs: SERVE_DISPATCH.queueTimeoutMs,
  retries: SERVE_DISPATCH.retries,
  breaker: SERVE_DISPATCH.breaker,
  sweepIntervalMs: 5_000,
};

export interface LatencySummary {
  readonly requests: number;
  readonly p50: number;
  readonly p90: number;
  readonly p99: number;
  readonly mean: number;
}

export interface BucketLatency extends LatencySummary {
  readonly bucket: string;
}

export interface RequestRecord {
  readonly index: number;
  readonly worker: number;
  readonly arrivalMs: number;
  readonly promptTokens: number;
  readonly islBlocks: number;
  readonly overlapBlocks: number;
  readonly bestOverlapBlocks: number;
  firstTokenMs: number;
  finishMs: number;
  cachedTokens: number;
}

export interface FleetResult {
  readonly name: string;
  /** The dispatcher's queue order for this run (fair: bands x tenants; fifo: arrival order). */
  readonly queue_order: 'fair' | 'fifo';
  readonly rate_scale: number;
  readonly hit: {
    readonly predicted_request_weighted: number;
    readonly predicted_block_weighted: number;
    readonly available_request_weighted: number;
    readonly available_block_weighted: number;
    /** Σ prefix-cache hits / Σ queries over the engines' counters (token-weighted, vLLM's ratio of sums). */
    readonly engine_token_weighted: number;
    /** Mean over requests of cached/prompt tokens as engines reported them. */
    readonly engine_request_weighted: number;
    /** The router's prediction for the same requests, in tokens (last prompt token never cached). */
    readonly predicted_token_weighted: number;
    /**
     * What the engines delivered, block-weighted: Σ floor(cached tokens / block size) / Σ prompt blocks over the
     * requests that got a first token (cached tokens as the engine reported them, host-tier loads included): the
     * figure the miss-ratio curve predicts.
     */
    readonly delivered_block_weighted: number;
  };
  /** Engines with a host tier (engine.hostBlocks > 0): its size per engine and what it did, summed over engines. */
  readonly host_tier?: {
    readonly blocks_per_engine: number;
    readonly hit_tokens: number;
    readonly stored: number;
    readonly loaded: number;
    readonly evicted: number;
  };
  readonly ttft_ms: LatencySummary;
  readonly ttft_by_bucket: readonly BucketLatency[];
  /** TTFT and refusals per tenant and per flow-control band (requests without a tenant: `default`). */
  readonly by_tenant: readonly GroupLatency[];
  readonly by_band: readonly GroupLatency[];
  /**
   * Jain's fairness index of service against max-min fair shares, over windows of contention (docs/flow-control.md):
   * per window, x_t = prompt tokens dispatched for tenant t / its max-min fair share of what the fleet dispatched
   * (water-filling over the tenants' demand: tokens that arrived in the window, weights as configured); J = (Σx)² / (n·Σx²)
   * is 1 when every tenant got its fair share. Averaged over windows in which requests queued, weighted by the tokens
   * dispatched; NaN when nothing ever queued or only one tenant asked.
   */
  readonly fairness: { readonly jain: number; readonly windows: number };
  /** Prompt + generated tokens per second of simulated time (first arrival to last finish). */
  readonly throughput_tokens_per_s: number;
  readonly output_tokens_per_s: number;
  /** max/mean over workers of prefill tokens computed (uncached) over the whole run. */
  readonly imbalance: number;
  /** The same per window of simulated time, averaged with each window weighted by its prefill work. */
  readonly imbalance_windowed: number;
  readonly preemptions: number;
  /** Per worker: requests routed there and prefill tokens it computed (the imbalance's inputs). */
  readonly per_worker: ReadonlyArray<{ readonly worker: string; readonly requests: number; readonly prefill_tokens: number }>;
  /** Cached blocks the engines evicted to make room. */
  readonly blocks_evicted: number;
  /**
   * served: answered by an engine; queued: waited in the dispatcher's queue at least once; refused: answered with a
   * refusal (by reason in `refusals`); retried: attempts that failed and were retried elsewhere.
   */
  readonly requests: {
    readonly served: number;
    readonly queued: number;
    readonly refused: number;
    readonly retried: number;
    readonly routed: number;
    readonly finished: number;
    readonly rejected: number;
  };
  readonly refusals: Partial<Record<RefusalCode | 'engine_rejected', number>>;
  /** Over requests that waited in the queue (NaN when none did). */
  readonly queue_wait_ms: { readonly p50: number; readonly p99: number; readonly max: number };
  readonly events: { readonly applied: number; readonly rejected: number };
  /** wall_s is elapsed time; cpu_s this process's user+system CPU (the fairer figure on a shared machine). */
  readonly sim: { readonly simulated_s: number; readonly wall_s: number; readonly cpu_s: number; readonly engine_steps: number };
  readonly perRequest?: readonly RequestRecord[];
  /** Inter-token latency per request: (finish - first token) / (output tokens - 1), requests with 2+ output tokens. */
  readonly itl_ms: LatencySummary;
  /** Requests within the SLO (TTFT and ITL), as a fraction of served requests and per second of simulated time. */
  readonly goodput: { readonly ttft_ms: number; readonly itl_ms: number; readonly fraction: number; readonly per_s: number };
  /** Disaggregated runs: the dispatcher's path counts and handoff counters, transfer time per handed-off request. */
  readonly pd?: {
    readonly prefill_workers: number;
    readonly decode_workers: number;
    readonly min_uncached_tokens: number;
    readonly paths: Record<string, number>;
    readonly decode_only: Record<string, number>;
    readonly transferred_tokens: number;
    readonly transfer_ms: LatencySummary;
  };
}

export interface GroupLatency extends LatencySummary {
  readonly name: string;
  readonly refused: number;
}

function groups(m: Map<string, { ttft: number[]; refused: number }>): GroupLatency[] {
  return [...m.entries()].sort(([a], [b]) => (a < b ? -1 : 1)).map(([name, g]) => ({ name, refused: g.refused, ...summarize(g.ttft) }));
}

/** Max-min fair shares of `capacity` for weighted demands (water-filling). */
export function maxMinShares(demand: ReadonlyMap<string, number>, weights: (t: string) => number, capacity: number): Map<string, number> {
  const share = new Map<string, number>();
  let open = [...demand.keys()].filter((t) => (demand.get(t) ?? 0) > 0);
  let left = capacity;
  while (open.length > 0 && left > 1e-9) {
    const wsum = open.reduce((a, t) => a + weights(t), 0);
    const unit = left / wsum;
    const satisfied = open.filter((t) => (demand.get(t) ?? 0) - (share.get(t) ?? 0) <= unit * weights(t));
    if (satisfied.length === 0) {
      for (const t of open) share.set(t, (share.get(t) ?? 0) + unit * weights(t));
      break;
    }
    for (const t of satisfied) {
      const need = (demand.get(t) ?? 0) - (share.get(t) ?? 0);
      share.set(t, demand.get(t) ?? 0);
      left -= need;
    }
    open = open.filter((t) => !satisfied.includes(t));
  }
  return share;
}

/** Jain's index of x = served / fair share over tenants with a share. NaN with fewer than two. */
export function jainIndex(xs: readonly number[]): number {
  if (xs.length < 2) return NaN;
  const sum = xs.reduce((a, b) => a + b, 0);
  const sq = xs.reduce((a, b) => a + b * b, 0);
  return sq > 0 ? (sum * sum) / (xs.length * sq) : NaN;
}

interface FairnessWindow {
  readonly demand: Map<string, number>;
  readonly served: Map<string, number>;
  contended: boolean;
}

function fairnessOf(windows: ReadonlyMap<number, FairnessWindow>, weights: (t: string) => number): { jain: number; windows: number } {
  let weighted = 0;
  let total = 0;
  let n = 0;
  for (const w of windows.values()) {
    if (!w.contended) continue;
    let capacity = 0;
    for (const v of w.served.values()) capacity += v;
    const shares = maxMinShares(w.demand, weights, capacity);
    const xs = [...shares.entries()].filter(([, a]) => a > 0).map(([t, a]) => (w.served.get(t) ?? 0) / a);
    const j = jainIndex(xs);
    if (!Number.isFinite(j)) continue;
    weighted += j * capacity;
    total += capacity;
    n++;
  }
  return { jain: total > 0 ? weighted / total : NaN, windows: n };
}

/** Window of simulated time for the fairness index. */
export const FAIRNESS_WINDOW_MS = 30_000;

export const TTFT_BUCKETS: ReadonlyArray<{ name: string; max: number }> = [
  { name: '<1.8k', max: 1800 },
  { name: '1.8k-8k', max: 8000 },
  { name: '8k-32k', max: 32_000 },
  { name: '>=32k', max: Infinity },
];

const ARRIVAL = 0;
const STEP_END = 1;
const DELIVER = 2;
const WAKE = 3;
const FAIL = 4;
const TRANSFER = 5;
const SCRAPE = 6;

interface WorkerState {
  readonly engine: MockEngine;
  readonly key: string;
  readonly role: 'both' | 'prefill' | 'decode';
  busy: boolean;
  pendingStep: StepResult | null;
  /** Event batches in flight to the router, in delivery order. */
  readonly inFlight: EngineEvent[][];
  prefillTokens: number;
  requests: number;
  windowPrefill: Map<number, number>;
}

function summarize(values: number[]): LatencySummary {
  const sorted = Float64Array.from(values).sort();
  let sum = 0;
  for (const v of values) sum += v;
  return {
    requests: values.length,
    p50: percentileSorted(sorted, 50),
    p90: percentileSorted(sorted, 90),
    p99: percentileSorted(sorted, 99),
    mean: values.length ? sum / values.length : NaN,
  };
}

/** Runs one policy over a trace. `requests` must be sorted by timestamp (loadTrace and the generators do that). */
export function runFleet(requests: readonly TraceRequest[], opts: FleetOptions): FleetResult {
  return new FleetRun(requests, opts).run();
}

type Group = { ttft: number[]; refused: number };

function groupOf(m: Map<string, Group>, k: string): Group {
  let g = m.get(k);
  if (!g) {
    g = { ttft: [], refused: 0 };
    m.set(k, g);
  }
  return g;
}

/** A prefill leg in flight: the request and where its decode leg goes. */
interface PrefillInFlight {
  readonly requestId: string;
  readonly i: number;
  readonly decodeWorker: number;
  readonly prefillWorker: number;
}

/** What a run counts as it goes (the result is computed from these at the end). */
class Tally {
  routed = 0;
  finished = 0;
  served = 0;
  refused = 0;
  retried = 0;
  engineRejected = 0;
  readonly refusals: Partial<Record<RefusalCode | 'engine_rejected', number>> = {};
  readonly queueWaits: number[] = [];
  eventsApplied = 0;
  eventsRejected = 0;
  lastFinish = 0;
  outputTokens = 0;
  promptTokensTotal = 0;
  engineRatioSum = 0;
  engineReports = 0;
  readonly ttft: number[] = [];
  readonly ttftBuckets: number[][] = TTFT_BUCKETS.map(() => []);
  /** Per tenant and per flow-control band: TTFTs of served requests and refusals. */
  readonly byTenant = new Map<string, Group>();
  readonly byBand = new Map<string, Group>();
  readonly fairWindows = new Map<number, FairnessWindow>();
  readonly itl: number[] = [];
  good = 0;
  readonly transferMs: number[] = [];
  deliveredPrompt = 0;
  deliveredCached = 0;
  /** First tokens' cached blocks and prompt blocks (the block-weighted delivered hit). */
  deliveredHitBlocks = 0;
  deliveredIslBlocks = 0;

  fairWindow(now: number): FairnessWindow {
    const k = Math.floor(now / FAIRNESS_WINDOW_MS);
    let w = this.fairWindows.get(k);
    if (!w) {
      w = { demand: new Map(), served: new Map(), contended: false };
      this.fairWindows.set(k, w);
    }
    return w;
  }

  engineRejection(): void {
    this.engineRejected++;
    this.refusals.engine_rejected = (this.refusals.engine_rejected ?? 0) + 1;
  }
}

/**
 * One simulation: the fleet (router, dispatcher, mock engines) and the event loop on the virtual clock. Each event
 * kind has its handler; the dispatcher's effects are carried out by `apply`.
 */
class FleetRun {
  private readonly wall0 = performance.now();
  private readonly cpu0 = process.cpuUsage();
  private readonly rateScale: number;
  private readonly delay: number;
  private readonly windowMs: number;
  private readonly pdMode: boolean;
  private readonly nPrefill: number;
  private readonly nDecode: number;
  private readonly transfer: { readonly bytesPerToken: number; readonly bytesPerS: number };
  private readonly slo: { readonly ttftMs: number; readonly itlMs: number };
  private readonly router: KvRouter;
  private readonly dispatcher: Dispatcher;
  private readonly failRate: number;
  private readonly failRng: () => number;
  private readonly failLatency: number;
  private readonly workers: WorkerState[] = [];
  private readonly workerOf = new Map<string, number>();
  private readonly hasher: TraceHasher;
  /** Set when the trace is a recording (requests carry `blockHashes`). */
  private readonly recorded: RecordedPrompts | null;
  private readonly heap = new EventHeap();
  private readonly n: number;
  private readonly arrival: Float64Array;
  private readonly records: (RequestRecord | undefined)[] = [];
  private readonly recordOf = new Map<string, RequestRecord>();
  private readonly closedLoop: number | undefined;
  private released = 0;
  private readonly queuedIds = new Set<string>();
  private wakeAt = Infinity;
  private arrived = 0;
  private readonly progressEvery: number;
  private readonly prefillLegs = new Map<string, PrefillInFlight>();
  /** KV transfers in flight, by a running number (the heap event's argument). */
  private readonly transfers = new Map<number, PrefillInFlight & { legId: string }>();
  private transferSeq = 0;
  /** The served leg's cached tokens (the prefill's for a disaggregated request). */
  private readonly servedCached = new Map<string, number>();
  private readonly c = new Tally();

  constructor(
    private readonly requests: readonly TraceRequest[],
    private readonly opts: FleetOptions,
  ) {
    this.rateScale = opts.rateScale ?? 1;
    this.delay = opts.eventDelayMs ?? 5;
    this.windowMs = opts.imbalanceWindowMs ?? 60_000;
    if (!(this.rateScale > 0)) throw new RangeError(`rate scale must be positive, got ${this.rateScale}`);
    this.pdMode = opts.prefillWorkers !== undefined || opts.decodeWorkers !== undefined;
    this.nPrefill = opts.prefillWorkers ?? 0;
    this.nDecode = opts.decodeWorkers ?? 0;
    const { nPrefill, nDecode } = this;
    if (this.pdMode && (!Number.isInteger(nPrefill) || nPrefill < 0 || !Number.isInteger(nDecode) || nDecode < 1)) {
      throw new RangeError(`P/D needs decode workers >= 1 and prefill workers >= 0, got ${nPrefill} and ${nDecode}`);
    }
    const nWorkers = this.pdMode ? nPrefill + nDecode : opts.workers;
    if (!Number.isInteger(nWorkers) || nWorkers < 1) throw new RangeError(`workers must be a positive integer, got ${nWorkers}`);
    this.transfer = opts.transfer ?? DEFAULT_TRANSFER;
    this.slo = opts.slo ?? { ttftMs: 2000, itlMs: 50 };
    this.router = new KvRouter({
      blockSize: opts.blockSize,
      policy: opts.customPolicy?.name ?? opts.policy,
      policies: opts.customPolicy ? [opts.customPolicy] : undefined,
      seed: opts.seed ?? 0,
      ...opts.router,
    });
    this.dispatcher = new Dispatcher(this.router, { ...SIM_DISPATCH_DEFAULTS, ...opts.dispatch });
    this.failRate = opts.engineFailures ?? 0;
    if (!(this.failRate >= 0 && this.failRate < 1)) {
      throw new RangeError(`engine failure fraction must be in [0, 1), got ${this.failRate}`);
    }
    this.failRng = createRng(((opts.seed ?? 0) ^ 0x5eed_fa11) >>> 0);
    this.failLatency = opts.failureLatencyMs ?? 2;
    this.addWorkers(nWorkers);
    const bs = opts.blockSize;
    this.hasher = opts.hasher && opts.hasher.blockSize === bs ? opts.hasher : new TraceHasher(bs);
    this.recorded = requests.some((r) => r.blockHashes !== undefined) ? new RecordedPrompts(bs) : null;
    this.n = requests.length;
    this.arrival = new Float64Array(this.n);
    this.closedLoop = opts.concurrency;
    if (this.closedLoop !== undefined && !(Number.isInteger(this.closedLoop) && this.closedLoop >= 1)) {
      throw new RangeError(`concurrency must be a positive integer, got ${this.closedLoop}`);
    }
    this.progressEvery = Math.max(1, Math.floor(this.n / 200));
  }

  private addWorkers(nWorkers: number): void {
    const { opts, pdMode, nPrefill } = this;
    let maxLen = 1;
    for (const r of this.requests) maxLen = Math.max(maxLen, r.inputLength + Math.max(1, r.outputLength));
    for (let w = 0; w < nWorkers; w++) {
      const role = !pdMode ? 'both' : w < nPrefill ? 'prefill' : 'decode';
      const engine = new MockEngine({
        blockSize: opts.blockSize,
        numGpuBlocks: opts.gpuBlocks,
        maxModelLen: maxLen + 1,
        seed: (opts.seed ?? 0) + w,
        ...opts.engine,
      });
      const key = !pdMode ? `w${w}` : role === 'prefill' ? `p${w}` : `d${w - nPrefill}`;
      this.dispatcher.addWorker({ id: key, mode: 'events', capacityBlocks: opts.gpuBlocks, role }, 0);
      this.workers.push({
        engine,
        key,
        role,
        busy: false,
        pendingStep: null,
        inFlight: [],
        prefillTokens: 0,
        requests: 0,
        windowPrefill: new Map(),
      });
    }
    for (const [i, w] of this.workers.entries()) this.workerOf.set(w.key, i);
  }

  run(): FleetResult {
    this.scheduleArrivals();
    // A policy that reads engine gauges sees them as scraped at its interval: stale between scrapes.
    const scrapeMs = (this.opts.customPolicy ?? createPolicy(this.opts.policy)).scrapeIntervalMs;
    if (scrapeMs !== undefined && scrapeMs > 0) this.scrape(0, scrapeMs);
    const ev = { time: 0, kind: 0, arg: 0 };
    while (this.heap.pop(ev)) {
      const now = ev.time;
      if (ev.kind === SCRAPE) this.scrape(now, scrapeMs!);
      else if (ev.kind === WAKE) {
        if (now < this.wakeAt) continue; // superseded by an earlier wake that already ran
        this.wakeAt = Infinity;
        this.apply(this.dispatcher.tick(now), now);
      } else if (ev.kind === FAIL) {
        this.apply(this.dispatcher.failed(`r${ev.arg}`, 'injected engine failure', now), now);
      } else if (ev.kind === ARRIVAL) this.onArrival(ev.arg, now);
      else if (ev.kind === TRANSFER) this.onTransfer(ev.arg, now);
      else if (ev.kind === STEP_END) this.onStepEnd(ev.arg, now);
      else this.onDeliver(ev.arg);
    }
    return this.result();
  }

  /** Every engine's gauges to the router as a metrics scrape would read them; the next scrape while work remains. */
  private scrape(now: number, intervalMs: number): void {
    for (const ws of this.workers) this.router.setEngineMetrics(ws.key, { waiting: ws.engine.numWaiting, kvUsage: ws.engine.kvUsage });
    if (this.heap.size > 0) this.heap.push(now + intervalMs, SCRAPE, 0);
  }

  private scheduleArrivals(): void {
    const { n, requests } = this;
    if (this.closedLoop !== undefined) {
      while (this.released < Math.min(this.closedLoop, n)) this.release(0);
    } else {
      const t0 = n > 0 ? requests[0].timestamp / this.rateScale : 0;
      for (let i = 0; i < n; i++) {
        this.arrival[i] = requests[i].timestamp / this.rateScale - t0;
        this.heap.push(this.arrival[i], ARRIVAL, i);
      }
    }
  }

  /** Closed loop: a request ended (served, refused or rejected), so the next one of the trace starts now. */
  private release(now: number): void {
    if (this.closedLoop === undefined || this.released >= this.n) return;
    this.arrival[this.released] = now;
    this.heap.push(now, ARRIVAL, this.released++);
  }

  private onArrival(i: number, now: number): void {
    const req = this.requests[i];
    const id = `r${i}`;
    // A recorded request is routed on the router hashes the live router computed (src/core/traffic-record.ts).
    const seqHashes = req.blockHashes ?? this.hasher.seqHashes(req);
    const demandWin = this.c.fairWindow(now);
    const tenantName = req.tenant ?? DEFAULT_TENANT;
    demandWin.demand.set(tenantName, (demandWin.demand.get(tenantName) ?? 0) + req.inputLength);
    const effects = this.dispatcher.submit(
      {
        requestId: id,
        model: 'sim',
        seqHashes,
        promptTokens: req.inputLength,
        ...(req.tenant !== undefined ? { tenant: req.tenant } : {}),
        ...(req.priority !== undefined ? { priority: req.priority } : {}),
        ...(req.sessionId !== undefined ? { sessionId: req.sessionId } : {}),
        ...(req.sloTtftMs !== undefined ? { sloTtftMs: req.sloTtftMs } : {}),
      },
      now,
    );
    if (effects.length === 0) this.queuedIds.add(id);
    this.apply(effects, now);
    this.arrived++;
    if (this.opts.onProgress && (this.arrived % this.progressEvery === 0 || this.arrived === this.n)) {
      this.opts.onProgress(this.arrived, this.n);
    }
  }

  private onTransfer(id: number, now: number): void {
    const t = this.transfers.get(id)!;
    this.transfers.delete(id);
    this.workers[t.prefillWorker].engine.releaseHeld(t.legId);
    this.addDecode(t.requestId, t.i, t.decodeWorker, now, this.requests[t.i].inputLength);
  }

  /** The prompt tokens an engine model gets for request `i`: expanded trace ids, or a recording's pseudo-tokens. */
  private promptOf(i: number): number[] {
    const req = this.requests[i];
    return this.recorded && req.blockHashes ? this.recorded.tokens(req, i) : expandTokensArray(req);
  }

  private onDeliver(w: number): void {
    const ws = this.workers[w];
    const batch = ws.inFlight.shift()!;
    const rec = this.recorded;
    // A recording's blocks reach the router under their recorded hashes (the ones its requests are routed on).
    const events = rec
      ? batch.map(
          (ev): KvEvent =>
            ev.kind === 'stored' ? { ...ev, tokens: null, seqHashes: BigUint64Array.from(ev.routerSeqHashes, (h) => rec.recorded(h)) } : ev,
        )
      : (batch as readonly KvEvent[]);
    const r = this.router.applyEvents(ws.key, events);
    this.c.eventsApplied += r.applied;
    this.c.eventsRejected += r.rejected;
  }

  private addDecode(requestId: string, i: number, w: number, now: number, preloaded?: number): boolean {
    const req = this.requests[i];
    try {
      this.workers[w].engine.addRequest(
        { requestId, promptTokens: this.promptOf(i), maxTokens: Math.max(1, req.outputLength), preloadedTokens: preloaded },
        now,
      );
    } catch (err) {
      if (!(err instanceof EngineInputError)) throw err;
      this.c.engineRejection();
      this.apply(this.dispatcher.finish(requestId, { outcome: 'error' }, now), now);
      this.release(now);
      return false;
    }
    if (!this.workers[w].busy) this.startStep(w, now);
    return true;
  }

  private startStep(w: number, now: number): void {
    const ws = this.workers[w];
    const res = ws.engine.step(now);
    if (res.events.length > 0) {
      ws.inFlight.push(res.events);
      this.heap.push(now + res.durationMs + this.delay, DELIVER, w);
    }
    if (res.durationMs === 0 && res.outputs.length === 0) {
      // Nothing could be scheduled (nothing waiting, or nothing fits): idle until the next arrival.
      ws.busy = false;
      return;
    }
    ws.busy = true;
    ws.pendingStep = res;
    this.heap.push(now + res.durationMs, STEP_END, w);
  }

  /** Carries out the dispatcher's effects, in order, then makes sure it is woken when it asks. */
  private apply(effects: DispatchEffect[], now: number): void {
    for (let k = 0; k < effects.length; k++) {
      const e = effects[k];
      if (e.kind === 'finished') continue;
      if (e.kind === 'reject') this.onReject(e, now);
      else this.onAttempt(e, now);
    }
    const at = this.dispatcher.nextWakeAt(now);
    if (at !== undefined && at < this.wakeAt) {
      this.wakeAt = at;
      this.heap.push(Math.max(now, at), WAKE, 0);
    }
  }

  private onReject(e: DispatchRefusal, now: number): void {
    const c = this.c;
    c.refused++;
    groupOf(c.byTenant, e.tenant).refused++;
    groupOf(c.byBand, e.band).refused++;
    c.refusals[e.code] = (c.refusals[e.code] ?? 0) + 1;
    if (this.queuedIds.delete(e.requestId)) c.queueWaits.push(e.queuedMs);
    this.release(now);
  }

  private onAttempt(e: DispatchAttempt, now: number): void {
    const c = this.c;
    const i = indexOf(e.requestId);
    if (e.attempt > 0) c.retried++;
    else {
      const win = c.fairWindow(now);
      win.served.set(e.tenant, (win.served.get(e.tenant) ?? 0) + e.decision.promptTokens);
      if (e.queuedMs > 0) win.contended = true;
    }
    if (this.queuedIds.delete(e.requestId)) c.queueWaits.push(e.queuedMs);
    const w = this.workerOf.get(e.decision.sourceKey)!;
    if (e.attempt === 0) this.opts.mrc?.observe(e.model, e.decision.sourceKey, e.decision.seqHashes, e.decision.islBlocks);
    if (this.failRate > 0 && this.failRng() < this.failRate) {
      this.heap.push(now + this.failLatency, FAIL, i);
      return;
    }
    if (e.prefill) {
      if (!this.startPrefillLeg(e, e.prefill, i, w, now)) return;
    } else if (!this.addDecode(e.requestId, i, w, now)) return;
    c.routed++;
    this.workers[w].requests++;
    const rec: RequestRecord = {
      index: i,
      worker: w,
      arrivalMs: this.arrival[i],
      promptTokens: this.requests[i].inputLength,
      islBlocks: e.decision.islBlocks,
      overlapBlocks: e.decision.overlapBlocks,
      bestOverlapBlocks: e.decision.bestOverlapBlocks,
      firstTokenMs: NaN,
      finishMs: NaN,
      cachedTokens: -1,
    };
    this.recordOf.set(e.requestId, rec);
    if (this.opts.keepRequests) this.records[i] = rec;
  }

  /** The prefill leg first: one token on the prefill worker, its blocks held for the decode side. */
  private startPrefillLeg(e: DispatchAttempt, leg: PrefillLeg, i: number, w: number, now: number): boolean {
    const pw = this.workerOf.get(leg.decision.sourceKey)!;
    try {
      this.workers[pw].engine.addRequest({ requestId: leg.legId, promptTokens: this.promptOf(i), maxTokens: 1, holdOnFinish: true }, now);
    } catch (err) {
      if (!(err instanceof EngineInputError)) throw err;
      this.c.engineRejection();
      this.apply(this.dispatcher.finish(e.requestId, { outcome: 'error' }, now), now);
      this.release(now);
      return false;
    }
    this.prefillLegs.set(leg.legId, { requestId: e.requestId, i, decodeWorker: w, prefillWorker: pw });
    this.workers[pw].requests++;
    if (!this.workers[pw].busy) this.startStep(pw, now);
    return true;
  }

  private onStepEnd(w: number, now: number): void {
    const ws = this.workers[w];
    const res = ws.pendingStep!;
    ws.pendingStep = null;
    for (const out of res.outputs) {
      if (ws.role === 'prefill') {
        this.onPrefillOutput(ws, out, now);
        continue;
      }
      this.c.outputTokens += out.newTokens.length;
      // Most outputs are plain decode tokens: look the request up only when its lifecycle changes.
      if (!out.firstToken && !out.finished) continue;
      const rec = this.recordOf.get(out.requestId);
      if (!rec) continue;
      if (out.firstToken) this.onFirstToken(ws, rec, out, now);
      if (out.finished) this.onFinished(rec, out, now);
    }
    ws.busy = false;
    if (ws.engine.hasWork()) this.startStep(w, now);
  }

  private countPrefill(ws: WorkerState, computed: number, now: number): void {
    ws.prefillTokens += computed;
    const win = Math.floor(now / this.windowMs);
    ws.windowPrefill.set(win, (ws.windowPrefill.get(win) ?? 0) + computed);
  }

  /** A prefill leg's output: its one token is the handoff, not the client's; when done, the KV transfer starts. */
  private onPrefillOutput(ws: WorkerState, out: RequestOutput, now: number): void {
    if (out.firstToken) this.countPrefill(ws, out.promptTokens - out.cachedTokens, now);
    if (!out.finished) return;
    const leg = this.prefillLegs.get(out.requestId);
    if (!leg) return;
    this.prefillLegs.delete(out.requestId);
    this.servedCached.set(leg.requestId, out.cachedTokens);
    this.apply(this.dispatcher.prefillDone(leg.requestId, { cachedTokens: out.cachedTokens }, now), now);
    const dws = this.workers[leg.decodeWorker];
    const lacking = Math.max(0, out.promptTokens - dws.engine.prefixHitTokens(this.promptOf(leg.i)));
    const ms = ((lacking * this.transfer.bytesPerToken) / this.transfer.bytesPerS) * 1000;
    this.c.transferMs.push(ms);
    const id = this.transferSeq++;
    this.transfers.set(id, { ...leg, legId: out.requestId });
    this.heap.push(now + ms, TRANSFER, id);
  }

  private onFirstToken(ws: WorkerState, rec: RequestRecord, out: RequestOutput, now: number): void {
    const c = this.c;
    this.apply(this.dispatcher.firstToken(out.requestId, now), now);
    rec.firstTokenMs = now;
    rec.cachedTokens = this.servedCached.get(out.requestId) ?? out.cachedTokens;
    c.deliveredHitBlocks += Math.floor(rec.cachedTokens / this.opts.blockSize);
    c.deliveredIslBlocks += rec.islBlocks;
    const t = now - rec.arrivalMs;
    c.ttft.push(t);
    let b = 0;
    while (rec.promptTokens >= TTFT_BUCKETS[b].max) b++;
    c.ttftBuckets[b].push(t);
    const tr = this.requests[rec.index];
    groupOf(c.byTenant, tr.tenant ?? DEFAULT_TENANT).ttft.push(t);
    groupOf(c.byBand, this.dispatcher.bandOf(tr.priority ?? 0)).ttft.push(t);
    this.countPrefill(ws, out.promptTokens - out.cachedTokens, now);
  }

  private onFinished(rec: RequestRecord, out: RequestOutput, now: number): void {
    const c = this.c;
    this.apply(this.dispatcher.finish(out.requestId, { outcome: 'ok', cachedTokens: out.cachedTokens }, now), now);
    rec.finishMs = now;
    const ttftMs = rec.firstTokenMs - rec.arrivalMs;
    const perToken = out.completionTokens > 1 ? (now - rec.firstTokenMs) / (out.completionTokens - 1) : NaN;
    if (Number.isFinite(perToken)) c.itl.push(perToken);
    if (ttftMs <= this.slo.ttftMs && !(perToken > this.slo.itlMs)) c.good++;
    c.deliveredPrompt += out.promptTokens;
    c.deliveredCached += rec.cachedTokens;
    this.servedCached.delete(out.requestId);
    c.served++;
    this.recordOf.delete(out.requestId);
    c.finished++;
    c.lastFinish = now;
    this.release(now);
    c.promptTokensTotal += out.promptTokens;
    c.engineRatioSum += rec.cachedTokens / out.promptTokens;
    c.engineReports++;
  }

  private result(): FleetResult {
    const { opts, c, workers } = this;
    const view = this.router.ledger.view();
    let queries = 0;
    let hits = 0;
    let preemptions = 0;
    let evicted = 0;
    let steps = 0;
    const host = { hit_tokens: 0, stored: 0, loaded: 0, evicted: 0 };
    for (const ws of workers) {
      host.hit_tokens += ws.engine.counters.hostHitTokens;
      host.stored += ws.engine.counters.hostStored;
      host.loaded += ws.engine.counters.hostLoaded;
      host.evicted += ws.engine.counters.hostEvicted;
      queries += ws.engine.counters.prefixCacheQueries;
      hits += ws.engine.counters.prefixCacheHits;
      preemptions += ws.engine.counters.preemptions;
      evicted += ws.engine.counters.blocksEvicted;
      steps += ws.engine.counters.steps;
    }
    const span = Math.max(1e-9, c.lastFinish) / 1000;
    const engineHit = this.pdMode
      ? c.deliveredPrompt > 0
        ? c.deliveredCached / c.deliveredPrompt
        : NaN
      : queries > 0
        ? hits / queries
        : NaN;
    return {
      name: opts.policy,
      queue_order: opts.dispatch?.flow?.order ?? 'fair',
      rate_scale: this.rateScale,
      hit: {
        predicted_request_weighted: view.predicted.requestWeighted,
        predicted_block_weighted: view.predicted.blockWeighted,
        available_request_weighted: view.available.requestWeighted,
        available_block_weighted: view.available.blockWeighted,
        // In a P/D fleet the decode engines' counters include prompts whose KV they received: the served legs' reports
        // (the prefill's for a disaggregated request) are the truth there.
        engine_token_weighted: engineHit,
        engine_request_weighted: c.engineReports > 0 ? c.engineRatioSum / c.engineReports : NaN,
        predicted_token_weighted: view.delivered.predictedTokenWeighted,
        delivered_block_weighted: c.deliveredIslBlocks > 0 ? c.deliveredHitBlocks / c.deliveredIslBlocks : NaN,
      },
      ...((opts.engine?.hostBlocks ?? 0) > 0 ? { host_tier: { blocks_per_engine: opts.engine!.hostBlocks!, ...host } } : {}),
      ttft_ms: summarize(c.ttft),
      ttft_by_bucket: TTFT_BUCKETS.map((b, k) => ({ bucket: b.name, ...summarize(c.ttftBuckets[k]) })),
      by_tenant: groups(c.byTenant),
      by_band: groups(c.byBand),
      fairness: fairnessOf(c.fairWindows, (t) => opts.dispatch?.flow?.weights?.[t] ?? 1),
      throughput_tokens_per_s: (c.promptTokensTotal + c.outputTokens) / span,
      output_tokens_per_s: c.outputTokens / span,
      imbalance: imbalanceOf(workers.map((w) => w.prefillTokens)),
      imbalance_windowed: windowedImbalance(workers.map((w) => w.windowPrefill)),
      preemptions,
      per_worker: workers.map((w) => ({ worker: w.key, requests: w.requests, prefill_tokens: w.prefillTokens })),
      blocks_evicted: evicted,
      requests: {
        served: c.served,
        queued: c.queueWaits.length,
        refused: c.refused,
        retried: c.retried,
        routed: c.routed,
        finished: c.finished,
        rejected: c.refused + c.engineRejected,
      },
      refusals: c.refusals,
      queue_wait_ms: queueSummary(c.queueWaits),
      events: { applied: c.eventsApplied, rejected: c.eventsRejected },
      sim: { simulated_s: span, wall_s: (performance.now() - this.wall0) / 1000, cpu_s: cpuSeconds(this.cpu0), engine_steps: steps },
      perRequest: opts.keepRequests ? (this.records.filter(Boolean) as RequestRecord[]) : undefined,
      itl_ms: summarize(c.itl),
      goodput: { ttft_ms: this.slo.ttftMs, itl_ms: this.slo.itlMs, fraction: c.served > 0 ? c.good / c.served : NaN, per_s: c.good / span },
      ...(this.pdMode ? { pd: this.pdResult(c) } : {}),
    };
  }

  private pdResult(c: Tally): NonNullable<FleetResult['pd']> {
    const stats = this.dispatcher.pdStats;
    return {
      prefill_workers: this.nPrefill,
      decode_workers: this.nDecode,
      min_uncached_tokens: this.opts.dispatch?.pd?.minUncachedTokens ?? 0,
      paths: { ...stats.paths },
      decode_only: { ...stats.decodeOnly },
      transferred_tokens: stats.transferredTokens,
      transfer_ms: summarize(c.transferMs),
    };
  }
}

const indexOf = (id: string) => Number(id.slice(1));

function queueSummary(waits: number[]): { p50: number; p99: number; max: number } {
  if (waits.length === 0) return { p50: NaN, p99: NaN, max: NaN };
  const sorted = Float64Array.from(waits).sort();
  return { p50: percentileSorted(sorted, 50), p99: percentileSorted(sorted, 99), max: sorted[sorted.length - 1] };
}

function cpuSeconds(since: NodeJS.CpuUsage): number {
  const d = process.cpuUsage(since);
  return (d.user + d.system) / 1e6;
}

/** max/mean of per-worker loads; 1 when there is no load. */
export function imbalanceOf(loads: readonly number[]): number {
  let max = 0;
  let sum = 0;
  for (const l of loads) {
    max = Math.max(max, l);
    sum += l;
  }
  return sum > 0 ? max / (sum / loads.length) : 1;
}

function windowedImbalance(perWorker: readonly Map<number, number>[]): number {
  const windows = new Set<number>();
  for (const m of perWorker) for (const k of m.keys()) windows.add(k);
  let weighted = 0;
  let total = 0;
  for (const win of windows) {
    const loads = perWorker.map((m) => m.get(win) ?? 0);
    const sum = loads.reduce((a, b) => a + b, 0);
    if (sum <= 0) continue;
    weighted += imbalanceOf(loads) * sum;
    total += sum;
  }
  return total > 0 ? weighted / total : 1;
}
