/**
 * The hit-rate report behind `kvroute hitrate`: two scrapes of the router's /metrics (live or saved), differenced, and
 * turned into the three quantities docs/protocols.md §6 separates (available, predicted, delivered), each aggregated
 * the two ways (request-weighted = mean of ratios, block-weighted = ratio of sums), next to the engine's own counters.
 *
 * Pure functions over parsed samples, so the same code reads a live router and two files saved with curl.
 */
import { engineReadings, parsePrometheusText, type Sample } from './scrape.ts';
import type { ReuseView } from '../core/ledger.ts';

/** Cumulative counters of one scope (overall or one worker) read from one scrape. */
export interface HitCounters {
  requests: number;
  hitRateSum: number;
  availableSum: number;
  availableCount: number;
  overlapBlocks: number;
  islBlocks: number;
  bestOverlapBlocks: number;
  engineCachedTokens: number;
  enginePromptTokens: number;
  predictedCachedTokens: number;
  deliveredRequests: number;
  deliveredRatioSum: number;
  /** Engine truth (mirror or a direct engine scrape), tokens; undefined when no engine metric was seen. */
  engineQueries?: number;
  engineHits?: number;
  /** SGLang's gauge: a level, not differenced. */
  engineHitRateGauge?: number;
}

export interface Snapshot {
  readonly prefix: string;
  readonly overall: HitCounters;
  readonly workers: Map<string, HitCounters>;
}

const COUNTER_FIELDS = [
  'requests',
  'hitRateSum',
  'availableSum',
  'availableCount',
  'overlapBlocks',
  'islBlocks',
  'bestOverlapBlocks',
  'engineCachedTokens',
  'enginePromptTokens',
  'predictedCachedTokens',
  'deliveredRequests',
  'deliveredRatioSum',
] as const satisfies readonly (keyof HitCounters)[];

const emptyCounters = (): HitCounters => ({
  requests: 0,
  hitRateSum: 0,
  availableSum: 0,
  availableCount: 0,
  overlapBlocks: 0,
  islBlocks: 0,
  bestOverlapBlocks: 0,
  engineCachedTokens: 0,
  enginePromptTokens: 0,
  predictedCachedTokens: 0,
  deliveredRequests: 0,
  deliveredRatioSum: 0,
});

export const UNLABELLED = '(no worker label)';

/** Finds the metrics prefix (e.g. `dynamo_component_`) from the names in a scrape; undefined when none are kvroute's. */
export function detectPrefix(samples: readonly Sample[]): string | undefined {
  for (const s of samples) {
    const m = /^(.*)router_kv_(?:isl_blocks_total|hit_rate_count)$/.exec(s.name);
    if (m) return m[1];
  }
  return undefined;
}

export class ScrapeError extends Error {
  readonly code = 'ERR_NOT_A_ROUTER_SCRAPE';
}

/** Reads a router scrape into per-worker cumulative counters. Throws ScrapeError when it holds no router_kv_ metrics. */
export function snapshotOf(samples: readonly Sample[], prefix?: string): Snapshot {
  const p = prefix ?? detectPrefix(samples);
  if (p === undefined) {
    throw new ScrapeError('no router_kv_* metrics in the scrape: is this the /metrics of a kvroute router?');
  }
  const fields: Record<string, keyof HitCounters> = {
    [`${p}router_kv_hit_rate_count`]: 'requests',
    [`${p}router_kv_hit_rate_sum`]: 'hitRateSum',
    [`${p}router_kv_available_hit_rate_sum`]: 'availableSum',
    [`${p}router_kv_available_hit_rate_count`]: 'availableCount',
    [`${p}router_kv_overlap_blocks_total`]: 'overlapBlocks',
    [`${p}router_kv_isl_blocks_total`]: 'islBlocks',
    [`${p}router_kv_best_overlap_blocks_total`]: 'bestOverlapBlocks',
    [`${p}router_kv_engine_cached_tokens_total`]: 'engineCachedTokens',
    [`${p}router_kv_engine_prompt_tokens_total`]: 'enginePromptTokens',
    [`${p}router_kv_predicted_cached_tokens_total`]: 'predictedCachedTokens',
    [`${p}router_kv_delivered_hit_rate_count`]: 'deliveredRequests',
    [`${p}router_kv_delivered_hit_rate_sum`]: 'deliveredRatioSum',
    [`${p}router_engine_prefix_cache_queries_total`]: 'engineQueries',
    [`${p}router_engine_prefix_cache_hits_total`]: 'engineHits',
  };
  const gaugeName = `${p}router_engine_cache_hit_rate`;
  const overall = emptyCounters();
  const workers = new Map<string, HitCounters>();
  const workerOf = (name: string) => {
    let w = workers.get(name);
    if (!w) {
      w = emptyCounters();
      workers.set(name, w);
    }
    return w;
  };
  for (const s of samples) {
    if (!Number.isFinite(s.value)) continue;
    const worker = s.labels.worker ?? '';
    if (s.name === gaugeName) {
      workerOf(worker).engineHitRateGauge = s.value;
      continue;
    }
    const field = fields[s.name];
    if (!field) continue;
    for (const c of [overall, workerOf(worker)]) c[field] = (c[field] ?? 0) + s.value;
  }
  // Series without a worker label (another producer, or a router without per-worker labels) still count overall;
  // they get a row of their own only when labelled workers exist beside them.
  const unlabelled = workers.get('');
  workers.delete('');
  if (unlabelled && workers.size > 0) workers.set(UNLABELLED, unlabelled);
  return { prefix: p, overall, workers };
}

