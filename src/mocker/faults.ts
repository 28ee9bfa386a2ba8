/**
 * Fault injection: the live fault settings, the seeded dice that decide which batch is dropped and which request fails
 * (so a run replays), the crash counter, and `GET/POST /fault`. What a crash or a restart does to the instance is the
 * composition root's (server.ts): this module only decides when.
 */
import type { ServerResponse } from 'node:http';
import { createRng } from '../core/rng.ts';
import { sendJson } from '../http/body.ts';
import { vllmError } from './http.ts';
import type { MockerFaults, MockerStats } from './types.ts';

/** What `POST /fault` asks of the instance beyond changing settings. */
export interface FaultActions {
  restart(): Promise<void>;
  die(): Promise<void>;
}

export class FaultInjector {
  readonly faults: MockerFaults;
  private readonly dice: () => number;
  /** Generation requests since the last (re)start or change of dieAfterRequests. */
  private requestsSinceStart = 0;

  constructor(
    initial: Partial<MockerFaults> | undefined,
    seed: number,
    private readonly stats: MockerStats,
  ) {
    this.faults = {
      dropEventFraction: 0,
      failRequestFraction: 0,
      dieAfterRequests: null,
      slowdown: 1,
      unhealthy: false,
      eosFirstToken: false,
      ...initial,
    };
    this.dice = createRng(seed);
  }

  /** The drop fault for one event batch. */
  dropBatch(): boolean {
    const f = this.faults.dropEventFraction;
    return f > 0 && this.dice() < f;
  }

  /** Counts a generation request; true when it is the one the crash fault kills the instance on. */
  countRequest(): boolean {
    this.stats.requests++;
    this.requestsSinceStart++;
    const n = this.faults.dieAfterRequests;
    return n !== null && this.requestsSinceStart > n;
  }

  /** After validation, so bad input stays a 400: the dead-engine fault (503), then the failure dice (500). */
  checkGeneration(): void {
    if (this.faults.unhealthy) throw vllmError(503, 'the engine is dead (injected fault)');
    const f = this.faults.failRequestFraction;
    if (f > 0 && this.dice() < f) {
      this.stats.failedRequests++;
      throw vllmError(500, 'injected failure');
    }
  }

  /** A (re)start: the crash counter starts again. */
  restarted(): void {
    this.requestsSinceStart = 0;
  }

  /** Applies a `POST /fault` body (every field optional); a bad field is a 400 naming it, and nothing is changed. */
  patch(body: Record<string, unknown>): void {
    const next = { ...this.faults };
    for (const k of ['dropEventFraction', 'failRequestFraction'] as const) {
      const v = body[k];
      if (v === undefined) continue;
      if (typeof v !== 'number' || !(v >= 0 && v <= 1)) throw vllmError(400, `${k} must be a number in [0, 1]`, k);
      next[k] = v;
    }
    const die = body.dieAfterRequests;
    if (die !== undefined) {
      if (die !== null && (typeof die !== 'number' || !Number.isInteger(die) || die < 0))
        throw vllmError(400, 'dieAfterRequests must be a non-negative integer or null', 'dieAfterRequests');
      next.dieAfterRequests = die as number | null;
    }
    for (const k of ['unhealthy', 'eosFirstToken'] as const) {
      if (body[k] === undefined) continue;
      if (typeof body[k] !== 'boolean') throw vllmError(400, `${k} must be a boolean`, k);
      next[k] = body[k] as boolean;
    }
    if (body.slowdown !== undefined) {
      const v = body.slowdown;
      if (typeof v !== 'number' || !(v > 0)) throw vllmError(400, 'slowdown must be a number > 0', 'slowdown');
      next.slowdown = v;
    }
    Object.assign(this.faults, next);
    if (die !== undefined) this.requestsSinceStart = 0;
  }

  /** `GET /fault`: the settings and the counters. */
  show(res: ServerResponse): void {
    sendJson(res, 200, { faults: this.faults, stats: this.stats });
  }

  /** `POST /fault`: change settings, then restart or die if asked (die after answering, so the client hears back). */
  async handle(res: ServerResponse, body: Record<string, unknown>, actions: FaultActions): Promise<void> {
    this.patch(body);
    if (body.restart === true) await actions.restart();
    this.show(res);
    if (body.die === true) setImmediate(() => void actions.die());
  }
}
