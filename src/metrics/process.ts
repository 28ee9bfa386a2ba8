/**
 * The process family: the standard process and Node.js series (resident memory, heap, handles, event-loop lag, GC)
 * with the router's prefix, and the event-loop delay of the last window for the live dashboard (the process series
 * have it only cumulatively).
 */
import { type IntervalHistogram, monitorEventLoopDelay } from 'node:perf_hooks';
import { collectDefaultMetrics, type Registry } from 'prom-client';

/** Event-loop delay over the last window (NaN until the first window closes). */
export interface EventLoopLag {
  meanMs: number;
  p99Ms: number;
  maxMs: number;
  windowS: number;
}

export class ProcessSeries {
  private readonly loopDelay: IntervalHistogram;
  private readonly loopTimer: NodeJS.Timeout;
  private window: EventLoopLag = { meanMs: Number.NaN, p99Ms: Number.NaN, maxMs: Number.NaN, windowS: 0 };

  constructor(registry: Registry, p: string, windowMs: number) {
    collectDefaultMetrics({ register: registry, prefix: p, eventLoopMonitoringPrecision: 10 });
    this.loopDelay = monitorEventLoopDelay({ resolution: 10 });
    this.loopDelay.enable();
    this.loopTimer = setInterval(() => {
      const h = this.loopDelay;
      this.window = { meanMs: h.mean / 1e6, p99Ms: h.percentile(99) / 1e6, maxMs: h.max / 1e6, windowS: windowMs / 1000 };
      h.reset();
    }, windowMs);
    this.loopTimer.unref();
  }

  /** The last complete window's event-loop delay. */
  eventLoop(): EventLoopLag {
    return { ...this.window };
  }

  /** Stops the event-loop monitor. */
  stop(): void {
    clearInterval(this.loopTimer);
    this.loopDelay.disable();
  }
}
