/**
 * The worker gauges family: per-worker load, cache and health, and the index's size, read from the router at scrape
 * time so they can never go stale.
 */
import { Gauge, type Registry } from 'prom-client';
import type { KvRouter } from '../core/router.ts';

type SourceState = ReturnType<KvRouter['state']>['sources'][number];

export interface WorkerGaugeSources {
  readonly router: KvRouter;
  /** A source key's `worker` label (bounded cardinality). */
  readonly label: (sourceKey: string) => string;
  /** Health as the shell's prober sees it; workers never marked are healthy. */
  readonly health: ReadonlyMap<string, boolean>;
  /** Sources without usable KV events. */
  readonly blind: ReadonlyMap<string, boolean>;
}

export function registerWorkerGauges(registry: Registry, p: string, from: WorkerGaugeSources): void {
  const registers = [registry];
  const { router, label, health, blind } = from;
  const sourceGauge = (name: string, help: string, read: (s: SourceState) => number) =>
    new Gauge({
      name: `${p}${name}`,
      help,
      labelNames: ['worker'],
      registers,
      collect() {
        this.reset();
        for (const s of router.state().sources) this.set({ worker: label(s.source) }, read(s));
      },
    });
  sourceGauge(
    'router_worker_active_prefill_tokens',
    'Prompt tokens routed to the worker whose prefill has not finished (uncached part).',
    (s) => s.activePrefillTokens,
  );
  sourceGauge(
    'router_worker_active_blocks',
    'KV blocks held by requests in flight on the worker, as the router accounts them.',
    (s) => s.activeBlocks,
  );
  sourceGauge('router_worker_active_requests', 'Requests in flight on the worker.', (s) => s.activeRequests);
  sourceGauge(
    'router_worker_indexed_blocks',
    "Blocks the router's event index holds for the worker (its view of the worker's cache).",
    (s) => s.cachedBlocks,
  );
  sourceGauge(
    'router_worker_approx_blocks',
    'Blocks the approximate index (workers without events) holds for the worker.',
    (s) => s.approxBlocks,
  );
  sourceGauge('router_worker_healthy', '1 when the worker is routable (healthy), 0 when marked unhealthy.', (s) =>
    (health.get(s.source) ?? true) ? 1 : 0,
  );
  sourceGauge('router_kv_event_source_blind', '1 when the worker publishes no usable KV events (the router is blind to its cache).', (s) =>
    blind.get(s.source) ? 1 : 0,
  );
  new Gauge({
    name: `${p}router_kv_event_source_degraded`,
    help:
      "1 while the worker's KV events were lost and not replayed (its index is not the engine's cache until healed), by the latest loss's reason; " +
      'value 0 series are not kept. GET /debug/state shows since when.',
    labelNames: ['worker', 'reason'],
    registers,
    collect() {
      this.reset();
      for (const s of router.state().sources) if (s.degraded) this.set({ worker: label(s.source), reason: s.degraded.reason }, 1);
    },
  });
  sourceGauge('router_kv_event_source_losses', 'Event losses of the worker since its index was last known whole (0 when healed).', (s) =>
    s.degraded ? s.degraded.losses : 0,
  );
  new Gauge({
    name: `${p}router_kv_index_blocks`,
    help: 'Distinct blocks in the event index (all workers).',
    registers,
    collect() {
      this.set(router.index.stats().blocks);
    },
  });
  new Gauge({
    name: `${p}router_kv_index_bytes`,
    help: 'Approximate memory of the event index in bytes.',
    registers,
    collect() {
      this.set(router.index.stats().bytes);
    },
  });
  new Gauge({
    name: `${p}router_requests_in_flight`,
    help: 'Requests routed and not yet finished.',
    registers,
    collect() {
      this.set(router.state().inFlight);
    },
  });
}
