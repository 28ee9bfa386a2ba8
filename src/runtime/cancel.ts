/**
 * A request's "the client left", as the request flow reads it. The flow and the lifecycle read an AbortSignal's
 * `aborted` and add an 'abort' listener only while a step waits (queued, a prefill leg in flight); nearly every request
 * is routed at once and never aborted. So a front end need not make an AbortController and its AbortSignal per request
 * (~4 µs together at load 10, `node` alone: a measurable share of a token-id request): this is what the flow touches,
 * and the real AbortSignal (undici's requests take one) is made only when asked for, already aborted if the client
 * has left, and aborted with it otherwise. `serve --processes N`'s primary uses it the same way for each submission a
 * shell forwards (aborted when the shell cancels it or dies).
 */
export class ClientCancel {
  aborted = false;
  private listeners: (() => void)[] | null = null;
  private controller: AbortController | null = null;

  /** The flow's view: `aborted` and 'abort' listeners, the parts of AbortSignal the flow and lifecycle use. */
  get flowSignal(): AbortSignal {
    return this as unknown as AbortSignal;
  }

  /** A real AbortSignal, aborted when this is (for undici and anything else outside the flow). */
  get signal(): AbortSignal {
    if (this.controller === null) {
      this.controller = new AbortController();
      if (this.aborted) this.controller.abort();
    }
    return this.controller.signal;
  }

  addEventListener(_type: 'abort', fn: () => void, _options?: { once?: boolean }): void {
    if (this.aborted) return;
    if (this.listeners === null) this.listeners = [fn];
    else this.listeners.push(fn);
  }

  removeEventListener(_type: 'abort', fn: () => void): void {
    const l = this.listeners;
    if (l === null) return;
    const i = l.indexOf(fn);
    if (i >= 0) l.splice(i, 1);
  }

  /** The client left: every listener runs once, the real signal (if made) aborts; a listener that throws stops neither
   * the others nor the signal (as with an EventTarget), and its error is thrown once they have all run. */
  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    const l = this.listeners;
    this.listeners = null;
    let failed: { err: unknown } | null = null;
    if (l)
      for (const fn of l) {
        try {
          fn();
        } catch (err) {
          failed ??= { err };
        }
      }
    this.controller?.abort();
    if (failed) throw failed.err;
  }
}