/** Raw vLLM/SGLang prefix-cache readings of a direct engine scrape, as HitCounters holding only the engine fields. */
export function engineSnapshotOf(samples: readonly Sample[], name: string): HitCounters {
  const c = emptyCounters();
  for (const r of engineReadings(samples, name, false).values()) {
    if (r.queries !== undefined) c.engineQueries = (c.engineQueries ?? 0) + r.queries;
    if (r.hits !== undefined) c.engineHits = (c.engineHits ?? 0) + r.hits;
    if (r.hitRateGauge !== undefined) c.engineHitRateGauge = r.hitRateGauge;
  }
  return c;
}

/**
 * b - a per field. A counter that went down was reset (process restart) between the scrapes: its delta is then its
 * new value (it counted up from zero), and the reset is reported.
 */
export function diffCounters(a: HitCounters | undefined, b: HitCounters): { delta: HitCounters; reset: boolean } {
  const delta = emptyCounters();
  let reset = false;
  const base = a ?? emptyCounters();
  // A histogram's count going down means the whole router restarted: every field then restarted from zero.
  const restarted = b.requests < base.requests || b.islBlocks < base.islBlocks;
  for (const f of COUNTER_FIELDS) {
    const d = restarted || b[f] < base[f] ? b[f] : b[f] - base[f];
    if (b[f] < base[f]) reset = true;
    delta[f] = d;
  }
  if (restarted) reset = true;
  for (const f of ['engineQueries', 'engineHits'] as const) {
    const bv = b[f];
    if (bv === undefined) continue;
    const av = a?.[f];
    if (av === undefined) {
      // Engine series first seen in the second scrape: it started at 0 (the mirror baselines), so all of it is new.
      delta[f] = bv;
    } else if (bv < av) {
      delta[f] = bv;
      reset = true;
    } else delta[f] = bv - av;
  }
  delta.engineHitRateGauge = b.engineHitRateGauge;
  return { delta, reset };
}

const ratio = (a: number, b: number): number => (b > 0 ? a / b : NaN);

/** The ledger's view (predicted, available, delivered; both aggregations), read from scrapes, plus the engine's. */
export interface HitRates extends ReuseView {
  readonly name: string;
  readonly islBlocks: number;
  /** The engine's own counters over the window: hits / queries (a ratio of sums, in tokens). */
  readonly engine: { readonly queries: number; readonly hits: number; readonly ratio: number; readonly gauge: number };
  readonly gaps: {
    /** request-weighted - block-weighted: the aggregation trap (negative: short requests are the cold ones). */
    readonly requestMinusBlock: number;
    /** predicted block-weighted - engine: the router's real error (positive: eviction after routing, missed events). */
    readonly blockMinusEngine: number;
    /** available - predicted (block-weighted): reuse traded for load balance. */
    readonly availableMinusPredicted: number;
    /** predicted - delivered, token-weighted over the same requests. */
    readonly predictedMinusDelivered: number;
  };
}

