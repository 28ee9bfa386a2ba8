/**
 * Session affinity: the source a session's last request was served on, remembered for `ttlMs` after its last use, at
 * most `capacity` sessions and `maxBytes` of estimated memory (least recently used dropped first). The routing stage that uses it lives in KvRouter.route
 * (`prefer`): the session's source goes first when it is a candidate and not overloaded (bounded load), so affinity
 * composes with the filters (an unhealthy, broken or busy source is never preferred) instead of bypassing them.
 */
export interface SessionEntry {
  readonly sourceKey: string;
  readonly expiresAt: number;
}

/**
 * Heap bytes of one remembered session beyond its id's characters: the Map slot and the entry record (the source key
 * string is the worker's, shared). Measured with `npm run bench:memory` (docs/operations.md "Memory model").
 */
export const SESSION_ENTRY_BYTES = 120;

/** Estimated bytes of a string kept as a key: a 16-byte header and, conservatively, two bytes per character. */
export function keyBytes(s: string): number {
  return 16 + 2 * s.length;
}

export class SessionTable {
  private readonly entries = new Map<string, SessionEntry>();
  private totalBytes = 0;
  /** Sessions dropped to stay within `capacity` / `maxBytes`. */
  evicted = 0;

  constructor(
    readonly ttlMs: number,
    readonly capacity: number,
    readonly maxBytes = Number.POSITIVE_INFINITY,
  ) {}

  /** Estimated memory of the table, bytes (what `maxBytes` bounds). */
  get bytes(): number {
    return this.totalBytes;
  }

  private drop(id: string): void {
    if (this.entries.delete(id)) this.totalBytes -= SESSION_ENTRY_BYTES + keyBytes(id);
  }

  get size(): number {
    return this.entries.size;
  }

  /** The session's source, if remembered and not expired. */
  get(sessionId: string, now: number): string | undefined {
    const e = this.entries.get(sessionId);
    if (!e) return undefined;
    if (e.expiresAt <= now) {
      this.drop(sessionId);
      return undefined;
    }
    return e.sourceKey;
  }

  /** Records where the session was served; returns the entry (for replicas to share). */
  set(sessionId: string, sourceKey: string, now: number): SessionEntry {
    const entry = { sourceKey, expiresAt: now + this.ttlMs };
    this.merge(sessionId, entry);
    return entry;
  }

  /** An entry learned from a peer replica: the later expiry wins. */
  merge(sessionId: string, entry: SessionEntry): void {
    const cur = this.entries.get(sessionId);
    if (cur && cur.expiresAt > entry.expiresAt) return;
    const weight = SESSION_ENTRY_BYTES + keyBytes(sessionId);
    if (weight > this.maxBytes) return; // an id larger than the whole budget is not remembered
    this.drop(sessionId); // re-insert: Map order is the LRU order
    this.entries.set(sessionId, entry);
    this.totalBytes += weight;
    while (this.entries.size > this.capacity || this.totalBytes > this.maxBytes) {
      this.drop(this.entries.keys().next().value as string);
      this.evicted++;
    }
  }

  /** Forgets sessions pinned to a source that left. */
  dropSource(sourceKey: string): void {
    for (const [id, e] of this.entries) if (e.sourceKey === sourceKey) this.drop(id);
  }

  sweep(now: number): void {
    for (const [id, e] of this.entries) if (e.expiresAt <= now) this.drop(id);
  }
}
