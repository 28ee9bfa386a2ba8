/**
 * The map a newcomer follows: each source folder has a README saying what it owns, what it may import and its entry
 * points, and what it says it may import covers what it does import (from the code's own imports); test/README.md
 * names every test folder.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { analyseHouse, folderOf } from '../../scripts/house.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const dirs = (p: string) => readdirSync(join(ROOT, p)).filter((n) => statSync(join(ROOT, p, n)).isDirectory());
const SRC_FOLDERS = dirs('src');
const house = analyseHouse(ROOT);

/** Folder names in the backticked words of the README's "May import" line (`src/core/types.ts` counts as core). */
function mayImport(readme: string): Set<string> | null {
  const line = readme.split('\n').find((l) => l.startsWith('**May import:**'));
  if (!line) return null;
  const words = [...line.matchAll(/`([^`]+)`/g)].map((m) =>
    m[1]
      .replace(/^src\//, '')
      .split('/')[0]
      .replace(/\.ts$/, ''),
  );
  return new Set(words.filter((w) => SRC_FOLDERS.includes(w) || w === 'log'));
}

describe('source folder READMEs', () => {
  for (const folder of SRC_FOLDERS) {
    it(`src/${folder}/README.md says what it owns, may import and its entry points, and its imports stay within it`, () => {
      const path = join(ROOT, 'src', folder, 'README.md');
      expect(existsSync(path)).toBe(true);
      const text = readFileSync(path, 'utf8');
      expect(text).toMatch(/^# /);
      const allowed = mayImport(text);
      expect(allowed).not.toBeNull();
      const actual = new Set(house.edges.filter((e) => folderOf(e.from) === folder).map((e) => folderOf(e.to)));
      actual.delete(folder);
      expect([...actual].filter((f) => !allowed!.has(f)).sort()).toEqual([]);
    });
  }

  it('the "may import" reading is strict (a folder missing from the line is found)', () => {
    expect([...mayImport('**May import:** `core`, `src/config/x.ts` (why), `EngineName`, its own `raw-json.ts`.')!].sort()).toEqual([
      'config',
      'core',
    ]);
    expect(mayImport('no such line')).toBeNull();
  });

  it('test/README.md maps every test folder', () => {
    const text = readFileSync(join(ROOT, 'test/README.md'), 'utf8');
    for (const d of dirs('test')) expect(text).toMatch(new RegExp(`^\\| \`${d}/\`\\s+\\|`, 'm'));
  });
});
