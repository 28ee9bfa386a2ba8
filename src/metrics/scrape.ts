/**
 * Prometheus text parsing and the engine mirror.
 *
 * The mirror scrapes each worker's /metrics on an interval and re-exports the engine's own prefix-cache counters
 * (the names each engine's adapter declares, src/engines/NAME/index.ts: vLLM's `vllm:prefix_cache_queries_total` /
 * `vllm:prefix_cache_hits_total`, in tokens) under the router's names, labelled by worker, so one scrape of the router
 * shows belief (router_kv_*) and truth (router_engine_*) side by side. An engine with only a hit-rate gauge (SGLang's
 * `sglang:cache_hit_rate`) has it re-exported as a gauge, never summed into the counters.
 */
import { Counter, Gauge, type Registry } from 'prom-client';
import { type EngineName, sourceKey } from '../core/types.ts';
import { engineAdapters } from '../engines/index.ts';

export interface Sample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

export interface ParseResult {
  readonly samples: Sample[];
  /** Lines that were neither comments, blank, nor valid samples (counted, never thrown). */
  readonly badLines: number;
}

const NAME_RE = /^[a-zA-Z_:][a-zA-Z0-9_:]*/;

function parseValue(text: string): number {
  // Case-insensitive, as Prometheus' own parser (Go's ParseFloat): prom-client writes NaN as "Nan".
  switch (
    /^[-+]?(inf|nan)$/i.test(text)
      ? text
          .replace(/^(\+?)inf$/i, 'Inf')
          .replace(/^-inf$/i, '-Inf')
          .replace(/^[-+]?nan$/i, 'NaN')
      : text
  ) {
    case '+Inf':
    case 'Inf':
      return Infinity;
    case '-Inf':
      return -Infinity;
    case 'NaN':
      return NaN;
    default: {
      // Number('') is 0 and Number('0x10') is 16: neither is a Prometheus value.
      if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text)) return Number.NaN;
      return Number(text);
    }
  }
}

/** Parses one `name{labels} value [timestamp]` line; undefined when malformed. */
function parseSampleLine(line: string): Sample | undefined {
  const m = NAME_RE.exec(line);
  if (!m) return undefined;
  const name = m[0];
  let i = name.length;
  const labels: Record<string, string> = {};
  if (line[i] === '{') {
    i++;
    for (;;) {
      while (line[i] === ' ' || line[i] === ',') i++;
      if (line[i] === '}') {
        i++;
        break;
      }
      const lm = /^[a-zA-Z_][a-zA-Z0-9_]*/.exec(line.slice(i));
      if (!lm) return undefined;
      i += lm[0].length;
      while (line[i] === ' ') i++;
      if (line[i] !== '=') return undefined;
      i++;
      while (line[i] === ' ') i++;
      if (line[i] !== '"') return undefined;
      i++;
      let value = '';
      for (;;) {
        const c = line[i];
        if (c === undefined) return undefined;
        i++;
        if (c === '"') break;
        if (c === '\\') {
          const e = line[i++];
          value += e === 'n' ? '\n' : e === undefined ? '' : e;
        } else value += c;
      }
      labels[lm[0]] = value;
    }
  }
  const rest = line.slice(i).trim().split(/\s+/);
  if (rest.length === 0 || rest[0] === '') return undefined;
  const value = parseValue(rest[0]);
  if (Number.isNaN(value) && !/^[-+]?nan$/i.test(rest[0])) return undefined;
  return { name, labels, value };
}

/** Parses Prometheus text exposition (0.0.4, and OpenMetrics' `# EOF`). Malformed lines are counted, not thrown. */
export function parsePrometheusText(text: string): ParseResult {
  const samples: Sample[] = [];
  let badLines = 0;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const s = parseSampleLine(line);
    if (s) samples.push(s);
    else badLines++;
  }
  return { samples, badLines };
}

/** Sum of every sample of a metric whose labels include `match`. Undefined when the metric is absent. */
export function sumOf(samples: readonly Sample[], name: string, match: Record<string, string> = {}): number | undefined {
  let total: number | undefined;
  outer: for (const s of samples) {
    if (s.name !== name) continue;
    for (const [k, v] of Object.entries(match)) if (s.labels[k] !== v) continue outer;
    total = (total ?? 0) + s.value;
  }
  return total;
}

