import { defineConfig } from 'vitest/config';
import SlowestFirstSequencer from './test/sequencer.ts';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Builds dist/ first: process tests run the compiled CLI, as the package ships it.
    globalSetup: ['test/global-setup.ts'],
    // The JSON report lets .ci/run print a plain "N passed, N failed" closing line.
    reporters: ['default', ['json', { outputFile: 'test-artifacts/vitest.json' }]],
    // Multi-process e2e tests share two cores; keep parallelism modest so timing-sensitive ones do not starve.
    maxWorkers: 2,
    // A worker keeps its loaded modules from one file to the next: importing src/ afresh for each of ~150 files cost
    // 97 s of the 539 s run on a quiet machine (25 s and 487 s without isolation, the same 1,012 tests passing). Every
    // file builds its own routers, servers and registries, so nothing a test asserts lives in module state.
    isolate: false,
    // The slowest files start first, on a fresh clone too (no timings cached there): see test/sequencer.ts.
    sequence: { sequencer: SlowestFirstSequencer },
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
