/**
 * bench:mrc — the live miss-ratio curve (src/core/mrc.ts, SHARDS sampling at the serve default rate) against exact
 * simulation, its cost next to route(), and its memory.
 *
 *   npm run bench:mrc                                   conversation + synthetic Mooncake traces and a generated agentic
 *                                                       trace; 64-token blocks; a fleet of 4 engines x 512k tokens
 *   npm run bench:mrc -- --block-size 16 --limit 4000   the router's default block size on the first 4,000 requests
 *   npm run bench:mrc -- --parts shared,cost            leave out the simulator runs (the slow part)
 *   npm run bench:mrc -- --parts host --limit 3000      the host-tier answer against engines with a host tier
 *
 * Tables (one run prints them side by side):
 *   shared     predicted hit of one LRU prefix cache of 0.5x, 1x, 2x, 4x the fleet's blocks, read off one curve, against
 *              an exact LRU prefix cache of that size (src/sim/lru-prefix.ts) fed the same stream; block-weighted
 *   engine     the fleet simulator (src/sim/run-fleet.ts: router, dispatcher, mock engines) run once at 1x; its routed
 *              stream feeds an MrcBook (fleet curve + one curve per engine) as the live tap would; the report's scale-up
 *              (engines of k x capacity) and scale-out (+1, +2, +4 engines of today's size) answers are then compared with
 *              the simulator run again with that fleet (the engines' delivered hit: cached tokens / block size over
 *              prompt blocks); the fixed-routing answer (each engine's stream as today) is printed beside
 *   host       the host-tier answer (MrcBook.report's hostTier: each engine's blocks plus N host blocks) read off the 1x
 *              run's curves (fed by the simulator's tap, FleetOptions.mrc, in dispatch order as the live tap), against the
 *              simulator run again with engines that have a host tier of N blocks (src/mocker/engine/host-tier.ts: an
 *              exclusive LRU level behind the GPU cache), N = --host-factors x the engine's GPU blocks; measured is the
 *              run's delivered block-weighted hit (host loads count as cached, as in vLLM's num_cached_tokens)
 *   cost       per request: route() (hash + match + select, 8 sources) against MrcBook.observe(), what the live tap runs
 *              (one pass over the hashes at the fleet curve's threshold for the fleet curve and the chosen engine's;
 *              engines fed round-robin), after a warm-up in which both ran; wall time in this process, and instruction
 *              counts (--no-callgrind: none): callgrind runs of this file (--cost-run route | observe), each after the same
 *              warm-up with instrumentation off, then only route() (or only observe(), on prompts routed beforehand)
 *              instrumented (callgrind_control -i on, then -d), --callgrind-runs times each (default 2: the figure's
 *              reproducibility), split into V8's GC, its optimizing compilers and the rest (--predictable: node's V8
 *              without concurrent compiler or GC threads); and the memory of all curves (fleet + 8 engines)
 * Goals (issue 27): |predicted - measured| <= 0.03; cost <= 5% of route().
 */
import { usage } from '../scripts/usage.ts';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { islBlocks } from '../src/core/hashing.ts';
import { MRC_DEFAULTS, MrcBook, ShardsMrc } from '../src/core/mrc.ts';
import { DEFAULT_KNOBS, KvRouter, TIER_CREDIT_ON } from '../src/core/router.ts';
import { DEFAULT_POLICY } from '../src/core/scheduling/registry.ts';
import { runFleet } from '../src/sim/run-fleet.ts';
import { LruPrefixCache } from '../src/sim/lru-prefix.ts';
import { expandTokensArray, TraceHasher } from '../src/sim/traces/expand.ts';
import type { TraceRequest } from '../src/sim/traces/format.ts';
import { generateAgentic } from '../src/sim/traces/generate.ts';
import { loadTrace } from '../src/sim/traces/reader.ts';
import { countsOf } from './lib/callgrind-counts.ts';

usage(import.meta.url);