// ------------------------------------------------------------------------------------------------ engine mirror

export interface EngineTarget {
  /** Worker id as the router knows it (sourceKey of dp rank 0). */
  readonly workerId: string;
  /** Base URL of the engine (http://host:port) or its full /metrics URL. */
  readonly url: string;
}

/** What the mirror knows about one source (a worker, or one DP rank of it) after the latest scrape. */
export interface MirroredSource {
  /** Monotonic totals since the mirror started watching (engine restarts are stitched, not subtracted). */
  queries: number;
  hits: number;
  /** SGLang's cache_hit_rate gauge, when the engine exposes it. */
  hitRateGauge?: number;
  /** Engine counter resets seen (restarts). */
  resets: number;
}

export interface MirrorTargetState {
  up: boolean;
  lastError?: string;
  lastScrapeAt?: number;
  scrapes: number;
  failures: number;
  /** Whose prefix-cache metrics the last good scrape exposed (an engine of the registry), or 'none'. */
  flavour: EngineName | 'none';
}

export interface EngineMirrorOptions {
  /** Where to register the re-exported metrics; none = keep state only (the CLI uses it that way). */
  readonly registry?: Registry;
  readonly prefix?: string;
  /** The targets to scrape, re-read before every round so workers can come and go. */
  readonly targets: () => readonly EngineTarget[];
  readonly intervalMs?: number;
  readonly timeoutMs?: number;
  /**
   * vLLM labels each DP rank's series with `engine="<rank>"`; with this on (default) rank r > 0 is mirrored as source
   * `worker#r`, matching the router's per-source labels. Off: all ranks are summed under the worker id.
   */
  readonly splitDpRanks?: boolean;
  /** Injected for tests; defaults to global fetch (undici). */
  readonly fetch?: typeof fetch;
  /** Wall clock in ms, for lastScrapeAt. */
  readonly now?: () => number;
  /** Called with the engine's KV capacity (vLLM's cache_config_info num_gpu_blocks, per rank) on every scrape. */
  readonly onCapacity?: (workerId: string, numGpuBlocks: number) => void;
}

/** What a metric name is to the mirror: whose, and which reading. */
const ENGINE_METRICS = new Map<string, { readonly engine: EngineName; readonly reading: 'queries' | 'hits' | 'hitRate' }>();
const CACHE_CONFIG = new Set<string>();
for (const a of engineAdapters()) {
  const m = a.metrics;
  if (m.prefixQueries) ENGINE_METRICS.set(m.prefixQueries, { engine: a.name, reading: 'queries' });
  if (m.prefixHits) ENGINE_METRICS.set(m.prefixHits, { engine: a.name, reading: 'hits' });
  if (m.hitRate) ENGINE_METRICS.set(m.hitRate, { engine: a.name, reading: 'hitRate' });
  if (m.cacheConfig) CACHE_CONFIG.add(m.cacheConfig);
}

/** KV capacity in blocks from an engine's cache-config gauge (vLLM's cache_config_info num_gpu_blocks label), if present. */
export function numGpuBlocks(samples: readonly Sample[]): number | undefined {
  for (const s of samples) {
    if (!CACHE_CONFIG.has(s.name)) continue;
    const n = Number(s.labels.num_gpu_blocks);
    if (Number.isInteger(n) && n > 0) return n;
  }
  return undefined;
}

export function metricsUrl(url: string): string {
  const u = url.replace(/\/+$/, '');
  return /\/metrics$/.test(u) ? u : `${u}/metrics`;
}

/** One source's prefix-cache readings from a scrape, and whose metrics they are. */
export interface EngineReading {
  engine: EngineName;
  queries?: number;
  hits?: number;
  hitRateGauge?: number;
}

