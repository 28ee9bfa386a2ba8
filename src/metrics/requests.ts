/**
 * The requests family: requests by API and by outcome, refusals by reason, pass-throughs, the router's own overhead
 * by phase, time to first token, inter-token latency, prompt and output lengths. Each also keeps the plain totals the
 * live dashboard reads (`totals`).
 */
import { Counter, Histogram, type Registry } from 'prom-client';
import type { RouteDecision } from '../core/types.ts';
import { fastCounter, fastHistogram, labelObjects } from './bound.ts';
import { ITL_BUCKETS, LATENCY_BUCKETS, LENGTH_BUCKETS, OVERHEAD_BUCKETS, type SumCount } from './buckets.ts';

export const OVERHEAD_PHASES = ['tokenize', 'hash', 'find_matches', 'select', 'total'] as const;
export type OverheadPhase = (typeof OVERHEAD_PHASES)[number];

type Worker = { worker: string };

/** RequestSeries.totals as plain JSON (what an HTTP shell of `--processes` sends with its registry). */
export interface RequestTotalsJson {
  overhead: Record<string, SumCount>;
  outcomes: Record<string, number>;
  refusals: Record<string, number>;
  ttft: SumCount;
  itl: SumCount;
}

// Stable labels objects: the metrics' fast path (bound.ts) is keyed by the object.
const API_LABELS = labelObjects('api');
const PHASE_LABELS = labelObjects('phase');
const OUTCOME_LABELS = labelObjects('outcome');

export class RequestSeries {
  private readonly apiRequests: Counter<'api'>;
  private readonly passthroughRequests: Counter<'path' | 'status'>;
  private readonly overheadHist: Histogram<'phase'>;
  private readonly requests: Counter<'outcome'>;
  private readonly refusedCounter: Counter<'reason'>;
  private readonly ttftHist: Histogram<'worker'>;
  private readonly itlHist: Histogram<'worker'>;
  private readonly promptTokens: Histogram<'worker'>;
  private readonly outputTokens: Histogram<'worker'>;

  /** Plain totals for the dashboard (exact, and cheap to read every poll). */
  readonly totals = {
    overhead: new Map<OverheadPhase, SumCount>(OVERHEAD_PHASES.map((p) => [p, { sum: 0, count: 0 }])),
    outcomes: new Map<string, number>(),
    refusals: new Map<string, number>(),
    ttft: { sum: 0, count: 0 } as SumCount,
    itl: { sum: 0, count: 0 } as SumCount,
  };

  /** The totals as plain JSON (a copy). */
  totalsJson(): RequestTotalsJson {
    const t = this.totals;
    return {
      overhead: Object.fromEntries([...t.overhead].map(([k, v]) => [k, { ...v }])),
      outcomes: Object.fromEntries(t.outcomes),
      refusals: Object.fromEntries(t.refusals),
      ttft: { ...t.ttft },
      itl: { ...t.itl },
    };
  }

