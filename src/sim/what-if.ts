/**
 * `kvroute sim --what-if`: one simulator run feeds the miss-ratio curves the live router keeps (MrcBook, src/core/mrc.ts,
 * through FleetOptions.mrc as src/runtime/mrc-feed.ts does), and their answers for other fleets are printed beside the
 * run's measured hit; with `check`, each of those fleets is simulated too and measured beside predicted, with the error.
 *
 * Every hit figure is block-weighted and delivered: Σ floor(cached tokens / block size) / Σ prompt blocks over the
 * requests that got a first token (FleetResult.hit.delivered_block_weighted), which is what the curve predicts.
 */
import { MRC_DEFAULTS, MrcBook, type MrcOptions, type MrcReport } from '../core/mrc.ts';
import type { TraceRequest } from './traces/format.ts';
import { type FleetOptions, type FleetResult, runFleet } from './run-fleet.ts';

/** The scale-up factors, engines added and the host tier the what-if answers (the issue's fleets). */
export const WHAT_IF_SCALE_UP: readonly number[] = [0.5, 2, 4];
export const WHAT_IF_SCALE_OUT: readonly number[] = [1, 2, 4];

export interface WhatIfAnswer {
  /** scale_up: every engine k x its KV blocks; scale_out: m more engines of today's size; host_tier: N host blocks per engine. */
  readonly kind: 'today' | 'scale_up' | 'scale_out' | 'host_tier';
  readonly label: string;
  /** The fleet the answer is about. */
  readonly engines: number;
  readonly gpu_blocks: number;
  readonly host_blocks: number;
  /** The curve's answer (null when it has none: no sampled traffic). */
  readonly predicted: number | null;
  /** The simulator's delivered block-weighted hit of that fleet on the same trace (null when not run). */
  readonly measured: number | null;
  /** predicted - measured (null unless both). */
  readonly error: number | null;
}

export interface WhatIfResult {
  readonly method: string;
  readonly policy: string;
  readonly requests: number;
  readonly sample_rate: number;
  readonly max_samples: number;
  readonly memory_bytes: number;
  /** Today's locality (engines' curves at 1x over the shared curve at 1x): the scale-up (above 1x) and scale-out factor. */
  readonly locality: number | null;
  /** The router credits host-tier blocks (--tier-credit): which host-tier answer applies. */
  readonly tier_credit: boolean;
  /** The other fleets were simulated too (measured and error filled). */
  readonly checked: boolean;
  /** The first row is today's fleet (measured: this run; predicted: the engines' own curves at 1x). */
  readonly answers: readonly WhatIfAnswer[];
  /** Largest |error| over the answers checked (null when none was). */
  readonly worst_error: number | null;
  /** The full curve report (what GET /debug/mrc serves), for the curve points and per-engine figures. */
  readonly curve: MrcReport;
}

export interface WhatIfOptions {
  /** The run's fleet (the what-if fleets change workers, gpuBlocks and engine.hostBlocks only). */
  readonly fleet: FleetOptions;
  /** Host-tier size per engine for its answer (blocks). */
  readonly hostBlocks: number;
  /** Simulate each answer's fleet too. */
  readonly check: boolean;
  readonly mrc?: MrcOptions;
  /** Called before each run: index (0 = today's), total runs, what it is. */
  readonly onRun?: (index: number, total: number, label: string) => void;
  /** Progress within a run (requests arrived of the trace). */
  readonly onProgress?: (done: number, total: number) => void;
}

