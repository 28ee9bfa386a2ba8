/**
 * Flow control: the order in which waiting requests get the fleet's freed capacity (docs/flow-control.md).
 *
 *   bands     by priority (lower runs first, vLLM's meaning): a request joins the first band whose maxPriority is >= its
 *             priority; bands are served strictly in order, each with its own queue TTL, and a `sheddable` band is
 *             refused at once (429) when its request would have to wait instead of queued
 *   tenants   within a band, start-time fair queuing: tenant t's next request gets the tag
 *               start = max(V, finish_t),  finish_t = start + cost / weight_t      (cost = prompt tokens, min 1)
 *             where V is the band's virtual time (the start tag of the last request dispatched from it); the smallest
 *             tag goes first, so over any busy period each tenant's share of dispatched tokens tends to its weight's
 *             share, whatever the others send; an idle tenant does not bank credit (V moves on without it)
 *   order     within one tenant of one band: arrival order (fcfs) or earliest deadline first (edf; no deadline = last)
 *   fifo      `order: 'fifo'` turns all of this off: one queue in arrival order (the old behaviour, kept for comparison)
 *
 * Pure data structure: the dispatcher decides what is tried, when, and what happens to it.
 */

export interface BandSpec {
  readonly name: string;
  /** Requests with priority <= this join the band (bands are tried in ascending maxPriority). */
  readonly maxPriority: number;
  /** Longest wait in this band's queue, ms (default: the dispatcher's queue timeout). */
  readonly ttlMs?: number;
  /** Refused with 429 instead of queued when the fleet is saturated. */
  readonly sheddable?: boolean;
  /** Within a tenant: arrival order or earliest deadline first. Default fcfs. */
  readonly order?: 'fcfs' | 'edf';
}

export interface FlowOptions {
  /** Bands in any order; a catch-all band (maxPriority +Infinity) is added when none covers every priority. */
  readonly bands?: readonly BandSpec[];
  /** 'fair' (bands x tenants) or 'fifo' (one queue, arrival order). Default fair. */
  readonly order?: 'fair' | 'fifo';
  /** Tenant weights (default 1). */
  readonly weights?: Readonly<Record<string, number>>;
}

export interface FlowItem {
  readonly requestId: string;
  readonly tenant: string;
  readonly priority: number;
  /** Tokens the request asks the fleet to prefill (its fairness cost). */
  readonly cost: number;
  readonly enqueuedAt: number;
  /** When it gives up waiting (band TTL). */
  readonly expiresAt: number;
  /** Absolute TTFT deadline, if the client gave one (EDF key). */
  readonly deadline?: number;
  /** Arrival sequence (FIFO and tie order). */
  readonly seq: number;
}

interface Tagged extends FlowItem {
  readonly band: number;
  start: number;
}

export const DEFAULT_BAND = 'default';

export interface Band {
  readonly name: string;
  readonly maxPriority: number;
  readonly ttlMs?: number;
  readonly sheddable: boolean;
  readonly order: 'fcfs' | 'edf';
}

/** Finish tags kept beyond twice the waiting requests before the ones behind the virtual clock are dropped. */
const FINISH_SLACK = 1024;

export class FlowQueue {
  readonly bands: readonly Band[];
  private readonly order: 'fair' | 'fifo';
  private readonly weights: Readonly<Record<string, number>>;
  private readonly items = new Map<string, Tagged>();
  /** Per band: virtual time and each tenant's last finish tag. */
  private readonly virtual: number[];
  private readonly finish: Map<string, number>[];
  private seq = 0;

  constructor(opts: FlowOptions = {}) {
    const specs = [...(opts.bands ?? [])].sort((a, b) => a.maxPriority - b.maxPriority);
    if (specs.length === 0 || specs[specs.length - 1].maxPriority !== Number.POSITIVE_INFINITY) {
      specs.push({ name: specs.length === 0 ? DEFAULT_BAND : 'rest', maxPriority: Number.POSITIVE_INFINITY });
    }
    const names = new Set<string>();
    for (const b of specs) {
      if (names.has(b.name)) throw new RangeError(`flow control: band "${b.name}" is defined twice`);
      names.add(b.name);
    }
    this.bands = specs.map((b) => ({
      name: b.name,
      maxPriority: b.maxPriority,
      ttlMs: b.ttlMs,
      sheddable: b.sheddable ?? false,
      order: b.order ?? 'fcfs',
    }));
    this.order = opts.order ?? 'fair';
    this.weights = opts.weights ?? {};
    this.virtual = this.bands.map(() => 0);
    this.finish = this.bands.map(() => new Map());
  }