export function ratesOf(name: string, d: HitCounters): HitRates {
  const predictedBlock = ratio(d.overlapBlocks, d.islBlocks);
  const predictedReq = ratio(d.hitRateSum, d.requests);
  const availableBlock = ratio(d.bestOverlapBlocks, d.islBlocks);
  const deliveredTok = ratio(d.engineCachedTokens, d.enginePromptTokens);
  const predictedTok = ratio(d.predictedCachedTokens, d.enginePromptTokens);
  const engineRatio = ratio(d.engineHits ?? 0, d.engineQueries ?? 0);
  return {
    name,
    requests: d.requests,
    islBlocks: d.islBlocks,
    predicted: { requestWeighted: predictedReq, blockWeighted: predictedBlock },
    available: { requestWeighted: ratio(d.availableSum, d.availableCount), blockWeighted: availableBlock },
    delivered: {
      requests: d.deliveredRequests,
      requestWeighted: ratio(d.deliveredRatioSum, d.deliveredRequests),
      tokenWeighted: deliveredTok,
      predictedTokenWeighted: predictedTok,
    },
    engine: {
      queries: d.engineQueries ?? NaN,
      hits: d.engineHits ?? NaN,
      ratio: engineRatio,
      gauge: d.engineHitRateGauge ?? NaN,
    },
    gaps: {
      requestMinusBlock: predictedReq - predictedBlock,
      blockMinusEngine: predictedBlock - engineRatio,
      availableMinusPredicted: availableBlock - predictedBlock,
      predictedMinusDelivered: predictedTok - deliveredTok,
    },
  };
}

export interface HitRateReport {
  readonly windowS: number;
  readonly prefix: string;
  readonly overall: HitRates;
  readonly workers: HitRates[];
  /** Where the engine figures came from: the router's mirror, direct engine scrapes, or nowhere. */
  readonly engineSource: 'mirror' | 'direct' | 'none';
  readonly resets: string[];
  readonly notes: string[];
  /**
   * Workers whose KV events were lost and not replayed in either scrape (router_kv_event_source_degraded): the
   * router's predictions for them are not to be trusted until healed, nor the gaps against the engine.
   */
  readonly degraded: Array<{ worker: string; reason: string }>;
  readonly verdict: string;
}

/** Within this many points, two hit rates are "the same" for the verdict. */
export const AGREEMENT = 0.05;

const f3 = (x: number) => x.toFixed(3);

/** One line in plain words: is the router's view accurate, and why the histogram reads what it reads. */
export function verdictOf(o: HitRates, engineSource: HitRateReport['engineSource']): string {
  if (o.requests === 0 && o.islBlocks === 0) {
    return 'no traffic in the window: no requests were routed, so there is no hit rate to compare (not 0, unknown)';
  }
  const B = o.predicted.blockWeighted;
  const H = o.predicted.requestWeighted;
  let trap = '';
  if (Number.isFinite(H) && Number.isFinite(B) && Math.abs(H - B) > AGREEMENT) {
    trap =
      H < B
        ? `; the histogram's ${f3(H)} is a mean of ratios pulled down by many short requests`
        : `; the histogram's ${f3(H)} is a mean of ratios pushed up by short requests sharing a cached prefix`;
  }
  let truthName: string;
  let truth: number;
  if (engineSource !== 'none' && Number.isFinite(o.engine.ratio)) {
    truthName = 'engine';
    truth = o.engine.ratio;
  } else if (Number.isFinite(o.delivered.tokenWeighted)) {
    // Delivered covers only the requests with a usage report; compare like with like.
    const delivered = o.delivered.tokenWeighted;
    const P = o.delivered.predictedTokenWeighted;
    const d = P - delivered;
    const head = Math.abs(d) <= AGREEMENT ? 'router view accurate' : d > 0 ? 'router over-predicts' : 'router under-predicts';
    return `${head}: predicted ${f3(P)} vs delivered ${f3(delivered)} on the ${o.delivered.requests} requests the engine reported cached tokens for (no engine counters)${trap}`;
  } else {
    return `no engine truth in the window (no engine counters, no cached_tokens in usage): router predicts block-weighted ${f3(B)}${trap}; add --engine URL or enable the engine mirror to check it`;
  }
  const d = B - truth;
  if (Math.abs(d) <= AGREEMENT) return `router view accurate: block-weighted ${f3(B)} vs ${truthName} ${f3(truth)}${trap}`;
  if (d > 0) {
    return `router over-predicts: block-weighted ${f3(B)} vs ${truthName} ${f3(truth)} (blocks evicted between routing and execution, or missed removal events)${trap}`;
  }
  return `router under-predicts: block-weighted ${f3(B)} vs ${truthName} ${f3(truth)} (the engine reuses more than the router knows: missed stored events, approximate mode, or traffic from elsewhere)${trap}`;
}

