/**
 * What the router believes a source holds because it sent requests there, not because the engine said so.
 *
 * Two uses, one structure:
 * - approximate mode, for engines without a KV event feed: every routing decision is recorded with a long TTL
 *   (default 120 s) and an optional per-source capacity (least recently routed blocks go first);
 * - the predicted overlay, for event-fed engines: a short TTL covers the burst of sibling requests that share a prefix
 *   before the engine's Stored events arrive, so they are routed together instead of scattered.
 *
 * Per source, a Map from sequence hash to expiry time. With one TTL per index, insertion order (refreshed on re-record)
 * is expiry order, so sweeping is a walk from the front that stops at the first live entry.
 */
export interface TtlIndexOptions {
  readonly ttlMs: number;
  /** Most blocks remembered per source; the oldest are forgotten first. Unbounded when absent. */
  readonly capacityPerSource?: number;
}

export class TtlIndex {
  readonly ttlMs: number;
  readonly capacity: number;
  private readonly bySource = new Map<number, Map<bigint, number>>();

  constructor(options: TtlIndexOptions) {
    this.ttlMs = options.ttlMs;
    this.capacity = options.capacityPerSource ?? Infinity;
  }

  /** Records that `source` will hold the blocks `seqHashes` from `now` on. */
  record(source: number, seqHashes: BigUint64Array, now: number): void {
    if (seqHashes.length === 0 || this.ttlMs <= 0) return;
    let entries = this.bySource.get(source);
    if (!entries) {
      entries = new Map();
      this.bySource.set(source, entries);
    }
    const expiry = now + this.ttlMs;
    for (let i = 0; i < seqHashes.length; i++) {
      const h = seqHashes[i];
      entries.delete(h);
      entries.set(h, expiry);
    }
    if (entries.size > this.capacity) {
      let excess = entries.size - this.capacity;
      for (const key of entries.keys()) {
        if (excess-- <= 0) break;
        entries.delete(key);
      }
    }
  }

  /**
   * For each source with entries, leading blocks of `seqHashes` it holds unexpired; raises `out[source]` to that
   * count (so callers can take the max with another index).
   */
  raiseMatches(seqHashes: BigUint64Array, now: number, out: Int32Array | number[]): void {
    if (seqHashes.length === 0) return;
    for (const [source, entries] of this.bySource) {
      if (entries.size === 0 || source >= out.length) continue;
      let i = 0;
      while (i < seqHashes.length) {
        const expiry = entries.get(seqHashes[i]);
        if (expiry === undefined || expiry <= now) break;
        i++;
      }
      if (i > out[source]) out[source] = i;
    }
  }

  /** Drops expired entries. */
  sweep(now: number): void {
    for (const entries of this.bySource.values()) {
      for (const [key, expiry] of entries) {
        if (expiry > now) break;
        entries.delete(key);
      }
    }
  }

  removeSource(source: number): void {
    this.bySource.delete(source);
  }

  blocks(source: number): number {
    return this.bySource.get(source)?.size ?? 0;
  }

  get size(): number {
    let n = 0;
    for (const e of this.bySource.values()) n += e.size;
    return n;
  }
}
