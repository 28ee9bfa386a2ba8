/**
 * The league (`kvroute sim --league`): every policy, kvroute's default and each peer's default (src/core/scheduling/
 * peers), on the same traces, seeds and fleets, one table. Rows are trace x load x fleet; each cell is the mean over
 * seeds with its seed-to-seed standard deviation, and a peer "wins beyond the spread" on a row only when it beats
 * kvroute's default on every seed (paired: same trace window, same seed).
 *
 * Traces: `conversation` and `synthetic` (the Mooncake traces in data/traces, 512-token blocks, 8 engines x 8,192
 * blocks, as bench/RESULTS.md; seed k replays the k-th window of `requests` requests, the arrival rate scaled with the
 * fleet so each engine sees the trace's own per-engine load at 1x); `agentic`, `noisy-neighbour` and `pd` (the
 * scenarios, drawn with the seed, their rate already scaled with the fleet). Load 3x divides arrival times by 3.
 *
 * Peers run without kvroute's session affinity (the trace's session ids are stripped for them: none of their defaults
 * has it); kvroute's default keeps it. Every policy runs behind the same admission (the scenario's busy threshold and
 * queue, serve's defaults otherwise): the fleet's, not the router's.
 */
import { existsSync } from 'node:fs';
import { dispatchOptionsFrom, routerOptionsFrom } from '../config/routing.ts';
import { resolveSettings } from '../config/settings.ts';
import { runSettings, type SimSettings, simSchema } from '../config/sim.ts';
import type { DispatchOptions } from '../core/dispatch/dispatcher.ts';
import type { KvKnobs } from '../core/types.ts';
import { PEER_POLICIES } from '../core/scheduling/peers/index.ts';
import { bandedMin } from '../core/scheduling/pickers.ts';
import { DEFAULT_POLICY } from '../core/scheduling/registry.ts';
import { PREFILL_LOAD, pressureDecode } from '../core/scheduling/scorers.ts';
import { ComposedPolicy, type Scorer, unitWeight } from '../core/scheduling/pipeline.ts';
import type { Policy } from '../core/scheduling/policy.ts';
import { type FleetOptions, type FleetResult, runFleet } from './run-fleet.ts';
import { computeOracle } from './oracle.ts';
import { scenario } from './scenarios.ts';
import { TraceHasher } from './traces/expand.ts';
import { TRACE_BLOCK_TOKENS, type TraceRequest } from './traces/format.ts';
import { loadTrace } from './traces/reader.ts';

export const LEAGUE_TRACES = ['conversation', 'synthetic', 'agentic', 'noisy-neighbour', 'pd'] as const;
export type LeagueTrace = (typeof LEAGUE_TRACES)[number];

export const TRACE_FILES: Record<'conversation' | 'synthetic', string> = {
  conversation: 'data/traces/mooncake_conversation_trace.jsonl.gz',
  synthetic: 'data/traces/mooncake_synthetic_trace.jsonl.gz',
};

/** One contender: a policy, and what of kvroute's machinery it runs with. */
export interface LeagueEntry {
  readonly label: string;
  readonly policy: string;
  /** Keeps the trace's session ids (kvroute's session affinity); peers run without. */
  readonly sessions: boolean;
  readonly knobs?: Partial<KvKnobs>;
  /** A fresh policy object per run (ablations). */
  readonly custom?: () => Policy;
  /** Without the scenario's busy thresholds. */
  readonly noBusy?: boolean;
  /** Without the predicted overlay. */
  readonly noOverlay?: boolean;
}

export const KVROUTE_DEFAULT = DEFAULT_POLICY;

/** kvroute's default first, then each peer's default (the registry's peer entries), then kvroute's `kv` and round-robin. */
export const LEAGUE_POLICIES: readonly string[] = [KVROUTE_DEFAULT, ...PEER_POLICIES.map((e) => e.name), 'kv', 'round-robin'];

export function entryFor(policy: string): LeagueEntry {
  return { label: policy, policy, sessions: policy === KVROUTE_DEFAULT };
}

