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
}

/** Times `calls` individual calls (microseconds), cycling through inputs, after an untimed warm-up. */
export function latency<T>(inputs: readonly T[], calls: number, fn: (input: T) => void, warmup = Math.ceil(calls / 10)): Latency {
  for (let i = 0; i < warmup; i++) fn(inputs[i % inputs.length]);
  const times = new Float64Array(calls);
  let sum = 0;
  for (let i = 0; i < calls; i++) {
    const input = inputs[i % inputs.length];
    const t = performance.now();
    fn(input);
    const dt = (performance.now() - t) * 1000;
    times[i] = dt;
    sum += dt;
  }
  times.sort();
  return { calls, p50: percentile(times, 0.5), p99: percentile(times, 0.99), max: times[calls - 1], mean: sum / calls };
}
