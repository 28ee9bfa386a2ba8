/**
 * The HTTP shell's side of the core dispatcher: it carries out the effects the dispatcher returns (an attempt to send, a
 * refusal to answer, a finished request to count), wakes the dispatcher at the time it asks for, and gives each HTTP
 * handler a promise for its request's next step. It decides nothing.
 */
import type { Logger } from 'pino';
import type {
  DispatchAttempt,
  DispatchEffect,
  Dispatcher,
  DispatchRefusal,
  FinishReport,
  PrefillReport,
  Submission,
} from '../core/dispatch/dispatcher.ts';
import type { FlowMetrics } from '../metrics/flow.ts';
import type { RouterMetrics } from '../metrics/registry.ts';

export type NextStep = DispatchAttempt | DispatchRefusal | { readonly kind: 'aborted' };

/**
 * What an HTTP handler asks of the lifecycle: the Lifecycle itself in one process; with `--processes` a shell's proxy of
 * the primary's (src/server/cluster/), so every decision is still made by the one dispatcher.
 */
export type LifecyclePort = Pick<Lifecycle, 'submit' | 'failed' | 'prefillFailed' | 'prefillDone' | 'firstToken' | 'finish'>;

export class Lifecycle {
  private readonly waiters = new Map<string, (step: NextStep) => void>();
  private timer: NodeJS.Timeout | undefined;
  private timerAt = Infinity;
  private readonly finishedExtra = new Map<string, number | undefined>();

  /** Told of every attempt dispatched (a NATS replica shares the sessions it pins). */
  private readonly dispatchListeners: ((a: DispatchAttempt) => void)[] = [];
  /** Told of every submission and every finish (the traffic recorder, src/runtime/recorder.ts). */
  private readonly submitListeners: ((sub: Submission, now: number) => void)[] = [];
  private readonly refuseListeners: ((r: DispatchRefusal) => void)[] = [];
  private readonly finishListeners: ((requestId: string, report: FinishReport, outputTokens: number | undefined) => void)[] = [];

  constructor(
    readonly dispatcher: Dispatcher,
    private readonly metrics: RouterMetrics,
    private readonly flow: FlowMetrics,
    private readonly log: Logger,
    private readonly now: () => number = Date.now,
  ) {}

  onDispatch(listener: (a: DispatchAttempt) => void): void {
    this.dispatchListeners.push(listener);
  }

  onSubmit(listener: (sub: Submission, now: number) => void): void {
    this.submitListeners.push(listener);
  }

  onRefuse(listener: (r: DispatchRefusal) => void): void {
    this.refuseListeners.push(listener);
  }

  onFinish(listener: (requestId: string, report: FinishReport, outputTokens: number | undefined) => void): void {
    this.finishListeners.push(listener);
  }

  /** Routes (or queues) a request; resolves with its first attempt or its refusal, or 'aborted' if the client left. */
  submit(sub: Submission, signal: AbortSignal): Promise<NextStep> {
    if (this.submitListeners.length > 0) {
      const now = this.now();
      for (const l of this.submitListeners) l(sub, now);
    }
    return this.wait(sub.requestId, signal, () => this.dispatcher.submit(sub, this.now()));
  }

  /** The attempt failed before the engine answered: resolves with the next attempt or the final refusal. */
  failed(requestId: string, error: string, signal: AbortSignal): Promise<NextStep> {
    return this.wait(requestId, signal, () => this.dispatcher.failed(requestId, error, this.now()));
  }

  /**
   * A gateway's proxy served the attempt on another worker (its fallback): the new attempt there, the refusal, or null
   * when the dispatcher had nothing to change. Synchronous: the request is under way, nothing waits.
   */
  servedElsewhere(requestId: string, workerId: string, error: string): DispatchAttempt | DispatchRefusal | null {
    const effects = this.dispatcher.servedElsewhere(requestId, workerId, error, this.now());
    const mine = effects.find((e): e is DispatchAttempt | DispatchRefusal => e.kind !== 'finished' && e.requestId === requestId);
    this.apply(effects.filter((e) => e !== mine));
    return mine ?? null;
  }