/** Cached blocks only, no load: max(requestBlocks - overlap, 0). */
const UNCACHED: Scorer = {
  name: 'uncached',
  formula: 'max(requestBlocks - overlap, 0)',
  score: (ctx, i) => Math.max(ctx.requestBlocks - ctx.candidates[i].overlapBlocks, 0),
};

/** One block of cost per request running on the source. */
const RUNNING: Scorer = { name: 'running', formula: 'activeRequests', score: (ctx, i) => ctx.candidates[i].activeRequests };

/** kvroute's default with one term or stage turned off at a time (where its advantage comes from), and one candidate. */
export const ABLATIONS: readonly LeagueEntry[] = [
  { label: 'kv-pressure -overlap', policy: KVROUTE_DEFAULT, sessions: true, knobs: { overlapCredit: 0 } },
  {
    label: 'kv-pressure -load',
    policy: 'kv-pressure-no-load',
    sessions: true,
    custom: () => new ComposedPolicy('kv-pressure-no-load', [unitWeight(UNCACHED)], bandedMin(1)),
  },
  {
    label: 'kv-pressure -decode',
    policy: 'kv-pressure-no-decode',
    sessions: true,
    custom: () => new ComposedPolicy('kv-pressure-no-decode', [unitWeight(PREFILL_LOAD)], bandedMin(1)),
  },
  { label: 'kv-pressure -busy', policy: KVROUTE_DEFAULT, sessions: true, noBusy: true },
  { label: 'kv-pressure -sessions', policy: KVROUTE_DEFAULT, sessions: false },
  { label: 'kv-pressure -overlay', policy: KVROUTE_DEFAULT, sessions: true, noOverlay: true },
  // A candidate, not an ablation: the default plus one block of cost per running request (decode concurrency).
  {
    label: 'kv-pressure +requests',
    policy: 'kv-pressure-requests',
    sessions: true,
    custom: () =>
      new ComposedPolicy(
        'kv-pressure-requests',
        [
          { scorer: PREFILL_LOAD, weight: (k) => k.prefillLoadScale, weightName: 'prefillLoadScale' },
          unitWeight(pressureDecode(1 / 64)),
          unitWeight(RUNNING),
        ],
        bandedMin(1),
      ),
  },
];

export interface LeagueOptions {
  readonly traces: readonly LeagueTrace[];
  readonly fleets: readonly number[];
  readonly loads: readonly number[];
  readonly seeds: number;
  /** Requests per run. */
  readonly requests: number;
  readonly entries: readonly LeagueEntry[];
  /** Goodput SLO (defaults: TTFT <= 2 s, ITL <= 50 ms). */
  readonly slo?: { readonly ttftMs: number; readonly itlMs: number };
  readonly onRun?: (done: number, total: number, label: string) => void;
}

/** One run's figures. */
export interface LeagueFigures {
  /** Engine-delivered prefix hits (token-weighted) as a fraction of the ideal shared cache's (oracleTokenWeighted). */
  readonly hit_of_ideal: number;
  /** The router's block-weighted prediction over the same oracle (the README's %oracle). */
  readonly predicted_of_ideal: number;
  readonly ttft_p50: number;
  readonly ttft_p90: number;
  readonly ttft_p99: number;
  readonly itl_p90: number;
  /** Requests within the SLO over requests offered (refused ones count as missed). */
  readonly goodput: number;
  readonly imbalance: number;
  readonly queued: number;
  readonly refused: number;
}

export const FIGURES: ReadonlyArray<keyof LeagueFigures> = [
  'hit_of_ideal',
  'predicted_of_ideal',
  'ttft_p50',
  'ttft_p90',
  'ttft_p99',
  'itl_p90',
  'goodput',
  'imbalance',
  'queued',
  'refused',
];

export interface LeagueCell {
  readonly label: string;
  readonly perSeed: LeagueFigures[];
  readonly mean: LeagueFigures;
  readonly sd: LeagueFigures;
}