  constructor(registry: Registry, p: string) {
    const registers = [registry];
    this.apiRequests = fastCounter(
      new Counter({
        name: `${p}router_api_requests_total`,
        help: 'Routed requests accepted for routing, by API (chat, completions, responses, messages, embeddings, pooling, score, rerank).',
        labelNames: ['api'],
        registers,
      }),
    );
    this.passthroughRequests = new Counter({
      name: `${p}router_passthrough_requests_total`,
      help: 'Requests passed through to a worker without routing (/tokenize, /detokenize, other engine paths), by path and status.',
      labelNames: ['path', 'status'],
      registers,
    });
    const w = ['worker'] as const;
    this.overheadHist = fastHistogram(
      new Histogram({
        name: `${p}router_routing_overhead_seconds`,
        help: 'Time the router spent per request, by phase: tokenize, hash, find_matches, select, total (their sum).',
        buckets: OVERHEAD_BUCKETS,
        labelNames: ['phase'],
        registers,
      }),
    );
    this.requests = fastCounter(
      new Counter({
        name: `${p}router_requests_total`,
        help: 'Requests handled by the router, by outcome.',
        labelNames: ['outcome'],
        registers,
      }),
    );
    this.refusedCounter = new Counter({
      name: `${p}router_requests_refused_total`,
      help: 'Requests the router could not place, by reason (no_sources, all_busy, duplicate_request, ...).',
      labelNames: ['reason'],
      registers,
    });
    this.ttftHist = fastHistogram(
      new Histogram({
        name: `${p}router_time_to_first_token_seconds`,
        help: 'Time to first token as seen at the router (request received to first streamed token).',
        buckets: LATENCY_BUCKETS,
        labelNames: w,
        registers,
      }),
    );
    this.itlHist = fastHistogram(
      new Histogram({
        name: `${p}router_inter_token_latency_seconds`,
        help: 'Time between consecutive streamed tokens (chunks) as seen at the router.',
        buckets: ITL_BUCKETS,
        labelNames: w,
        registers,
      }),
    );
    this.promptTokens = fastHistogram(
      new Histogram({
        name: `${p}router_prompt_tokens`,
        help: 'Prompt length in tokens per routed request.',
        buckets: LENGTH_BUCKETS,
        labelNames: w,
        registers,
      }),
    );
    this.outputTokens = fastHistogram(
      new Histogram({
        name: `${p}router_output_tokens`,
        help: 'Output length in tokens per finished request (when known).',
        buckets: LENGTH_BUCKETS,
        labelNames: w,
        registers,
      }),
    );
  }

  /** A request accepted by one of the routed APIs. */
  apiRequest(api: string): void {
    this.apiRequests.inc(API_LABELS(api));
  }

  /** A pass-through answered; `path` must come from a bounded set (the caller maps the rest to "other"). */
  passthrough(path: string, status: number): void {
    this.passthroughRequests.inc({ path, status: String(status) });
  }

  /** At routing time: the prompt's length and the overhead by phase (tokenize measured by the shell, the rest by the core). */
  routed(worker: Worker, decision: RouteDecision, timingsS: { tokenize: number }): void {
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
    this.overheadHist.observe(PHASE_LABELS(phase), s);
    const sc = this.totals.overhead.get(phase)!;
    sc.sum += s;
    sc.count++;
  }

  refused(reason: string): void {
    this.refusedCounter.inc({ reason });
    this.totals.refusals.set(reason, (this.totals.refusals.get(reason) ?? 0) + 1);
  }

  firstToken(worker: Worker, ttftS: number): void {
    if (!Number.isFinite(ttftS) || ttftS < 0) return;
    this.ttftHist.observe(worker, ttftS);
    this.totals.ttft.sum += ttftS;
    this.totals.ttft.count++;
  }

  token(worker: Worker, interTokenS: number): void {
    if (!Number.isFinite(interTokenS) || interTokenS < 0) return;
    this.itlHist.observe(worker, interTokenS);
    this.totals.itl.sum += interTokenS;
    this.totals.itl.count++;
  }

  outputLength(worker: Worker, tokens: number | undefined): void {
    if (tokens !== undefined && Number.isFinite(tokens) && tokens >= 0) this.outputTokens.observe(worker, tokens);
  }

  outcome(outcome: string): void {
    this.requests.inc(OUTCOME_LABELS(outcome));
    this.totals.outcomes.set(outcome, (this.totals.outcomes.get(outcome) ?? 0) + 1);
  }
}

/** Adds `more` into `into` (the dashboard's totals of several registries: a primary and its HTTP shells). */
export function addTotals(into: RequestTotalsJson, more: RequestTotalsJson): void {
  for (const [k, v] of Object.entries(more.overhead)) {
    const o = into.overhead[k];
    into.overhead[k] = { sum: (o?.sum ?? 0) + v.sum, count: (o?.count ?? 0) + v.count };
  }
  for (const [k, v] of Object.entries(more.outcomes)) into.outcomes[k] = (into.outcomes[k] ?? 0) + v;
  for (const [k, v] of Object.entries(more.refusals)) into.refusals[k] = (into.refusals[k] ?? 0) + v;
  into.ttft.sum += more.ttft.sum;
  into.ttft.count += more.ttft.count;
  into.itl.sum += more.itl.sum;
  into.itl.count += more.itl.count;
}
