/**
 * The chaos soak (scripts/chaos.ts) in its CI size: real router + 4 real mock engines with KV events, faults on
 * (event drops, engine 500s, engine death + restart mid-stream, a slow engine, client disconnects) under streaming
 * load. `npm run chaos` runs the 150 s version, `npm run chaos -- --short` 28 s.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { printReport, runChaos, TEST, type ChaosReport } from '../../scripts/chaos.ts';

let report: ChaosReport;

beforeAll(async () => {
  const lines: string[] = [];
  report = await runChaos({ ...TEST, log: (s) => lines.push(s) });
  printReport(report, (s) => lines.push(s));
  console.log(lines.join('\n'));
}, 40_000);

const check = (prefix: string) => report.checks.find((c) => c.name.startsWith(prefix))!;

describe('chaos soak (CI size)', () => {
  it('faults were injected: dropped event batches, engine 500s, two deaths and restarts, client disconnects', () => {
    expect(check('faults were actually injected').ok, check('faults').detail).toBe(true);
  });

  it('every request completed or got a clear error; none hung', () => {
    expect(report.outcomes.hung).toBe(0);
    expect(report.outcomes.ok).toBeGreaterThan(report.requests * 0.9);
    expect(check('every request').ok, check('every request').detail).toBe(true);
  });

  it('no request failed before its first byte while a healthy engine existed (retried on another)', () => {
    expect(report.lostWhileHealthy).toEqual([]);
  });

  it('active load back to zero on every worker (GET /debug/state)', () => {
    expect(check('active load').ok, check('active load').detail).toBe(true);
  });

  it('the index equals the engines’ true caches after recovery', () => {
    for (const x of report.index) {
      expect(x, `${x.worker}: resets ${JSON.stringify(report.ingest.resetsBySource[x.worker])}`).toMatchObject({ missing: 0, extra: 0 });
      expect(x.engineBlocks).toBeGreaterThan(0);
    }
  });

  it('dropped event batches are recovered by replay, never by resetting a warm engine', () => {
    // Found by this soak: a batch dropped while a replay streamed ended the replay "incomplete" and reset the source
    // (the warm engine was then treated as cold). Fixed in src/ingest/sequence-tracker.ts; only restarts reset now.
    expect(report.ingest.replays).toBeGreaterThan(0);
    for (const [worker, reasons] of Object.entries(report.ingest.resetsBySource)) {
      for (const reason of Object.keys(reasons)) expect(`${worker}: ${reason}`).toMatch(/^engine2: (restart|reconnect_gap)$/);
    }
  });

  it('heap after the run is at most 1.2 x the heap after warm-up', () => {
    expect(report.heap.ratio, JSON.stringify(report.heap)).toBeLessThanOrEqual(1.2);
  });
});