  /** The prefill leg failed before answering: resolves with a new prefill leg, decode alone, or the final refusal. */
  prefillFailed(requestId: string, error: string, signal: AbortSignal): Promise<NextStep> {
    return this.wait(requestId, signal, () => this.dispatcher.prefillFailed(requestId, error, this.now()));
  }

  /** The prefill leg answered (its cached tokens are the request's delivered reuse). */
  prefillDone(requestId: string, report: PrefillReport): void {
    this.apply(this.dispatcher.prefillDone(requestId, report, this.now()));
  }

  firstToken(requestId: string): void {
    this.apply(this.dispatcher.firstToken(requestId, this.now()));
  }

  finish(requestId: string, report: FinishReport, outputTokens?: number): void {
    for (const l of this.finishListeners) l(requestId, report, outputTokens);
    this.finishedExtra.set(requestId, outputTokens);
    this.apply(this.dispatcher.finish(requestId, { ...report, ...(outputTokens ? { outputTokens } : {}) }, this.now()));
    this.finishedExtra.delete(requestId);
    this.metrics.outcome(report.outcome);
  }

  /** Effects from anywhere else (workers added, health changes). */
  apply(effects: readonly DispatchEffect[]): void {
    for (const e of effects) {
      if (e.kind === 'finished') {
        this.metrics.finished(e.request, { outputTokens: this.finishedExtra.get(e.request.requestId) });
        continue;
      }
      if (e.kind === 'dispatch') {
        this.flow.dispatched(e);
        for (const l of this.dispatchListeners) l(e);
      } else {
        this.flow.refused(e);
        for (const l of this.refuseListeners) l(e);
      }
      const waiter = this.waiters.get(e.requestId);
      if (!waiter) {
        // Nobody waits: the handler left (its client did) between the dispatcher's decision and now. Give it back.
        if (e.kind === 'dispatch') this.apply(this.dispatcher.cancel(e.requestId, this.now()));
        continue;
      }
      this.waiters.delete(e.requestId);
      waiter(e);
    }
    this.arm();
  }

  /** Refuses every queued request (shutdown). */
  close(): void {
    this.apply(this.dispatcher.close(this.now()));
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private wait(requestId: string, signal: AbortSignal, act: () => DispatchEffect[]): Promise<NextStep> {
    if (signal.aborted) return Promise.resolve({ kind: 'aborted' });
    // Most steps are decided at once (routed, or refused): then no abort listener is added and removed again. The
    // client cannot leave during act(): leaving is an event, and events run after this synchronous call.
    let immediate: NextStep | undefined;
    this.waiters.set(requestId, (step) => {
      immediate = step;
    });
    try {
      this.apply(act());
    } catch (err) {
      return Promise.reject(err);
    }
    if (immediate) return Promise.resolve(immediate);
    // Queued: the next step comes later, unless the client leaves first.
    return new Promise<NextStep>((resolve) => {
      const onAbort = () => {
        if (!this.waiters.delete(requestId)) return;
        this.apply(this.dispatcher.cancel(requestId, this.now()));
        resolve({ kind: 'aborted' });
      };
      this.waiters.set(requestId, (step) => {
        signal.removeEventListener('abort', onAbort);
        resolve(step);
      });
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** One timer, at the dispatcher's next wake-up (queue deadlines, breakers cooling down, the sweep). */
  private arm(): void {
    const at = this.dispatcher.nextWakeAt(this.now());
    if (at === undefined) return;
    if (this.timer && at >= this.timerAt) return;
    clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(
      () => {
        this.timer = undefined;
        this.timerAt = Infinity;
        try {
          this.apply(this.dispatcher.tick(this.now()));
        } catch (err) {
          this.log.error({ err }, 'dispatcher tick failed');
        }
      },
      Math.max(0, at - this.now()),
    );
    this.timer.unref();
  }
}
