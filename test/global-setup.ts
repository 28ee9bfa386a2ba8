/**
 * Builds dist/ before any test runs: tests that start `kvroute` as a process run bin/kvroute.mjs, which runs the
 * compiled CLI, since that is what ships. Incremental (dist/.tsbuildinfo), so an up-to-date build costs ~2 s.
 */
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

export default function setup(): void {
  const root = fileURLToPath(new URL('..', import.meta.url));
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  const r = spawnSync(process.execPath, [tsc, '-p', 'tsconfig.build.json'], { cwd: root, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`npm run build failed (exit ${r.status}):\n${r.stdout}${r.stderr}`);
}
