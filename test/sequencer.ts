/**
 * The order test files start in (vitest.config.ts `sequence.sequencer`): the slowest files first, on a fresh clone too.
 *
 * Two workers take files from one queue, so the suite's wall time is at least the start of its slowest file plus that
 * file's length. Vitest's own order starts the files that ran longest last time first, but a fresh clone (CI) has no
 * such record, and then vitest starts the largest files (in bytes) first: test/e2e/package.test.ts, the longest file
 * by far (two npm installs and three builds), is a small file and started half-way through the run, so it alone
 * decided when the suite ended. SLOWEST below lists the files that take longest on a quiet 2-core machine, with their
 * seconds there (from the JSON report, test-artifacts/vitest.json; refresh it when a file's time changes a lot): they
 * start first, longest first, and every other file follows in vitest's own order.
 */
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/** Seconds on a quiet 2-core machine (the whole suite, 2 workers), by file. Only the order matters. */
export const SLOWEST: Readonly<Record<string, number>> = {
  'test/e2e/package.test.ts': 200,
};

/** The estimate for a file, by its path relative to the root (`/` separators), or undefined. */
export function slowestEstimate(root: string, moduleId: string): number | undefined {
  const rel = moduleId.replace(/\\/g, '/').slice(root.replace(/\\/g, '/').replace(/\/?$/, '/').length);
  return SLOWEST[rel];
}

export default class SlowestFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const base = await super.sort(files);
    const root = this.ctx.config.root;
    const known = base.filter((f) => slowestEstimate(root, f.moduleId) !== undefined);
    const rest = base.filter((f) => slowestEstimate(root, f.moduleId) === undefined);
    known.sort((a, b) => (slowestEstimate(root, b.moduleId) ?? 0) - (slowestEstimate(root, a.moduleId) ?? 0));
    return [...known, ...rest];
  }
}
