/**
 * Restore benchmark (issue 30, "Restore in pieces"): a replica reloading one very large source from a snapshot while
 * it serves, the way a stream gap makes it (event-consumer resync): the source's old blocks are cleared, then the
 * snapshot's are loaded. Side by side in one process, alternating:
 *
 *   one piece   resetSource, then restoreSource (what a resync did before: each a synchronous piece)
 *   in steps    resetSteps, then restoreSteps (KvRouter; one bounded step per event-loop turn, as the replica runs them)
 *
 * A 1 ms ticker routes a request on every tick while the restore runs; the longest gap between ticks is the longest
 * time routing waited. Also: the longest single step in wall and process CPU time (process CPU counts the GC's
 * helper threads too), and the whole restore's wall and CPU time (the requests routed meanwhile included).
 *
 *   npm run bench:restore -- [--blocks 1000000] [--rounds 3] [--budget 4096]
 */
import { loadavg } from 'node:os';
import { performance } from 'node:perf_hooks';
import { KvRouter } from '../src/core/router.ts';
import { createRng } from '../src/core/rng.ts';
import type { SourceSnapshot } from '../src/core/index/snapshot.ts';
import { runSteps } from '../src/transport/nats/snapshot-store.ts';
import { numArg } from '../scripts/usage.ts';

if (process.argv.includes('--help') || process.argv.includes('-h')) {
  console.log('usage: npm run bench:restore -- [--blocks N (1000000)] [--rounds R (3)] [--budget BLOCKS_PER_STEP (4096)]');
  process.exit(0);
}
const BLOCKS = numArg('blocks', 1_000_000);
const ROUNDS = numArg('rounds', 3);
const BUDGET = numArg('budget', 4096);
const BS = 16;
/** Blocks per conversation; each shares a random prefix of an earlier one (a prefix tree, as engines' caches are). */
const CONV = 256;

/** The snapshot of one source holding `n` blocks, and the conversations' hashes (what the ticker routes). */
function build(n: number, seed: number): { snap: SourceSnapshot; probes: BigUint64Array[] } {
  const rand = createRng(seed);
  const r = new KvRouter({ blockSize: BS });
  r.addSource({ workerId: 'big', dpRank: 0 });
  const convs: BigUint64Array[] = [];
  let id = BigInt(seed) << 40n;
  let held = 0;
  const ids = new Map<bigint, bigint>(); // last hash of a prefix -> its engine id (shared prefixes share ids)
  while (held < n) {
    const from = convs.length > 0 ? convs[Math.floor(rand() * convs.length)] : null;
    const share = from ? Math.floor(rand() * CONV * 0.75) : 0;
    const seq = new BigUint64Array(CONV);
    for (let b = 0; b < CONV; b++) {
      seq[b] =
        b < share ? from![b] : BigInt.asUintN(64, (BigInt(Math.floor(rand() * 2 ** 32)) << 32n) | BigInt(Math.floor(rand() * 2 ** 32)));
    }
    const fresh = Math.min(CONV - share, n - held);
    const engineIds: bigint[] = [];
    for (let b = share; b < share + fresh; b++) {
      const e = id++;
      engineIds.push(e);
      ids.set(seq[b], e);
    }
    r.applyEvents('big', [
      {
        kind: 'stored',
        parent: share > 0 ? ids.get(seq[share - 1])! : null,
        engineIds,
        tokens: null,
        blockSize: BS,
        seqHashes: seq.slice(share, share + fresh),
      },
    ]);
    held += fresh;
    convs.push(seq);
  }
  return { snap: r.snapshot().source('big')!, probes: convs.slice(0, 512) };
}

const turn = () => new Promise<void>((resolve) => setImmediate(resolve));

interface Figures {
  maxGapMs: number;
  maxStepMs: number;
  maxStepCpuMs: number;
  wallMs: number;
  cpuMs: number;
  blocks: number;
  routed: number;
}