const { values } = parseArgs({
  allowNegative: true,
  options: {
    'block-size': { type: 'string', default: '64' },
    limit: { type: 'string' },
    workers: { type: 'string', default: '4' },
    'capacity-tokens': { type: 'string', default: String(512 * 1024) },
    'sample-rate': { type: 'string', default: String(MRC_DEFAULTS.sampleRate) },
    'max-samples': { type: 'string', default: String(MRC_DEFAULTS.maxSamples) },
    'agentic-requests': { type: 'string', default: '8000' },
    parts: { type: 'string', default: 'shared,engine,host,cost' },
    'host-factors': { type: 'string', default: '0.5,1,2' },
    'cost-requests': { type: 'string', default: '1000' },
    'cost-warm': { type: 'string', default: '2000' },
    callgrind: { type: 'boolean', default: true },
    'callgrind-warm': { type: 'string', default: '1000' },
    'callgrind-requests': { type: 'string', default: '300' },
    'callgrind-runs': { type: 'string', default: '2' },
    predictable: { type: 'boolean', default: false },
    'cost-run': { type: 'string' },
  },
});
const BS = Number(values['block-size']);
const LIMIT = values.limit ? Number(values.limit) : undefined;
const WORKERS = Number(values.workers);
const PER_ENGINE = Math.floor(Number(values['capacity-tokens']) / BS);
const FLEET = WORKERS * PER_ENGINE;
const OPTS = { sampleRate: Number(values['sample-rate']), maxSamples: Number(values['max-samples']) };
const FACTORS = [0.5, 1, 2, 4];
const PARTS = new Set(values.parts!.split(','));

const COST_RUN = values['cost-run'] as 'route' | 'observe' | undefined;
if (COST_RUN !== undefined && !['route', 'observe'].includes(COST_RUN)) throw new Error(`--cost-run: route or observe, got ${COST_RUN}`);

const traces: [string, TraceRequest[]][] = COST_RUN
  ? [['conversation', (await loadTrace('data/traces/mooncake_conversation_trace.jsonl.gz', { limit: LIMIT })).requests]]
  : [
      ['conversation', (await loadTrace('data/traces/mooncake_conversation_trace.jsonl.gz', { limit: LIMIT })).requests],
      ['synthetic', (await loadTrace('data/traces/mooncake_synthetic_trace.jsonl.gz', { limit: LIMIT })).requests],
      ['agentic', generateAgentic({ requests: LIMIT ?? Number(values['agentic-requests']), seed: 1 })],
    ];
if (COST_RUN) {
  costRun(COST_RUN, Number(values['cost-warm']), Number(values['cost-requests']), 1, false);
  process.exit(0);
}

console.log(
  `bench:mrc  block ${BS} tokens, fleet ${WORKERS} engines x ${PER_ENGINE.toLocaleString('en-US')} blocks = ` +
    `${FLEET.toLocaleString('en-US')} blocks, sample rate ${OPTS.sampleRate}, max samples ${OPTS.maxSamples}, node ${process.version}`,
);

const f3 = (x: number) => (Number.isFinite(x) ? x.toFixed(3) : '  -  ');
const sign = (x: number) => `${x >= 0 ? '+' : ''}${x.toFixed(3)}`;
let worstShared = 0;
let worstEngine = 0;
let worstFixed = 0;
const OUT = [1, 2, 4];

