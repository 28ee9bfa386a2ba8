/** A cache's state: `bytes` is the estimated weight its budget (`maxBytes`) bounds. */
export interface LruInfo {
  readonly entries: number;
  readonly bytes: number;
  readonly maxBytes: number;
  readonly hits: number;
  readonly misses: number;
  readonly evictions: number;
}

/**
 * A small LRU map bounded by a caller-defined weight (estimated bytes, here). Map insertion order is the recency order:
 * a hit is deleted and re-inserted, eviction takes from the front.
 */
export class WeightedLru<K, V> {
  // The entry keeps the key it was stored under: a hit re-inserts with that one, not the caller's (which may be a V8
  // sliced string pinning a whole prompt, see ownKey).
  private readonly map = new Map<K, { key: K; value: V; weight: number }>();
  private total = 0;
  hits = 0;
  misses = 0;
  evictions = 0;

  constructor(readonly maxWeight: number) {}

  /** Its size, weight, budget and counters, as the tokenizers report them. */
  info(): LruInfo {
    return {
      entries: this.map.size,
      bytes: this.total,
      maxBytes: this.maxWeight,
      hits: this.hits,
      misses: this.misses,
      evictions: this.evictions,
    };
  }

  get(key: K): V | undefined {
    const entry = this.map.get(key);
    if (!entry) {
      this.misses++;
      return undefined;
    }
    this.hits++;
    this.map.delete(key);
    this.map.set(entry.key, entry);
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
    this.map.set(key, { key, value, weight });
    this.total += weight;
    while (this.total > this.maxWeight) {
      const first = this.map.keys().next();
      if (first.done) break;
      const e = this.map.get(first.value)!;
      this.total -= e.weight;
      this.map.delete(first.value);
      this.evictions++;
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

// biome-ignore lint/suspicious/noControlCharactersInRegex: the Latin-1 range is the point
const NOT_LATIN1 = /[^\u0000-\u00ff]/;

/**
 * A long-lived cache key for `s` and the bytes V8 gives its characters: a flat copy of `s`, holding only its own
 * characters. `split()`, `slice()` and regex matches return V8 "sliced strings" (13+ characters) that point into their
 * parent, so a cached segment of a rendered prompt would keep the whole prompt alive for as long as it stays cached.
 * Latin-1 text is copied as one byte per character, anything else as UTF-16 (exact, lone surrogates included); the
 * bytes count a 16-byte string header. Only the miss path pays the copy.
 */
export function ownKey(s: string): { key: string; bytes: number } {
  const latin1 = !NOT_LATIN1.test(s);
  const bytes = 16 + (latin1 ? s.length : 2 * s.length);
  if (s.length < 13) return { key: s, bytes }; // V8 copies short substrings anyway
  return { key: latin1 ? Buffer.from(s, 'latin1').toString('latin1') : Buffer.from(s, 'utf16le').toString('utf16le'), bytes };
}
