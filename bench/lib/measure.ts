/** Shared measuring helpers for benchmarks: GC pause log, heap size, latency percentiles. */
import { constants, PerformanceObserver, performance } from 'node:perf_hooks';

export interface GcPause {
  readonly start: number;
  readonly duration: number;
  readonly kind: string;
  readonly forced: boolean;
}

const KINDS: Record<number, string> = {
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'major',
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'minor',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weakcb',
};

/** Records every GC pause of the process (entries arrive asynchronously: call `settle()` before reading). */
export class GcLog {
  readonly pauses: GcPause[] = [];
  private readonly observer: PerformanceObserver;

  constructor() {
    this.observer = new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        const detail = (e as unknown as { detail?: { kind: number; flags: number } }).detail;
        this.pauses.push({
          start: e.startTime,
          duration: e.duration,
          kind: KINDS[detail?.kind ?? 0] ?? 'other',
          forced: ((detail?.flags ?? 0) & constants.NODE_PERFORMANCE_GC_FLAGS_FORCED) !== 0,
        });
      }
    });
    this.observer.observe({ entryTypes: ['gc'] });
  }

  /** Lets queued GC entries be delivered. */
  async settle(): Promise<void> {
    await new Promise((r) => setTimeout(r, 5));
  }

  /** Unforced pauses starting inside any of the windows. */
  inWindows(windows: ReadonlyArray<readonly [number, number]>): GcPause[] {
    return this.pauses.filter((p) => !p.forced && windows.some(([a, b]) => p.start >= a && p.start <= b));
  }

  /** Longest unforced pause starting inside any of the windows. */
  longestIn(windows: ReadonlyArray<readonly [number, number]>): GcPause | null {
    let best: GcPause | null = null;
    for (const p of this.pauses) {
      if (p.forced) continue;
      if (!windows.some(([a, b]) => p.start >= a && p.start <= b)) continue;
      if (!best || p.duration > best.duration) best = p;
    }
    return best;
  }

  stop(): void {
    this.observer.disconnect();
  }
}

declare const gc: (() => void) | undefined;

/** heapUsed + arrayBuffers after full collections (typed arrays live in arrayBuffers). Needs --expose-gc. */
export function heapBytes(): number {
  if (typeof gc !== 'function') throw new Error('run with node --expose-gc');
  gc();
  gc();
  const m = process.memoryUsage();
  return m.heapUsed + m.arrayBuffers;
}

export function percentile(sorted: Float64Array, q: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)];
}

export interface Latency {
  readonly calls: number;
  readonly p50: number;
  readonly p99: number;
  readonly max: number;
  readonly mean: number;
  /** p99 of each round, ascending; the median round is robust to a burst of load from other processes. */
  readonly roundP99: readonly number[];
}

/**
 * Times individual calls (microseconds) in `rounds` rounds of `callsPerRound`, cycling through inputs, after an
 * untimed warm-up.
 */
export function latencyRounds<T>(inputs: readonly T[], rounds: number, callsPerRound: number, fn: (input: T) => void): Latency {
  const calls = rounds * callsPerRound;
  for (let i = 0; i < Math.ceil(calls / 10); i++) fn(inputs[i % inputs.length]);
  const times = new Float64Array(calls);
  const roundP99: number[] = [];
  let sum = 0;
  for (let r = 0; r < rounds; r++) {
    for (let k = 0; k < callsPerRound; k++) {
      const i = r * callsPerRound + k;
      const input = inputs[i % inputs.length];
      const t = performance.now();
      fn(input);
      const dt = (performance.now() - t) * 1000;
      times[i] = dt;
      sum += dt;
    }
    roundP99.push(percentile(times.slice(r * callsPerRound, (r + 1) * callsPerRound).sort(), 0.99));
  }
  times.sort();
  roundP99.sort((a, b) => a - b);
  return { calls, p50: percentile(times, 0.5), p99: percentile(times, 0.99), max: times[calls - 1], mean: sum / calls, roundP99 };
}

/** Times `calls` individual calls (microseconds) in one round (used by other benches: keep this signature). */
export function latency<T>(inputs: readonly T[], calls: number, fn: (input: T) => void): Latency {
  return latencyRounds(inputs, 1, calls, fn);
}

/**
 * Per-call process CPU time (getrusage, microsecond resolution, all threads): the cost of the code itself, without the
 * time the process spent descheduled. On a machine shared with other jobs, wall-clock p99 mostly measures the
 * scheduler; this measures the code. Resolution is 1 us, and the call itself adds ~1 us.
 */
export function cpuLatency<T>(inputs: readonly T[], calls: number, fn: (input: T) => void): { p50: number; p99: number } {
  for (let i = 0; i < Math.ceil(calls / 10); i++) fn(inputs[i % inputs.length]);
  const times = new Float64Array(calls);
  for (let i = 0; i < calls; i++) {
    const input = inputs[i % inputs.length];
    const c0 = process.cpuUsage();
    fn(input);
    const c = process.cpuUsage(c0);
    times[i] = c.user + c.system;
  }
  times.sort();
  return { p50: percentile(times, 0.5), p99: percentile(times, 0.99) };
}