/** Per-source engine prefix-cache readings from one engine scrape (raw counter values, not yet stitched). */
export function engineReadings(samples: readonly Sample[], workerId: string, splitDpRanks = true): Map<string, EngineReading> {
  const out = new Map<string, EngineReading>();
  const keyOf = (labels: Readonly<Record<string, string>>): string => {
    // vLLM's `engine` label is the DP rank; SGLang's `dp_rank` likewise when present.
    const rank = labels.engine ?? labels.dp_rank;
    if (!splitDpRanks || rank === undefined || !/^\d+$/.test(rank)) return workerId;
    return sourceKey({ workerId, dpRank: Number(rank) });
  };
  for (const s of samples) {
    const m = ENGINE_METRICS.get(s.name);
    if (!m || !Number.isFinite(s.value)) continue;
    const key = keyOf(s.labels);
    let r = out.get(key);
    if (!r) {
      r = { engine: m.engine };
      out.set(key, r);
    }
    if (m.reading === 'queries') r.queries = (r.queries ?? 0) + s.value;
    else if (m.reading === 'hits') r.hits = (r.hits ?? 0) + s.value;
    else r.hitRateGauge = s.value; // one gauge per rank; a model_name split would be unusual and is last-wins
  }
  return out;
}

/**
 * Scrapes engines and keeps stitched, monotonic prefix-cache totals per source. A counter that goes down means the
 * engine restarted: the new raw value is counted from zero instead of producing a negative delta.
 */
export class EngineMirror {
  readonly sources = new Map<string, MirroredSource>();
  readonly targets = new Map<string, MirrorTargetState>();
  private readonly lastRaw = new Map<string, { queries?: number; hits?: number }>();
  private readonly opts: EngineMirrorOptions;
  private readonly fetchFn: typeof fetch;
  private timer?: NodeJS.Timeout;
  private inFlight?: Promise<void>;
  private readonly queriesCounter?: Counter<'worker'>;
  private readonly hitsCounter?: Counter<'worker'>;
  private readonly hitRateGauge?: Gauge<'worker'>;
  private readonly upGauge?: Gauge<'worker'>;
  private readonly failuresCounter?: Counter<'worker'>;
  private readonly resetsCounter?: Counter<'worker'>;

  constructor(opts: EngineMirrorOptions) {
    this.opts = opts;
    this.fetchFn = opts.fetch ?? fetch;
    const p = opts.prefix ?? '';
    const registers = opts.registry ? [opts.registry] : [];
    if (opts.registry) {
      this.queriesCounter = new Counter({
        name: `${p}router_engine_prefix_cache_queries_total`,
        help:
          "Engine truth, mirrored: prompt tokens the engine looked up in its prefix cache (vLLM's " +
          'prefix_cache_queries_total, stitched across engine restarts). rate(hits)/rate(queries) is a ratio of sums, ' +
          'comparable with rate(router_kv_overlap_blocks_total)/rate(router_kv_isl_blocks_total).',
        labelNames: ['worker'],
        registers,
      });
      this.hitsCounter = new Counter({
        name: `${p}router_engine_prefix_cache_hits_total`,
        help: "Engine truth, mirrored: prompt tokens served from the engine's prefix cache (vLLM's prefix_cache_hits_total).",
        labelNames: ['worker'],
        registers,
      });
      this.hitRateGauge = new Gauge({
        name: `${p}router_engine_cache_hit_rate`,
        help: "Engine truth, mirrored: SGLang's cache_hit_rate gauge (a fraction over the engine's own window; not a counter).",
        labelNames: ['worker'],
        registers,
      });
      this.upGauge = new Gauge({
        name: `${p}router_engine_scrape_up`,
        help: '1 when the latest scrape of the worker /metrics succeeded, else 0.',
        labelNames: ['worker'],
        registers,
      });
      this.failuresCounter = new Counter({
        name: `${p}router_engine_scrape_failures_total`,
        help: 'Failed scrapes of a worker /metrics (connection error, timeout, non-200).',
        labelNames: ['worker'],
        registers,
      });
      this.resetsCounter = new Counter({
        name: `${p}router_engine_counter_resets_total`,
        help: 'Engine prefix-cache counters that went backwards (engine restarts), stitched by the mirror.',
        labelNames: ['worker'],
        registers,
      });
    }
  }

  start(): this {
    if (this.timer) return this;
    const interval = this.opts.intervalMs ?? 5_000;
    void this.scrapeOnce();
    this.timer = setInterval(() => void this.scrapeOnce(), interval);
    this.timer.unref();
    return this;
  }