/** The base run with the tap, then the answers (and with `check` the runs that measure them). */
export function runWhatIf(requests: readonly TraceRequest[], o: WhatIfOptions): { base: FleetResult; whatIf: WhatIfResult } {
  const fleet = o.fleet;
  if (fleet.prefillWorkers !== undefined || fleet.decodeWorkers !== undefined) {
    throw new RangeError('--what-if answers for aggregated fleets only (no prefill/decode workers)');
  }
  if ((fleet.engine?.hostBlocks ?? 0) > 0) {
    throw new RangeError(
      '--what-if answers for a fleet without a host tier today: drop --host-blocks (the host-tier answer is --what-if-host-blocks)',
    );
  }
  const G = fleet.gpuBlocks;
  const credit = (fleet.router?.knobs?.hostTierCredit ?? 0) > 0;
  const N = fleet.workers;
  const book = new MrcBook(o.mrc ?? MRC_DEFAULTS);
  const total = o.check ? 1 + WHAT_IF_SCALE_UP.length + WHAT_IF_SCALE_OUT.length + 1 : 1;
  o.onRun?.(0, total, `today: ${N} engines x ${G} blocks (the curves' traffic)`);
  const base = runFleet(requests, { ...fleet, mrc: book, onProgress: o.onProgress });
  const curve = book.report(() => G, o.hostBlocks, [0.5, 1, 2, 4]);
  const up = (k: number) => curve.scaleUp.find((p) => p.factor === k)?.hit ?? null;
  type Plan = Omit<WhatIfAnswer, 'measured' | 'error'>;
  const plans: Plan[] = [
    ...WHAT_IF_SCALE_UP.map(
      (k): Plan => ({
        kind: 'scale_up',
        label: `${k}x KV per engine`,
        engines: N,
        gpu_blocks: Math.max(1, Math.round(k * G)),
        host_blocks: 0,
        predicted: up(k),
      }),
    ),
    ...WHAT_IF_SCALE_OUT.map(
      (m): Plan => ({
        kind: 'scale_out',
        label: `+${m} engine${m === 1 ? '' : 's'}`,
        engines: N + m,
        gpu_blocks: G,
        host_blocks: 0,
        predicted: curve.scaleOut.find((p) => p.enginesAdded === m)?.hit ?? null,
      }),
    ),
    {
      kind: 'host_tier',
      label: `+host tier (${credit ? 'credited' : 'not credited'})`,
      engines: N,
      gpu_blocks: G,
      host_blocks: o.hostBlocks,
      // A router that credits the tier's blocks keeps each prefix's traffic where the tier holds it (the locality answer);
      // one that does not keeps today's routing (each engine's own curve at its GPU + host blocks): bench:mrc --parts host.
      predicted: (credit ? curve.hostTier?.hit : curve.hostTier?.hitFixedRouting) ?? null,
    },
  ];
  const today: WhatIfAnswer = withMeasured(
    { kind: 'today', label: 'today', engines: N, gpu_blocks: G, host_blocks: 0, predicted: up(1) },
    base.hit.delivered_block_weighted,
  );
  const answers: WhatIfAnswer[] = [today];
  for (const [i, p] of plans.entries()) {
    if (!o.check) {
      answers.push({ ...p, measured: null, error: null });
      continue;
    }
    o.onRun?.(
      i + 1,
      total,
      `${p.label}: ${p.engines} engines x ${p.gpu_blocks} blocks${p.host_blocks > 0 ? ` + ${p.host_blocks} host` : ''}`,
    );
    answers.push(withMeasured(p, measure(requests, fleet, p, o.onProgress)));
  }
  let worst: number | null = null;
  for (const a of answers) if (a.error !== null) worst = Math.max(worst ?? 0, Math.abs(a.error));
  return {
    base,
    whatIf: {
      method: curve.method,
      policy: fleet.policy,
      requests: curve.requests,
      sample_rate: curve.sampleRate,
      max_samples: curve.maxSamples,
      memory_bytes: curve.memoryBytes,
      locality: curve.locality,
      tier_credit: credit,
      checked: o.check,
      answers,
      worst_error: worst,
      curve,
    },
  };
}

function withMeasured(p: Omit<WhatIfAnswer, 'measured' | 'error'>, measured: number): WhatIfAnswer {
  const m = Number.isFinite(measured) ? measured : null;
  return { ...p, measured: m, error: m !== null && p.predicted !== null ? p.predicted - m : null };
}

/** The delivered block-weighted hit of the fleet an answer describes, on the same trace and settings. */
export function measure(
  requests: readonly TraceRequest[],
  fleet: FleetOptions,
  p: Pick<WhatIfAnswer, 'engines' | 'gpu_blocks' | 'host_blocks'>,
  onProgress?: (done: number, total: number) => void,
): number {
  const r = runFleet(requests, {
    ...fleet,
    workers: p.engines,
    gpuBlocks: p.gpu_blocks,
    ...(p.host_blocks > 0 && { engine: { ...fleet.engine, hostBlocks: p.host_blocks } }),
    onProgress,
  });
  return r.hit.delivered_block_weighted;
}

const f3 = (x: number | null) => (x === null ? '-' : x.toFixed(3));
const signed = (x: number | null) => (x === null ? '-' : `${x >= 0 ? '+' : ''}${x.toFixed(3)}`);
const n = (x: number) => x.toLocaleString('en-US');

/** The human table. */
export function formatWhatIf(w: WhatIfResult): string {
  const lines: string[] = [];
  lines.push(
    `what-if (policy ${w.policy}): the live miss-ratio curves (the MrcBook \`kvroute serve\` keeps), fed this run's routing: ` +
      `${n(w.requests)} routed requests, sample rate ${w.sample_rate.toPrecision(3)}, ${n(Math.round(w.memory_bytes / 1024))} KiB; ` +
      `locality ${w.locality === null ? 'n/a' : w.locality.toFixed(3)}`,
  );
  lines.push(
    'block-weighted hit the engines deliver (cached blocks / prompt blocks), predicted by the curve and measured by the simulator:',
  );
  const header = ['what', 'fleet', 'predicted', 'measured', 'error'];
  const rows = w.answers.map((a) => [
    a.label,
    `${a.engines} x ${n(a.gpu_blocks)} blocks${a.host_blocks > 0 ? ` + ${n(a.host_blocks)} host` : ''}`,
    f3(a.predicted),
    f3(a.measured),
    signed(a.error),
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) => cells.map((c, i) => (i < 2 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ');
  lines.push(line(header), widths.map((x) => '-'.repeat(x)).join('  '), ...rows.map(line));
  if (w.checked)
    lines.push(`worst |error| ${w.worst_error === null ? '-' : w.worst_error.toFixed(3)} (each fleet simulated on the same trace)`);
  else lines.push('measured: today only; --what-if-check simulates each fleet too (7 more runs) and prints the error');
  return `${lines.join('\n')}\n`;
}