const hashed = new Map<string, { seq: BigUint64Array; isl: number }[]>();
if (PARTS.has('shared') || PARTS.has('engine')) {
  console.log('\nshared LRU prefix cache of k x the fleet (block-weighted hit): predicted by the curve vs exact');
  console.log('trace          k    exact  predicted   error   sampled refs  final rate  samples   curve memory');
  for (const [name, trace] of traces) {
    const hasher = new TraceHasher(BS);
    const stream = trace.map((r) => ({ seq: hasher.seqHashes(r), isl: islBlocks(r.inputLength, BS) }));
    hashed.set(name, stream);
    const mrc = new ShardsMrc(OPTS);
    for (const r of stream) mrc.observeHashes(r.seq, r.isl);
    const snap = mrc.snapshot();
    for (const k of PARTS.has('shared') ? FACTORS : []) {
      const cache = new LruPrefixCache(Math.round(k * FLEET));
      for (const r of stream) cache.access(r.seq, r.isl);
      const p = mrc.hitRatio(k * FLEET);
      worstShared = Math.max(worstShared, Math.abs(p - cache.hitRatio));
      console.log(
        `${name.padEnd(13)} ${String(k).padStart(3)}  ${f3(cache.hitRatio)}  ${f3(p).padStart(9)}  ${sign(p - cache.hitRatio).padStart(6)}  ` +
          `${String(snap.sampledRefs).padStart(13)}  ${snap.sampleRate.toFixed(5).padStart(10)}  ${String(snap.samples).padStart(7)}  ` +
          `${(mrc.memoryBytes() / 1024).toFixed(0).padStart(9)} KiB`,
      );
    }
  }
  console.log(`worst |error| ${worstShared.toFixed(3)} (goal <= 0.03)`);
}

if (PARTS.has('engine')) {
  console.log(`\nfleet runs against what the 1x run's curves predict (${WORKERS} engines, policy ${DEFAULT_POLICY}, trace timestamps)`);
  console.log('trace         what            measured  predicted   error   fixed routing  (error)   locality');
  const measuredHit = (run: ReturnType<typeof runFleet>): number => {
    let hit = 0;
    let isl = 0;
    for (const rec of run.perRequest ?? []) {
      if (rec.cachedTokens < 0) continue;
      hit += Math.floor(rec.cachedTokens / BS);
      isl += rec.islBlocks;
    }
    return hit / isl;
  };
  for (const [name, trace] of traces) {
    const stream = hashed.get(name)!;
    const sim = (workers: number, gpuBlocks: number) =>
      runFleet(trace, { workers, policy: DEFAULT_POLICY, blockSize: BS, gpuBlocks, keepRequests: true });
    const base = sim(WORKERS, PER_ENGINE);
    // What the live tap does: every routed request into the book (arrival order), keyed by the engine it went to; the
    // answers are the report's (MrcBook.report, what GET /debug/mrc and `kvroute hitrate --what-if` print).
    const book = new MrcBook(OPTS);
    const recs = [...(base.perRequest ?? [])].sort((x, y) => x.index - y.index);
    for (const rec of recs) book.observe('m', `w${rec.worker}`, stream[rec.index].seq, stream[rec.index].isl);
    const rep = book.report(() => PER_ENGINE, undefined, FACTORS);
    const row = (what: string, measured: number, predicted: number | null, fixed: number | null) => {
      const p = predicted ?? NaN;
      worstEngine = Math.max(worstEngine, Math.abs(p - measured));
      if (fixed !== null) worstFixed = Math.max(worstFixed, Math.abs(fixed - measured));
      console.log(
        `${name.padEnd(13)} ${what.padEnd(14)}  ${f3(measured).padStart(8)}  ${f3(p).padStart(9)}  ${sign(p - measured).padStart(6)}  ` +
          `${(fixed === null ? '-' : f3(fixed)).padStart(13)}  ${(fixed === null ? '' : sign(fixed - measured)).padStart(7)}   ${(rep.locality ?? NaN).toFixed(3)}`,
      );
    };
    for (const [i, k] of FACTORS.entries()) {
      const measured = measuredHit(k === 1 ? base : sim(WORKERS, Math.round(k * PER_ENGINE)));
      row(`${k}x per engine`, measured, rep.scaleUp[i].hit, rep.scaleUpFixedRouting[i].hit);
    }
    for (const p of rep.scaleOut) {
      if (!OUT.includes(p.enginesAdded)) continue;
      row(`+${p.enginesAdded} engine${p.enginesAdded === 1 ? '' : 's'}`, measuredHit(sim(p.engines, PER_ENGINE)), p.hit, null);
    }
  }
  console.log(
    `worst |error| ${worstEngine.toFixed(3)} (goal <= 0.03); with each engine's stream held as today (the fixed-routing answer, up to ` +
      `1x the reported one): ${worstFixed.toFixed(3)}`,
  );
}

