/**
 * Waiting room for requests refused because every eligible worker is busy. Strict FIFO: when load frees up
 * (a first token, a finish), the head is retried first and the pass stops at the first request still refused, so a
 * long prompt at the head is not starved by short ones slipping past it.
 */
import type { RouteDecision, RouteResult } from '../core/types.ts';

export type QueueOutcome = { kind: 'routed'; decision: RouteDecision } | { kind: 'timeout' } | { kind: 'aborted' } | { kind: 'closed' };

interface Waiter {
  readonly tryRoute: () => RouteResult;
  readonly resolve: (o: QueueOutcome) => void;
  timer: NodeJS.Timeout;
  done: boolean;
}

export class RequestQueue {
  private readonly waiters: Waiter[] = [];
  private draining = false;

  constructor(
    readonly limit: number,
    readonly timeoutMs: number,
  ) {}

  get length(): number {
    return this.waiters.length;
  }

  get full(): boolean {
    return this.waiters.length >= this.limit;
  }

  /** Waits until `tryRoute` routes, the timeout passes, or `signal` aborts. Call only when not full. */
  wait(tryRoute: () => RouteResult, signal: AbortSignal): Promise<QueueOutcome> {
    return new Promise((resolve) => {
      const waiter: Waiter = {
        tryRoute,
        resolve: (o) => {
          if (waiter.done) return;
          waiter.done = true;
          clearTimeout(waiter.timer);
          signal.removeEventListener('abort', onAbort);
          const i = this.waiters.indexOf(waiter);
          if (i >= 0) this.waiters.splice(i, 1);
          resolve(o);
        },
        timer: setTimeout(() => waiter.resolve({ kind: 'timeout' }), this.timeoutMs),
        done: false,
      };
      const onAbort = () => waiter.resolve({ kind: 'aborted' });
      if (signal.aborted) {
        clearTimeout(waiter.timer);
        resolve({ kind: 'aborted' });
        return;
      }
      signal.addEventListener('abort', onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  /** Load went down somewhere: route waiting requests in order while they fit. */
  kick(): void {
    if (this.draining) return; // re-entrant kicks (a routed waiter finishing synchronously) are covered by the loop
    this.draining = true;
    try {
      while (this.waiters.length > 0) {
        const head = this.waiters[0];
        const r = head.tryRoute();
        if (r.kind === 'routed') {
          head.resolve({ kind: 'routed', decision: r });
          continue;
        }
        if (r.reason === 'all_busy') break;
        // no_sources or duplicate: waiting will not help this one; let the caller answer it.
        head.resolve({ kind: 'timeout' });
      }
    } finally {
      this.draining = false;
    }
  }

  close(): void {
    for (const w of [...this.waiters]) w.resolve({ kind: 'closed' });
  }
}
