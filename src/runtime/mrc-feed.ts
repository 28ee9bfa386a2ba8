/**
 * The lifecycle tap of the miss-ratio curves (src/core/mrc.ts): every request's first attempt gives its model, the
 * source chosen and the router's own hash chain to the curves, synchronously, before the request is sent. Retries are
 * not fed again (the prompt was seen once). Reading (gauges, GET /debug/mrc, `kvroute hitrate --what-if`) asks the
 * router for each engine's capacity at that moment.
 */
import { MrcBook, type MrcReport } from '../core/mrc.ts';
import type { KvRouter } from '../core/router.ts';
import type { Lifecycle } from './lifecycle.ts';

export class MrcFeed {
  readonly book: MrcBook;

  constructor(
    lifecycle: Lifecycle,
    private readonly router: KvRouter,
    options: { sampleRate: number; maxSamples: number },
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
