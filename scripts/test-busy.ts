/**
 * The suite on a busy machine (issue 30, "The suite under load"): `npm run test:busy -- [--runs 3] [VITEST ARGS]`.
 *
 * Starts one CPU hog per core (a `node` process spinning in a loop, at normal priority), runs `vitest run` `--runs`
 * times one after another while they spin, then ends the hogs by their pids (also on Ctrl-C or an error). Reports each
 * run's result (passed/failed tests, exit code), wall time and slowest tests, then a summary; exit code 1 when any
 * run failed. Options:
 *
 *   --runs N    runs of the suite (default 3)
 *   --hogs N    hog processes (default: one per core, os.availableParallelism())
 *   --top N     slowest tests listed per run (default 8)
 *
 * Anything else is passed to vitest as is: test files or a name filter select a subset, e.g.
 * `npm run test:busy -- --runs 1 test/core/restore-steps.test.ts -t "budget"`. Each run's JSON report is kept as
 * test-artifacts/busy-run-N.json.
 */
import { usage } from './usage.ts';
import { spawn } from 'node:child_process';
import { copyFileSync, existsSync, readFileSync, rmSync } from 'node:fs';
import { availableParallelism, loadavg } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { endCpuHogs, startCpuHogs } from './cpu-hogs.ts';

usage(import.meta.url);

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const REPORT = join(ROOT, 'test-artifacts/vitest.json');

function parseArgs(argv: string[]): { runs: number; hogs: number; top: number; vitest: string[] } {
  const out = { runs: 3, hogs: availableParallelism(), top: 8, vitest: [] as string[] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const key = a === '--runs' ? 'runs' : a === '--hogs' ? 'hogs' : a === '--top' ? 'top' : null;
    if (key === null) {
      out.vitest.push(a);
      continue;
    }
    const v = Number(argv[++i]);
    if (!Number.isInteger(v) || v < (key === 'runs' ? 1 : 0)) {
      console.error(`test:busy: ${a} needs a whole number${key === 'runs' ? ' of at least 1' : ''}, got ${argv[i]}`);
      process.exit(2);
    }
    out[key] = v;
  }
  return out;
}

const la = () =>
  loadavg()
    .map((x) => x.toFixed(2))
    .join(' ');

interface TestTime {
  readonly name: string;
  readonly ms: number;
  readonly status: string;
}

interface RunResult {
  readonly code: number;
  readonly wallMs: number;
  readonly passed: number;
  readonly failed: number;
  readonly skipped: number;
  readonly tests: TestTime[];
}

/** Reads vitest's JSON report: every test's time and status. */
function readReport(): Omit<RunResult, 'code' | 'wallMs'> | null {
  if (!existsSync(REPORT)) return null;
  const r = JSON.parse(readFileSync(REPORT, 'utf8')) as {
    numPassedTests: number;
    numFailedTests: number;
    numPendingTests?: number;
    numTodoTests?: number;
    testResults: Array<{
      name: string;
      assertionResults: Array<{ fullName: string; duration?: number | null; status: string }>;
    }>;
  };
  const tests: TestTime[] = [];
  for (const f of r.testResults) {
    const file = f.name.startsWith(ROOT) ? f.name.slice(ROOT.length) : f.name;
    for (const t of f.assertionResults) tests.push({ name: `${file} > ${t.fullName}`, ms: t.duration ?? 0, status: t.status });
  }
  return {
    passed: r.numPassedTests,
    failed: r.numFailedTests,
    skipped: (r.numPendingTests ?? 0) + (r.numTodoTests ?? 0),
    tests,
  };
}

function runSuite(args: string[]): Promise<RunResult> {
  rmSync(REPORT, { force: true });
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(ROOT, 'node_modules/vitest/vitest.mjs'), 'run', ...args], {
      cwd: ROOT,
      stdio: 'inherit',
    });
    child.on('error', reject);
    child.on('exit', (code, signal) => {
      const wallMs = performance.now() - t0;
      const report = readReport();
      resolve({ code: code ?? (signal ? 128 : 1), wallMs, ...(report ?? { passed: 0, failed: 0, skipped: 0, tests: [] }) });
    });
  });
}

async function main(): Promise<void> {
  const opts = parseArgs(process.argv.slice(2));
  console.log(`test:busy: ${opts.runs} run(s) of vitest run ${opts.vitest.join(' ')} with ${opts.hogs} CPU hog(s); load average ${la()}`);
  const hogPids = startCpuHogs(opts.hogs);
  console.log(`test:busy: hogs started, pids ${hogPids.join(', ')}`);
  const results: RunResult[] = [];
  try {
    for (let run = 1; run <= opts.runs; run++) {
      console.log(`\n=== test:busy run ${run}/${opts.runs} (load average ${la()}) ===\n`);
      const r = await runSuite(opts.vitest);
      results.push(r);
      if (existsSync(REPORT)) copyFileSync(REPORT, join(ROOT, `test-artifacts/busy-run-${run}.json`));
      const verdict = r.code === 0 ? 'PASS' : 'FAIL';
      console.log(
        `\n--- run ${run}: ${verdict} (exit ${r.code}), ${r.passed} passed, ${r.failed} failed, ${r.skipped} skipped, ` +
          `wall ${(r.wallMs / 1000).toFixed(1)} s, load average ${la()}`,
      );
      for (const t of r.tests.filter((x) => x.status === 'failed')) console.log(`    failed: ${t.name}`);
      console.log(`    slowest ${opts.top}:`);
      for (const t of r.tests
        .filter((x) => x.status === 'passed' || x.status === 'failed')
        .sort((a, b) => b.ms - a.ms)
        .slice(0, opts.top)) {
        console.log(`    ${(t.ms / 1000).toFixed(2).padStart(7)} s  ${t.name}`);
      }
    }
  } finally {
    endCpuHogs();
  }
  console.log(`\ntest:busy summary (${opts.hogs} hog(s), load average at the end ${la()}):`);
  console.log('| run | result | tests passed | failed | wall s |');
  console.log('| --- | ------ | ------------ | ------ | ------ |');
  results.forEach((r, i) => {
    console.log(`| ${i + 1} | ${r.code === 0 ? 'pass' : 'FAIL'} | ${r.passed} | ${r.failed} | ${(r.wallMs / 1000).toFixed(1)} |`);
  });
  process.exitCode = results.every((r) => r.code === 0) ? 0 : 1;
}

await main();
