/**
 * The decision baseline: a fixed, seeded simulation per built-in policy whose per-request picks (worker, predicted
 * overlap, delivered cached tokens, first-token and finish times) are hashed and compared with the hash recorded when
 * the guard was written. A refactor of the routing pipeline, the dispatcher or the simulator must keep every hash; a
 * change of routing behaviour must update them on purpose (and say why in its commit).
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { type FleetOptions, type FleetResult, runFleet } from '../../src/sim/run-fleet.ts';
import { generateMultiTurn, generateSharedPrefix } from '../../src/sim/traces/generate.ts';

const multiTurn = generateMultiTurn({ requests: 160, seed: 7, rate: 8 });
const shared = generateSharedPrefix({ groups: 6, promptsPerGroup: 12, systemPromptLen: 1024, questionLen: 96, outputLen: 24, rate: 30 });
const trace = [...multiTurn, ...shared.map((r) => ({ ...r, timestamp: r.timestamp + 1 }))].sort((a, b) => a.timestamp - b.timestamp);

function digest(r: FleetResult): string {
  const h = createHash('sha256');
  for (const q of r.perRequest ?? []) {
    h.update(`${q.index}:${q.worker}:${q.overlapBlocks}:${q.bestOverlapBlocks}:${q.cachedTokens}:${q.firstTokenMs}:${q.finishMs}\n`);
  }
  h.update(JSON.stringify({ per_worker: r.per_worker, refusals: r.refusals, pd: r.pd ?? null, requests: r.requests }));
  return h.digest('hex').slice(0, 16);
}

const base = { workers: 4, blockSize: 16, gpuBlocks: 3000, seed: 11, keepRequests: true } as const;

const CASES: ReadonlyArray<readonly [string, FleetOptions, string]> = [
  ['kv-pressure', { ...base, policy: 'kv-pressure' }, '49d772a1c115b2a1'], // overlay withdraws blocks the engine removed (recorded overlaps change)
  ['kv', { ...base, policy: 'kv' }, 'c911cdbaf97da864'], // overlay withdraws blocks the engine removed (recorded overlaps change)
  [
    'kv, temperature 0.5, tier credit on',
    { ...base, policy: 'kv', router: { knobs: { temperature: 0.5, hostTierCredit: 0.75, diskTierCredit: 0.25 } } },
    '6b11e6a387c74379', // overlay withdraws blocks the engine removed (recorded overlaps change)
  ],
  ['least-loaded', { ...base, policy: 'least-loaded' }, '71b669f251695ee8'], // overlay withdrawal: the recorded predicted overlaps change
  ['prefix-hash', { ...base, policy: 'prefix-hash' }, 'da6b2171375fe70b'],
  ['round-robin', { ...base, policy: 'round-robin' }, '2b725be811463a60'],
  ['random', { ...base, policy: 'random' }, '83e7f5e345c720c6'],
  [
    'kv-pressure, sampled selection (2 cold candidates)',
    { ...base, workers: 8, policy: 'kv-pressure', router: { selection: 'sampled', coldCandidates: 2 } },
    'ad94c46613408f78',
  ],
  ['kv-pressure, busy thresholds', { ...base, policy: 'kv-pressure', router: { busy: { activePrefillTokens: 6000 } } }, 'e82c2684f289d56f'], // overlay withdraws blocks the engine removed (recorded overlaps change)
  [
    'P/D: pd-prefill + pd-decode legs',
    { ...base, policy: 'kv-pressure', prefillWorkers: 2, decodeWorkers: 2, dispatch: { pd: { minUncachedTokens: 256 } } },
    'b1032c976192f7cc', // overlay withdraws blocks the engine removed (recorded overlaps change)
  ],
];

describe('decision baseline (per-request picks of a seeded simulation, per policy)', () => {
  for (const [name, opts, expected] of CASES) {
    it(`${name}: picks unchanged`, () => {
      const r = runFleet(trace, opts);
      expect(r.requests.finished).toBeGreaterThan(trace.length * 0.9);
      expect(digest(r)).toBe(expected);
      if (opts.prefillWorkers) expect(Object.keys(r.pd?.paths ?? {}).length).toBeGreaterThan(0);
    });
  }
  it('the recorded hashes tell the cases apart (each case exercises different picks)', () => {
    expect(new Set(CASES.map((c) => c[2])).size).toBe(CASES.length);
  });
});
