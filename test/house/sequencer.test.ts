/**
 * test/sequencer.ts, the order test files start in: the listed slowest files first (longest first) whether or not
 * vitest has timings cached (a fresh clone has none), then vitest's own order; and every listed file exists, so a
 * renamed file cannot silently fall back to the end of the queue.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import type { TestSpecification, Vitest } from 'vitest/node';
import SlowestFirstSequencer, { SLOWEST, slowestEstimate } from '../sequencer.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url)).replace(/\/$/, '');

/** What BaseSequencer reads of a run: the root, cached results (by "project:path") and file sizes. */
function fakeRun(sizes: Record<string, number>, durations: Record<string, number> = {}): Vitest {
  return {
    config: { root: ROOT, shard: undefined },
    cache: {
      getFileTestResults: (key: string) => {
        const ms = durations[key.slice(1)];
        return ms === undefined ? undefined : { duration: ms, failed: false };
      },
      getFileStats: (key: string) => {
        const size = sizes[key.slice(1)];
        return size === undefined ? undefined : { size };
      },
    },
  } as unknown as Vitest;
}

const project = { name: '', config: { sequence: { groupOrder: 0 }, isolate: true } };
const spec = (path: string) => ({ moduleId: join(ROOT, path), project }) as unknown as TestSpecification;
const order = async (run: Vitest, paths: string[]) =>
  (await new SlowestFirstSequencer(run).sort(paths.map(spec))).map((s) => s.moduleId.slice(ROOT.length + 1));

const listed = Object.entries(SLOWEST)
  .sort((a, b) => b[1] - a[1])
  .map(([path]) => path);

describe('the slowest files start first', () => {
  it('lists files that exist, with positive estimates', () => {
    expect(listed.length).toBeGreaterThan(0);
    for (const [path, seconds] of Object.entries(SLOWEST)) {
      expect(existsSync(join(ROOT, path)), path).toBe(true);
      expect(seconds, path).toBeGreaterThan(0);
    }
    expect(slowestEstimate(`${ROOT}/`, join(ROOT, listed[0]))).toBe(SLOWEST[listed[0]]);
    expect(slowestEstimate(ROOT, join(ROOT, 'test/core/not-listed.test.ts'))).toBeUndefined();
  });

  it('on a fresh clone (no cached timings): the listed files longest first, then the others largest first', async () => {
    const others = ['test/a.test.ts', 'test/b.test.ts', 'test/c.test.ts'];
    // Listed files are small here and come in reverse order: only the list may put them first.
    const sizes: Record<string, number> = { 'test/a.test.ts': 100, 'test/b.test.ts': 30_000, 'test/c.test.ts': 5_000 };
    for (const path of listed) sizes[path] = 10;
    const got = await order(fakeRun(sizes), [...others, ...[...listed].reverse()]);
    expect(got).toEqual([...listed, 'test/b.test.ts', 'test/c.test.ts', 'test/a.test.ts']);
  });

  it('with cached timings: the listed files still first, the others longest first as vitest orders them', async () => {
    const sizes = { 'test/a.test.ts': 100, 'test/b.test.ts': 30_000 };
    const durations: Record<string, number> = { 'test/a.test.ts': 9_000, 'test/b.test.ts': 10 };
    for (const path of listed) durations[path] = 1;
    const got = await order(fakeRun(sizes, durations), ['test/b.test.ts', 'test/a.test.ts', ...listed]);
    expect(got).toEqual([...listed, 'test/a.test.ts', 'test/b.test.ts']);
  });
});
