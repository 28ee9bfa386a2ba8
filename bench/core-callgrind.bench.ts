/**
 * bench:core-callgrind — bench:core's fleets counted in instructions (valgrind's callgrind), so that a change to the
 * routing core or to the replicas' sharing can be compared on a shared machine whose wall and CPU times swing 2x.
 *
 * bench:core (its own process, the whole of it instrumented) is run twice per fleet, with `--requests n` and
 * `--requests 2n` after the same `--warmup`: the difference of the two totals divided by n is the instructions per
 * request of the steady state, start-up, warm-up and the end's waits cancelled (tsx's transpile cache is filled by a
 * run outside valgrind first, or the first counted run would pay for it). In the `replicas` fleet that is the
 * routing replica and its peer together (both in the process; the nats-server is another process, not counted): what
 * sharing a request costs is the difference between the `replicas` and `approximate` rows, and one more peer's share
 * the difference between `--peers 2` and `--peers 1` (passed on to bench:core). With --compare, another
 * checkout's bench:core (its own code) is counted the same way, alternating with this one's.
 *
 *   npm run bench:core-callgrind [-- --requests 1000 --warmup 1000 --only approximate,replicas --peers 1
 *                                 --compare <checkout dir>]
 *
 * Caution: at 1,000 requests a row swings by ±100 k instructions per request between runs (where V8 optimizes a
 * function, in the n-request run or the 2n one, moves more than the replicas' sharing costs; bench/RESULTS.md
 * "Replicas' sharing cost per request"): use many more requests before comparing rows.
 *
 * Counts are split as bench:callgrind's are (bench/lib/callgrind-counts.ts): V8's garbage collector, its optimizing
 * compilers, and the rest.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { numArg, usage } from '../scripts/usage.ts';
import { type Counts, countsOf } from './lib/callgrind-counts.ts';

usage(import.meta.url);

const REQUESTS = numArg('requests', 1000);
const WARMUP = numArg('warmup', 1000);
const arg = (name: string): string | null => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? (process.argv[i + 1] ?? null) : null;
};
const FLEETS = (arg('only') ?? 'approximate,replicas').split(',');
const PEERS = numArg('peers', 1);
const HERE = resolve(fileURLToPath(new URL('..', import.meta.url)));
const trees: [string, string][] = [['this checkout', HERE]];
const other = arg('compare');
if (other) trees.unshift(['before', resolve(other)]);

const dir = mkdtempSync(join(tmpdir(), 'kvroute-core-callgrind-'));

/** One run outside valgrind first: tsx caches what it transpiles, so that neither counted run pays for it. */
function warmCache(root: string, fleet: string): void {
  execFileSync(
    process.execPath,
    ['--import', 'tsx', 'bench/core.bench.ts', '--only', fleet, '--requests', '50', '--warmup', '50', '--peers', String(PEERS)],
    { cwd: root, stdio: ['ignore', 'ignore', 'ignore'] },
  );
}

function count(root: string, fleet: string, requests: number): Counts {
  const out = join(dir, `out.${Date.now()}`);
  execFileSync(
    'valgrind',
    [
      '--tool=callgrind',
      '--smc-check=all-non-file',
      `--callgrind-out-file=${out}`,
      process.execPath,
      '--import',
      'tsx',
      'bench/core.bench.ts',
      '--only',
      fleet,
      '--requests',
      String(requests),
      '--warmup',
      String(WARMUP),
      '--peers',
      String(PEERS),
    ],
    { cwd: root, stdio: ['ignore', 'ignore', 'ignore'] },
  );
  return countsOf(out);
}

console.log(
  `# bench:core-callgrind  node ${process.version}, bench:core --requests ${REQUESTS} vs ${2 * REQUESTS} after --warmup ${WARMUP} --peers ${PEERS}, loadavg ${loadavg()[0].toFixed(1)} at the start`,
);
console.log('');
console.log('| fleet | tree | k instructions/request | of which GC | optimizing compilers | the rest |');
console.log('|---|---|---:|---:|---:|---:|');
// Each row as soon as it is counted (a row takes minutes).
for (const fleet of FLEETS) {
  for (const [label, root] of trees) {
    console.error(`[core-callgrind] ${label}, ${fleet}: ${REQUESTS} and ${2 * REQUESTS} requests`);
    warmCache(root, fleet);
    const a = count(root, fleet, REQUESTS);
    const b = count(root, fleet, 2 * REQUESTS);
    const per = (k: keyof Counts) => (b[k] - a[k]) / REQUESTS / 1000;
    const total = per('total');
    console.log(
      `| ${fleet} | ${label} | ${total.toFixed(0)} | ${per('gc').toFixed(0)} | ${per('jit').toFixed(0)} | ${(total - per('gc') - per('jit')).toFixed(0)} |`,
    );
  }
}
rmSync(dir, { recursive: true, force: true });
