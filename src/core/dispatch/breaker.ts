/**
 * A worker's circuit breaker, a state machine driven by request outcomes and the clock it is given:
 *
 *   closed     --threshold consecutive failures-->  open (until now + cooldown)
 *   open       --cooldown passed, seen at routing-->  half_open
 *   half_open  --one trial reserved at routing time; success--> closed; failure--> open again; cancelled--> half_open
 *
 * The trial is reserved in the same synchronous call that picks the worker, so a burst arriving after the cooldown sends
 * exactly one request to the failing worker (the old shell checked eligibility before an await and let 9 of 24 through).
 */
export type BreakerState = 'closed' | 'open' | 'half_open';

export interface BreakerOptions {
  /** Consecutive failures that open the breaker. */
  readonly threshold: number;
  /** How long an open breaker refuses traffic before one trial, ms. */
  readonly cooldownMs: number;
}

export class Breaker {
  private stateNow: BreakerState = 'closed';
  private failures = 0;
  private openUntilMs = 0;
  /** Request holding the half-open trial, if any. */
  private trial: string | null = null;

  constructor(private readonly opts: BreakerOptions) {}

  /** The state as of `now` (an open breaker past its cooldown reads as half-open). */
  state(now: number): BreakerState {
    if (this.stateNow === 'open' && now >= this.openUntilMs) {
      this.stateNow = 'half_open';
      this.trial = null;
    }
    return this.stateNow;
  }

  /** Can a new request be sent here now? Closed, or half-open with its trial not yet taken. */
  admits(now: number): boolean {
    const s = this.state(now);
    return s === 'closed' || (s === 'half_open' && this.trial === null);
  }

  /** When an open breaker turns half-open (for the dispatcher's wake-up); undefined unless open. */
  get reopensAt(): number | undefined {
    return this.stateNow === 'open' ? this.openUntilMs : undefined;
  }

  get trialHolder(): string | null {
    return this.trial;
  }

  /** A request was routed here: in half-open state it becomes the one trial. Returns whether it took the trial. */
  reserve(requestId: string, now: number): boolean {
    if (this.state(now) !== 'half_open' || this.trial !== null) return false;
    this.trial = requestId;
    return true;
  }

  /** The worker answered properly. */
  success(requestId: string): void {
    this.failures = 0;
    if (this.stateNow !== 'open' || this.trial === requestId) {
      this.stateNow = 'closed';
      this.trial = null;
    }
  }

  /** The worker failed this request (connection error, 5xx, broken stream). */
  failure(requestId: string, now: number): void {
    this.failures++;
    if (this.trial === requestId) this.trial = null;
    if (this.stateNow === 'half_open' || (this.stateNow === 'closed' && this.failures >= this.opts.threshold)) {
      this.stateNow = 'open';
      this.openUntilMs = now + this.opts.cooldownMs;
      this.trial = null;
    }
  }

  /** The request ended without a verdict on the worker (the client left): a trial it held is given back. */
  release(requestId: string): void {
    if (this.trial === requestId) this.trial = null;
  }

  toJSON(): { state: BreakerState; failures: number; openUntilMs?: number; trial: string | null } {
    return {
      state: this.stateNow,
      failures: this.failures,
      ...(this.stateNow === 'open' ? { openUntilMs: this.openUntilMs } : {}),
      trial: this.trial,
    };
  }
}
