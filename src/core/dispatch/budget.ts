/**
 * Per-tenant token budgets: a bucket per tenant holding up to one minute of its budget, refilled continuously at
 * budget / 60 s. Admission needs a positive balance and takes the prompt tokens; output tokens are taken at finish (the
 * balance may go negative: a tenant that overdrew waits until the refill pays it back). Pure: time is an argument.
 */
/** Buckets kept before the full ones are dropped (checked when a new tenant arrives). */
const BUCKET_SWEEP_AT = 1024;

export class TokenBudgets {
  private readonly buckets = new Map<string, { balance: number; at: number }>();

  constructor(
    /** Tokens per minute by tenant; `*` is the default for tenants not listed; absent or 0 = unlimited. */
    private readonly perMinute: Readonly<Record<string, number>>,
  ) {}

  limitOf(tenant: string): number {
    return this.perMinute[tenant] ?? this.perMinute['*'] ?? 0;
  }

  private bucket(tenant: string, now: number, limit: number): { balance: number; at: number } {
    let b = this.buckets.get(tenant);
    if (!b) {
      if (this.buckets.size >= BUCKET_SWEEP_AT) this.forgetFull(now);
      b = { balance: limit, at: now };
      this.buckets.set(tenant, b);
    }
    b.balance = Math.min(limit, b.balance + ((now - b.at) * limit) / 60_000);
    b.at = now;
    return b;
  }

  /**
   * Drops buckets that have refilled to their limit: a full bucket is what a new one starts as, so admission is
   * unchanged while the table stays bounded by the tenants still paying back (a tenant is whatever a header says).
   */
  private forgetFull(now: number): void {
    for (const [tenant, b] of this.buckets) {
      const limit = this.limitOf(tenant);
      if (b.balance + ((now - b.at) * limit) / 60_000 >= limit) this.buckets.delete(tenant);
    }
  }

  /** Tenants with a bucket (bounded: see forgetFull). */
  get size(): number {
    return this.buckets.size;
  }

  /** Admits and charges `tokens`, or says how long until the tenant has a positive balance again. */
  admit(tenant: string, tokens: number, now: number): { ok: true } | { ok: false; retryAfterMs: number } {
    const limit = this.limitOf(tenant);
    if (!(limit > 0)) return { ok: true };
    const b = this.bucket(tenant, now, limit);
    if (b.balance <= 0) return { ok: false, retryAfterMs: Math.ceil(((1 - b.balance) * 60_000) / limit) };
    b.balance -= tokens;
    return { ok: true };
  }

  /** Tokens used after admission (generated output). */
  charge(tenant: string, tokens: number, now: number): void {
    const limit = this.limitOf(tenant);
    if (!(limit > 0) || !(tokens > 0)) return;
    this.bucket(tenant, now, limit).balance -= tokens;
  }

  balance(tenant: string, now: number): number | undefined {
    const limit = this.limitOf(tenant);
    return limit > 0 ? this.bucket(tenant, now, limit).balance : undefined;
  }
}
