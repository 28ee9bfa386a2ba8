/**
 * bench:route-ab — bench:route's workload (a 32k-token prompt over 64 sources, 16 cached families, 64 requests in
 * flight) on this tree's KvRouter and on another commit's, interleaved call by call in one process, so both sides see
 * the same machine at the same moment (the shared machine's load moves faster than whole runs). Each side gets its own
 * freshly built prompt (as bench:route builds one per call); which side goes first alternates. Every call's decision
 * (the chosen source and the whole candidate ranking) is compared between the sides.
 *
 *   npm run bench:route-ab [-- --against <commit> --iterations 4000 --tokens 32768 --sources 64 --cold]
 *     --against <commit>   the other side: that commit's src/ (default HEAD), extracted to a temporary directory
 *
 * Prints route() and phase p50 / p90 / p99 per side and the per-call difference of route() (this - against).
 */
import { usage } from '../scripts/usage.ts';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath, pathToFileURL } from 'node:url';
import * as here from '../src/core/router.ts';
import { createRng } from '../src/core/rng.ts';
import type { KvEvent, RouteDecision } from '../src/core/types.ts';

usage(import.meta.url);

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

const ITER = Number(arg('iterations', '4000'));
const TOKENS = Number(arg('tokens', '32768'));
const SOURCES = Number(arg('sources', '64'));
const AGAINST = arg('against', 'HEAD');
const COLD = process.argv.includes('--cold');
const BS = 16;

type RouterModule = typeof here;

/** The other commit's router: its src/ extracted next to a link to this checkout's node_modules. */
async function against(commit: string): Promise<RouterModule> {
  const repo = fileURLToPath(new URL('..', import.meta.url));
  const dir = mkdtempSync(join(tmpdir(), 'kvroute-route-ab-'));
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  execFileSync('sh', ['-c', `git -C "${repo}" archive "${commit}" src package.json | tar -x -C "${dir}"`]);
  symlinkSync(join(repo, 'node_modules'), join(dir, 'node_modules'));
  return (await import(pathToFileURL(join(dir, 'src/core/router.ts')).href)) as RouterModule;
}

const families = Array.from({ length: 16 }, (_, f) => Array.from({ length: TOKENS }, (_, i) => (f * 7_919 + i * 31) % 151_000));
const prompt = (i: number): number[] =>
  COLD
    ? Array.from({ length: TOKENS }, (_, j) => (i * 7_777 + j * 13 + ((j * j) % 977)) % 151_000)
    : families[i % families.length].slice(0, TOKENS - 1024).concat(Array.from({ length: 1024 }, (_, j) => (i * 1_003 + j) % 151_000));

/** bench:route's router: 64 sources, each family cached to a random depth (50-100%) on 3 of them. */
function setup(mod: RouterModule): here.KvRouter {
  const rng = createRng(42);
  const router = new mod.KvRouter({ blockSize: BS, seed: 1, selection: 'auto', clock: () => performance.now() });
  for (let s = 0; s < SOURCES; s++) router.addSource({ workerId: `w${s}`, dpRank: 0 });
  let engineId = 1n;
  for (const [f, tokens] of families.entries()) {
    for (let k = 0; k < 3; k++) {
      const blocks = Math.floor((0.5 + 0.5 * rng()) * (TOKENS / BS));
      const ids = Array.from({ length: blocks }, () => engineId++);
      const ev: KvEvent = { kind: 'stored', parent: null, engineIds: ids, tokens: tokens.slice(0, blocks * BS), blockSize: BS };
      router.applyEvents(`w${(f * 3 + k) % SOURCES}`, [ev]);
    }
  }
  return router;
}

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const us = (x: number) => (x * 1000).toFixed(0);

const other = await against(AGAINST);
const sides = { this: setup(here), against: setup(other) };
type Side = keyof typeof sides;
const phases = ['total', 'hash', 'find', 'select'] as const;
const times: Record<Side, Record<(typeof phases)[number], number[]>> = {
  this: { total: [], hash: [], find: [], select: [] },
  against: { total: [], hash: [], find: [], select: [] },
};
const diff: number[] = [];
const held: Record<Side, BigUint64Array[]> = { this: [], against: [] }; // each side's in-flight hashes, by i % 64
const WARMUP = Math.min(200, ITER / 4);
const load0 = loadavg()[0];
for (let i = 0; i < ITER + WARMUP; i++) {
  const order: Side[] = i % 2 === 0 ? ['this', 'against'] : ['against', 'this'];
  const got: Partial<Record<Side, RouteDecision>> = {};
  const took: Partial<Record<Side, number>> = {};
  for (const side of order) {
    const router = sides[side];
    const p = prompt(i);
    const t0 = performance.now();
    const d = router.route({ requestId: `r${i}`, tokens: p }, i);
    const t1 = performance.now();
    if (d.kind !== 'routed') throw new Error('refused');
    if (i >= 64) {
      router.finish(`r${i - 64}`, { cachedTokens: 0 }, i);
      // As the dispatcher does when a request finishes (a tree without KvRouter.releaseHashes skips it).
      const done = held[side][i % 64];
      if (done && 'releaseHashes' in router) (router as { releaseHashes(h: BigUint64Array): void }).releaseHashes(done);
    }
    held[side][i % 64] = d.seqHashes;
    got[side] = d;
    took[side] = t1 - t0;
    if (i < WARMUP) continue;
    const t = times[side];
    t.total.push(t1 - t0);
    t.hash.push(d.timingsMs!.hash);
    t.find.push(d.timingsMs!.find);
    t.select.push(d.timingsMs!.select);
  }
  const a = got.this!;
  const b = got.against!;
  if (a.sourceKey !== b.sourceKey || JSON.stringify(a.candidates) !== JSON.stringify(b.candidates)) {
    throw new Error(`call ${i}: the sides decided differently (${a.sourceKey} against ${b.sourceKey})`);
  }
  if (i >= WARMUP) diff.push(took.this! - took.against!);
}
console.log(
  `bench:route-ab  ${TOKENS}-token prompts, ${SOURCES} sources, ${ITER} calls a side, interleaved${COLD ? ', cold' : ''}, ` +
    `node ${process.version}, load average ${load0.toFixed(1)} -> ${loadavg()[0].toFixed(1)}; decisions identical on every call`,
);
console.log('side                 route p50 / p90 / p99    hash p50 / p99   find p50 / p99   select p50 / p99   (us)');
for (const side of ['against', 'this'] as const) {
  const t = times[side];
  const name = side === 'this' ? 'this tree' : AGAINST;
  console.log(
    `${name.padEnd(18)} ${`${us(pct(t.total, 50))} / ${us(pct(t.total, 90))} / ${us(pct(t.total, 99))}`.padStart(22)}` +
      `${`${us(pct(t.hash, 50))} / ${us(pct(t.hash, 99))}`.padStart(17)}${`${us(pct(t.find, 50))} / ${us(pct(t.find, 99))}`.padStart(17)}` +
      `${`${us(pct(t.select, 50))} / ${us(pct(t.select, 99))}`.padStart(19)}`,
  );
}
console.log(`per-call route() difference (this - against): p50 ${us(pct(diff, 50))} us`);