export interface ReportInput {
  /** The two router scrapes as text. */
  readonly from: string;
  readonly to: string;
  readonly windowS: number;
  /** Optional direct engine scrapes, by engine name (matched against worker labels). */
  readonly engines?: ReadonlyArray<{ readonly name: string; readonly from: string; readonly to: string }>;
  readonly prefix?: string;
}

export function buildReport(input: ReportInput): HitRateReport {
  const notes: string[] = [];
  const pa = parsePrometheusText(input.from);
  const pb = parsePrometheusText(input.to);
  if (pa.badLines + pb.badLines > 0) notes.push(`${pa.badLines + pb.badLines} malformed lines in the scrapes were skipped`);
  const b = snapshotOf(pb.samples, input.prefix);
  const a = snapshotOf(pa.samples, input.prefix ?? b.prefix);
  // P/D fleets: a decode engine counts every prompt whose KV it received as a prefix-cache query; its counters are left
  // out of the overall engine figure (the prefill pool's, and aggregated workers', are the truth).
  const decodeWorkers = new Set(
    pb.samples
      .filter((s) => s.name === `${b.prefix}router_worker_role` && s.labels.role === 'decode' && s.value === 1)
      .map((s) => s.labels.worker),
  );
  const resets: string[] = [];

  const overallDiff = diffCounters(a.overall, b.overall);
  if (overallDiff.reset) resets.push('overall');
  const workerDeltas = new Map<string, HitCounters>();
  for (const [name, wb] of b.workers) {
    const d = diffCounters(a.workers.get(name), wb);
    if (d.reset) resets.push(name);
    workerDeltas.set(name, d.delta);
  }
  for (const name of a.workers.keys()) {
    if (!b.workers.has(name)) notes.push(`worker ${name} disappeared between the scrapes (left out)`);
  }
  // Recompute overall from worker deltas so a reset on one worker does not distort the others.
  const overall = emptyCounters();
  for (const [name, d] of workerDeltas) {
    for (const f of COUNTER_FIELDS) overall[f] += d[f];
    if (decodeWorkers.has(name)) continue;
    for (const f of ['engineQueries', 'engineHits'] as const) if (d[f] !== undefined) overall[f] = (overall[f] ?? 0) + d[f]!;
  }
  if (decodeWorkers.size > 0) {
    notes.push(
      `P/D fleet: the engine counters of ${decodeWorkers.size} decode worker(s) are left out of the overall engine figure (they count received KV as queries); the ledger counts prefill workers (and decode workers serving alone)`,
    );
  }
  if (workerDeltas.size === 0) Object.assign(overall, overallDiff.delta);

  let engineSource: HitRateReport['engineSource'] = overall.engineQueries !== undefined ? 'mirror' : 'none';
  if (input.engines && input.engines.length > 0) {
    let q = 0;
    let h = 0;
    let any = false;
    for (const e of input.engines) {
      const ea = engineSnapshotOf(parsePrometheusText(e.from).samples, e.name);
      const eb = engineSnapshotOf(parsePrometheusText(e.to).samples, e.name);
      if (eb.engineQueries === undefined) {
        notes.push(
          eb.engineHitRateGauge !== undefined
            ? `engine ${e.name} exposes only a hit-rate gauge (SGLang): ${f3(eb.engineHitRateGauge)}, not summable`
            : `engine ${e.name} exposes no prefix-cache metrics (vllm:prefix_cache_queries_total missing)`,
        );
        continue;
      }
      const d = diffCounters(ea.engineQueries === undefined ? undefined : ea, eb);
      if (d.reset) resets.push(`engine ${e.name}`);
      any = true;
      q += d.delta.engineQueries ?? 0;
      h += d.delta.engineHits ?? 0;
      const w = workerDeltas.get(e.name);
      if (w && w.engineQueries === undefined) {
        w.engineQueries = d.delta.engineQueries;
        w.engineHits = d.delta.engineHits;
      }
    }
    // Direct scrapes are the fallback when the router does not mirror; the mirror (same counters) wins otherwise.
    if (any && engineSource === 'none') {
      overall.engineQueries = q;
      overall.engineHits = h;
      engineSource = 'direct';
    }
  }
  if (engineSource === 'none') notes.push('no engine prefix-cache counters: neither the router mirror nor --engine scrapes');
  else if ((overall.engineQueries ?? 0) === 0) notes.push('engine counters present but no prompt tokens queried in the window');
  if (resets.length > 0) notes.push(`counter resets (restart) between the scrapes: ${resets.join(', ')}; counted from zero`);

  const degraded = new Map<string, string>();
  for (const s of [...pa.samples, ...pb.samples]) {
    if (s.name === `${b.prefix}router_kv_event_source_degraded` && s.value === 1 && s.labels.worker) {
      degraded.set(s.labels.worker, s.labels.reason ?? 'unknown');
    }
  }

  const o = ratesOf('overall', overall);
  const workers = [...workerDeltas].sort(([x], [y]) => (x < y ? -1 : x > y ? 1 : 0)).map(([name, d]) => ratesOf(name, d));
  return {
    windowS: input.windowS,
    prefix: b.prefix,
    overall: o,
    workers,
    engineSource,
    resets,
    notes,
    degraded: [...degraded].map(([worker, reason]) => ({ worker, reason })),
    verdict: verdictOf(o, engineSource),
  };
}

