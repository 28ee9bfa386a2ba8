/**
 * Session affinity: the source a session's last request was served on, remembered for `ttlMs` after its last use, at
 * most `capacity` sessions (least recently used dropped first). The routing stage that uses it lives in KvRouter.route
 * (`prefer`): the session's source goes first when it is a candidate and not overloaded (bounded load), so affinity
 * composes with the filters (an unhealthy, broken or busy source is never preferred) instead of bypassing them.
 */
export interface SessionEntry {
  readonly sourceKey: string;
  readonly expiresAt: number;
}

export class SessionTable {
  private readonly entries = new Map<string, SessionEntry>();

  constructor(
    readonly ttlMs: number,
    readonly capacity: number,
  ) {}

  get size(): number {
    return this.entries.size;
  }

  /** The session's source, if remembered and not expired. */
  get(sessionId: string, now: number): string | undefined {
    const e = this.entries.get(sessionId);
    if (!e) return undefined;
    if (e.expiresAt <= now) {
      this.entries.delete(sessionId);
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
    this.entries.delete(sessionId); // re-insert: Map order is the LRU order
    this.entries.set(sessionId, entry);
    while (this.entries.size > this.capacity) {
      const oldest = this.entries.keys().next().value as string;
      this.entries.delete(oldest);
    }
  }

  /** Forgets sessions pinned to a source that left. */
  dropSource(sourceKey: string): void {
    for (const [id, e] of this.entries) if (e.sourceKey === sourceKey) this.entries.delete(id);
  }

  sweep(now: number): void {
    for (const [id, e] of this.entries) if (e.expiresAt <= now) this.entries.delete(id);
  }
}
