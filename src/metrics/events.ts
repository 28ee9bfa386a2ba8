/**
 * The KV events family: events and their blocks applied to the index (or rejected, by reason), and the event stream's
 * health as the transport reports it (sequence gaps, replays, resets, undecodable messages by cause, blind sources),
 * per worker, with the per-source totals the live dashboard reads.
 */
import { Counter, Gauge, type Registry } from 'prom-client';
import type { ApplyResult } from '../core/types.ts';

/** Event-ingestion counters the transport layer reports (sequence gaps, replays, resets, decode errors). */
export interface IngestCounts {
  gaps?: number;
  replays?: number;
  resets?: number;
  /** Undecodable payloads (cause "undecodable") when `decodeErrorsByCause` is absent. */
  decodeErrors?: number;
  /** Decode errors by cause (frame_count, seq_length, undecodable, malformed_event, unknown_event_type). */
  decodeErrorsByCause?: Partial<Record<string, number>>;
}

export interface EventTotals {
  events: number;
  appliedBlocks: number;
  rejectedBlocks: number;
  gaps: number;
  replays: number;
  resets: number;
  decodeErrors: number;
}

export const emptyEventTotals = (): EventTotals => ({
  events: 0,
  appliedBlocks: 0,
  rejectedBlocks: 0,
  gaps: 0,
  replays: 0,
  resets: 0,
  decodeErrors: 0,
});

export class EventSeries {
  private readonly eventsCounter: Counter<'worker' | 'kind' | 'status'>;
  private readonly eventBlocks: Counter<'worker' | 'kind' | 'status'>;
  private readonly gaps: Counter<'worker'>;
  private readonly replays: Counter<'worker'>;
  private readonly resets: Counter<'worker'>;
  private readonly decodeErrors: Counter<'worker' | 'cause'>;
  private readonly lastIngestTotals = new Map<string, IngestCounts>();
  /** Per source, for the dashboard. */
  readonly totals = new Map<string, EventTotals>();
  /** Sources without usable KV events (the router is blind to their cache). */
  readonly blind = new Map<string, boolean>();

  /** `label`: a source key's `worker` label (bounded cardinality, src/metrics/registry.ts). */
  constructor(
    registry: Registry,
    p: string,
    private readonly label: (sourceKey: string) => string,
  ) {
    const registers = [registry];
    const w = ['worker'] as const;
    this.eventsCounter = new Counter({
      name: `${p}router_kv_events_total`,
      help: 'KV events applied to the index, by worker, kind (stored/removed/cleared) and status (applied or the reject reason).',
      labelNames: ['worker', 'kind', 'status'],
      registers,
    });
    this.eventBlocks = new Counter({
      name: `${p}router_kv_event_blocks_total`,
      help: 'Blocks carried by KV events, by worker, kind and status (applied/rejected).',
      labelNames: ['worker', 'kind', 'status'],
      registers,
    });
    this.gaps = new Counter({
      name: `${p}router_kv_event_gaps_total`,
      help: 'Sequence-number gaps detected in a KV event stream (events lost between engine and router).',
      labelNames: w,
      registers,
    });
    this.replays = new Counter({
      name: `${p}router_kv_event_replays_total`,
      help: 'Replays requested from an engine to repair a gap.',
      labelNames: w,
      registers,
    });
    this.resets = new Counter({
      name: `${p}router_kv_event_resets_total`,
      help: "Times a source's index was cleared (engine restart or a gap that could not be repaired).",
      labelNames: w,
      registers,
    });
    this.decodeErrors = new Counter({
      name: `${p}router_kv_event_decode_errors_total`,
      help:
        'KV event messages or events that could not be decoded (dropped, counted), by cause: frame_count, seq_length, ' +
        'undecodable (payload not a batch), malformed_event, unknown_event_type.',
      labelNames: ['worker', 'cause'],
      registers,
    });
  }

