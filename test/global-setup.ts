/**
 * Runs once before any test:
 *  - builds dist/: tests that start `kvroute` as a process run bin/kvroute.mjs, which runs the compiled CLI, since that
 *    is what ships. Incremental (dist/.tsbuildinfo), so an up-to-date build costs ~2 s.
 *  - finds or fetches Chromium and nats-server (test/fixtures/test-binaries.ts) and hands their paths to the tests as
 *    KVR_TEST_CHROMIUM and KVR_TEST_NATS_SERVER (test workers inherit this process's environment).
 *  - marks the run (KVR_TEST_RUN), ends orphans of earlier runs, and at teardown every process this run left
 *    (test/fixtures/process-sweep.ts).
 */
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { RUN_MARK, sweepOrphans, sweepRun } from './fixtures/process-sweep.ts';
import { ensureChromium, ensureNatsServer } from './fixtures/test-binaries.ts';

export default async function setup(): Promise<() => void> {
  const swept = sweepOrphans();
  if (swept > 0) process.stderr.write(`test setup: ended ${swept} processes that earlier test runs left running\n`);
  const mark = `${process.pid}-${Date.now()}`;
  process.env[RUN_MARK] = mark;
  const root = fileURLToPath(new URL('..', import.meta.url));
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  const r = spawnSync(process.execPath, [tsc, '-p', 'tsconfig.build.json'], { cwd: root, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`npm run build failed (exit ${r.status}):\n${r.stdout}${r.stderr}`);
  process.env.KVR_TEST_NATS_SERVER = ensureNatsServer();
  process.env.KVR_TEST_CHROMIUM = await ensureChromium();
  return () => {
    const left = sweepRun(mark);
    if (left > 0) process.stderr.write(`test teardown: ended ${left} processes the tests left running\n`);
  };
}