// ------------------------------------------------------------------------------------------------ output

const cell = (x: number, digits = 3) => (Number.isFinite(x) ? x.toFixed(digits) : '-');
const signed = (x: number) => (Number.isFinite(x) ? (x >= 0 ? '+' : '') + x.toFixed(3) : '-');

export function formatReport(r: HitRateReport): string {
  const head = [
    'scope',
    'requests',
    'pred req-w',
    'pred block-w',
    'avail block-w',
    'delivered',
    'pred (same)',
    'engine',
    'req-w - block-w',
    'block-w - engine',
    'avail - pred',
  ];
  const rows = [r.overall, ...r.workers].map((x) => [
    x.name,
    String(x.requests),
    cell(x.predicted.requestWeighted),
    cell(x.predicted.blockWeighted),
    cell(x.available.blockWeighted),
    cell(x.delivered.tokenWeighted),
    cell(x.delivered.predictedTokenWeighted),
    cell(x.engine.ratio),
    signed(x.gaps.requestMinusBlock),
    signed(x.gaps.blockMinusEngine),
    signed(x.gaps.availableMinusPredicted),
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i].length)));
  const line = (cols: string[]) => cols.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ');
  const out: string[] = [];
  out.push(
    `${Number.isFinite(r.windowS) ? `window ${r.windowS.toFixed(1)} s` : 'between two saved scrapes'}; ${r.overall.requests} requests, ${r.overall.islBlocks} prompt blocks routed; ` +
      `engine figures: ${r.engineSource}${r.prefix ? `; metric prefix "${r.prefix}"` : ''}`,
  );
  out.push(line(head));
  out.push(widths.map((n) => '-'.repeat(n)).join('  '));
  for (const row of rows) out.push(line(row));
  out.push('');
  out.push('pred req-w = mean of per-request ratios (the histogram); pred block-w = ratio of sums (comparable with engine);');
  out.push(
    'avail = best overlap in the fleet; delivered = cached_tokens/prompt_tokens from usage reports, "pred (same)" = router prediction for those requests.',
  );
  for (const n of r.notes) out.push(`note: ${n}`);
  for (const d of r.degraded) {
    out.push(
      `WARNING: worker ${d.worker}: KV events were lost and not replayed (${d.reason}); the router's view of its cache is incomplete, ` +
        'so its predicted figures (and the overall ones) are not to be trusted until it is healed (GET /debug/state: degraded)',
    );
  }
  out.push('');
  out.push(`verdict: ${r.verdict}`);
  return `${out.join('\n')}\n`;
}

/** JSON form: NaN (no data) becomes null so the output is valid JSON and never reads as 0. */
export function reportJson(r: HitRateReport): string {
  return JSON.stringify(r, (_k, v) => (typeof v === 'number' && !Number.isFinite(v) ? null : v), 2);
}
