/**
 * The lifecycle tap of the miss-ratio curves (src/core/mrc.ts): every request's first attempt gives its model, the
 * source chosen and the router's own hash chain to the curves, synchronously, before the request is sent. Retries are
 * not fed again (the prompt was seen once). Reading (gauges, GET /debug/mrc, `kvroute hitrate --what-if`) asks the
 * router for each engine's capacity at that moment.
 */
import { MrcBook, type MrcOptions, type MrcReport } from '../core/mrc.ts';
import type { KvRouter } from '../core/router.ts';
import { badRequest } from '../http/errors.ts';
import type { Lifecycle } from './lifecycle.ts';

/**
 * The host-tier size of a /debug/mrc query string (`host_blocks=N`, N an integer >= 0), or undefined without one; a
 * bad value is a 400. serve's admin routes and the epp's metrics listener both answer /debug/mrc with it.
 */
export function hostBlocksOf(query: string): number | undefined {
  const raw = new URLSearchParams(query).get('host_blocks');
  if (raw === null) return undefined;
  const host = Number(raw);
  if (raw.trim() === '' || !Number.isInteger(host) || host < 0) {
    throw badRequest(`host_blocks must be an integer >= 0, got "${raw}"`, 'host_blocks');
  }
  return host;
}

export class MrcFeed {
  readonly book: MrcBook;

  constructor(
    lifecycle: Lifecycle,
    private readonly router: KvRouter,
    options: MrcOptions,
  ) {
    this.book = new MrcBook(options);
    lifecycle.onDispatch((a) => {
      if (a.attempt !== 0) return;
      this.book.observe(a.model, a.decision.sourceKey, a.decision.seqHashes, a.decision.islBlocks);
    });
  }

  /** The what-if answers; `hostBlocksPerEngine` adds the host-tier answer. */
  report(hostBlocksPerEngine?: number): MrcReport {
    // An engine that left the fleet no longer counts toward today's capacity (its curve stays until forgotten).
    for (const key of this.book.engineKeys()) {
      if (!this.router.hasSource(key)) this.book.forgetEngine(key);
    }
    return this.book.report((key) => this.router.capacityOf(key), hostBlocksPerEngine);
  }
}