  /** Stops the interval; resolves once a round still in flight has landed. */
  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    await this.inFlight;
  }

  /** One round over all targets; concurrent calls share the round in flight. Never throws. */
  scrapeOnce(): Promise<void> {
    if (!this.inFlight) {
      this.inFlight = Promise.all(this.opts.targets().map((t) => this.scrapeTarget(t))).then(
        () => {
          this.inFlight = undefined;
        },
        () => {
          this.inFlight = undefined;
        },
      );
    }
    return this.inFlight;
  }

  private targetState(workerId: string): MirrorTargetState {
    let st = this.targets.get(workerId);
    if (!st) {
      st = { up: false, scrapes: 0, failures: 0, flavour: 'none' };
      this.targets.set(workerId, st);
    }
    return st;
  }

  private async scrapeTarget(t: EngineTarget): Promise<void> {
    const st = this.targetState(t.workerId);
    st.scrapes++;
    let text: string;
    try {
      const res = await this.fetchFn(metricsUrl(t.url), { signal: AbortSignal.timeout(this.opts.timeoutMs ?? 3_000) });
      if (!res.ok) {
        await res.body?.cancel();
        throw new Error(`HTTP ${res.status}`);
      }
      text = await res.text();
    } catch (err) {
      st.up = false;
      st.failures++;
      st.lastError = (err as Error).message;
      this.upGauge?.set({ worker: t.workerId }, 0);
      this.failuresCounter?.inc({ worker: t.workerId });
      return;
    }
    st.up = true;
    st.lastError = undefined;
    st.lastScrapeAt = this.opts.now?.() ?? Date.now();
    this.upGauge?.set({ worker: t.workerId }, 1);
    const samples = parsePrometheusText(text).samples;
    this.ingest(t.workerId, samples);
    const capacity = this.opts.onCapacity ? numGpuBlocks(samples) : undefined;
    if (capacity !== undefined) this.opts.onCapacity!(t.workerId, capacity);
  }

  /** Folds one scrape of a worker into the stitched totals (public for tests and offline use). */
  ingest(workerId: string, samples: readonly Sample[]): void {
    const readings = engineReadings(samples, workerId, this.opts.splitDpRanks ?? true);
    const st = this.targetState(workerId);
    st.flavour = 'none';
    for (const [key, r] of readings) {
      let src = this.sources.get(key);
      if (!src) {
        src = { queries: 0, hits: 0, resets: 0 };
        this.sources.set(key, src);
      }
      const last = this.lastRaw.get(key) ?? {};
      if (r.queries !== undefined || r.hits !== undefined) st.flavour = r.engine;
      else if (r.hitRateGauge !== undefined && st.flavour === 'none') st.flavour = r.engine;
      let reset = false;
      const step = (raw: number | undefined, prev: number | undefined): number => {
        if (raw === undefined) return 0;
        if (prev === undefined) return 0; // first sight: a baseline, not traffic we saw happen
        if (raw < prev) {
          reset = true;
          return raw; // restarted from zero since the last scrape
        }
        return raw - prev;
      };
      const dq = step(r.queries, last.queries);
      const dh = step(r.hits, last.hits);
      // The first scrape is a baseline: counters accumulated before the router watched are not re-exported as a jump,
      // so rate() over the mirrored series never shows a spike for history that predates the router.
      src.queries += dq;
      src.hits += dh;
      if (reset) {
        src.resets++;
        this.resetsCounter?.inc({ worker: key });
      }
      this.lastRaw.set(key, { queries: r.queries ?? last.queries, hits: r.hits ?? last.hits });
      if (r.queries !== undefined) this.queriesCounter?.inc({ worker: key }, dq);
      if (r.hits !== undefined) this.hitsCounter?.inc({ worker: key }, dh);
      if (r.hitRateGauge !== undefined) {
        src.hitRateGauge = r.hitRateGauge;
        this.hitRateGauge?.set({ worker: key }, r.hitRateGauge);
      }
    }
  }

  /** Totals over all sources, for the dashboard. */
  /** Sums over the sources; `skip` leaves some out (decode workers of a P/D fleet count received KV as queries). */
  totals(skip?: (sourceKey: string) => boolean): { queries: number; hits: number } {
    let queries = 0;
    let hits = 0;
    for (const [key, s] of this.sources) {
      if (skip?.(key)) continue;
      queries += s.queries;
      hits += s.hits;
    }
    return { queries, hits };
  }
}