export interface LeagueRow {
  readonly trace: LeagueTrace;
  readonly load: number;
  readonly fleet: number;
  readonly requests: number;
  readonly cells: LeagueCell[];
}

export interface LeagueResult {
  readonly seeds: number;
  readonly requests: number;
  readonly slo: { readonly ttftMs: number; readonly itlMs: number };
  readonly rows: LeagueRow[];
}

interface RowInput {
  readonly requests: TraceRequest[];
  readonly settings: SimSettings;
  readonly fleet: Omit<FleetOptions, 'policy'>;
}

function stats(xs: readonly LeagueFigures[]): { mean: LeagueFigures; sd: LeagueFigures } {
  const mean: Record<string, number> = {};
  const sd: Record<string, number> = {};
  for (const k of FIGURES) {
    const v = xs.map((x) => x[k]).filter((x) => Number.isFinite(x));
    const m = v.length ? v.reduce((a, b) => a + b, 0) / v.length : NaN;
    mean[k] = m;
    sd[k] = v.length > 1 ? Math.sqrt(v.reduce((a, b) => a + (b - m) ** 2, 0) / (v.length - 1)) : 0;
  }
  return { mean: mean as unknown as LeagueFigures, sd: sd as unknown as LeagueFigures };
}

/**
 * The ideal shared cache in the engines' unit: tokens. A request can reuse its leading trace blocks seen in any earlier
 * request, up to its prompt less one token (an engine always computes the last one), over all prompt tokens.
 */
export function oracleTokenWeighted(requests: readonly TraceRequest[]): number {
  const seen = new Set<number>();
  let reused = 0;
  let total = 0;
  for (const r of requests) {
    let k = 0;
    while (k < r.hashIds.length && seen.has(r.hashIds[k])) k++;
    for (const id of r.hashIds) seen.add(id);
    reused += Math.min(k * TRACE_BLOCK_TOKENS, Math.max(0, r.inputLength - 1));
    total += r.inputLength;
  }
  return total > 0 ? reused / total : 0;
}

function figures(r: FleetResult, oracle: { tokens: number; blocks: number }, offered: number): LeagueFigures {
  return {
    hit_of_ideal: oracle.tokens > 0 ? r.hit.engine_token_weighted / oracle.tokens : NaN,
    predicted_of_ideal: oracle.blocks > 0 ? r.hit.predicted_block_weighted / oracle.blocks : NaN,
    ttft_p50: r.ttft_ms.p50,
    ttft_p90: r.ttft_ms.p90,
    ttft_p99: r.ttft_ms.p99,
    itl_p90: r.itl_ms.p90,
    goodput: offered > 0 ? (r.goodput.fraction * r.requests.served) / offered : NaN,
    imbalance: r.imbalance,
    queued: r.requests.queued,
    refused: r.requests.refused,
  };
}

/** Loads the Mooncake traces the run needs (once), or throws a clear error when they are not there. */
export async function loadLeagueTraces(traces: readonly LeagueTrace[]): Promise<Map<string, TraceRequest[]>> {
  const out = new Map<string, TraceRequest[]>();
  for (const t of traces) {
    if (t !== 'conversation' && t !== 'synthetic') continue;
    const path = TRACE_FILES[t];
    if (!existsSync(path)) throw new Error(`trace ${t} needs ${path} (run the league from the repository root)`);
    out.set(t, (await loadTrace(path)).requests);
  }
  return out;
}

function settingsFor(values: Record<string, unknown>, path: string): SimSettings {
  return resolveSettings(simSchema, { flags: {}, file: { path, values } }).config;
}

