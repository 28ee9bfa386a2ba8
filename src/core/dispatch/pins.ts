/**
 * Pins: a key (a Responses API `previous_response_id`) bound to the worker that holds its state. The engine keeps a
 * stored response in its own memory, so the request that continues it must go to the same worker, like a session.
 *
 * Pure and bounded: at most `limit` pins, each living `ttlMs` from when it was made (a pin is refreshed when the key is
 * pinned again). Every pin has the same lifetime, so insertion order is expiry order: expired pins are dropped from the
 * front, and past the limit the oldest goes first.
 */

import { keyBytes } from './sessions.ts';

export interface PinOptions {
  /** Most pins kept; the oldest is dropped beyond. */
  readonly limit: number;
  /** Lifetime of a pin, ms. */
  readonly ttlMs: number;
  /** Most estimated bytes kept (`PIN_ENTRY_BYTES` + the key per pin); the oldest is dropped beyond. Default unbounded. */
  readonly maxBytes?: number;
}

/**
 * Heap bytes of one pin beyond its key's characters: the Map slot and the pin record (the worker id is the worker's,
 * shared). Measured with `npm run bench:memory` (docs/operations.md "Memory model").
 */
export const PIN_ENTRY_BYTES = 120;

interface Pin {
  readonly workerId: string;
  readonly expiresAt: number;
}

export class PinTable {
  private readonly pins = new Map<string, Pin>();
  /** Pins dropped because the table was full (a limit too small for the traffic shows here). */
  evicted = 0;
  expired = 0;
  private totalBytes = 0;

  constructor(readonly options: PinOptions) {}

  /** Estimated memory of the table, bytes (what `maxBytes` bounds). */
  get bytes(): number {
    return this.totalBytes;
  }

  private drop(key: string): void {
    if (this.pins.delete(key)) this.totalBytes -= PIN_ENTRY_BYTES + keyBytes(key);
  }

  /** Binds `key` to `workerId` from `now` on. */
  pin(key: string, workerId: string, now: number): void {
    if (this.options.limit <= 0) return;
    const weight = PIN_ENTRY_BYTES + keyBytes(key);
    const maxBytes = this.options.maxBytes ?? Number.POSITIVE_INFINITY;
    if (weight > maxBytes) return; // a key larger than the whole budget is not pinned
    this.expire(now);
    this.drop(key); // re-inserted at the back: its new expiry is the latest
    this.pins.set(key, { workerId, expiresAt: now + this.options.ttlMs });
    this.totalBytes += weight;
    while (this.pins.size > this.options.limit || this.totalBytes > maxBytes) {
      this.drop(this.pins.keys().next().value as string);
      this.evicted++;
    }
  }

  /** The worker `key` is pinned to, if the pin is alive. */
  lookup(key: string, now: number): string | undefined {
    const p = this.pins.get(key);
    if (!p) return undefined;
    if (p.expiresAt <= now) {
      this.drop(key);
      this.expired++;
      return undefined;
    }
    return p.workerId;
  }

  /** lookup() without its side effects (an expired pin is left for lookup to drop and count). */
  peek(key: string, now: number): string | undefined {
    const p = this.pins.get(key);
    return p && p.expiresAt > now ? p.workerId : undefined;
  }

  /** Drops every pin to a worker (it left the fleet: its stored state went with it). */
  dropWorker(workerId: string): number {
    let n = 0;
    for (const [k, p] of this.pins) {
      if (p.workerId !== workerId) continue;
      this.drop(k);
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
      this.drop(k);
      this.expired++;
    }
  }
}
