/**
 * Pins: a key (a Responses API `previous_response_id`) bound to the worker that holds its state. The engine keeps a
 * stored response in its own memory, so the request that continues it must go to the same worker, like a session.
 *
 * Pure and bounded: at most `limit` pins, each living `ttlMs` from when it was made (a pin is refreshed when the key is
 * pinned again). Every pin has the same lifetime, so insertion order is expiry order: expired pins are dropped from the
 * front, and past the limit the oldest goes first.
 */

export interface PinOptions {
  /** Most pins kept; the oldest is dropped beyond. */
  readonly limit: number;
  /** Lifetime of a pin, ms. */
  readonly ttlMs: number;
}

interface Pin {
  readonly workerId: string;
  readonly expiresAt: number;
}

export class PinTable {
  private readonly pins = new Map<string, Pin>();
  /** Pins dropped because the table was full (a limit too small for the traffic shows here). */
  evicted = 0;
  expired = 0;

  constructor(readonly options: PinOptions) {}

  /** Binds `key` to `workerId` from `now` on. */
  pin(key: string, workerId: string, now: number): void {
    if (this.options.limit <= 0) return;
    this.expire(now);
    this.pins.delete(key); // re-inserted at the back: its new expiry is the latest
    this.pins.set(key, { workerId, expiresAt: now + this.options.ttlMs });
    while (this.pins.size > this.options.limit) {
      const oldest = this.pins.keys().next().value as string;
      this.pins.delete(oldest);
      this.evicted++;
    }
  }

  /** The worker `key` is pinned to, if the pin is alive. */
  lookup(key: string, now: number): string | undefined {
    const p = this.pins.get(key);
    if (!p) return undefined;
    if (p.expiresAt <= now) {
      this.pins.delete(key);
      this.expired++;
      return undefined;
    }
    return p.workerId;
  }

  /** Drops every pin to a worker (it left the fleet: its stored state went with it). */
  dropWorker(workerId: string): number {
    let n = 0;
    for (const [k, p] of this.pins) {
      if (p.workerId !== workerId) continue;
      this.pins.delete(k);
      n++;
    }
    return n;
  }

  get size(): number {
    return this.pins.size;
  }

  private expire(now: number): void {
    for (const [k, p] of this.pins) {
      if (p.expiresAt > now) break;
      this.pins.delete(k);
      this.expired++;
    }
  }
}