function rowInput(trace: LeagueTrace, fleet: number, seedIndex: number, n: number, files: Map<string, TraceRequest[]>): RowInput {
  const seed = seedIndex + 1;
  if (trace === 'conversation' || trace === 'synthetic') {
    const all = files.get(trace)!;
    // Seed k: the k-th window of the trace (wrapping when the trace is shorter than seeds x requests).
    const start = (seedIndex * n) % Math.max(1, all.length - n + 1);
    const requests = all.slice(start, start + n);
    return {
      requests,
      settings: settingsFor({ blockSize: 512, seed }, `league ${trace}`),
      // 8 engines replay the trace at its own rate; a larger fleet gets proportionally more traffic.
      fleet: { workers: fleet, blockSize: 512, gpuBlocks: 8192, seed, rateScale: fleet / 8 },
    };
  }
  const sc = scenario(trace, seed, n, { workers: fleet });
  return {
    requests: sc.requests,
    settings: settingsFor({ blockSize: sc.fleet.blockSize, seed, ...sc.settings }, `scenario ${trace}`),
    fleet: { ...sc.fleet },
  };
}

/**
 * On a P/D fleet kvroute routes each leg with its own policy (pd-prefill, pd-decode); a peer routes both legs with its
 * rule (Dynamo's and SMG's P/D routers run the same selection on each pool; llm-d runs its profile per pool).
 */
function legPolicies(d: DispatchOptions, entry: LeagueEntry, fleet: RowInput['fleet']): DispatchOptions {
  if (fleet.decodeWorkers === undefined || entry.policy === KVROUTE_DEFAULT || entry.custom) return d;
  return { ...d, pd: { ...d.pd, prefillPolicy: entry.policy, decodePolicy: entry.policy } };
}

/** Runs the league: every entry on every row and seed. */
export async function runLeague(opts: LeagueOptions): Promise<LeagueResult> {
  const files = await loadLeagueTraces(opts.traces);
  const slo = opts.slo ?? { ttftMs: 2000, itlMs: 50 };
  const total = opts.traces.length * opts.fleets.length * opts.loads.length * opts.seeds * opts.entries.length;
  let done = 0;
  const rows: LeagueRow[] = [];
  for (const trace of opts.traces) {
    for (const fleet of opts.fleets) {
      const inputs = Array.from({ length: opts.seeds }, (_, k) => rowInput(trace, fleet, k, opts.requests, files));
      const oracles = inputs.map((i) => ({ tokens: oracleTokenWeighted(i.requests), blocks: computeOracle(i.requests).blockWeighted }));
      const hashers = inputs.map((i) => new TraceHasher(i.settings.blockSize));
      for (const load of opts.loads) {
        const perEntry = opts.entries.map(() => [] as LeagueFigures[]);
        for (let k = 0; k < opts.seeds; k++) {
          const input = inputs[k];
          const stripped = input.requests.map((r) => {
            if (r.sessionId === undefined) return r;
            const { sessionId: _drop, ...rest } = r;
            return rest;
          });
          for (const [e, entry] of opts.entries.entries()) {
            const label = `${trace} x${load} ${fleet} engines seed ${k + 1}: ${entry.label}`;
            opts.onRun?.(done, total, label);
            const run = runSettings(input.settings, {
              policy: (entry.custom ? 'kv-pressure' : entry.policy) as SimSettings['policy'][number],
              queueOrder: 'fair',
              disaggMinUncachedTokens: input.settings.disaggMinUncachedTokens[0] ?? 0,
            });
            const router = routerOptionsFrom(run);
            const r = runFleet(entry.sessions ? input.requests : stripped, {
              ...input.fleet,
              policy: entry.policy,
              customPolicy: entry.custom?.(),
              rateScale: (input.fleet.rateScale ?? 1) * load,
              hasher: hashers[k],
              slo,
              router: {
                ...router,
                policy: entry.policy,
                knobs: { ...router.knobs, ...entry.knobs },
                ...(entry.noBusy ? { busy: {} } : {}),
                ...(entry.noOverlay ? { overlay: false } : {}),
              },
              dispatch: legPolicies(dispatchOptionsFrom(run), entry, input.fleet),
            });
            perEntry[e].push(figures(r, oracles[k], input.requests.length));
            done++;
          }
        }
        rows.push({
          trace,
          load,
          fleet,
          requests: opts.requests,
          cells: opts.entries.map((entry, e) => ({ label: entry.label, perSeed: perEntry[e], ...stats(perEntry[e]) })),
        });
      }
    }
  }
  opts.onRun?.(done, total, 'done');
  return { seeds: opts.seeds, requests: opts.requests, slo, rows };
}

