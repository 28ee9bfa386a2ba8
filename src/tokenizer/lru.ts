/**
 * A small LRU map bounded by a caller-defined weight (characters, tokens, entries). Map insertion order is the
 * recency order: a hit is deleted and re-inserted, eviction takes from the front.
 */
export class WeightedLru<K, V> {
  private readonly map = new Map<K, { value: V; weight: number }>();
  private total = 0;
  hits = 0;
  misses = 0;

  constructor(private readonly maxWeight: number) {}

  get(key: K): V | undefined {
    const entry = this.map.get(key);
    if (!entry) {
      this.misses++;
      return undefined;
    }
    this.hits++;
    this.map.delete(key);
    this.map.set(key, entry);
    return entry.value;
  }

  set(key: K, value: V, weight: number): void {
    // An entry heavier than the whole cache would evict everything and still not fit.
    if (weight > this.maxWeight) return;
    const old = this.map.get(key);
    if (old) {
      this.total -= old.weight;
      this.map.delete(key);
    }
    this.map.set(key, { value, weight });
    this.total += weight;
    while (this.total > this.maxWeight) {
      const first = this.map.keys().next();
      if (first.done) break;
      const e = this.map.get(first.value)!;
      this.total -= e.weight;
      this.map.delete(first.value);
    }
  }

  get size(): number {
    return this.map.size;
  }

  get weight(): number {
    return this.total;
  }

  clear(): void {
    this.map.clear();
    this.total = 0;
  }
}
