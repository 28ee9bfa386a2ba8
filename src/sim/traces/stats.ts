/** Shape of a trace: what `kvroute trace gen` prints and the simulator's JSON carries under "trace". */
import { computeOracle } from '../oracle.ts';
import type { TraceRequest } from './format.ts';

/** Linear-interpolated percentile of sorted values (numpy's default method), q in [0, 100]. */
export function percentileSorted(sorted: ArrayLike<number>, q: number): number {
  const n = sorted.length;
  if (n === 0) return NaN;
  const pos = (q / 100) * (n - 1);
  const lo = Math.floor(pos);
  const hi = Math.min(lo + 1, n - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

export interface TraceStats {
  readonly requests: number;
  readonly duration_s: number;
  readonly rate_rps: number;
  readonly isl: { mean: number; p50: number; p90: number; p99: number; max: number };
  readonly osl_mean: number;
  readonly under_1800_fraction: number;
  readonly over_130k_fraction: number;
  readonly oracle: { block_weighted: number; request_weighted: number };
}

export function traceStats(requests: readonly TraceRequest[]): TraceStats {
  const n = requests.length;
  const isl = new Float64Array(n);
  let sum = 0;
  let osl = 0;
  let under = 0;
  let over = 0;
  let t0 = Infinity;
  let t1 = -Infinity;
  for (let i = 0; i < n; i++) {
    const r = requests[i];
    isl[i] = r.inputLength;
    sum += r.inputLength;
    osl += r.outputLength;
    if (r.inputLength < 1800) under++;
    if (r.inputLength > 130_000) over++;
    t0 = Math.min(t0, r.timestamp);
    t1 = Math.max(t1, r.timestamp);
  }
  isl.sort();
  const oracle = computeOracle(requests);
  const duration = n > 0 ? (t1 - t0) / 1000 : 0;
  return {
    requests: n,
    duration_s: duration,
    rate_rps: duration > 0 ? n / duration : 0,
    isl: {
      mean: n ? sum / n : 0,
      p50: percentileSorted(isl, 50),
      p90: percentileSorted(isl, 90),
      p99: percentileSorted(isl, 99),
      max: n ? isl[n - 1] : 0,
    },
    osl_mean: n ? osl / n : 0,
    under_1800_fraction: n ? under / n : 0,
    over_130k_fraction: n ? over / n : 0,
    oracle: { block_weighted: oracle.blockWeighted, request_weighted: oracle.requestWeighted },
  };
}

export function formatTraceStats(s: TraceStats): string {
  const f = (x: number) => Math.round(x).toLocaleString('en-US');
  return [
    `requests          ${s.requests.toLocaleString('en-US')} over ${s.duration_s.toFixed(1)} s (${s.rate_rps.toFixed(2)} req/s)`,
    `ISL mean/p50/p90/p99/max  ${f(s.isl.mean)} / ${f(s.isl.p50)} / ${f(s.isl.p90)} / ${f(s.isl.p99)} / ${f(s.isl.max)}`,
    `OSL mean          ${f(s.osl_mean)}`,
    `under 1,800 tok   ${(100 * s.under_1800_fraction).toFixed(1)}%   over 130k: ${(100 * s.over_130k_fraction).toFixed(2)}%`,
    `ideal hit (infinite shared cache): block-weighted ${s.oracle.block_weighted.toFixed(3)}, request-weighted ${s.oracle.request_weighted.toFixed(3)}`,
  ].join('\n');
}