/** One restore over a router holding `old` for the source, with the ticker routing meanwhile. */
async function once(mode: 'one piece' | 'in steps', old: SourceSnapshot, snap: SourceSnapshot, probes: BigUint64Array[]): Promise<Figures> {
  const r = new KvRouter({ blockSize: BS });
  r.addSource({ workerId: 'big', dpRank: 0 });
  r.addSource({ workerId: 'other', dpRank: 0 });
  r.restoreSource(old);
  let last = performance.now();
  let maxGap = 0;
  let routed = 0;
  let now = 0;
  const ticker = setInterval(() => {
    const t = performance.now();
    maxGap = Math.max(maxGap, t - last);
    last = t;
    const id = `q${routed++}`;
    const d = r.route({ requestId: id, seqHashes: probes[routed % probes.length], policy: 'kv' }, ++now);
    if (d.kind === 'routed') r.finish(id, { outcome: 'ok' }, now);
  }, 1);
  await new Promise((res) => setTimeout(res, 50));
  let maxStep = 0;
  let maxStepCpu = 0;
  const onStep = (ms: number, cpu: number) => {
    maxStep = Math.max(maxStep, ms);
    maxStepCpu = Math.max(maxStepCpu, cpu);
  };
  last = performance.now();
  maxGap = 0;
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  let blocks = 0;
  if (mode === 'one piece') {
    const step = <T>(f: () => T): T => {
      const c = process.cpuUsage();
      const s = performance.now();
      const v = f();
      const u = process.cpuUsage(c);
      onStep(performance.now() - s, (u.user + u.system) / 1000);
      return v;
    };
    step(() => r.resetSource('big'));
    await turn();
    blocks = step(() => r.restoreSource(snap)).applied;
  } else {
    await runSteps(r.resetSteps(['big'], BUDGET), onStep);
    blocks = (await runSteps(r.restoreSteps([snap], BUDGET), onStep)).blocks;
  }
  const wallMs = performance.now() - t0;
  const cu = process.cpuUsage(c0);
  await new Promise((res) => setTimeout(res, 20));
  clearInterval(ticker);
  return {
    maxGapMs: maxGap,
    maxStepMs: maxStep,
    maxStepCpuMs: maxStepCpu,
    wallMs,
    cpuMs: (cu.user + cu.system) / 1000,
    blocks,
    routed,
  };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)];

async function main(): Promise<void> {
  console.log(`building two snapshots of one source, ${BLOCKS.toLocaleString('en-US')} blocks each ...`);
  const { snap: old } = build(BLOCKS, 1);
  const { snap, probes } = build(BLOCKS, 2);
  const runs: Record<string, Figures[]> = { 'one piece': [], 'in steps': [] };
  for (let round = 0; round < ROUNDS; round++) {
    for (const mode of round % 2 === 0 ? (['one piece', 'in steps'] as const) : (['in steps', 'one piece'] as const)) {
      const f = await once(mode, old, snap, probes);
      if (f.blocks !== snap.engineIds.length) throw new Error(`${mode}: ${f.blocks} blocks restored of ${snap.engineIds.length}`);
      runs[mode].push(f);
    }
  }
  const la = loadavg()
    .map((x) => x.toFixed(2))
    .join(' ');
  console.log(
    `\nrestore of one source, ${snap.engineIds.length.toLocaleString('en-US')} blocks, over ${old.engineIds.length.toLocaleString('en-US')} old ones; ` +
      `budget ${BUDGET} blocks/step; ${ROUNDS} rounds (median / max); node ${process.version}, load average ${la}\n`,
  );
  const rows: Array<[string, (f: Figures) => number, number]> = [
    ['longest routing gap (1 ms ticker), ms', (f) => f.maxGapMs, 1],
    ['longest step, wall ms', (f) => f.maxStepMs, 1],
    ['longest step, CPU ms', (f) => f.maxStepCpuMs, 1],
    ['restore wall time, ms', (f) => f.wallMs, 0],
    ['restore CPU time, ms', (f) => f.cpuMs, 0],
    ['requests routed meanwhile', (f) => f.routed, 0],
  ];
  const cell = (fs: Figures[], get: (f: Figures) => number, dp: number) =>
    `${median(fs.map(get)).toFixed(dp)} / ${Math.max(...fs.map(get)).toFixed(dp)}`;
  console.log(`| ${'figure'.padEnd(40)} | ${'one piece (before)'.padEnd(20)} | ${'in steps'.padEnd(20)} |`);
  console.log(`| ${'-'.repeat(40)} | ${'-'.repeat(20)} | ${'-'.repeat(20)} |`);
  for (const [name, get, dp] of rows) {
    console.log(`| ${name.padEnd(40)} | ${cell(runs['one piece'], get, dp).padEnd(20)} | ${cell(runs['in steps'], get, dp).padEnd(20)} |`);
  }
  const worst = Math.max(...runs['in steps'].map((f) => f.maxStepCpuMs));
  console.log(`\ngoal: no step over 50 ms of CPU while restoring: ${worst <= 50 ? 'met' : 'NOT met'} (longest ${worst.toFixed(1)} ms)`);
}

await main();
