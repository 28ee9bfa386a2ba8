/**
 * The scheduling tables in docs/routing.md and src/core/scheduling/README.md are generated from the stage and policy
 * registry (scripts/scheduling-docs.ts): this fails when either is stale, and runs the check as the command a
 * contributor runs.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { renderTables, TARGETS, withTables } from '../../scripts/scheduling-docs.ts';
import { SOURCE_FILTERS, WORKER_FILTERS } from '../../src/core/scheduling/filters.ts';
import { POLICY_REGISTRY } from '../../src/core/scheduling/registry.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

describe('scheduling tables (generated from the registry)', () => {
  for (const t of TARGETS) {
    it(`${t.file} carries the current tables`, () => {
      const text = readFileSync(`${ROOT}${t.file}`, 'utf8');
      expect(withTables(text, t.filters)).toBe(text);
    });
  }

  it('lists every registered policy with its formula, and every filter where filters are asked for', () => {
    const table = renderTables(true);
    for (const e of POLICY_REGISTRY) {
      const d = e.create().describe?.();
      expect(d).toBeDefined();
      expect(table).toContain(`| \`${e.name}\``);
      for (const s of d!.scorers) expect(table).toContain(`| \`${s.name}\` |`);
    }
    for (const f of [...WORKER_FILTERS, ...SOURCE_FILTERS]) expect(table).toContain(`| \`${f.name}\` |`);
    expect(renderTables(false)).not.toContain('| worker |');
  });

  it('a file without the generated block is an error, not a silent no-op', () => {
    expect(() => withTables('# no block here\n', false)).toThrow(/no generated block/);
  });

  it('`npm run docs:scheduling -- --check` exits 0 on the repository', () => {
    const r = spawnSync('npm', ['run', '--silent', 'docs:scheduling', '--', '--check'], { cwd: ROOT, encoding: 'utf8' });
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
  });
});
