/**
 * Runs once before any test:
 *  - builds dist/ (`npm run build`: scripts/build.mjs): tests that start `kvroute` as a process run bin/kvroute.mjs,
 *    which runs the compiled CLI, since that is what ships. Incremental (a file whose output is newer is skipped), so an
 *    up-to-date build costs a directory walk.
 *  - finds or fetches Chromium and nats-server (test/fixtures/test-binaries.ts) and hands their paths to the tests as
 *    KVR_TEST_CHROMIUM and KVR_TEST_NATS_SERVER (test workers inherit this process's environment), while the build
 *    runs (on a fresh clone Chromium's decompression takes a few seconds of the other core).
 *  - marks the run (KVR_TEST_RUN), ends orphans of earlier runs, and at teardown every process this run left
 *    (test/fixtures/process-sweep.ts).
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { RUN_MARK, sweepOrphans, sweepRun } from './fixtures/process-sweep.ts';
import { ensureChromium, ensureNatsServer } from './fixtures/test-binaries.ts';

export default async function setup(): Promise<() => void> {
  const swept = sweepOrphans();
  if (swept > 0) process.stderr.write(`test setup: ended ${swept} processes that earlier test runs left running\n`);
  const mark = `${process.pid}-${Date.now()}`;
  process.env[RUN_MARK] = mark;
  const root = fileURLToPath(new URL('..', import.meta.url));
  const build = new Promise<void>((resolve, reject) => {
    const child = spawn(process.execPath, ['scripts/build.mjs'], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d));
    child.stderr.on('data', (d: Buffer) => (out += d));
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve() : reject(new Error(`npm run build failed (exit ${code}):\n${out}`))));
  });
  build.catch(() => {}); // awaited below, after the binaries: not an unhandled rejection meanwhile
  try {
    process.env.KVR_TEST_NATS_SERVER = ensureNatsServer();
    process.env.KVR_TEST_CHROMIUM = await ensureChromium();
  } finally {
    await build; // its failure first: a test run without a build is pointless
  }
  return () => {
    const left = sweepRun(mark);
    if (left > 0) process.stderr.write(`test teardown: ended ${left} processes the tests left running\n`);
  };
}
