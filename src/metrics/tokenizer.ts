/**
 * The tokenizer cache's gauges: its estimated bytes against its budget (--tokenizer-cache-mb), entries and evictions.
 * Read at scrape time from the local tokenizer (its worker thread answers info()) or the engine-tokenizer answer cache.
 */
import { Counter, Gauge, type Registry } from 'prom-client';

/** What the gauges read: the cache's state (LocalTokenizer.cacheInfo, RemoteTokenizer.cacheInfo). */
export interface TokenizerCacheGauges {
  readonly entries: number;
  readonly bytes: number;
  readonly maxBytes: number;
  readonly evictions: number;
}

export function registerTokenizerGauges(registry: Registry, p: string, read: () => Promise<TokenizerCacheGauges | undefined>): void {
  const registers = [registry];
  let evicted = 0;
  new Gauge({
    name: `${p}router_tokenizer_cache_bytes`,
    help:
      "Estimated memory of the tokenizer's cache (segment cache of the local tokenizer, or the engine-tokenizer answer " +
      'cache), bytes: what its budget counts (docs/operations.md "Memory model").',
    registers,
    async collect() {
      const c = await read().catch(() => undefined);
      if (!c) return;
      this.set(c.bytes);
      limit.set(c.maxBytes);
      entries.set(c.entries);
      if (c.evictions > evicted) evictions.inc(c.evictions - evicted);
      evicted = c.evictions;
    },
  });
  const limit = new Gauge({
    name: `${p}router_tokenizer_cache_limit_bytes`,
    help: "The tokenizer cache's byte budget (--tokenizer-cache-mb).",
    registers,
  });
  const entries = new Gauge({
    name: `${p}router_tokenizer_cache_entries`,
    help: "Entries in the tokenizer's cache (segments, or engine answers).",
    registers,
  });
  const evictions = new Counter({
    name: `${p}router_tokenizer_cache_evictions_total`,
    help: "Entries the tokenizer's cache dropped to stay within its budget (counted at scrape time).",
    registers,
  });
}
