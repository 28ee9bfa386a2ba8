/**
 * bench:memory: what each of the router's bounded tables costs in memory, measured (heap + array buffers freed when
 * the table is emptied, after full garbage collections), beside the estimate its byte budget counts. The figures
 * behind docs/operations.md "Memory model".
 *
 *   npm run bench:memory [-- --sessions 600 --index-blocks 200000 --approx-mb 64 --json]
 *   npm run bench:memory -- --approx-only [--approx-compare <dir>]
 *
 * Rows: the tokenizer's segment cache (Qwen3, soak-like chats: system prompts of 200-4,000 tokens, sessions of 8
 * turns), the session and pin tables (100,000 entries with 36-character keys), the event index (blocks stored by
 * 1 and by 4 sources), approximate mode's table filled to its budget (--approx-table-mb); and the baseline, an idle
 * `kvroute serve` (the built CLI) without and with the tokenizer. Then approximate mode's record() at a full table:
 * per-call times (p50, p99, worst) of 64-block chains (32 blocks new) over 8 sources, and with --approx-compare the
 * same for another tree's src/core/approx.ts (a table of as many entries, bounded by its per-source capacity).
 */
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { TtlIndex } from '../src/core/approx.ts';
import { KvIndex } from '../src/core/index/kv-index.ts';
import { PinTable } from '../src/core/dispatch/pins.ts';
import { SessionTable } from '../src/core/dispatch/sessions.ts';
import { LocalTokenizer, SEGMENT_OVERHEAD_BYTES } from '../src/tokenizer/local.ts';
import { prose } from './lib/http-workloads.ts';
import { benchArgs, KVROUTE_BIN, listeningUrl, QWEN3_DIR, serveArgs, track } from './lib/proxy-run.ts';

const HELP = `bench:memory: measured bytes per entry of the tokenizer cache, sessions, pins and the event index

usage: npm run bench:memory -- [options]

  --sessions <n>      chat sessions (8 turns each) fed to the tokenizer cache (default 600)
  --entries <n>       session and pin entries (default 100000)
  --index-blocks <n>  blocks stored in the index per source (default 200000)
  --approx-mb <mb>    approximate mode's budget for its row and the record() timing (default 64)
  --approx-records <n>  record() calls timed at a full approximate table (default 20000)
  --approx-compare <dir>  also time the record() of <dir>/src/core/approx.ts (a before-tree)
  --approx-only       only the approximate table's row and timing
  --no-baseline       skip the idle kvroute serve processes (they need npm run build)
  --json              print the rows as JSON after the table
  -h, --help          this text

Needs --expose-gc (the npm script passes it).`;

const { argv, num } = benchArgs('bench:memory', HELP);
const SESSIONS = num('sessions', 600, true);
const ENTRIES = num('entries', 100_000, true);
const INDEX_BLOCKS = num('index-blocks', 200_000, true);
const APPROX_MB = num('approx-mb', 64);
const APPROX_RECORDS = num('approx-records', 20_000, true);
const APPROX_ONLY = argv.includes('--approx-only');
const approxCompare = argv.indexOf('--approx-compare');
const APPROX_COMPARE = approxCompare >= 0 ? argv[approxCompare + 1] : undefined;
const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) {
  console.error('bench:memory: run with node --expose-gc (npm run bench:memory does)');
  process.exit(2);
}

/** Heap used + array buffers after full collections. */
function held(): number {
  gc!();
  gc!();
  const m = process.memoryUsage();
  return m.heapUsed + m.arrayBuffers;
}

/** The word list of this benchmark's prose (bench/lib/http-workloads.ts prose() without sentence breaks). */
const WORDS =
  'the of and to in is that for it as was with be by on not he this are or his from at which but have an they you were her all she there would their we him been has when who will more no if out so said what up its about into than them can only other new some could time'.split(
    ' ',
  );

interface Row {
  table: string;
  entries: number;
  measuredBytes: number;
  perEntry: number;
  unit: string;
  perUnit: number;
  estimateBytes: number | null;
}
const rows: Row[] = [];