let worstHost = 0;
if (PARTS.has('host')) {
  const sizes = values['host-factors']!.split(',').map(Number);
  console.log(
    `\nengines with a host tier of N blocks (CPU offload behind each engine's ${PER_ENGINE.toLocaleString('en-US')} GPU blocks; ` +
      `${WORKERS} engines, policy ${DEFAULT_POLICY}): measured by the simulator vs the 1x run's curve (report.hostTier)`,
  );
  console.log(
    'router: credits host blocks (--tier-credit: 0.75 of a GPU block) or not (the default); predicted: hostTier.hit with ' +
      "credit (fleet curve x locality), hostTier.hitFixedRouting without (each engine's own curve at its GPU + host blocks)",
  );
  console.log('trace         host N (x GPU)    router     measured  predicted   error   no tier   loaded from host   locality');
  for (const [name, trace] of traces) {
    const book = new MrcBook(OPTS);
    const base = runFleet(trace, { workers: WORKERS, policy: DEFAULT_POLICY, blockSize: BS, gpuBlocks: PER_ENGINE, mrc: book });
    for (const k of sizes) {
      const hostBlocks = Math.round(k * PER_ENGINE);
      const rep = book.report(() => PER_ENGINE, hostBlocks, FACTORS);
      for (const credit of [false, true]) {
        const run = runFleet(trace, {
          workers: WORKERS,
          policy: DEFAULT_POLICY,
          blockSize: BS,
          gpuBlocks: PER_ENGINE,
          engine: { hostBlocks },
          ...(credit && { router: { knobs: { ...DEFAULT_KNOBS, ...TIER_CREDIT_ON } } }),
        });
        const measured = run.hit.delivered_block_weighted;
        const p = (credit ? rep.hostTier?.hit : rep.hostTier?.hitFixedRouting) ?? NaN;
        worstHost = Math.max(worstHost, Math.abs(p - measured));
        const loaded = run.host_tier ? run.host_tier.loaded.toLocaleString('en-US') : '-';
        console.log(
          `${name.padEnd(13)} ${`${hostBlocks.toLocaleString('en-US')} (${k}x)`.padEnd(16)}  ${(credit ? 'credit' : 'no credit').padEnd(9)}  ` +
            `${f3(measured).padStart(8)}  ${f3(p).padStart(9)}  ${sign(p - measured).padStart(6)}  ` +
            `${f3(base.hit.delivered_block_weighted).padStart(8)}  ${loaded.padStart(17)} blocks   ${(rep.locality ?? NaN).toFixed(3)}`,
        );
      }
    }
  }
  console.log(
    `worst |error| ${worstHost.toFixed(3)} (goal <= 0.03); load average ${loadavg()
      .map((x) => x.toFixed(2))
      .join(' ')}`,
  );
}

