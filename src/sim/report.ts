/**
 * Presentation of simulator results: the stdout table, the JSON document and an SVG chart drawn by hand (bars for
 * hit rates, bars for TTFT p50/p90 per policy; lines over the rate-scale sweep when there is one).
 */
import type { FleetResult } from './run-fleet.ts';
import type { OracleResult } from './oracle.ts';
import type { TraceStats } from './traces/stats.ts';

export interface SimReport {
  readonly trace: TraceStats & { readonly source: string };
  readonly fleet: {
    readonly workers: number;
    readonly block_size: number;
    readonly gpu_blocks: number;
    readonly event_delay_ms: number;
    readonly seed: number;
    /** Host tier (CPU offload) blocks per engine, when the engines have one. */
    readonly host_blocks?: number;
  };
  readonly oracle: { readonly block_weighted: number; readonly request_weighted: number };
  readonly policies: readonly FleetResult[];
}

export function buildReport(
  trace: TraceStats & { source: string },
  fleet: SimReport['fleet'],
  oracle: OracleResult,
  policies: readonly FleetResult[],
): SimReport {
  return {
    trace,
    fleet,
    oracle: { block_weighted: oracle.blockWeighted, request_weighted: oracle.requestWeighted },
    policies,
  };
}

const f3 = (x: number) => (Number.isFinite(x) ? x.toFixed(3) : '-');
const ms = (x: number) => (Number.isFinite(x) ? (x >= 10_000 ? `${(x / 1000).toFixed(1)}s` : `${Math.round(x)}`) : '-');

