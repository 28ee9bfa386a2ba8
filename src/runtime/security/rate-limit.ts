/**
 * Token buckets: `rate` tokens per second refill up to `burst`; a request takes one token or is refused with the
 * time until one is available. Time is injected (ms), so tests drive the clock. The spec is `--rate-limit`'s, parsed by
 * src/config/security.ts.
 */
import type { RateLimitSpec } from '../../config/security.ts';

export type TakeResult = { ok: true } | { ok: false; retryAfterMs: number };

export class TokenBucket {
  private tokens: number;
  private last: number;

  constructor(
    readonly spec: RateLimitSpec,
    now: number,
  ) {
    this.tokens = spec.burst;
    this.last = now;
  }

  private refill(now: number): void {
    // A clock going backwards (tests, NTP steps on Date.now) must not drain or overfill the bucket.
    const dt = Math.max(0, now - this.last);
    this.last = Math.max(this.last, now);
    this.tokens = Math.min(this.spec.burst, this.tokens + (dt * this.spec.rps) / 1000);
  }

  take(now: number): TakeResult {
    this.refill(now);
    if (this.tokens >= 1) {
      this.tokens -= 1;
      return { ok: true };
    }
    return { ok: false, retryAfterMs: ((1 - this.tokens) * 1000) / this.spec.rps };
  }

  /** Full again: the bucket carries no state worth keeping. */
  idle(now: number): boolean {
    this.refill(now);
    return this.tokens >= this.spec.burst;
  }

  available(now: number): number {
    this.refill(now);
    return this.tokens;
  }
}

/**
 * One bucket per key (API key id, or client address when keys are off). The map is bounded: when it reaches
 * `maxKeys`, full buckets are dropped (they carry no state); if none is full the oldest is dropped, which can only
 * favour that key, never lock anyone out.
 */
export class KeyedRateLimiter {
  private readonly buckets = new Map<string, TokenBucket>();

  constructor(
    readonly spec: RateLimitSpec,
    private readonly clock: () => number = Date.now,
    readonly maxKeys = 100_000,
  ) {}

  take(key: string): TakeResult {
    const now = this.clock();
    let b = this.buckets.get(key);
    if (!b) {
      if (this.buckets.size >= this.maxKeys) this.prune(now);
      b = new TokenBucket(this.spec, now);
      this.buckets.set(key, b);
    }
    return b.take(now);
  }

  get size(): number {
    return this.buckets.size;
  }

  private prune(now: number): void {
    for (const [k, b] of this.buckets) if (b.idle(now)) this.buckets.delete(k);
    if (this.buckets.size >= this.maxKeys) {
      const oldest = this.buckets.keys().next();
      if (!oldest.done) this.buckets.delete(oldest.value);
    }
  }
}