// Cost: route() vs what the live tap runs, on the conversation trace's prompts. Wall time in this process (route and
// observe interleaved, so load hits both alike), and instruction counts under callgrind (child runs of this file with
// --cost-run route | observe, each counting only its own calls after the same warm-up).
if (PARTS.has('cost')) {
  const wall = costRun('tap', Number(values['cost-warm']), Number(values['cost-requests']), 2, true);
  console.log(
    `\ncost per request (${wall.requests} requests of the conversation trace, mean ${wall.meanTokens.toFixed(0)} tokens, ` +
      `${wall.blocks.toFixed(0)} blocks of ${BS} tokens; 8 sources, engine curves fed round-robin; load average ${loadavg()
        .map((x) => x.toFixed(2))
        .join(' ')})`,
  );
  console.log(`  route()             ${(wall.routeNs / wall.requests / 1000).toFixed(1).padStart(8)} us`);
  console.log(
    `  MrcBook.observe()   ${(wall.tapNs / wall.requests / 1000).toFixed(2).padStart(8)} us = ` +
      `${((100 * wall.tapNs) / wall.routeNs).toFixed(1).padStart(4)}% of route() in wall time (goal <= 5%)`,
  );
  const cg = values.callgrind
    ? callgrindCosts(Number(values['callgrind-warm']), Number(values['callgrind-requests']), Number(values['callgrind-runs']))
    : null;
  if (cg) {
    console.log(
      `  instructions per request (callgrind; ${cg.requests} measured requests after ${values['callgrind-warm']} warm-up, each part ` +
        `counted alone in its own process${values.predictable ? ', node --predictable' : ''}; "rest" = all but V8's GC and optimizing compilers):`,
    );
    const k = (x: number) => `${(x / 1000).toFixed(1).padStart(8)} k`;
    for (let run = 0; run < cg.route.length; run++) {
      const r = cg.route[run];
      const o = cg.observe[run];
      const rRest = r.total - r.gc - r.jit;
      const oRest = o.total - o.gc - o.jit;
      console.log(
        `    run ${run + 1}: route() ${k(r.total)} (rest ${k(rRest)}), observe() ${k(o.total)} (rest ${k(oRest)}) = ` +
          `${((100 * o.total) / r.total).toFixed(2)}% (rest: ${((100 * oRest) / rRest).toFixed(2)}%)`,
      );
    }
  }
  console.log(`  memory of the curves (1+8)   ${(wall.memory / 1024).toFixed(0)} KiB (per curve at most ~ max samples x 150 B + 11 KiB)`);
}

interface CostResult {
  requests: number;
  meanTokens: number;
  blocks: number;
  routeNs: number;
  tapNs: number;
  memory: number;
  sampleRate: number;
}

/**
 * A warm-up round over `warm` prompts in every mode (route() and MrcBook.observe() both run, so the JIT has compiled
 * both and the book holds a working set at its steady sample rate), then the measured part over the first `measured`
 * prompts: 'route' route() (and finish()), 'observe' MrcBook.observe() alone (the measured prompts are routed first,
 * outside the measured part), 'tap' route() and observe() interleaved (timed: wall time of each, over `rounds` rounds).
 * Under callgrind (--cost-run) instrumentation is switched on just before the measured part and the counters dumped
 * just after (callgrind_control -i on / -d), so the count is the measured part's alone.
 */