// ------------------------------------------------------------------ tokenizer segment cache
if (!APPROX_ONLY) {
  const tok = await LocalTokenizer.load(QWEN3_DIR, { cacheBytes: 2 ** 40 });
  const systems = Array.from({ length: 24 }, (_, i) => prose([200, 800, 2000, 4000][i % 4], 100 + i, WORDS, false));
  let n = 0;
  let cachedChars = 0;
  for (let s = 0; s < SESSIONS; s++) {
    const turns: { role: string; content: string }[] = [];
    for (let t = 0; t < 8; t++) {
      const content = `turn ${t} of session ${s}: ${prose(20 + (n % 60), n, WORDS, false)}`;
      n++;
      turns.push({ role: 'user', content });
      const misses = tok.cacheInfo.misses;
      tok.encodeChat({ messages: [{ role: 'system', content: systems[s % systems.length] }, ...turns] });
      // What this call added to the cache: the characters it encoded (every segment it missed is cached).
      if (tok.cacheInfo.misses > misses) cachedChars += tok.stats.encodedChars;
      turns.push({ role: 'assistant', content: 'ok' });
    }
  }
  const filled = held();
  const info = tok.cacheInfo;
  tok.clearCache();
  const measured = filled - held();
  rows.push({
    table: 'tokenizer segment cache',
    entries: info.entries,
    measuredBytes: measured,
    perEntry: measured / info.entries,
    unit: 'cached character',
    perUnit: measured / cachedChars,
    estimateBytes: info.bytes,
  });
  console.error(
    `[memory] tokenizer: ${info.entries} segments, ${cachedChars} characters; estimate ${info.bytes} B (overhead ${SEGMENT_OVERHEAD_BYTES} B/entry), measured ${measured} B`,
  );
}

// ------------------------------------------------------------------ sessions and pins
if (!APPROX_ONLY) {
  const ids = Array.from({ length: ENTRIES }, (_, i) => `${(i * 2654435761) >>> 0}-4f1c-4a7e-9b2d-${String(i).padStart(12, '0')}`);
  const before = held();
  const sessions = new SessionTable(1e12, ENTRIES + 1);
  for (const id of ids) sessions.set(id, 'worker-0:rank-0', 0);
  const filled = held();
  rows.push({
    table: 'sessions',
    entries: sessions.size,
    measuredBytes: filled - before,
    perEntry: (filled - before) / sessions.size,
    unit: 'id character',
    perUnit: (filled - before) / (sessions.size * ids[0].length),
    estimateBytes: sessions.bytes,
  });
  sessions.sweep(2e12);
  const pins = new PinTable({ limit: ENTRIES + 1, ttlMs: 1e9 });
  const before2 = held();
  for (const id of ids) pins.pin(`resp_${id}`, 'worker-0', 0);
  const filled2 = held();
  rows.push({
    table: 'response pins',
    entries: pins.size,
    measuredBytes: filled2 - before2,
    perEntry: (filled2 - before2) / pins.size,
    unit: 'key character',
    perUnit: (filled2 - before2) / (pins.size * (ids[0].length + 5)),
    estimateBytes: pins.bytes,
  });
  // The ids themselves are the test's (kept alive above both tables): each table's figure is its own cost plus the key.
  // V8 shares the string, so add one copy's characters (16 + length) to compare with the estimate.
  for (const r of rows.slice(-2)) r.measuredBytes += r.entries * (16 + ids[0].length);
  for (const r of rows.slice(-2)) r.perEntry = r.measuredBytes / r.entries;
}

