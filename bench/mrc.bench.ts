/**
 * bench:mrc — the live miss-ratio curve (src/core/mrc.ts, SHARDS sampling at the serve default rate) against exact
 * simulation, its cost next to route(), and its memory.
 *
 *   npm run bench:mrc                                   conversation + synthetic Mooncake traces and a generated agentic
 *                                                       trace; 64-token blocks; a fleet of 4 engines x 512k tokens
 *   npm run bench:mrc -- --block-size 16 --limit 4000   the router's default block size on the first 4,000 requests
 *   npm run bench:mrc -- --parts shared,cost            leave out the simulator runs (the slow part)
 *
 * Tables (one run prints them side by side):
 *   shared     predicted hit of one LRU prefix cache of 0.5x, 1x, 2x, 4x the fleet's blocks, read off one curve, against
 *              an exact LRU prefix cache of that size (src/sim/lru-prefix.ts) fed the same stream; block-weighted
 *   per-engine the fleet simulator (src/sim/run-fleet.ts: router, dispatcher, mock engines) run once at 1x; each engine's
 *              routed stream feeds its own curve, read at k x its capacity; then the simulator is run again with engines
 *              of k x capacity and the engines' delivered hit (cached tokens / block size over prompt blocks) is measured
 *   cost       per request: route() (hash + match + select, 8 sources) against MrcBook.observe(), what the live tap runs
 *              (one pass over the hashes for the fleet curve and the chosen engine's; a model has its own curve only once
 *              a second model is seen), same prompts; and the memory of all curves (fleet + 8 engines)
 * Goals (issue 27): |predicted - measured| <= 0.03; cost <= 5% of route().
 */
import { parseArgs } from 'node:util';
import { islBlocks } from '../src/core/hashing.ts';
import { MRC_DEFAULTS, MrcBook, ShardsMrc } from '../src/core/mrc.ts';
import { KvRouter } from '../src/core/router.ts';
import { DEFAULT_POLICY } from '../src/core/scheduling/registry.ts';
import { runFleet } from '../src/sim/run-fleet.ts';
import { LruPrefixCache } from '../src/sim/lru-prefix.ts';
import { expandTokensArray, TraceHasher } from '../src/sim/traces/expand.ts';
import type { TraceRequest } from '../src/sim/traces/format.ts';
import { generateAgentic } from '../src/sim/traces/generate.ts';
import { loadTrace } from '../src/sim/traces/reader.ts';