  /** Index of the band a priority falls in. */
  bandOf(priority: number): number {
    for (let i = 0; i < this.bands.length; i++) if (priority <= this.bands[i].maxPriority) return i;
    return this.bands.length - 1;
  }

  weightOf(tenant: string): number {
    const w = this.weights[tenant];
    return w !== undefined && w > 0 ? w : 1;
  }

  get length(): number {
    return this.items.size;
  }

  has(requestId: string): boolean {
    return this.items.has(requestId);
  }

  get(requestId: string): FlowItem | undefined {
    return this.items.get(requestId);
  }

  nextSeq(): number {
    return ++this.seq;
  }

  /** Adds a waiting request. `retry`: it was admitted before (a failed attempt): it keeps its place at the front. */
  push(item: FlowItem, retry = false): void {
    const band = this.bandOf(item.priority);
    let start: number;
    if (retry) start = Number.NEGATIVE_INFINITY;
    else if (this.order === 'fifo') start = 0;
    else {
      const fin = this.finish[band];
      start = Math.max(this.virtual[band], fin.get(item.tenant) ?? 0);
      fin.set(item.tenant, start + Math.max(1, item.cost) / this.weightOf(item.tenant));
      if (fin.size > 2 * this.items.size + FINISH_SLACK) this.forgetPast(band);
    }
    this.items.set(item.requestId, { ...item, band, start });
  }

  /**
   * Drops finish tags at or behind the band's virtual time: such a tag gives the same start as no tag (the start is the
   * larger of the two), so fairness is unchanged while the table stays bounded by the tenants still ahead of the
   * virtual clock (every tenant ever seen would otherwise stay, and a tenant is whatever a header says).
   */
  private forgetPast(band: number): void {
    const v = this.virtual[band];
    const fin = this.finish[band];
    for (const [tenant, tag] of fin) if (tag <= v) fin.delete(tenant);
  }

  /** Tenants with a finish tag, all bands (bounded: see forgetPast). */
  get finishTags(): number {
    return this.finish.reduce((a, m) => a + m.size, 0);
  }

  remove(requestId: string): FlowItem | undefined {
    const it = this.items.get(requestId);
    if (!it) return undefined;
    this.items.delete(requestId);
    return it;
  }

  /** The request was dispatched: its band's virtual time moves to its start tag. */
  dispatched(item: FlowItem): void {
    const t = item as Tagged;
    if (t.band !== undefined && Number.isFinite(t.start) && t.start > this.virtual[t.band]) this.virtual[t.band] = t.start;
  }

  /** Waiting requests in the order they are offered capacity. */
  inOrder(): FlowItem[] {
    const all = [...this.items.values()];
    if (this.order === 'fifo') return all.sort((a, b) => (a.start === b.start ? a.seq - b.seq : a.start - b.start));
    return all.sort((a, b) => {
      if (a.band !== b.band) return a.band - b.band;
      if (a.start !== b.start) return a.start - b.start;
      if (a.tenant === b.tenant && this.bands[a.band].order === 'edf') {
        const da = a.deadline ?? Number.POSITIVE_INFINITY;
        const db = b.deadline ?? Number.POSITIVE_INFINITY;
        if (da !== db) return da - db;
      }
      return a.seq - b.seq;
    });
  }

  /** Removes and returns requests whose band TTL has passed. */
  expire(now: number): FlowItem[] {
    const out: FlowItem[] = [];
    for (const it of this.items.values()) if (it.expiresAt <= now) out.push(it);
    for (const it of out) this.items.delete(it.requestId);
    return out;
  }

  earliestExpiry(): number | undefined {
    let min: number | undefined;
    for (const it of this.items.values()) if (min === undefined || it.expiresAt < min) min = it.expiresAt;
    return min;
  }

  /** Waiting requests per band and tenant (for metrics and /debug/state). */
  census(): Array<{ band: string; tenant: string; waiting: number; oldestMs: number }> {
    const m = new Map<string, { band: string; tenant: string; waiting: number; oldest: number }>();
    for (const it of this.items.values()) {
      const k = `${it.band}\u0000${it.tenant}`;
      const e = m.get(k) ?? { band: this.bands[it.band].name, tenant: it.tenant, waiting: 0, oldest: it.enqueuedAt };
      e.waiting++;
      e.oldest = Math.min(e.oldest, it.enqueuedAt);
      m.set(k, e);
    }
    return [...m.values()].map((e) => ({ band: e.band, tenant: e.tenant, waiting: e.waiting, oldestMs: e.oldest }));
  }
}
