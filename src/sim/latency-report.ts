/**
 * The latency table `kvroute sim` prints under its report: TTFT and inter-token latency (p50/p90), goodput at the SLO,
 * and for disaggregated fleets the conditional threshold, the paths taken and the KV transfer time.
 */
import type { FleetResult } from './run-fleet.ts';

const ms = (x: number) => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : '-');
const ms1 = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : '-');

export function formatPdTable(results: readonly FleetResult[]): string {
  const head = ['run', 'fleet', 'N', 'TTFT p50', 'p90', 'ITL p50', 'p90 (ms)', 'goodput', 'good/s', 'disagg', 'decode-only', 'xfer p50 ms'];
  const rows = results.map((r) => {
    const pd = r.pd;
    const decodeOnly = pd ? (pd.paths.decode_rule ?? 0) + (pd.paths.decode_fallback ?? 0) : 0;
    return [
      `${r.name} x${r.rate_scale}`,
      pd ? `${pd.prefill_workers}P+${pd.decode_workers}D` : `${r.per_worker.length} agg`,
      pd ? String(pd.min_uncached_tokens) : '-',
      ms(r.ttft_ms.p50),
      ms(r.ttft_ms.p90),
      ms1(r.itl_ms.p50),
      ms1(r.itl_ms.p90),
      Number.isFinite(r.goodput.fraction) ? `${(r.goodput.fraction * 100).toFixed(1)}%` : '-',
      r.goodput.per_s.toFixed(2),
      pd ? String(pd.paths.disaggregated ?? 0) : '-',
      pd ? String(decodeOnly) : '-',
      pd ? ms1(pd.transfer_ms.p50) : '-',
    ];
  });
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i].length)));
  const line = (cols: string[]) => cols.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ');
  const slo = results[0]?.goodput;
  return [
    `latency and goodput (SLO: TTFT <= ${slo?.ttft_ms ?? 2000} ms and ITL <= ${slo?.itl_ms ?? 50} ms; ITL = (finish - first token) / (output tokens - 1) per request):`,
    line(head),
    widths.map((n) => '-'.repeat(n)).join('  '),
    ...rows.map(line),
  ].join('\n');
}