function table(header: string[], rows: string[][], leftCols = 1): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) => cells.map((c, i) => (i < leftCols ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ');
  return [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
}

/** The stdout table: one row per policy (and rate scale), the oracle below. */
export function formatReport(rep: SimReport): string {
  const sweep = new Set(rep.policies.map((p) => p.rate_scale)).size > 1;
  const header = [
    'policy',
    ...(sweep ? ['rate'] : []),
    'pred req-w',
    'pred blk-w',
    'avail blk-w',
    'engine tok-w',
    '%oracle',
    'TTFT p50',
    'p90',
    'p99 (ms)',
    'tok/s',
    'imbal',
    'imbal/60s',
    'preempt',
  ];
  const rows = rep.policies.map((p) => [
    p.name,
    ...(sweep ? [`x${p.rate_scale}`] : []),
    f3(p.hit.predicted_request_weighted),
    f3(p.hit.predicted_block_weighted),
    f3(p.hit.available_block_weighted),
    f3(p.hit.engine_token_weighted),
    rep.oracle.block_weighted > 0 ? `${Math.round((100 * p.hit.predicted_block_weighted) / rep.oracle.block_weighted)}%` : '-',
    ms(p.ttft_ms.p50),
    ms(p.ttft_ms.p90),
    ms(p.ttft_ms.p99),
    Math.round(p.throughput_tokens_per_s).toLocaleString('en-US'),
    p.imbalance.toFixed(2),
    p.imbalance_windowed.toFixed(2),
    String(p.preemptions),
  ]);
  const buckets = rep.policies[0]?.ttft_by_bucket.map((b) => b.bucket) ?? [];
  const bucketRows = rep.policies.map((p) => [
    p.name,
    ...(sweep ? [`x${p.rate_scale}`] : []),
    ...p.ttft_by_bucket.map((b) => `${ms(b.p50)} / ${ms(b.p90)} (${b.requests})`),
  ]);
  const t = rep.trace;
  return [
    `trace ${t.source}: ${t.requests.toLocaleString('en-US')} requests, ISL mean ${Math.round(t.isl.mean).toLocaleString('en-US')}, ` +
      `${(100 * t.under_1800_fraction).toFixed(1)}% under 1,800 tokens; fleet ${rep.fleet.workers} workers x ` +
      `${rep.fleet.gpu_blocks.toLocaleString('en-US')} blocks of ${rep.fleet.block_size} tokens, KV events after ${rep.fleet.event_delay_ms} ms`,
    '',
    table(header, rows, sweep ? 2 : 1),
    '',
    `oracle (infinite shared cache, ${t.source.includes('(recorded by kvroute') ? `the recording's ${rep.fleet.block_size}-token blocks` : '512-token trace blocks'}): block-weighted ${f3(rep.oracle.block_weighted)}, request-weighted ${f3(rep.oracle.request_weighted)}`,
    'pred = overlap on the chosen worker at routing time; avail = best overlap in the fleet; engine = prefix-cache hits/queries',
    '(tokens) summed over the engines; req-w = mean of per-request ratios, blk-w/tok-w = ratio of sums.',
    '',
    'TTFT p50 / p90 ms (requests) by prompt length:',
    table(['policy', ...(sweep ? ['rate'] : []), ...buckets], bucketRows, sweep ? 2 : 1),
    '',
    'admission (served / queued / refused / retried attempts; queue wait p50 / p99 ms; refusals):',
    ...rep.policies.map((p) => {
      const r = p.requests;
      const q = p.queue_wait_ms;
      const why = Object.entries(p.refusals)
        .map(([k, v]) => `${k} ${v}`)
        .join(', ');
      const wait = r.queued > 0 ? `${ms(q.p50)} / ${ms(q.p99)}` : '-';
      return `  ${p.name}${sweep ? ` x${p.rate_scale}` : ''}: ${r.served} / ${r.queued} / ${r.refused} / ${r.retried}; ${wait}${why ? `; ${why}` : ''}`;
    }),
    '',
    ...tenantSection(rep),
    'requests per worker (min / max): ' +
      rep.policies
        .map((p) => {
          const counts = p.per_worker.map((w) => w.requests);
          return `${p.name}${sweep ? ` x${p.rate_scale}` : ''} ${Math.min(...counts)} / ${Math.max(...counts)}`;
        })
        .join('; '),
    'simulation cost: ' +
      rep.policies
        .map(
          (p) =>
            `${p.name}${sweep ? ` x${p.rate_scale}` : ''} ${p.sim.wall_s.toFixed(1)} s wall / ${p.sim.cpu_s.toFixed(1)} s cpu (${p.sim.engine_steps.toLocaleString('en-US')} engine steps, ${p.sim.simulated_s.toFixed(0)} s simulated)`,
        )
        .join('; '),
  ].join('\n');
}

// ------------------------------------------------------------------ SVG

const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7', '#9c755f'];

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

interface Panel {
  x: number;
  y: number;
  w: number;
  h: number;
}

function axis(p: Panel, max: number, ticks: number, fmt: (v: number) => string): string {
  const out: string[] = [];
  for (let i = 0; i <= ticks; i++) {
    const v = (max * i) / ticks;
    const y = p.y + p.h - (p.h * i) / ticks;
    out.push(`<line x1="${p.x}" y1="${y.toFixed(1)}" x2="${p.x + p.w}" y2="${y.toFixed(1)}" stroke="#e5e5e5"/>`);
    out.push(`<text x="${p.x - 6}" y="${(y + 4).toFixed(1)}" text-anchor="end">${esc(fmt(v))}</text>`);
  }
  out.push(`<line x1="${p.x}" y1="${p.y + p.h}" x2="${p.x + p.w}" y2="${p.y + p.h}" stroke="#333"/>`);
  return out.join('\n');
}

function niceMax(v: number): number {
  if (!(v > 0)) return 1;
  const e = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * e >= v) return m * e;
  return 10 * e;
}

/** Grouped bars: one group per category, one bar per series. */
function bars(
  p: Panel,
  title: string,
  categories: string[],
  series: { name: string; values: number[] }[],
  max: number,
  fmt: (v: number) => string,
  refLine?: { value: number; label: string },
): string {
  const out: string[] = [`<text x="${p.x}" y="${p.y - 12}" font-weight="bold">${esc(title)}</text>`, axis(p, max, 4, fmt)];
  const groupW = p.w / Math.max(1, categories.length);
  const barW = (groupW * 0.8) / Math.max(1, series.length);
  categories.forEach((cat, g) => {
    const gx = p.x + g * groupW + groupW * 0.1;
    series.forEach((s, k) => {
      const v = s.values[g];
      if (!Number.isFinite(v)) return;
      const h = Math.min(p.h, (p.h * v) / max);
      const x = gx + k * barW;
      out.push(
        `<rect x="${x.toFixed(1)}" y="${(p.y + p.h - h).toFixed(1)}" width="${(barW - 2).toFixed(1)}" height="${h.toFixed(1)}" fill="${PALETTE[k % PALETTE.length]}"><title>${esc(`${cat} ${s.name}: ${fmt(v)}`)}</title></rect>`,
      );
    });
    out.push(`<text x="${(gx + groupW * 0.4).toFixed(1)}" y="${p.y + p.h + 16}" text-anchor="middle">${esc(cat)}</text>`);
  });
  if (refLine && Number.isFinite(refLine.value)) {
    const y = p.y + p.h - (p.h * refLine.value) / max;
    out.push(`<line x1="${p.x}" y1="${y.toFixed(1)}" x2="${p.x + p.w}" y2="${y.toFixed(1)}" stroke="#000" stroke-dasharray="6 4"/>`);
    out.push(`<text x="${p.x + p.w}" y="${(y - 4).toFixed(1)}" text-anchor="end">${esc(refLine.label)}</text>`);
  }
  return out.join('\n');
}

function legend(x: number, y: number, names: string[]): string {
  return names
    .map(
      (n, k) =>
        `<rect x="${x + k * 150}" y="${y - 10}" width="12" height="12" fill="${PALETTE[k % PALETTE.length]}"/><text x="${x + k * 150 + 18}" y="${y}">${esc(n)}</text>`,
    )
    .join('\n');
}

/** Lines of TTFT p90 against rate scale, one per policy (the sweep's knee). */
function lines(p: Panel, title: string, xs: number[], series: { name: string; values: number[] }[], max: number): string {
  const out: string[] = [
    `<text x="${p.x}" y="${p.y - 12}" font-weight="bold">${esc(title)}</text>`,
    axis(p, max, 4, (v) => `${Math.round(v)}`),
  ];
  const xAt = (i: number) => p.x + (xs.length <= 1 ? p.w / 2 : (p.w * i) / (xs.length - 1));
  for (const [i, x] of xs.entries()) out.push(`<text x="${xAt(i).toFixed(1)}" y="${p.y + p.h + 16}" text-anchor="middle">x${x}</text>`);
  series.forEach((s, k) => {
    const pts = s.values
      .map((v, i) => (Number.isFinite(v) ? `${xAt(i).toFixed(1)},${(p.y + p.h - Math.min(p.h, (p.h * v) / max)).toFixed(1)}` : null))
      .filter(Boolean);
    out.push(`<polyline fill="none" stroke="${PALETTE[k % PALETTE.length]}" stroke-width="2" points="${pts.join(' ')}"/>`);
    for (const pt of pts) {
      const [cx, cy] = pt!.split(',');
      out.push(`<circle cx="${cx}" cy="${cy}" r="3" fill="${PALETTE[k % PALETTE.length]}"/>`);
    }
  });
  return out.join('\n');
}

/** Hit rates and TTFT per policy; with a rate sweep, a third panel of TTFT p90 against load. */
export function renderSvg(rep: SimReport): string {
  const rates = [...new Set(rep.policies.map((p) => p.rate_scale))].sort((a, b) => a - b);
  const names = [...new Set(rep.policies.map((p) => p.name))];
  // Bars use the first rate scale (the nominal load) so the panels compare like with like.
  const at = rates.includes(1) ? 1 : rates[0];
  const sel = names.map((n) => rep.policies.find((p) => p.name === n && p.rate_scale === at)!);
  const width = 960;
  const height = rates.length > 1 ? 980 : 680;
  const parts: string[] = [];
  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`,
  );
  parts.push(`<rect width="100%" height="100%" fill="#fff"/>`);
  parts.push(
    `<text x="20" y="28" font-size="16" font-weight="bold">${esc(`kvroute sim: ${rep.trace.source}, ${rep.fleet.workers} workers x ${rep.fleet.gpu_blocks} blocks of ${rep.fleet.block_size}, load x${at}`)}</text>`,
  );
  parts.push(legend(80, 56, names));
  const hitCats = ['pred req-w', 'pred blk-w', 'avail blk-w', 'engine tok-w'];
  parts.push(
    bars(
      { x: 80, y: 100, w: 840, h: 220 },
      'Hit rate per policy (dashed: oracle block-weighted)',
      hitCats,
      sel.map((p) => ({
        name: p.name,
        values: [
          p.hit.predicted_request_weighted,
          p.hit.predicted_block_weighted,
          p.hit.available_block_weighted,
          p.hit.engine_token_weighted,
        ],
      })),
      1,
      (v) => v.toFixed(2),
      { value: rep.oracle.block_weighted, label: `oracle ${rep.oracle.block_weighted.toFixed(3)}` },
    ),
  );
  const ttftMax = niceMax(Math.max(...sel.map((p) => p.ttft_ms.p90)));
  parts.push(
    bars(
      { x: 80, y: 400, w: 840, h: 220 },
      'TTFT per policy (ms)',
      ['p50', 'p90'],
      sel.map((p) => ({ name: p.name, values: [p.ttft_ms.p50, p.ttft_ms.p90] })),
      ttftMax,
      (v) => `${Math.round(v)}`,
    ),
  );
  if (rates.length > 1) {
    const series = names.map((n) => ({
      name: n,
      values: rates.map((r) => rep.policies.find((p) => p.name === n && p.rate_scale === r)?.ttft_ms.p90 ?? NaN),
    }));
    const max = niceMax(Math.max(...series.flatMap((s) => s.values.filter(Number.isFinite))));
    parts.push(lines({ x: 80, y: 700, w: 840, h: 220 }, 'TTFT p90 (ms) against load (rate scale)', rates, series, max));
  }
  parts.push('</svg>');
  return `${parts.join('\n')}\n`;
}

/** Per-tenant TTFT and the fairness index, when the trace names more than one tenant. */
function tenantSection(rep: SimReport): string[] {
  if (!rep.policies.some((p) => p.by_tenant.length > 1)) return [];
  const sweep = new Set(rep.policies.map((p) => p.rate_scale)).size > 1;
  const rows: string[][] = [];
  for (const p of rep.policies) {
    for (const t of p.by_tenant) {
      rows.push([
        `${p.name} ${p.queue_order}${sweep ? ` x${p.rate_scale}` : ''}`,
        t.name,
        String(t.requests),
        `${ms(t.p50)} / ${ms(t.p90)} / ${ms(t.p99)}`,
        String(t.refused),
      ]);
    }
  }
  const jain = rep.policies
    .map(
      (p) =>
        `${p.name} ${p.queue_order}${sweep ? ` x${p.rate_scale}` : ''} ${Number.isFinite(p.fairness.jain) ? p.fairness.jain.toFixed(3) : '-'} (${p.fairness.windows} contended windows)`,
    )
    .join('; ');
  return [
    'TTFT by tenant (including queue wait):',
    table(['run', 'tenant', 'served', 'TTFT p50 / p90 / p99 ms', 'refused'], rows, 2),
    `fairness (Jain's index of service vs max-min fair shares, 30 s windows with queueing): ${jain}`,
    '',
  ];
}