const { values } = parseArgs({
  options: {
    'block-size': { type: 'string', default: '64' },
    limit: { type: 'string' },
    workers: { type: 'string', default: '4' },
    'capacity-tokens': { type: 'string', default: String(512 * 1024) },
    'sample-rate': { type: 'string', default: String(MRC_DEFAULTS.sampleRate) },
    'max-samples': { type: 'string', default: String(MRC_DEFAULTS.maxSamples) },
    'agentic-requests': { type: 'string', default: '8000' },
    parts: { type: 'string', default: 'shared,engine,cost' },
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

const traces: [string, TraceRequest[]][] = [
  ['conversation', (await loadTrace('data/traces/mooncake_conversation_trace.jsonl.gz', { limit: LIMIT })).requests],
  ['synthetic', (await loadTrace('data/traces/mooncake_synthetic_trace.jsonl.gz', { limit: LIMIT })).requests],
  ['agentic', generateAgentic({ requests: LIMIT ?? Number(values['agentic-requests']), seed: 1 })],
];

console.log(
  `bench:mrc  block ${BS} tokens, fleet ${WORKERS} engines x ${PER_ENGINE.toLocaleString('en-US')} blocks = ` +
    `${FLEET.toLocaleString('en-US')} blocks, sample rate ${OPTS.sampleRate}, max samples ${OPTS.maxSamples}, node ${process.version}`,
);

const f3 = (x: number) => (Number.isFinite(x) ? x.toFixed(3) : '  -  ');
const sign = (x: number) => `${x >= 0 ? '+' : ''}${x.toFixed(3)}`;
let worstShared = 0;
let worstEngine = 0;

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
  console.log(`\nper-engine curves under the router's own routing (${WORKERS} engines, policy ${DEFAULT_POLICY}, trace timestamps)`);
  console.log('trace          k    measured  predicted   error   (engines of k x capacity; curves from the 1x run)');
  for (const [name, trace] of traces) {
    const stream = hashed.get(name)!;
    const base = runFleet(trace, { workers: WORKERS, policy: DEFAULT_POLICY, blockSize: BS, gpuBlocks: PER_ENGINE, keepRequests: true });
    const curves = Array.from({ length: WORKERS }, () => new ShardsMrc(OPTS));
    const islPer = new Float64Array(WORKERS);
    for (const rec of base.perRequest ?? []) {
      curves[rec.worker].observeHashes(stream[rec.index].seq, stream[rec.index].isl);
      islPer[rec.worker] += stream[rec.index].isl;
    }
    for (const k of FACTORS) {
      const run =
        k === 1
          ? base
          : runFleet(trace, {
              workers: WORKERS,
              policy: DEFAULT_POLICY,
              blockSize: BS,
              gpuBlocks: Math.round(k * PER_ENGINE),
              keepRequests: true,
            });
      let hit = 0;
      let isl = 0;
      for (const rec of run.perRequest ?? []) {
        if (rec.cachedTokens < 0) continue;
        hit += Math.floor(rec.cachedTokens / BS);
        isl += rec.islBlocks;
      }
      const measured = hit / isl;
      let num = 0;
      let den = 0;
      for (let w = 0; w < WORKERS; w++) {
        const h = curves[w].hitRatio(k * PER_ENGINE);
        if (Number.isFinite(h)) {
          num += h * islPer[w];
          den += islPer[w];
        }
      }
      const predicted = num / den;
      worstEngine = Math.max(worstEngine, Math.abs(predicted - measured));
      console.log(
        `${name.padEnd(13)} ${String(k).padStart(3)}  ${f3(measured).padStart(8)}  ${f3(predicted).padStart(9)}  ${sign(predicted - measured).padStart(6)}`,
      );
    }
  }
  console.log(`worst |error| ${worstEngine.toFixed(3)} (goal <= 0.03)`);
}

// Cost: route() vs the tap's three observe() calls, on the conversation trace's prompts.
if (PARTS.has('cost')) {
  const trace = traces[0][1].slice(0, 1500);
  const router = new KvRouter({ blockSize: BS, seed: 1 });
  for (let s = 0; s < 8; s++) router.addSource({ workerId: `w${s}`, dpRank: 0 });
  const prompts = trace.map(expandTokensArray);
  // What the live tap runs per request (src/runtime/mrc-feed.ts): MrcBook.observe, one model, the chosen engine's curve.
  const book = new MrcBook(OPTS);
  let routeNs = 0;
  let tapNs = 0;
  const rounds = 3;
  for (let round = 0; round < rounds; round++) {
    for (let i = 0; i < prompts.length; i++) {
      const t0 = process.hrtime.bigint();
      const d = router.route({ requestId: `r${round}-${i}`, tokens: prompts[i] }, i);
      const t1 = process.hrtime.bigint();
      if (d.kind !== 'routed') throw new Error('refused');
      const isl = islBlocks(prompts[i].length, BS);
      const t2 = process.hrtime.bigint();
      book.observe('model', d.sourceKey, d.seqHashes, isl);
      const t3 = process.hrtime.bigint();
      router.finish(`r${round}-${i}`, { cachedTokens: 0 }, i);
      if (round === 0) continue; // warm-up
      routeNs += Number(t1 - t0);
      tapNs += Number(t3 - t2);
    }
  }
  const n = prompts.length * (rounds - 1);
  const mem = book.memoryBytes();
  console.log(
    `\ncost per request (${n} requests of the conversation trace, mean ${(prompts.reduce((a, p) => a + p.length, 0) / prompts.length).toFixed(0)} tokens, 8 sources)`,
  );
  console.log(`  route()                      ${(routeNs / n / 1000).toFixed(1)} us`);
  console.log(
    `  MrcBook.observe()            ${(tapNs / n / 1000).toFixed(2)} us   = ${((100 * tapNs) / routeNs).toFixed(1)}% of route() (goal <= 5%)`,
  );
  console.log(`  memory of the curves (1+8)   ${(mem / 1024).toFixed(0)} KiB (per curve at most ~ max samples x 150 B + 11 KiB)`);
}