  /** Registered with the gauges, after them: the count of blind sources at scrape time. */
  registerBlindCount(registry: Registry, p: string): void {
    const blind = this.blind;
    new Gauge({
      name: `${p}router_kv_event_sources_blind`,
      help: 'Workers the router is currently blind to (no usable KV events).',
      registers: [registry],
      collect() {
        let n = 0;
        for (const b of blind.values()) if (b) n++;
        this.set(n);
      },
    });
  }

  private totalsOf(sourceKey: string): EventTotals {
    let t = this.totals.get(sourceKey);
    if (!t) {
      t = emptyEventTotals();
      this.totals.set(sourceKey, t);
    }
    return t;
  }

  /** After router.applyEvents() (one call per event or per batch; eventKind labels the batch, 'batch' when mixed). */
  applied(sourceKey: string, result: ApplyResult, eventKind = 'batch'): void {
    const worker = this.label(sourceKey);
    const status = result.reason ?? 'applied';
    this.eventsCounter.inc({ worker, kind: eventKind, status });
    if (result.applied > 0) this.eventBlocks.inc({ worker, kind: eventKind, status: 'applied' }, result.applied);
    if (result.rejected > 0) this.eventBlocks.inc({ worker, kind: eventKind, status: 'rejected' }, result.rejected);
    const t = this.totalsOf(sourceKey);
    t.events++;
    t.appliedBlocks += result.applied;
    t.rejectedBlocks += result.rejected;
  }

  /** Transport-level event health: increments, plus whether the source is currently blind. */
  ingestCounters(sourceKey: string, counts: IngestCounts & { blind?: boolean }): void {
    const worker = { worker: this.label(sourceKey) };
    const t = this.totalsOf(sourceKey);
    const add = (c: Counter<'worker'>, n: number | undefined, field: 'gaps' | 'replays' | 'resets') => {
      if (n === undefined || !Number.isFinite(n) || n <= 0) return;
      c.inc(worker, n);
      t[field] += n;
    };
    add(this.gaps, counts.gaps, 'gaps');
    add(this.replays, counts.replays, 'replays');
    add(this.resets, counts.resets, 'resets');
    const causes = counts.decodeErrorsByCause ?? (counts.decodeErrors !== undefined ? { undecodable: counts.decodeErrors } : {});
    for (const [cause, n] of Object.entries(causes)) {
      if (n === undefined || !Number.isFinite(n) || n <= 0) continue;
      this.decodeErrors.inc({ ...worker, cause }, n);
      t.decodeErrors += n;
    }
    if (counts.blind !== undefined) this.blind.set(sourceKey, counts.blind);
  }

  /**
   * Same counters from cumulative totals (e.g. the ingest layer's per-source health, synced before each scrape): the
   * increase since the last call is added. A total that went down (the source's ingest was recreated) counts from 0.
   * Use either this or ingestCounters() for a given counter, not both.
   */
  ingestTotals(sourceKey: string, totals: IngestCounts & { blind?: boolean }): void {
    let last = this.lastIngestTotals.get(sourceKey);
    if (!last) {
      last = {};
      this.lastIngestTotals.set(sourceKey, last);
    }
    const inc: IngestCounts & { blind?: boolean } = { blind: totals.blind };
    for (const k of ['gaps', 'replays', 'resets', 'decodeErrors'] as const) {
      const now = totals[k];
      if (now === undefined || !Number.isFinite(now)) continue;
      const prev = last[k] ?? 0;
      inc[k] = now >= prev ? now - prev : now;
      last[k] = now;
    }
    if (totals.decodeErrorsByCause) {
      const prevByCause = last.decodeErrorsByCause ?? {};
      const incByCause: Record<string, number> = {};
      const nowByCause: Record<string, number> = {};
      for (const [cause, now] of Object.entries(totals.decodeErrorsByCause)) {
        if (now === undefined || !Number.isFinite(now)) continue;
        const prev = prevByCause[cause] ?? 0;
        incByCause[cause] = now >= prev ? now - prev : now;
        nowByCause[cause] = now;
      }
      inc.decodeErrorsByCause = incByCause;
      last.decodeErrorsByCause = nowByCause;
    }
    this.ingestCounters(sourceKey, inc);
  }
}
