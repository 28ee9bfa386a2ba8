/**
 * KV events into the router: one ZMQ subscription per worker rank (src/ingest), or the HTTP poll of an engine that
 * has one (the engine registry says which), delivering into the router's index, and
 * the event streams' health copied into metrics every 2 s (cumulative totals; metrics add the increase).
 */
import type { Logger } from 'pino';
import { type KvRouter, resetLosesEvents } from '../core/router.ts';
import type { KvEvent } from '../core/types.ts';
import { engineAdapter } from '../engines/index.ts';
import { EventIngest } from '../transport/event-ingest.ts';
import type { RouterMetrics } from '../metrics/registry.ts';
import type { Worker } from './workers.ts';

export class ServerEvents {
  private ingest: EventIngest | null = null;
  private readonly poll: NodeJS.Timeout;

  constructor(
    private readonly router: KvRouter,
    private readonly metrics: RouterMetrics,
    private readonly log: Logger,
    private readonly blockSize: number,
  ) {
    this.poll = setInterval(() => this.copyHealth(), 2000);
    this.poll.unref();
  }

  private ensure(): EventIngest {
    this.ingest ??= new EventIngest({
      routerBlockSize: this.blockSize,
      sink: (key: string, events: KvEvent[]) => {
        this.metrics.eventsApplied(key, this.router.applyEvents(key, events, Date.now()));
        // The engine cleared its cache: what the index holds from here is the engine's cache again.
        if (events.some((e) => e.kind === 'cleared')) this.router.markHealed(key);
      },
      onReset: (key: string, reason: string) => {
        this.router.resetSource(key); // counted for metrics by the health poll
        if (resetLosesEvents(reason)) this.router.markDegraded(key, reason, Date.now());
        else this.router.markHealed(key);
        this.log.warn({ source: key, reason }, 'KV event stream reset: source treated as cold');
      },
      log: {
        info: (o, m) => this.log.info(o, m),
        warn: (o, m) => this.log.warn(o, m),
        error: (o, m) => this.log.error(o, m),
      },
    });
    return this.ingest;
  }

  /**
   * Subscribes to a worker's KV events: its ZMQ publisher when the spec has `events=`; a TensorRT-LLM worker without
   * it is polled over HTTP (POST /kv_cache_events).
   */
  async added(w: Worker): Promise<void> {
    const engine = engineAdapter(w.spec.engine);
    if (!w.spec.events) {
      if (engine.events.httpPoll) {
        const dispatcher = w.spec.appProtocol === 'h2c' ? w.pool : undefined;
        this.ensure().addPolledWorker({ workerId: w.id, url: w.url, dpRanks: w.spec.dp ?? 1, dispatcher });
      }
      return;
    }
    await this.ensure().addWorker({
      workerId: w.id,
      endpoint: w.spec.events,
      replayEndpoint: w.spec.replay ?? null,
      dpRanks: w.spec.dp ?? 1,
      flavor: engine.events.zmqWire,
    });
  }

  async removed(w: Worker): Promise<void> {
    if (this.ingest) for (const k of w.sourceKeys) await this.ingest.removeSource(k);
  }

  /** A request was routed to this source: a source whose events never come is flagged blind. */
  routed(sourceKey: string): void {
    this.ingest?.noteRequestRouted(sourceKey);
  }

  health(): ReturnType<EventIngest['health']> {
    return this.ingest ? this.ingest.health() : [];
  }

  private copyHealth(): void {
    if (!this.ingest) return;
    for (const h of this.ingest.health()) this.metrics.ingestTotals(h.sourceKey, h);
  }

  async close(): Promise<void> {
    clearInterval(this.poll);
    if (this.ingest) await this.ingest.close();
  }
}
