/**
 * The rank loop: each data-parallel rank runs its engine on a virtual clock in ms. A step that starts at t lasts
 * durationMs · slowdown (modelled), its outputs and events are delivered after durationMs · slowdown / speedup of wall
 * time, and the next step starts at its modelled end. An idle rank re-syncs its clock to wall time · speedup, so TTFT
 * and latency histograms are in modelled seconds whatever the speedup.
 */
import { performance } from 'node:perf_hooks';
import type { EngineEvent, MockEngine, RequestOutput, StepResult } from './engine/index.ts';

/** Where a request's outputs go (the HTTP response writer). */
export interface Sink {
  onOutput(o: RequestOutput): void;
  /** Writes what onOutput buffered (one socket write per wake). */
  flush(): void;
  onAbort(): void;
  arrivalMs: number;
}

const MAX_STEPS_PER_WAKE = 4;

/**
 * Process-wide wake pump shared by every mocker instance in the process: ranks whose step is due are served in FIFO
 * order within a CPU budget per event-loop turn; the rest wait for the next turn. Without it, N engines that are all due
 * run in the same turn, and at high speedup (CPU-bound) one turn grows with the fleet size, which is exactly the
 * event-loop delay a many-engine process must avoid. Engine state stays per instance; only the turn is shared.
 */
const TURN_BUDGET_MS = 4;
const dueWakes: (() => void)[] = [];
let pumpScheduled = false;

function enqueueWake(fn: () => void): void {
  dueWakes.push(fn);
  if (!pumpScheduled) {
    pumpScheduled = true;
    setImmediate(pump);
  }
}

function pump(): void {
  pumpScheduled = false;
  const t0 = performance.now();
  // Wakes enqueued while pumping (a rank re-arming itself) run next turn.
  let n = dueWakes.length;
  while (n-- > 0) {
    dueWakes.shift()!();
    if (performance.now() - t0 > TURN_BUDGET_MS) break;
  }
  if (dueWakes.length > 0 && !pumpScheduled) {
    pumpScheduled = true;
    setImmediate(pump);
  }
}

/** One data-parallel rank: an engine, its clock and the requests it is serving. */
export class Rank {
  readonly sinks = new Map<string, Sink>();
  inFlight = false;
  idle = true;
  stepStartMs = 0;
  stepEndMs = 0;
  timer: NodeJS.Timeout | null = null;
  /** Bumped by a reset: a wake armed before it must not deliver. */
  generation = 0;

  constructor(
    readonly rank: number,
    readonly engine: MockEngine,
  ) {}

  /** Queued plus running requests: the load a request without a rank header is balanced on. */
  get load(): number {
    return this.engine.numRunning + this.engine.numWaiting;
  }
}

export interface RankLoopOptions {
  /** Wall time runs this many times faster than modelled time. */
  readonly speedup: number;
  /** Read at every step (a live fault setting). */
  slowdown(): number;
  /** False once the instance is closed or dead: armed wakes then deliver nothing. */
  running(): boolean;
  /** The events of one step, in step order (to the KV event publisher). */
  onEvents(rank: number, events: EngineEvent[]): void;
  /** Modelled seconds from arrival to the first token and to the end, per request (engine metrics). */
  onFirstToken(rank: number, seconds: number): void;
  onFinished(rank: number, seconds: number): void;
}

export class RankLoop {
  private readonly wall0 = performance.now();

  constructor(
    readonly ranks: readonly Rank[],
    private readonly opts: RankLoopOptions,
  ) {}

  private wallModelMs(): number {
    return (performance.now() - this.wall0) * this.opts.speedup;
  }

  /** The rank's modelled now: its clock while a step is in flight, wall time once idle. */
  modelNow(r: Rank): number {
    if (r.idle) return Math.max(r.stepEndMs, this.wallModelMs());
    return Math.min(Math.max(this.wallModelMs(), r.stepStartMs), r.stepEndMs);
  }

  /**
   * Runs the next step(s) of a rank. Steps shorter than a timer tick in wall time (high speedup) are run back to back,
   * up to 1 ms of wall time, MAX_STEPS_PER_WAKE steps or 3 ms of CPU, and delivered together: every SSE event is still its own
   * `data:` line, but each stream gets one socket write per wake instead of one per token (writev dominated the CPU).
   */
  kick(r: Rank): void {
    if (r.inFlight || !this.opts.running() || !r.engine.hasWork()) return;
    const { speedup } = this.opts;
    const slowdown = this.opts.slowdown();
    const start = r.idle ? Math.max(r.stepEndMs, this.wallModelMs()) : r.stepEndMs;
    let t = start;
    const cpu0 = performance.now();
    const batch: { res: StepResult; endMs: number }[] = [];
    while (batch.length < MAX_STEPS_PER_WAKE) {
      const res = r.engine.step(t);
      if (res.scheduledRequests === 0) {
        this.opts.onEvents(r.rank, res.events);
        break;
      }
      t += res.durationMs * slowdown;
      batch.push({ res, endMs: t });
      // Also bounded by real CPU time, so one wake never becomes a long task for the event loop.
      if ((t - start) / speedup >= 1 || !r.engine.hasWork() || performance.now() - cpu0 > 3) break;
    }
    if (batch.length === 0) {
      r.idle = true;
      // Not expected (a lone request always fits), but never leave queued work without a next wake.
      if (r.engine.hasWork() && !r.timer) {
        r.timer = setTimeout(() => {
          r.timer = null;
          this.kick(r);
        }, 1);
      }
      return;
    }
    r.idle = false;
    r.inFlight = true;
    r.stepStartMs = start;
    r.stepEndMs = t;
    const wallDelay = (t - start) / speedup;
    const gen = r.generation;
    const done = () => {
      if (!this.opts.running() || gen !== r.generation) return;
      r.inFlight = false;
      const touched = new Set<Sink>();
      for (const b of batch) {
        this.deliver(r, b.res, b.endMs, touched);
        this.opts.onEvents(r.rank, b.res.events);
      }
      for (const s of touched) s.flush();
      if (r.engine.hasWork()) this.kick(r);
      else r.idle = true;
    };
    if (wallDelay < 1) enqueueWake(done);
    else
      r.timer = setTimeout(() => {
        r.timer = null;
        enqueueWake(done);
      }, wallDelay);
  }

  private deliver(r: Rank, res: StepResult, endMs: number, touched: Set<Sink>): void {
    for (const o of res.outputs) {
      const sink = r.sinks.get(o.requestId);
      if (!sink) continue;
      if (o.finished) r.sinks.delete(o.requestId);
      if (o.firstToken) this.opts.onFirstToken(r.rank, Math.max(0, endMs - sink.arrivalMs) / 1000);
      if (o.finished) this.opts.onFinished(r.rank, Math.max(0, endMs - sink.arrivalMs) / 1000);
      sink.onOutput(o);
      touched.add(sink);
    }
  }

  /** Drops everything in flight (a restart or a crash): timers cleared, engines reset, every open response aborted. */
  reset(): void {
    for (const r of this.ranks) {
      if (r.timer) {
        clearTimeout(r.timer);
        r.timer = null;
      }
      r.generation++;
      r.inFlight = false;
      r.idle = true;
      r.engine.reset();
      const sinks = [...r.sinks.values()];
      r.sinks.clear();
      for (const s of sinks) s.onAbort();
    }
  }
}