// ------------------------------------------------------------------------------------------------ report

const pct = (x: number) => (Number.isFinite(x) ? `${Math.round(100 * x)}%` : '-');
const msf = (x: number) => (Number.isFinite(x) ? (x >= 10_000 ? `${(x / 1000).toFixed(1)}s` : `${Math.round(x)}`) : '-');
const f2 = (x: number) => (Number.isFinite(x) ? x.toFixed(2) : '-');
const int = (x: number) => (Number.isFinite(x) ? `${Math.round(x)}` : '-');

function withSpread(m: number, s: number, fmt: (x: number) => string): string {
  return s > 0 && Number.isFinite(s) ? `${fmt(m)} ±${fmt(s)}` : fmt(m);
}

/** A peer beats `base` on this figure on every seed (paired). Lower is better unless `higher`. */
function beatsEverySeed(peer: LeagueCell, base: LeagueCell, k: keyof LeagueFigures, higher: boolean): boolean {
  if (peer.perSeed.length === 0) return false;
  return peer.perSeed.every((p, i) => {
    const a = p[k];
    const b = base.perSeed[i]?.[k];
    return Number.isFinite(a) && Number.isFinite(b) && (higher ? a > b : a < b);
  });
}

/** Per row: where kvroute's default stands, and every peer that beats it on every seed. */
export interface RowVerdict {
  readonly row: string;
  readonly goodputRank: number;
  readonly ttftP90Rank: number;
  readonly beatenOnGoodput: Array<{ label: string; by: number }>;
  readonly beatenOnTtftP90: Array<{ label: string; by: number }>;
}

export function verdicts(res: LeagueResult): RowVerdict[] {
  return res.rows.map((row) => {
    const base = row.cells.find((c) => c.label === KVROUTE_DEFAULT) ?? row.cells[0];
    const others = row.cells.filter((c) => c !== base && !c.label.startsWith(`${KVROUTE_DEFAULT} `));
    const rank = (k: keyof LeagueFigures, higher: boolean) =>
      1 + others.filter((c) => (higher ? c.mean[k] > base.mean[k] : c.mean[k] < base.mean[k])).length;
    return {
      row: `${row.trace} x${row.load} ${row.fleet}`,
      goodputRank: rank('goodput', true),
      ttftP90Rank: rank('ttft_p90', false),
      beatenOnGoodput: others
        .filter((c) => beatsEverySeed(c, base, 'goodput', true))
        .map((c) => ({ label: c.label, by: c.mean.goodput - base.mean.goodput })),
      beatenOnTtftP90: others
        .filter((c) => beatsEverySeed(c, base, 'ttft_p90', false))
        .map((c) => ({ label: c.label, by: base.mean.ttft_p90 - c.mean.ttft_p90 })),
    };
  });
}

