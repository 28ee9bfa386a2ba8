/**
 * Token buckets: `rate` tokens per second refill up to `burst`; a request takes one token or is refused with the
 * time until one is available. Time is injected (ms), so tests drive the clock.
 */

export interface RateLimitSpec {
  /** Sustained requests per second. */
  readonly rps: number;
  /** Bucket size: requests allowed at once after idling. */
  readonly burst: number;
}

/** Parses `--rate-limit <rps>,<burst>` (burst defaults to max(1, rps)). */
export function parseRateLimit(text: string): RateLimitSpec {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(?:,\s*(\d+)\s*)?$/.exec(text);
  if (!m) throw new Error(`--rate-limit must be "<rps>" or "<rps>,<burst>" (e.g. 10,20), got "${text}"`);
  const rps = Number(m[1]);
  const burst = m[2] !== undefined ? Number(m[2]) : Math.max(1, Math.ceil(rps));
  if (!(rps > 0)) throw new Error(`--rate-limit rate must be > 0, got "${text}"`);
  if (!Number.isInteger(burst) || burst < 1) throw new Error(`--rate-limit burst must be an integer >= 1, got "${text}"`);
  return { rps, burst };
}

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
