/**
 * The waiting room of requests refused because every eligible source was busy. Strict FIFO: when load frees up the
 * head is tried first and a pass stops at the first request still busy, so a long prompt at the head is not starved
 * by short ones slipping past it. Nothing here decides eligibility: every try routes afresh (the fleet may have changed
 * while a request waited).
 */
export interface QueuedItem<T> {
  readonly requestId: string;
  readonly value: T;
  readonly enqueuedAt: number;
  /** When the request gives up waiting (queue_timeout). */
  readonly deadline: number;
}

export class FifoQueue<T> {
  private items: QueuedItem<T>[] = [];

  get length(): number {
    return this.items.length;
  }

  push(item: QueuedItem<T>, front = false): void {
    if (front) this.items.unshift(item);
    else this.items.push(item);
  }

  remove(requestId: string): QueuedItem<T> | undefined {
    const i = this.items.findIndex((q) => q.requestId === requestId);
    if (i < 0) return undefined;
    return this.items.splice(i, 1)[0];
  }

  has(requestId: string): boolean {
    return this.items.some((q) => q.requestId === requestId);
  }

  /** Items in the order they are tried. */
  inOrder(): readonly QueuedItem<T>[] {
    return this.items;
  }

  /** Removes and returns the items whose deadline has passed. */
  expire(now: number): QueuedItem<T>[] {
    const out: QueuedItem<T>[] = [];
    if (this.items.length === 0) return out;
    this.items = this.items.filter((q) => {
      if (q.deadline > now) return true;
      out.push(q);
      return false;
    });
    return out;
  }

  earliestDeadline(): number | undefined {
    let min: number | undefined;
    for (const q of this.items) if (min === undefined || q.deadline < min) min = q.deadline;
    return min;
  }
}