// ------------------------------------------------------------------ the event index
for (const holders of APPROX_ONLY ? [] : [1, 4]) {
  const BLOCK = 16;
  const index = new KvIndex({ blockSize: BLOCK });
  for (let s = 0; s < holders; s++) index.addSource(s);
  const before = held();
  const per = 64; // blocks per stored event: a 1,024-token prompt
  for (let e = 0; e < INDEX_BLOCKS / per; e++) {
    const seqHashes = crypto.getRandomValues(new BigUint64Array(per)); // hashes are uniform 64-bit values
    const engineIds = Array.from({ length: per }, (_, i) => BigInt(e * per + i + 1));
    for (let s = 0; s < holders; s++)
      index.apply(s, { kind: 'stored', parent: null, engineIds, tokens: null, blockSize: BLOCK, seqHashes });
  }
  const filled = held();
  const st = index.stats();
  rows.push({
    table: `index, ${holders} source${holders > 1 ? 's' : ''} per block`,
    entries: st.pairs,
    measuredBytes: filled - before,
    perEntry: (filled - before) / st.pairs,
    unit: 'block',
    perUnit: (filled - before) / st.blocks,
    estimateBytes: st.bytes,
  });
}

// ------------------------------------------------------------------ approximate mode's table
/** The 64-block chains the approximate rows record: 32 blocks shared with an earlier chain of the same source, 32 new. */
function approxChains(sources: number) {
  const last: BigUint64Array[] = Array.from({ length: sources }, () => crypto.getRandomValues(new BigUint64Array(64)));
  let t = 0;
  return (): { source: number; chain: BigUint64Array } => {
    const source = t++ % sources;
    const chain = new BigUint64Array(64);
    chain.set(last[source].subarray(0, 32));
    crypto.getRandomValues(chain.subarray(32));
    last[source] = chain;
    return { source, chain };
  };
}
{
  const idx = new TtlIndex({ ttlMs: 1e9, maxBytes: APPROX_MB * 2 ** 20 });
  const before = held();
  const next = approxChains(8);
  for (let t = 0; idx.size < idx.maxEntries - 64; t++) {
    const { source, chain } = next();
    idx.record(source, chain, t);
  }
  const filled = held();
  rows.push({
    table: `approximate table (--approx-table-mb ${APPROX_MB})`,
    entries: idx.size,
    measuredBytes: filled - before,
    perEntry: (filled - before) / idx.size,
    unit: 'budget byte per block',
    perUnit: (APPROX_MB * 2 ** 20) / idx.maxEntries,
    estimateBytes: idx.bytes,
  });
}

/** Per-call times of record() on a full table (ms): `make` builds the index, sized to `entries` blocks in all. */
interface ApproxLike {
  record(source: number, seqHashes: BigUint64Array, now: number): void;
  readonly size: number;
}
function recordTimes(idx: ApproxLike, full: () => boolean): number[] {
  const next = approxChains(8);
  let t = 0;
  while (!full()) {
    const { source, chain } = next();
    idx.record(source, chain, t++);
  }
  // Past the first evictions: half the table's entries recorded again before timing.
  const warm = t + Math.ceil(idx.size / 64);
  while (t < warm) {
    const { source, chain } = next();
    idx.record(source, chain, t++);
  }
  const times: number[] = [];
  for (let i = 0; i < APPROX_RECORDS; i++) {
    const { source, chain } = next();
    const t0 = performance.now();
    idx.record(source, chain, t++);
    times.push(performance.now() - t0);
  }
  return times.sort((a, b) => a - b);
}
const stalls: { tree: string; entries: number; p50: number; p99: number; worst: number; total: number; worstCells?: number }[] = [];
{
  const idx = new TtlIndex({ ttlMs: 1e9, maxBytes: APPROX_MB * 2 ** 20 });
  const entries = idx.maxEntries;
  const times = recordTimes(idx, () => idx.size >= entries - 64);
  const pick = (q: number) => times[Math.min(times.length - 1, Math.floor(q * times.length))];
  stalls.push({
    tree: 'this tree (budget)',
    entries: idx.size,
    p50: pick(0.5),
    p99: pick(0.99),
    worst: times.at(-1)!,
    total: times.reduce((a, b) => a + b, 0),
    worstCells: idx.scanned.worstRecord,
  });
  if (APPROX_COMPARE) {
    const mod = (await import(pathToFileURL(join(APPROX_COMPARE, 'src/core/approx.ts')).href)) as {
      TtlIndex: new (o: { ttlMs: number; capacityPerSource?: number }) => ApproxLike;
    };
    // The same number of entries, bounded the only way the old index could be: a capacity per source.
    const old = new mod.TtlIndex({ ttlMs: 1e9, capacityPerSource: Math.floor(entries / 8) });
    const oldTimes = recordTimes(old, () => old.size >= entries - 64 * 8);
    const at = (q: number) => oldTimes[Math.min(oldTimes.length - 1, Math.floor(q * oldTimes.length))];
    stalls.push({
      tree: APPROX_COMPARE,
      entries: old.size,
      p50: at(0.5),
      p99: at(0.99),
      worst: oldTimes.at(-1)!,
      total: oldTimes.reduce((a, b) => a + b, 0),
    });
  }
}

