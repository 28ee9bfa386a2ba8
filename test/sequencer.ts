/**
 * The order test files start in (vitest.config.ts `sequence.sequencer`): the slowest files first, on a fresh clone too.
 *
 * Two workers take files from one queue, so the suite's wall time is at least the start of its slowest file plus that
 * file's length. Vitest's own order starts the files that ran longest last time first, but a fresh clone (CI) has no
 * such record, and then vitest starts the largest files (in bytes) first: test/e2e/package.test.ts, the longest file
 * by far (two npm installs and three builds), is a small file and started half-way through the run, so it alone
 * decided when the suite ended; and a 10-60 s file started last stretched the end while the other worker idled.
 * SLOWEST below lists the files that take longest, with their estimated seconds on a quiet 2-core machine (a loaded
 * run's JSON report, test-artifacts/vitest.json, scaled to CI's quiet total; refresh it when a file's time changes a
 * lot): they start first, longest first, and every other file follows in vitest's own order.
 */
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/** Estimated seconds on a quiet 2-core machine (the whole suite, 2 workers), by file. Only the order matters. */
export const SLOWEST: Readonly<Record<string, number>> = {
  'test/e2e/package.test.ts': 200,
  'test/docs/commands.test.ts': 40,
  'test/sim/scenario-cli.test.ts': 33,
  'test/config/serve-cli.test.ts': 27,
  'test/server/processes.test.ts': 20,
  'test/server/record-process.test.ts': 19,
  'test/cli/relay-mocker-settings.test.ts': 19,
  'test/epp/chart.test.ts': 18,
  'test/sim/calibration-bench.test.ts': 17,
  'test/epp/tls.test.ts': 16,
  'test/sim/league-cli.test.ts': 14,
  'test/sim/agentic.test.ts': 13,
  'test/server/flow-process.test.ts': 13,
  'test/sim/scenarios.test.ts': 12,
  'test/server/multimodal-serve.test.ts': 12,
  'test/reliability/chaos-nats.test.ts': 11,
  // From a loaded run's report (2026-12-06), scaled to CI's quiet total: unlisted, they started late and stretched the end.
  'test/sim/what-if-cli.test.ts': 25,
  'test/core/mrc.test.ts': 22,
  'test/epp/epp.test.ts': 20,
  'test/reliability/cli-auth.test.ts': 16,
  'test/epp/parity.test.ts': 16,
  'test/epp/k8s.test.ts': 16,
  'test/epp/wire.test.ts': 14,
  'test/discovery/k8s-serve.test.ts': 14,
  'test/sim/recorded-trace.test.ts': 13,
  'test/epp/nats.test.ts': 13,
  'test/tokenizer/local.test.ts': 11,
  'test/server/mrc-process.test.ts': 11,
  'test/mocker/cli.test.ts': 11,
  'test/ingest/fuzz.test.ts': 11,
  'test/mocker/pd-cli.test.ts': 10,
};

/** The estimate for a file, by its path relative to the root (`/` separators), or undefined. */
export function slowestEstimate(root: string, moduleId: string): number | undefined {
  return SLOWEST[relative(root, moduleId)];
}

function relative(root: string, moduleId: string): string {
  return moduleId.replace(/\\/g, '/').slice(root.replace(/\\/g, '/').replace(/\/?$/, '/').length);
}

export default class SlowestFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const base = await super.sort(files);
    const root = this.ctx.config.root;
    const known = base.filter((f) => slowestEstimate(root, f.moduleId) !== undefined);
    const rest = base.filter((f) => slowestEstimate(root, f.moduleId) === undefined);
    // Longest first; equal estimates in the list's order.
    const rank = (f: TestSpecification) => Object.keys(SLOWEST).indexOf(relative(root, f.moduleId));
    known.sort((a, b) => (slowestEstimate(root, b.moduleId) ?? 0) - (slowestEstimate(root, a.moduleId) ?? 0) || rank(a) - rank(b));
    return [...known, ...rest];
  }
}