function costRun(mode: 'route' | 'observe' | 'tap', warm: number, measured: number, rounds: number, timeIt: boolean): CostResult {
  const trace = traces[0][1].slice(0, Math.max(warm, measured));
  const router = new KvRouter({ blockSize: BS, seed: 1 });
  for (let s = 0; s < 8; s++) router.addSource({ workerId: `w${s}`, dpRank: 0 });
  const prompts = trace.map(expandTokensArray);
  const keys = Array.from({ length: 8 }, (_, s) => `w${s}:0`);
  const book = new MrcBook(OPTS);
  for (let i = 0; i < warm; i++) {
    const d = router.route({ requestId: `w-${i}`, tokens: prompts[i] }, i);
    if (d.kind !== 'routed') throw new Error('refused');
    book.observe('model', keys[i % 8], d.seqHashes, islBlocks(prompts[i].length, BS));
    router.finish(`w-${i}`, { cachedTokens: 0 }, i);
  }
  let routeNs = 0;
  let tapNs = 0;
  let blocks = 0;
  const mark = (what: '-i' | '-d') => {
    if (timeIt) return;
    const r = spawnSync('callgrind_control', what === '-i' ? ['-i', 'on', String(process.pid)] : ['-d', String(process.pid)], {
      encoding: 'utf8',
    });
    if (r.status !== 0) throw new Error(`callgrind_control ${what} failed: ${r.stderr}`);
  };
  if (mode === 'observe') {
    const routed: { seq: BigUint64Array; isl: number }[] = [];
    for (let i = 0; i < measured; i++) {
      const d = router.route({ requestId: `r-${i}`, tokens: prompts[i] }, i);
      if (d.kind !== 'routed') throw new Error('refused');
      routed.push({ seq: d.seqHashes.slice(), isl: islBlocks(prompts[i].length, BS) });
      router.finish(`r-${i}`, { cachedTokens: 0 }, i);
      blocks += d.seqHashes.length;
    }
    mark('-i');
    for (let i = 0; i < measured; i++) book.observe('model', keys[i % 8], routed[i].seq, routed[i].isl);
    mark('-d');
  } else {
    mark('-i');
    for (let round = 0; round < rounds; round++) {
      for (let i = 0; i < measured; i++) {
        const t0 = timeIt ? process.hrtime.bigint() : 0n;
        const d = router.route({ requestId: `r${round}-${i}`, tokens: prompts[i] }, i);
        const t1 = timeIt ? process.hrtime.bigint() : 0n;
        if (d.kind !== 'routed') throw new Error('refused');
        const isl = islBlocks(prompts[i].length, BS);
        const t2 = timeIt ? process.hrtime.bigint() : 0n;
        if (mode === 'tap') book.observe('model', keys[i % 8], d.seqHashes, isl);
        const t3 = timeIt ? process.hrtime.bigint() : 0n;
        router.finish(`r${round}-${i}`, { cachedTokens: 0 }, i);
        routeNs += Number(t1 - t0);
        tapNs += Number(t3 - t2);
        blocks += d.seqHashes.length;
      }
    }
    mark('-d');
  }
  const timed = mode === 'observe' ? measured : measured * rounds;
  return {
    requests: timed,
    meanTokens: prompts.slice(0, measured).reduce((a, p) => a + p.length, 0) / measured,
    blocks: blocks / timed,
    routeNs,
    tapNs,
    memory: book.memoryBytes(),
    sampleRate: book.fleet.sampleRate,
  };
}

interface IrRun {
  /** Instructions per measured request: all, V8's GC, V8's optimizing compilers. */
  total: number;
  gc: number;
  jit: number;
}

/**
 * Instructions per request of route() and of MrcBook.observe(), each counted alone in its own callgrind run of this file
 * (--cost-run route | observe: the same warm-up, then only the measured calls instrumented), `runs` times each.
 */
function callgrindCosts(warm: number, requests: number, runs: number): { route: IrRun[]; observe: IrRun[]; requests: number } | null {
  const probe = spawnSync('valgrind', ['--version'], { encoding: 'utf8' });
  if (probe.status !== 0) {
    console.log('  (valgrind not found: no instruction counts)');
    return null;
  }
  const dir = mkdtempSync(join(tmpdir(), 'bench-mrc-'));
  const ir: { route: IrRun[]; observe: IrRun[] } = { route: [], observe: [] };
  try {
    for (let run = 0; run < runs; run++) {
      for (const mode of ['route', 'observe'] as const) {
        const out = join(dir, `callgrind.${mode}.${run}`);
        const r = spawnSync(
          'valgrind',
          [
            '--tool=callgrind',
            '--instr-atstart=no',
            `--callgrind-out-file=${out}`,
            process.execPath,
            ...(values.predictable ? ['--predictable'] : []),
            '--import',
            'tsx',
            fileURLToPath(import.meta.url),
            '--cost-run',
            mode,
            '--cost-warm',
            String(warm),
            '--cost-requests',
            String(requests),
            '--block-size',
            String(BS),
            '--sample-rate',
            String(OPTS.sampleRate),
            '--max-samples',
            String(OPTS.maxSamples),
            '--limit',
            String(Math.max(warm, requests)),
          ],
          { encoding: 'utf8', maxBuffer: 64 << 20 },
        );
        if (r.status !== 0) throw new Error(`callgrind run ${mode} failed: ${r.stderr.slice(-2000)}`);
        // The dump callgrind_control -d wrote: the measured part only (no start-up, no warm-up).
        const c = countsOf(`${out}.1`);
        ir[mode].push({ total: c.total / requests, gc: c.gc / requests, jit: c.jit / requests });
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return { ...ir, requests };
}
