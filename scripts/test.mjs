/**
 * `npm test`: the linter, then the type check and the tests side by side; fails when any of them fails.
 *
 *   npm test [-- <vitest arguments>]    e.g. npm test -- test/core
 *
 * Why side by side: the type check (`npm run typecheck`: tsc over src/, the tests, bench and scripts) is single-threaded,
 * ~20 s of CPU, so run first and alone it left the second core idle for those ~20 s before the first test started;
 * beside the tests it takes its CPU from what the tests leave, and the run is shorter by up to its length (bench/RESULTS.md,
 * "Build and test start-up"). Its output is printed when it ends; a type error fails `npm test` as before, and the
 * tests still report what they found. Plain JavaScript, spawned with this Node: no shell, the same on every platform.
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const require = createRequire(import.meta.url);

/** Runs a Node script with this Node; resolves to its exit code. `quiet`: its output is kept and printed at its end. */
function run(label, bin, args, quiet = false) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [bin, ...args], { cwd: ROOT, stdio: quiet ? ['ignore', 'pipe', 'pipe'] : 'inherit' });
    let out = '';
    if (quiet) {
      child.stdout.on('data', (d) => (out += d));
      child.stderr.on('data', (d) => (out += d));
    }
    child.once('error', (err) => {
      process.stderr.write(`${label}: ${err.message}\n`);
      resolve(1);
    });
    child.once('close', (code, signal) => {
      if (quiet && out) process.stdout.write(out);
      process.stdout.write(`${label}: ${code === 0 ? 'passed' : `FAILED (${signal ?? `exit ${code}`})`}\n`);
      resolve(code ?? 1);
    });
  });
}

/** The `npm run lint` and `npm run typecheck` of package.json, run by the npm that runs this script. */
const npm = process.env.npm_execpath;
if (!npm) {
  process.stderr.write('scripts/test.mjs runs as `npm test` (it runs the lint and typecheck scripts through npm)\n');
  process.exit(2);
}
/** A package's command-line script, from its package.json "bin". */
function binOf(pkg, name) {
  const json = require.resolve(`${pkg}/package.json`);
  const { bin } = JSON.parse(readFileSync(json, 'utf8'));
  return join(dirname(json), typeof bin === 'string' ? bin : bin[name]);
}

const lint = await run('npm run lint', npm, ['run', '--silent', 'lint']);
if (lint !== 0) process.exit(lint);
const [types, tests] = await Promise.all([
  run('npm run typecheck', npm, ['run', '--silent', 'typecheck'], true),
  run('vitest run', binOf('vitest', 'vitest'), ['run', ...process.argv.slice(2)]),
]);
process.exit(types !== 0 ? types : tests);
