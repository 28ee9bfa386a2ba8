/**
 * Disaggregated prefill/decode metrics: requests by path, why requests were served on decode alone, handoff failures by
 * cause, transferred tokens and prefill retries (the dispatcher's counters, read at scrape time so they cannot drift
 * from the core), and per-leg durations as the router sees them (measured by the shell).
 */
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import { HANDOFF_FAILURES, PD_PATHS, type PdStats } from '../core/dispatch/dispatcher.ts';
import { LATENCY_BUCKETS } from './buckets.ts';

export type PdLeg = 'prefill' | 'decode_first_token' | 'decode';

export class PdMetrics {
  private readonly legs: PdLegs;

  constructor(
    registry: Registry,
    prefix: string,
    stats: () => PdStats,
    /** Every source with its worker's role (for router_worker_role). */
    roles: () => Iterable<{ readonly sourceKey: string; readonly role: string }> = () => [],
  ) {
    const registers = [registry];
    const p = prefix;
    new Gauge({
      name: `${p}router_worker_role`,
      help:
        "1 per worker source and its role (both, prefill, decode). kvroute hitrate leaves decode workers' engine counters out of " +
        'the overall engine figure: a decode engine counts the prompts whose KV it received as prefix-cache queries.',
      labelNames: ['worker', 'role'],
      registers,
      collect() {
        this.reset();
        for (const r of roles()) this.set({ worker: r.sourceKey, role: r.role }, 1);
      },
    });
    // Counters fed from the core's totals: each scrape adds what grew since the last one.
    const fromTotals = <L extends string>(
      name: string,
      help: string,
      label: L | null,
      read: (s: PdStats) => Record<string, number>,
      zero: readonly string[] = [],
    ) => {
      const last = new Map<string, number>();
      return new Counter({
        name: `${p}${name}`,
        help,
        labelNames: label ? [label] : [],
        registers,
        collect() {
          const now = read(stats());
          for (const k of new Set([...zero, ...Object.keys(now)])) {
            const v = now[k] ?? 0;
            const d = v - (last.get(k) ?? 0);
            last.set(k, v);
            const labels = (label ? { [label]: k } : {}) as Record<L, string>;
            this.inc(labels, Math.max(0, d));
          }
        },
      });
    };
    fromTotals(
      'router_pd_requests_total',
      'Requests finished by path: aggregated (no prefill pool for the model), disaggregated (prefill + decode leg), ' +
        'decode_rule (decode alone: short uncached part or several sequences), decode_fallback (decode alone: no usable prefill worker).',
      'path',
      (s) => s.paths,
      PD_PATHS,
    );
    fromTotals(
      'router_pd_decode_only_total',
      'Routings served on the decode worker alone in a P/D fleet, by cause (short, sequences, or the prefill pool refusal).',
      'cause',
      (s) => s.decodeOnly,
    );
    fromTotals(
      'router_pd_handoff_failures_total',
      'Handoffs that did not go as planned, by cause: prefill_failed (retried elsewhere or served on decode alone), ' +
        'no_kv_transfer_params (a vLLM or TensorRT-LLM prefill answer without its handoff params: the decode side recomputes), ' +
        'decode_failed (a new pair), ' +
        'cancelled (the client left before the decode side had the KV).',
      'cause',
      (s) => s.handoffFailures,
      HANDOFF_FAILURES,
    );
    fromTotals(
      'router_pd_transferred_tokens_total',
      "Prompt tokens whose KV was handed from a prefill to a decode worker (counted at the decode leg's first token).",
      null,
      (s) => ({ '': s.transferredTokens }),
      [''],
    );
    fromTotals(
      'router_pd_prefill_retries_total',
      'Prefill legs sent again on another prefill worker.',
      null,
      (s) => ({ '': s.prefillRetries }),
      [''],
    );
    this.legs = new PdLegs(registry, p);
  }

  legDuration(leg: PdLeg, seconds: number): void {
    this.legs.legDuration(leg, seconds);
  }

  /** Plain sums for the dashboard. */
  get legTotals(): Record<PdLeg, { sum: number; count: number }> {
    return this.legs.totals;
  }
}

/**
 * router_pd_leg_duration_seconds alone: what a request handler records of a disaggregated request (an HTTP shell of
 * `--processes` keeps it in its own registry, summed into the primary's /metrics at scrape time).
 */
export class PdLegs {
  private readonly legs: Histogram<'leg'>;
  readonly totals: Record<PdLeg, { sum: number; count: number }> = {
    prefill: { sum: 0, count: 0 },
    decode_first_token: { sum: 0, count: 0 },
    decode: { sum: 0, count: 0 },
  };

  constructor(registry: Registry, p: string) {
    this.legs = new Histogram({
      name: `${p}router_pd_leg_duration_seconds`,
      help:
        'Per leg of a disaggregated request as the router sees it: prefill (request to its whole answer), decode_first_token ' +
        '(decode request to its first token: KV transfer and first step), decode (decode request to the end of its answer).',
      buckets: LATENCY_BUCKETS,
      labelNames: ['leg'],
      registers: [registry],
    });
  }

  legDuration(leg: PdLeg, seconds: number): void {
    if (!Number.isFinite(seconds) || seconds < 0) return;
    this.legs.observe({ leg }, seconds);
    this.totals[leg].sum += seconds;
    this.totals[leg].count++;
  }
}
