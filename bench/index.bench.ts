/**
 * Index benchmark (issue 2, "Benchmarks"; issue 20, fleet scale): KvIndex against a naive Map/Set baseline, side by
 * side in one run, on the Mooncake conversation trace expanded to 16-token blocks, N sources with per-worker LRU caches;
 * then a snapshot phase (KvRouter.snapshot / restore). `--sweep` runs the index alone at several fleet sizes, each in
 * a fresh process, and prints one table.
 *
 *   npm run bench:index -- --trace PATH          (node --expose-gc --import tsx bench/index.bench.ts)
 *   options: --trace PATH (or KVROUTE_TRACE)  --sources N  --capacity BLOCKS_PER_SOURCE  --no-baseline  --no-snapshot
 *            --sweep 64,256,1024,4096  --repeat R (runs per size; the table shows medians)  --json  --help
 *   BENCH_GC_DEBUG=1 prints every chunk's timed window and every unforced GC pause over 2 ms.
 *
 * Phases per structure: build from the pre-generated event stream (timed chunk by chunk, event objects materialised
 * untimed between chunks), heap delta, findMatches latency; GC pauses are attributed to the phase they start in.
 */
import { performance } from 'node:perf_hooks';
import { execFileSync } from 'node:child_process';
import { cpus, loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { KvIndex } from '../src/core/index/kv-index.ts';
import { KvRouter } from '../src/core/router.ts';
import type { KvEvent } from '../src/core/types.ts';
import { NaiveIndex } from './lib/naive-index.ts';
import { cpuLatency, GcLog, heapBytes, latencyRounds, type Latency } from './lib/measure.ts';
import { BLOCK, buildWorkload, chunkBounds, loadTrace, materialize, requestSeqHashes, type Workload } from './lib/workload.ts';
import type { SourceSnapshot } from '../src/core/index/snapshot.ts';
import { numArg, strArg } from '../scripts/usage.ts';

interface Target {
  addSource(s: number): void;
  apply(source: number, ev: KvEvent): { applied: number; rejected: number };
  findMatches(seq: BigUint64Array): Int32Array;
}

const HELP = `usage: npm run bench:index -- [--trace PATH] [options]
  --trace PATH         the Mooncake trace (JSONL or .gz); or set KVROUTE_TRACE; default data/traces/mooncake_conversation_trace.jsonl.gz
  --sources N          sources (engines x data-parallel ranks), default 64
  --capacity BLOCKS    LRU blocks per source, default 36000
  --no-baseline        skip the naive Map/Set baseline (most of the run time)
  --no-snapshot        skip the snapshot phase
  --sweep LIST         fleet sizes to run the index alone at, one fresh process each (e.g. 64,256,1024,4096);
                       capacity per source: --capacity if given, else max(9000, 2,304,000 / N)
  --repeat R           runs per fleet size in a sweep (the table shows medians), default 1
  --json               print the figures as one JSON line (what --sweep reads)`;
if (process.argv.includes('--help') || process.argv.includes('-h')) {
  console.log(HELP);
  process.exit(0);
}
const TRACE = strArg(
  'trace',
  process.env.KVROUTE_TRACE ?? new URL('../data/traces/mooncake_conversation_trace.jsonl.gz', import.meta.url).pathname,
);
const SOURCES = numArg('sources', 64);
const CAPACITY = numArg('capacity', 36000);
const BASELINE = !process.argv.includes('--no-baseline');
const SNAPSHOT = !process.argv.includes('--no-snapshot');
const JSON_OUT = process.argv.includes('--json');
const SWEEP = strArg('sweep', '');
const REPEAT = numArg('repeat', 1);
const LONG_TOKENS = 131_072;
const SHORT_TOKENS = 8_192;
const CHUNK_BLOCKS = 250_000;
const ROUNDS = 5;

const gcLog = new GcLog();
const tick = () => new Promise<void>((r) => setImmediate(r));
const t0 = performance.now();
const log = (msg: string) => console.log(`[${((performance.now() - t0) / 1000).toFixed(1)}s] ${msg}`);

interface BuildResult {
  target: Target;
  applyMs: number;
  blockEvents: number;
  rejected: number;
  heapDelta: number;
  windows: Array<[number, number]>;
  cpuShare: number;
}

async function build(w: Workload, make: () => Target, withTokens: boolean): Promise<BuildResult> {
  const target = make();
  for (let s = 0; s < w.sources; s++) target.addSource(s);
  const before = heapBytes();
  const bounds = chunkBounds(w, CHUNK_BLOCKS);
  const windows: Array<[number, number]> = [];
  let applyMs = 0;
  let blockEvents = 0;
  let rejected = 0;
  let cpuMs = 0;
  for (let c = 0; c + 1 < bounds.length; c++) {
    let events: ReturnType<typeof materialize> | null = materialize(w, bounds[c], bounds[c + 1], withTokens);
    for (const { event } of events) if (event.kind !== 'cleared') blockEvents += event.engineIds.length;
    // A pre-built chunk is an artefact of the benchmark (live events arrive one by one and die young): promote it
    // to old space with a forced (unreported) collection, so scavenges during apply see only apply's own garbage.
    heapBytes();
    await tick();
    const cpu0 = process.cpuUsage();
    const start = performance.now();
    for (let i = 0; i < events.length; i++) rejected += target.apply(events[i].source, events[i].event).rejected;
    const end = performance.now();
    const cpu = process.cpuUsage(cpu0);
    cpuMs += (cpu.user + cpu.system) / 1000;
    applyMs += end - start;
    windows.push([start, end]);
    if (process.env.BENCH_GC_DEBUG)
      console.log(`  chunk ${c} apply ${((start - t0) / 1000).toFixed(2)}-${((end - t0) / 1000).toFixed(2)}s`);
    events = null;
  }
  const heapDelta = heapBytes() - before;
  // Below ~95%, other processes took the CPU during timed windows (wall-clock figures and GC pauses are inflated).
  const cpuShare = cpuMs / applyMs;
  return { target, applyMs, blockEvents, rejected, heapDelta, windows, cpuShare };
}

interface FindResult {
  short: Latency;
  long: Latency;
  shortCpu: { p50: number; p99: number };
  longCpu: { p50: number; p99: number };
  window: [number, number];
}

function measureFind(
  target: Target,
  shortPrompts: BigUint64Array[],
  longPrompt: BigUint64Array,
  shortCalls: number,
  longCalls: number,
): FindResult {
  const start = performance.now();
  const short = latencyRounds(shortPrompts, ROUNDS, shortCalls / ROUNDS, (p) => target.findMatches(p));
  const long = latencyRounds([longPrompt], ROUNDS, longCalls / ROUNDS, (p) => target.findMatches(p));
  const shortCpu = cpuLatency(shortPrompts, shortCalls / 2, (p) => target.findMatches(p));
  const longCpu = cpuLatency([longPrompt], longCalls / 2, (p) => target.findMatches(p));
  return { short, long, shortCpu, longCpu, window: [start, performance.now()] };
}

function deepest(scores: Int32Array): number {
  let d = 0;
  for (let i = 0; i < scores.length; i++) if (scores[i] > d) d = scores[i];
  return d;
}

/** "longest (kind), n > 10 ms of m" over the unforced pauses in the windows. */
function gcSummary(windows: ReadonlyArray<readonly [number, number]>): string {
  const pauses = gcLog.inWindows(windows);
  if (pauses.length === 0) return '0';
  const worst = pauses.reduce((a, b) => (b.duration > a.duration ? b : a));
  const over = pauses.filter((p) => p.duration > 10).length;
  return `${fmt(worst.duration, 1)} (${worst.kind}; ${over} of ${pauses.length} > 10 ms)`;
}

const fmt = (n: number, digits = 0) => n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
const mb = (b: number) => `${fmt(b / 2 ** 20, 1)} MiB`;

async function main(): Promise<void> {
  log(`node ${process.version}, ${cpus().length} cores (${cpus()[0]?.model ?? '?'}), load average ${loadavg()[0].toFixed(2)}`);
  const trace = loadTrace(TRACE);
  const w = buildWorkload(trace, {
    sources: SOURCES,
    capacityPerSource: CAPACITY,
    longProbeTokens: LONG_TOKENS,
    longProbeSources: [0, Math.floor(SOURCES / 3), Math.floor((2 * SOURCES) / 3)],
  });
  const events = w.evKind.length;
  log(
    `workload: ${fmt(trace.length)} trace requests + ${w.probeRequests.length} x ${fmt(LONG_TOKENS)}-token probe, ` +
      `${fmt(w.reqKeys.length)} router blocks (${BLOCK} tokens), round-robin over ${SOURCES} sources, LRU ${fmt(CAPACITY)} blocks/source`,
  );
  log(
    `events: ${fmt(events)} (${fmt(w.storedBlocks)} stored + ${fmt(w.removedBlocks)} removed block events); ` +
      `final (block, source) pairs ${fmt(w.finalPairs)}, distinct blocks ${fmt(w.distinctFinalBlocks)}`,
  );

  // Prompts for findMatches: recent trace prompts of >= 8k tokens, cut to 8k (still resident on the source they were
  // routed to), and the 128k-token probe resident on three sources.
  const shortPrompts: BigUint64Array[] = [];
  const shortBlocks = SHORT_TOKENS / BLOCK;
  for (let r = w.probeRequests[0] - 1; r >= 0 && shortPrompts.length < 64; r--) {
    if (w.reqStart[r + 1] - w.reqStart[r] >= shortBlocks) shortPrompts.push(requestSeqHashes(w, r, shortBlocks));
  }
  const longPrompt = requestSeqHashes(w, w.probeRequests[0]);

  const rows: Record<string, Record<string, string>> = {};
  const expected: Int32Array[] = [];
  // The figures as numbers, for --json and the sweep.
  const figures: Record<string, number | boolean | Record<string, number | boolean>> = {
    sources: SOURCES,
    capacity: CAPACITY,
    pairs: w.finalPairs,
    blocks: w.distinctFinalBlocks,
    loadStart: loadavg()[0],
  };

  // ---- KvIndex, tokens in events (the router hashes them).
  let r = await build(w, () => new KvIndex({ blockSize: BLOCK }), true);
  const idx = r.target as KvIndex;
  const st = idx.stats();
  log(
    `KvIndex (tokens): ${fmt(r.blockEvents / (r.applyMs / 1000))} block events/s, heap +${mb(r.heapDelta)}, rejected ${r.rejected}, cpu/wall ${fmt(r.cpuShare * 100)}%`,
  );
  for (const p of shortPrompts) expected.push(Int32Array.from(idx.findMatches(p)));
  expected.push(Int32Array.from(idx.findMatches(longPrompt)));
  const depth = shortPrompts.reduce((a, p) => a + deepest(idx.findMatches(p)), 0) / shortPrompts.length;
  const longDepth = deepest(idx.findMatches(longPrompt));
  const holders = Array.from(idx.findMatches(longPrompt)).filter((x) => x === longPrompt.length).length;
  log(
    `probe depth: 8k prompts ${fmt(depth, 1)}/${shortBlocks} blocks (mean of best source), 128k prompt ${longDepth}/${longPrompt.length} on ${holders} sources`,
  );
  const fi = measureFind(idx, shortPrompts, longPrompt, 20_000, 2_000);
  await gcLog.settle();
  const idxWindows: Array<readonly [number, number]> = [...r.windows, fi.window];
  rows.KvIndex = {
    applyTok: fmt(r.blockEvents / (r.applyMs / 1000)),
    memPair: fmt(r.heapDelta / w.finalPairs, 1),
    memBlock: fmt(r.heapDelta / w.distinctFinalBlocks, 1),
    heap: mb(r.heapDelta),
    p99s: fmt(fi.short.p99, 1),
    p99sMed: fmt(fi.short.roundP99[ROUNDS >> 1], 1),
    p99sCpu: fmt(fi.shortCpu.p99, 0),
    p99lCpu: fmt(fi.longCpu.p99, 0),
    p99lMed: fmt(fi.long.roundP99[ROUNDS >> 1], 1),
    applyTokCpu: fmt(r.blockEvents / ((r.applyMs * r.cpuShare) / 1000)),
    p50s: fmt(fi.short.p50, 1),
    p99l: fmt(fi.long.p99, 1),
    p50l: fmt(fi.long.p50, 1),
    gc: '',
    pairs: fmt(st.pairs),
    own: mb(st.bytes),
  };
  Object.assign(figures, {
    memPair: r.heapDelta / w.finalPairs,
    heapMiB: r.heapDelta / 2 ** 20,
    ownMiB: st.bytes / 2 ** 20,
    overflowBlocks: st.overflowBlocks,
    applyTok: r.blockEvents / (r.applyMs / 1000),
    applyTokCpu: r.blockEvents / ((r.applyMs * r.cpuShare) / 1000),
    cpuShareTok: r.cpuShare,
    p50s: fi.short.p50,
    p99s: fi.short.roundP99[ROUNDS >> 1],
    p50l: fi.long.p50,
    p99l: fi.long.roundP99[ROUNDS >> 1],
  });
  if (st.pairs !== w.finalPairs || r.rejected !== 0)
    console.log(`!! KvIndex pairs ${st.pairs} vs engines ${w.finalPairs}, rejected ${r.rejected}`);
  figures.exact = st.pairs === w.finalPairs && r.rejected === 0;
  r = null as unknown as BuildResult;

  // ---- KvIndex, precomputed seqHashes (index cost alone).
  r = await build(w, () => new KvIndex({ blockSize: BLOCK }), false);
  await gcLog.settle();
  rows.KvIndex.applySeq = fmt(r.blockEvents / (r.applyMs / 1000));
  rows.KvIndex.applySeqCpu = fmt(r.blockEvents / ((r.applyMs * r.cpuShare) / 1000));
  idxWindows.push(...r.windows);
  rows.KvIndex.gc = gcSummary(idxWindows);
  figures.applySeq = r.blockEvents / (r.applyMs / 1000);
  figures.applySeqCpu = r.blockEvents / ((r.applyMs * r.cpuShare) / 1000);
  figures.cpuShareSeq = r.cpuShare;
  figures.gcMs = gcLog.inWindows(idxWindows).reduce((m, p) => Math.max(m, p.duration), 0);
  log(`KvIndex (seqHashes): ${rows.KvIndex.applySeq} block events/s, rejected ${r.rejected}, cpu/wall ${fmt(r.cpuShare * 100)}%`);
  r = null as unknown as BuildResult;

  if (SNAPSHOT) {
    const sn = await snapshotPhase(w, [...shortPrompts, longPrompt], expected);
    figures.snapshot = sn;
    log(
      `snapshot of ${fmt(sn.blocks)} blocks (${SOURCES} sources): capture ${fmt(sn.captureMs, 1)} ms, longest synchronous piece ` +
        `${fmt(sn.longestMs, 1)} ms, export ${fmt(sn.exportMs, 1)} ms in all, ${fmt(sn.mib, 1)} MiB of typed arrays; restore into ` +
        `an empty router ${fmt(sn.restoreMs, 0)} ms; findMatches of the restored router identical on every probe prompt: ${sn.equal ? 'yes' : 'NO'}`,
    );
  }

  if (BASELINE) {
    r = await build(w, () => new NaiveIndex(BLOCK), true);
    const naive = r.target as NaiveIndex;
    log(
      `naive (tokens): ${fmt(r.blockEvents / (r.applyMs / 1000))} block events/s, heap +${mb(r.heapDelta)}, rejected ${r.rejected}, cpu/wall ${fmt(r.cpuShare * 100)}%`,
    );
    let agree = true;
    shortPrompts.forEach((p, i) => {
      const got = naive.findMatches(p);
      for (let s = 0; s < SOURCES; s++) if (got[s] !== expected[i][s]) agree = false;
    });
    const gotLong = naive.findMatches(longPrompt);
    for (let s = 0; s < SOURCES; s++) if (gotLong[s] !== expected[shortPrompts.length][s]) agree = false;
    log(`findMatches results of KvIndex and baseline agree on every probe prompt: ${agree ? 'yes' : 'NO'}`);
    const fn = measureFind(naive, shortPrompts, longPrompt, 5_000, 300);
    await gcLog.settle();
    const naiveWindows: Array<readonly [number, number]> = [...r.windows, fn.window];
    rows.naive = {
      applyTok: fmt(r.blockEvents / (r.applyMs / 1000)),
      memPair: fmt(r.heapDelta / w.finalPairs, 1),
      memBlock: fmt(r.heapDelta / w.distinctFinalBlocks, 1),
      heap: mb(r.heapDelta),
      p99s: fmt(fn.short.p99, 1),
      p99sMed: fmt(fn.short.roundP99[ROUNDS >> 1], 1),
      p99sCpu: fmt(fn.shortCpu.p99, 0),
      p99lCpu: fmt(fn.longCpu.p99, 0),
      p99lMed: fmt(fn.long.roundP99[ROUNDS >> 1], 1),
      applyTokCpu: fmt(r.blockEvents / ((r.applyMs * r.cpuShare) / 1000)),
      p50s: fmt(fn.short.p50, 1),
      p99l: fmt(fn.long.p99, 1),
      p50l: fmt(fn.long.p50, 1),
      gc: '',
      pairs: fmt(naive.stats().pairs),
      own: '-',
    };
    r = null as unknown as BuildResult;
    r = await build(w, () => new NaiveIndex(BLOCK), false);
    await gcLog.settle();
    rows.naive.applySeq = fmt(r.blockEvents / (r.applyMs / 1000));
    rows.naive.applySeqCpu = fmt(r.blockEvents / ((r.applyMs * r.cpuShare) / 1000));
    naiveWindows.push(...r.windows);
    rows.naive.gc = gcSummary(naiveWindows);
    log(`naive (seqHashes): ${rows.naive.applySeq} block events/s, rejected ${r.rejected}, cpu/wall ${fmt(r.cpuShare * 100)}%`);
    r = null as unknown as BuildResult;
  }
  await gcLog.settle();
  if (process.env.BENCH_GC_DEBUG) {
    for (const p of gcLog.pauses)
      if (p.duration > 2 && !p.forced)
        console.log(`gc ${p.kind}${p.forced ? ' forced' : ''} ${p.duration.toFixed(1)} ms at ${((p.start - t0) / 1000).toFixed(2)}s`);
  }
  const anyGc = gcLog.pauses.filter((p) => !p.forced).reduce((m, p) => Math.max(m, p.duration), 0);
  gcLog.stop();

  const metrics: Array<[string, string, string]> = [
    ['apply, tokens in events (block events/s)', 'applyTok', '>= 2x baseline'],
    ['apply, precomputed seqHashes (block events/s)', 'applySeq', '>= 2x baseline'],
    ['apply, tokens, per CPU-second (block events/s)', 'applyTokCpu', '-'],
    ['apply, seqHashes, per CPU-second (block events/s)', 'applySeqCpu', '-'],
    ['memory per (block, source) pair (B)', 'memPair', '<= 64'],
    ['memory per distinct block (B)', 'memBlock', '-'],
    ['heap + arrayBuffers delta after build', 'heap', '-'],
    ['findMatches 8k tokens p50 (us)', 'p50s', '-'],
    ['findMatches 8k tokens p99 (us)', 'p99s', '<= 20'],
    [`findMatches 8k tokens p99, median of ${ROUNDS} rounds (us)`, 'p99sMed', '<= 20'],
    ['findMatches 8k tokens p99 of process CPU time per call (us, 1 us resolution)', 'p99sCpu', '(<= 20)'],
    ['findMatches 128k tokens p50 (us)', 'p50l', '-'],
    ['findMatches 128k tokens p99 (us)', 'p99l', '<= 200'],
    [`findMatches 128k tokens p99, median of ${ROUNDS} rounds (us)`, 'p99lMed', '<= 200'],
    ['findMatches 128k tokens p99 of process CPU time per call (us)', 'p99lCpu', '(<= 200)'],
    ['longest GC pause in apply + find phases (ms)', 'gc', '<= 10'],
    ['(block, source) pairs held at the end', 'pairs', '-'],
  ];
  console.log('');
  console.log('| metric | KvIndex | naive baseline | target |');
  console.log('|---|---:|---:|---|');
  for (const [label, key, target] of metrics) {
    console.log(`| ${label} | ${rows.KvIndex[key]} | ${rows.naive?.[key] ?? '-'} | ${target} |`);
  }
  if (rows.naive) {
    const ratio = (k: string) => (Number(rows.KvIndex[k].replace(/,/g, '')) / Number(rows.naive[k].replace(/,/g, ''))).toFixed(2);
    console.log(
      `\napply speed-up vs baseline (wall): ${ratio('applyTok')}x with hashing, ${ratio('applySeq')}x with precomputed hashes; ` +
        `per CPU-second: ${ratio('applyTokCpu')}x, ${ratio('applySeqCpu')}x`,
    );
  }
  console.log(`KvIndex own accounting of its arrays: ${rows.KvIndex.own}`);
  console.log(`longest GC pause anywhere in the run (incl. untimed event generation and the baseline): ${fmt(anyGc, 2)} ms`);
  figures.loadEnd = loadavg()[0];
  log(`done (load average ${loadavg()[0].toFixed(2)})`);
  if (JSON_OUT) console.log(`RESULT ${JSON.stringify(figures)}`);
}

interface SnapshotFigures {
  [k: string]: number | boolean;
  blocks: number;
  captureMs: number;
  longestMs: number;
  exportMs: number;
  mib: number;
  restoreMs: number;
  equal: boolean;
}

/**
 * KvRouter.snapshot() on a router holding the workload's final state (built untimed), exported source by source in
 * steps, with an event-loop turn between steps as a shell would; then restore() into an empty router.
 */
async function snapshotPhase(w: Workload, probes: BigUint64Array[], expected: Int32Array[]): Promise<SnapshotFigures> {
  const makeRouter = () => {
    const router = new KvRouter({ blockSize: BLOCK });
    for (let s = 0; s < w.sources; s++) router.addSource({ workerId: `w${s}`, dpRank: 0 });
    return router;
  };
  const router = makeRouter();
  const keys = router.sourceKeys();
  const bounds = chunkBounds(w, CHUNK_BLOCKS);
  for (let c = 0; c + 1 < bounds.length; c++) {
    for (const { source, event } of materialize(w, bounds[c], bounds[c + 1], false)) router.applyEvents(keys[source], [event]);
  }
  heapBytes();
  await tick();
  let t = performance.now();
  const snap = router.snapshot();
  const captureMs = performance.now() - t;
  let longestMs = captureMs;
  let exportMs = captureMs;
  let bytes = 0;
  let blocks = 0;
  const sources: SourceSnapshot[] = [];
  for (const key of snap.keys) {
    // Step by step (the default budget), yielding to the event loop in between, as a shell would.
    const steps = snap.sourceSteps(key);
    let r: IteratorResult<void, SourceSnapshot | null>;
    do {
      await tick();
      t = performance.now();
      r = steps.next();
      const dt = performance.now() - t;
      longestMs = Math.max(longestMs, dt);
      exportMs += dt;
    } while (!r.done);
    const s = r.value;
    if (!s) continue;
    sources.push(s);
    blocks += s.engineIds.length;
    bytes += s.engineIds.byteLength + s.seqHashes.byteLength + (s.parents?.byteLength ?? 0);
  }
  const restored = makeRouter();
  await tick();
  t = performance.now();
  const result = restored.restore({ blockSize: snap.blockSize, sources });
  const restoreMs = performance.now() - t;
  let equal = result.rejected.length === 0 && restored.index.stats().pairs === router.index.stats().pairs;
  probes.forEach((p, i) => {
    const got = restored.index.findMatches(p);
    for (let s = 0; s < w.sources; s++) if (got[s] !== expected[i][s]) equal = false;
  });
  return { blocks, captureMs, longestMs, exportMs, mib: bytes / 2 ** 20, restoreMs, equal };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];

/** Runs the index alone at each fleet size in a fresh process (a clean heap per size) and prints one table. */
function sweep(): void {
  const sizes = SWEEP.split(',').map(Number);
  const explicitCapacity = process.argv.includes('--capacity');
  const self = fileURLToPath(import.meta.url);
  console.log(
    `node ${process.version}, ${cpus().length} cores (${cpus()[0]?.model ?? '?'}), load average ${loadavg()
      .map((x) => x.toFixed(2))
      .join(' ')}`,
  );
  const runs: Array<Array<Record<string, number & Record<string, number>>>> = [];
  for (const n of sizes) {
    const capacity = explicitCapacity ? CAPACITY : Math.max(9000, Math.round(2_304_000 / n));
    const mine: Array<Record<string, number & Record<string, number>>> = [];
    for (let k = 0; k < REPEAT; k++) {
      const args = [
        '--expose-gc',
        '--import',
        'tsx',
        self,
        '--trace',
        TRACE,
        '--sources',
        String(n),
        '--capacity',
        String(capacity),
        '--no-baseline',
        '--json',
      ];
      if (!SNAPSHOT) args.push('--no-snapshot');
      const out = execFileSync(process.execPath, args, { encoding: 'utf8', maxBuffer: 64 << 20, stdio: ['ignore', 'pipe', 'inherit'] });
      const line = out.split('\n').find((l) => l.startsWith('RESULT '));
      if (!line) throw new Error(`no RESULT line from the run at ${n} sources:\n${out}`);
      const f = JSON.parse(line.slice(7));
      mine.push(f);
      console.log(
        `  ${n} sources, run ${k + 1}/${REPEAT}: ${fmt(f.memPair, 1)} B/pair, 8k p50/p99 ${fmt(f.p50s, 1)}/${fmt(f.p99s, 1)} us, ` +
          `128k ${fmt(f.p50l, 1)}/${fmt(f.p99l, 1)} us, load average ${f.loadStart.toFixed(2)} -> ${f.loadEnd.toFixed(2)}`,
      );
    }
    runs.push(mine);
  }
  const med = (rs: Array<Record<string, number & Record<string, number>>>, key: string, sub?: string) =>
    median(rs.map((r) => (sub ? r[key][sub] : r[key]) as number));
  console.log(`\nmedian of ${REPEAT} run(s) per fleet size:\n`);
  console.log(
    '| sources | LRU blocks/source | (block, source) pairs | B/pair | blocks with > 4 holders | apply tokens (block events/CPU-s) | apply seqHashes (block events/CPU-s) | findMatches 8k p50 / p99 (us) | findMatches 128k p50 / p99 (us) | heap + arrayBuffers | longest GC pause (ms) |',
  );
  console.log('|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  runs.forEach((rs, i) => {
    console.log(
      `| ${fmt(sizes[i])} | ${fmt(rs[0].capacity)} | ${fmt(rs[0].pairs)} | ${fmt(med(rs, 'memPair'), 1)} | ${fmt(med(rs, 'overflowBlocks'))} | ` +
        `${fmt(med(rs, 'applyTokCpu'))} | ${fmt(med(rs, 'applySeqCpu'))} | ${fmt(med(rs, 'p50s'), 1)} / ${fmt(med(rs, 'p99s'), 1)} | ` +
        `${fmt(med(rs, 'p50l'), 1)} / ${fmt(med(rs, 'p99l'), 1)} | ${fmt(med(rs, 'heapMiB'), 1)} MiB | ${fmt(med(rs, 'gcMs'), 1)} |`,
    );
  });
  if (SNAPSHOT) {
    console.log(
      '\n| sources | blocks exported | capture (ms) | longest synchronous piece (ms) | export in all (ms) | typed arrays (MiB) | restore into an empty router (ms) | restored findMatches identical |',
    );
    console.log('|---:|---:|---:|---:|---:|---:|---:|---|');
    runs.forEach((rs, i) => {
      console.log(
        `| ${fmt(sizes[i])} | ${fmt(med(rs, 'snapshot', 'blocks'))} | ${fmt(med(rs, 'snapshot', 'captureMs'), 1)} | ${fmt(med(rs, 'snapshot', 'longestMs'), 1)} | ` +
          `${fmt(med(rs, 'snapshot', 'exportMs'), 1)} | ${fmt(med(rs, 'snapshot', 'mib'), 1)} | ${fmt(med(rs, 'snapshot', 'restoreMs'), 0)} | ` +
          `${rs.every((r) => r.snapshot.equal) ? 'yes' : 'NO'} |`,
      );
    });
  }
  console.log(
    `\nload average at the end ${loadavg()
      .map((x) => x.toFixed(2))
      .join(' ')}`,
  );
}

if (SWEEP) sweep();
else await main();
