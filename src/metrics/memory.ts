/**
 * The memory of the router's bounded tables, as the estimates their byte budgets count (docs/operations.md "Memory
 * model"): the tokenizer cache (--tokenizer-cache-mb; read at scrape time from the local tokenizer, whose worker thread
 * answers info(), or the engine-tokenizer answer cache), the session table (--session-table-mb) and the response pins
 * (--response-pin-table-mb), and approximate mode's table (--approx-table-mb). The event index has its own gauge (router_kv_index_bytes, worker-gauges.ts).
 */
import { Counter, Gauge, type Registry } from 'prom-client';

/** What the gauges read: the cache's state (LocalTokenizer.cacheInfo, RemoteTokenizer.cacheInfo). */
export interface TokenizerCacheGauges {
  readonly entries: number;
  readonly bytes: number;
  readonly maxBytes: number;
  readonly evictions: number;
}

/** Several caches as one (under `kvroute serve --processes N`: the primary's and every HTTP shell's); none known: undefined. */
export function sumCaches(caches: readonly (TokenizerCacheGauges | undefined)[]): TokenizerCacheGauges | undefined {
  let sum: { entries: number; bytes: number; maxBytes: number; evictions: number } | undefined;
  for (const c of caches) {
    if (!c) continue;
    sum ??= { entries: 0, bytes: 0, maxBytes: 0, evictions: 0 };
    sum.entries += c.entries;
    sum.bytes += c.bytes;
    sum.maxBytes += c.maxBytes;
    sum.evictions += c.evictions;
  }
  return sum;
}

export function registerTokenizerGauges(registry: Registry, p: string, read: () => Promise<TokenizerCacheGauges | undefined>): void {
  const registers = [registry];
  // A scrape collects every metric at once (prom-client starts all collect() calls together): the four gauges share
  // one read (one info() round trip to the tokenizer thread) per scrape.
  let current: Promise<TokenizerCacheGauges | undefined> | null = null;
  const snapshot = () => {
    current ??= read()
      .catch(() => undefined)
      .finally(() => {
        current = null;
      });
    return current;
  };
  let evicted = 0;
  const gauge = (name: string, help: string, value: (c: TokenizerCacheGauges) => number) =>
    new Gauge({
      name: `${p}${name}`,
      help,
      registers,
      async collect() {
        const c = await snapshot();
        if (c) this.set(value(c));
      },
    });
  gauge(
    'router_tokenizer_cache_bytes',
    "Estimated memory of the tokenizer's cache (segment cache of the local tokenizer, or the engine-tokenizer answer " +
      'cache), bytes: what its budget counts (docs/operations.md "Memory model").',
    (c) => c.bytes,
  );
  gauge('router_tokenizer_cache_limit_bytes', "The tokenizer cache's byte budget (--tokenizer-cache-mb).", (c) => c.maxBytes);
  gauge('router_tokenizer_cache_entries', "Entries in the tokenizer's cache (segments, or engine answers).", (c) => c.entries);
  new Counter({
    name: `${p}router_tokenizer_cache_evictions_total`,
    help: "Entries the tokenizer's cache dropped to stay within its budget (counted at scrape time).",
    registers,
    async collect() {
      const c = await snapshot();
      if (c && c.evictions > evicted) this.inc(c.evictions - evicted);
      if (c) evicted = c.evictions;
    },
  });
}

/** What the table gauges read: the dispatcher's session table and pin table, and its router's approximate table. */
export interface TableBytesSource {
  readonly sessions: { readonly bytes: number; readonly maxBytes: number };
  readonly pins: { readonly bytes: number; readonly options: { readonly maxBytes?: number } };
  readonly router?: { readonly approxTable: { readonly bytes: number; readonly maxBytes: number } };
}

export function registerTableGauges(registry: Registry, p: string, from: TableBytesSource): void {
  const registers = [registry];
  new Gauge({
    name: `${p}router_table_bytes`,
    help:
      'Estimated memory of a bounded routing table, bytes (table: sessions, response_pins, approximate): what its budget ' +
      "counts (approximate: the arrays' bytes).",
    labelNames: ['table'] as const,
    registers,
    collect() {
      this.set({ table: 'sessions' }, from.sessions.bytes);
      this.set({ table: 'response_pins' }, from.pins.bytes);
      limit.set({ table: 'sessions' }, from.sessions.maxBytes);
      limit.set({ table: 'response_pins' }, from.pins.options.maxBytes ?? Number.POSITIVE_INFINITY);
      if (from.router) {
        this.set({ table: 'approximate' }, from.router.approxTable.bytes);
        limit.set({ table: 'approximate' }, from.router.approxTable.maxBytes);
      }
    },
  });
  const limit = new Gauge({
    name: `${p}router_table_limit_bytes`,
    help: "A bounded routing table's byte budget (--session-table-mb, --response-pin-table-mb, --approx-table-mb).",
    labelNames: ['table'] as const,
    registers,
  });
}
