/**
 * The house's import rules, checked on the code's own imports (scripts/house.ts's analysis, TypeScript's parser):
 * core imports nothing outside core; config nothing above it; no front end imports another; the shared layers import
 * no front end; nothing imports the CLI; no import cycles between files (type-only imports included) or folders.
 */
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { analyseHouse, stronglyConnected, wrongWayRule } from '../../scripts/house.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const house = analyseHouse(ROOT);

describe('import rules (the guard)', () => {
  it('the analysis sees the code (a broken parser must not pass by seeing nothing)', () => {
    expect(house.files).toBeGreaterThan(150);
    expect(house.edges.length).toBeGreaterThan(500);
    expect(house.edges.some((e) => e.from === 'src/core/router.ts' && e.to === 'src/core/scheduling/registry.ts' && e.value)).toBe(true);
  });

  it('no import runs the wrong way', () => {
    expect(house.wrongWay.map((e) => `${e.from} -> ${e.to} (${e.rule})`)).toEqual([]);
  });

  it('no import cycles: files (value and type imports) and folders', () => {
    expect(house.valueFileCycles).toEqual([]);
    expect(house.fileCycles).toEqual([]);
    expect(house.valueFolderCycles).toEqual([]);
    expect(house.folderCycles).toEqual([]);
  });

  it('the rules name each wrong way (checked on made-up edges)', () => {
    expect(wrongWayRule('src/core/router.ts', 'src/server/app.ts')).toBe('core imports nothing outside core');
    expect(wrongWayRule('src/core/router.ts', 'src/config/routing.ts')).toBe('core imports nothing outside core');
    expect(wrongWayRule('src/config/routing.ts', 'src/runtime/compose.ts')).toMatch(/config imports nothing above it/);
    expect(wrongWayRule('src/config/routing.ts', 'src/core/types.ts')).toBeNull();
    expect(wrongWayRule('src/epp/server.ts', 'src/server/app.ts')).toBe('no front end imports another');
    expect(wrongWayRule('src/server/app.ts', 'src/epp/exchange.ts')).toBe('no front end imports another');
    expect(wrongWayRule('src/sim/run-fleet.ts', 'src/server/app.ts')).toBe('no front end imports another');
    expect(wrongWayRule('src/mocker/server.ts', 'src/sim/heap.ts')).toBe('no front end imports another');
    expect(wrongWayRule('src/sim/run-fleet.ts', 'src/mocker/engine/engine.ts')).toBeNull();
    expect(wrongWayRule('src/runtime/request-flow.ts', 'src/server/app.ts')).toBe('the shared layers import no front end');
    expect(wrongWayRule('src/server/app.ts', 'src/cli/main.ts')).toBe('nothing imports the CLI');
    expect(wrongWayRule('src/cli/serve.ts', 'src/server/app.ts')).toBeNull();
  });

  it('a cycle is found when there is one (the detector itself)', () => {
    const next: Record<string, string[]> = { a: ['b'], b: ['c'], c: ['a'], d: ['a'] };
    expect(stronglyConnected(Object.keys(next), (n) => next[n]).map((c) => [...c].sort())).toEqual([['a', 'b', 'c']]);
  });
});