// ------------------------------------------------------------------ baseline: kvroute serve, idle
/** RSS of an idle `kvroute serve` (the built CLI) with one worker, without and with the Qwen3 tokenizer thread. */
async function idleRss(withTokenizer: boolean): Promise<number> {
  const child = track(process.execPath, serveArgs(KVROUTE_BIN, ['http://127.0.0.1:9'], withTokenizer ? ['--tokenizer', QWEN3_DIR] : []));
  try {
    const url = await listeningUrl(child);
    await new Promise((r) => setTimeout(r, 3000));
    const text = await (await fetch(`${url}/metrics`)).text();
    return Number(/^process_resident_memory_bytes (\d+)/m.exec(text)?.[1]);
  } finally {
    child.kill('SIGTERM');
  }
}
if (!argv.includes('--no-baseline') && !APPROX_ONLY) {
  for (const withTokenizer of [false, true]) {
    const rss = await idleRss(withTokenizer);
    rows.push({
      table: withTokenizer ? 'kvroute serve idle, with --tokenizer (Qwen3)' : 'kvroute serve idle, no tokenizer',
      entries: 1,
      measuredBytes: rss,
      perEntry: rss,
      unit: 'process (RSS)',
      perUnit: rss,
      estimateBytes: null,
    });
  }
}

const fmt = (x: number, d = 0) => x.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d });
console.log(
  `# bench:memory  node ${process.version}, loadavg ${loadavg()
    .map((x) => x.toFixed(1))
    .join(' ')}`,
);
console.log('| table | entries | measured MiB | bytes per entry | per unit | bytes per unit | estimate MiB | measured ÷ estimate |');
console.log('| --- | --- | --- | --- | --- | --- | --- | --- |');
for (const r of rows)
  console.log(
    `| ${r.table} | ${fmt(r.entries)} | ${fmt(r.measuredBytes / 2 ** 20, 1)} | ${r.entries === 1 ? '–' : fmt(r.perEntry)} | ${r.unit} | ${r.entries === 1 ? '–' : fmt(r.perUnit, 2)} | ${r.estimateBytes === null ? '–' : fmt(r.estimateBytes / 2 ** 20, 1)} | ${r.estimateBytes === null ? '–' : fmt(r.measuredBytes / r.estimateBytes, 2)} |`,
  );
console.log('(index rows: entries = block-source pairs, "per entry" = per pair; its estimate is router_kv_index_bytes)');
console.log(`\napproximate mode's record() at a full table (${APPROX_RECORDS} calls of 64 blocks, 32 new, 8 sources):`);
console.log('| tree | entries | p50 µs | p99 µs | worst ms | total ms | most cells one record() scanned |');
console.log('| --- | --- | --- | --- | --- | --- | --- |');
for (const r of stalls)
  console.log(
    `| ${r.tree} | ${fmt(r.entries)} | ${fmt(r.p50 * 1000, 1)} | ${fmt(r.p99 * 1000, 1)} | ${fmt(r.worst, 2)} | ${fmt(r.total, 0)} | ${r.worstCells === undefined ? 'every cell, twice, per eviction' : fmt(r.worstCells)} |`,
  );
if (argv.includes('--json')) console.log(JSON.stringify({ rows, stalls }, null, 2));