/** The Markdown report: one table per row (trace, load, fleet), then the verdicts. */
export function formatLeague(res: LeagueResult): string {
  const out: string[] = [];
  out.push(
    `League: ${res.seeds} seeds x ${res.requests} requests per run; mean ±sd over seeds. hit = engine-delivered prefix hits ` +
      `as % of an ideal shared cache's (both token-weighted); goodput = requests with TTFT <= ${res.slo.ttftMs} ms ` +
      `and ITL <= ${res.slo.itlMs} ms over requests offered; imbal = max/mean prefill tokens computed per engine. Peers run ` +
      'without session affinity; kvroute (kv-pressure) keeps it.',
  );
  for (const row of res.rows) {
    out.push('', `### ${row.trace}, load ${row.load}x, ${row.fleet} engines`, '');
    out.push('| policy | hit | TTFT p50 | TTFT p90 | TTFT p99 | ITL p90 | goodput | imbal | queued | refused |');
    out.push('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
    for (const c of row.cells) {
      const m = c.mean;
      const s = c.sd;
      out.push(
        `| ${c.label} | ${withSpread(m.hit_of_ideal, s.hit_of_ideal, pct)} | ${withSpread(m.ttft_p50, s.ttft_p50, msf)} | ` +
          `${withSpread(m.ttft_p90, s.ttft_p90, msf)} | ${withSpread(m.ttft_p99, s.ttft_p99, msf)} | ` +
          `${withSpread(m.itl_p90, s.itl_p90, f2)} | ${withSpread(m.goodput, s.goodput, pct)} | ${withSpread(m.imbalance, s.imbalance, f2)} | ` +
          `${int(m.queued)} | ${int(m.refused)} |`,
      );
    }
  }
  out.push('', '### Verdict per row (kvroute default: rank among the peers; peers better on every seed)', '');
  out.push('| row | goodput rank | TTFT p90 rank | peers better on goodput, every seed | peers better on TTFT p90, every seed |');
  out.push('|---|---:|---:|---|---|');
  for (const v of verdicts(res)) {
    const g = v.beatenOnGoodput.map((b) => `${b.label} (+${(100 * b.by).toFixed(1)} pts)`).join(', ') || 'none';
    const t = v.beatenOnTtftP90.map((b) => `${b.label} (-${Math.round(b.by)} ms)`).join(', ') || 'none';
    out.push(`| ${v.row} | ${v.goodputRank} | ${v.ttftP90Rank} | ${g} | ${t} |`);
  }
  return out.join('\n');
}

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

/**
 * The plot: a grid of rows (trace, load, fleet) by policies, each cell coloured by its TTFT p90 over kvroute's
 * default on that row (green: faster, red: slower, log scale, clamped at 4x either way) and labelled with that ratio
 * and the hit.
 */
export function renderLeagueSvg(res: LeagueResult): string {
  const labels = res.rows[0]?.cells.map((c) => c.label) ?? [];
  const cw = 92;
  const ch = 26;
  const left = 190;
  const top = 120;
  const width = left + cw * labels.length + 20;
  const height = top + ch * res.rows.length + 40;
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="11">`,
    `<text x="10" y="20" font-size="14">TTFT p90 / kvroute default's (colour, ratio) and hit % of ideal, mean of ${res.seeds} seeds</text>`,
  ];
  labels.forEach((l, j) => {
    const x = left + j * cw + cw / 2;
    out.push(`<text x="${x}" y="${top - 8}" transform="rotate(-40 ${x} ${top - 8})">${esc(l)}</text>`);
  });
  res.rows.forEach((row, i) => {
    const y = top + i * ch;
    out.push(`<text x="10" y="${y + ch / 2 + 4}">${esc(`${row.trace} ${row.load}x, ${row.fleet} engines`)}</text>`);
    const base = row.cells.find((c) => c.label === KVROUTE_DEFAULT) ?? row.cells[0];
    row.cells.forEach((c, j) => {
      const ratio = c.mean.ttft_p90 / base.mean.ttft_p90;
      const t = Number.isFinite(ratio) ? Math.max(-1, Math.min(1, Math.log(ratio) / Math.log(4))) : 0;
      const red = t > 0 ? 255 : Math.round(255 * (1 + t));
      const green = t < 0 ? 255 : Math.round(255 * (1 - t));
      const fill = `rgb(${red},${green},${Math.round(255 * (1 - Math.abs(t)))})`;
      const x = left + j * cw;
      out.push(`<rect x="${x}" y="${y}" width="${cw - 2}" height="${ch - 2}" fill="${fill}"/>`);
      const text = `${Number.isFinite(ratio) ? ratio.toFixed(2) : '-'} · ${pct(c.mean.hit_of_ideal)}`;
      out.push(`<text x="${x + cw / 2 - 1}" y="${y + ch / 2 + 3}" text-anchor="middle">${text}</text>`);
    });
  });
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}
