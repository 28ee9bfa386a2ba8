/**
 * Every benchmark and script that `npm run` starts answers `--help` with its usage and exit code 0 before it starts
 * anything (scripts/usage.ts prints a file's opening doc comment; a few entry points parse their own --help).
 */
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { docComment } from '../../scripts/usage.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
/** Modules the entry points import, not commands of their own. */
const LIBRARIES = new Set(['scripts/cpu-hogs.ts', 'scripts/usage.ts']);

function entryPoints(): string[] {
  const out: string[] = [];
  for (const dir of ['bench', 'scripts'])
    for (const f of readdirSync(join(ROOT, dir))) if (f.endsWith('.ts') && !LIBRARIES.has(`${dir}/${f}`)) out.push(`${dir}/${f}`);
  return out.sort();
}

describe('--help of the benchmarks and scripts', () => {
  it('reads a file opening doc comment as its usage text', () => {
    expect(docComment('/**\n * bench:x — what it does.\n *\n *   npm run bench:x [-- --n 3]\n */\nimport a from "b";')).toBe(
      'bench:x — what it does.\n\n  npm run bench:x [-- --n 3]',
    );
    expect(docComment('#!/usr/bin/env node\n/** one line */\n')).toBe('one line');
    expect(docComment('import a from "b";\n/** later */')).toBe('');
  });

  it('every entry point has usage text and answers --help', () => {
    const missing: string[] = [];
    for (const f of entryPoints()) {
      const src = readFileSync(join(ROOT, f), 'utf8');
      const handles = src.includes('usage(import.meta.url)') || /--help\b|help: { type: 'boolean'/.test(src.slice(docComment(src).length));
      if (!handles || docComment(src).length < 40) missing.push(f);
    }
    expect(missing).toEqual([]);
  });

  it.each([
    ['bench/route.bench.ts', 'bench:route'],
    ['scripts/house.ts', 'npm run house'],
  ])('%s --help prints its usage and exits 0 without running', (file, words) => {
    const r = spawnSync(process.execPath, ['--import', 'tsx', join(ROOT, file), '--help'], { encoding: 'utf8', cwd: ROOT });
    expect(r.status).toBe(0);
    expect(r.stdout).toContain(words);
    expect(r.stdout).not.toMatch(/verdict:|over 400 lines: \d/);
  });

  it.each([
    [['--calls', 'abc'], '--calls needs a number, got "abc"'],
    [['--tokens'], '--tokens needs a number, got nothing'],
  ])('a bad option value (%j) is refused in one line with exit 2 before anything runs', (args, message) => {
    const r = spawnSync(process.execPath, ['--import', 'tsx', join(ROOT, 'bench/hash.bench.ts'), ...args], { encoding: 'utf8', cwd: ROOT });
    expect(r.status).toBe(2);
    expect(r.stderr.trim()).toBe(`error: ${message} (--help lists the options)`);
    expect(r.stdout).toBe('');
  });

  it.each([
    [['--duration', 'x'], 'error: --duration needs a number, got "x" (--help lists the options)'],
    [['--rounds', '-1'], 'bench:capacity: --rounds must be a positive number, got -1'],
    [['--compare'], 'error: --compare needs a value (--help lists the options)'],
  ])('the proxy benches (benchArgs) refuse %j in one line with exit 2 before starting anything', (args, message) => {
    const r = spawnSync(process.execPath, ['--import', 'tsx', join(ROOT, 'bench/capacity.bench.ts'), ...args], {
      encoding: 'utf8',
      cwd: ROOT,
    });
    expect(r.status).toBe(2);
    expect(r.stderr.trim()).toBe(message);
    expect(r.stdout).toBe('');
  });
});
