import { describe, expect, it } from 'vitest';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { runFleet } from '../../src/sim/run-fleet.ts';
import { scenario } from '../../src/sim/scenarios.ts';

const run = promisify(execFile);
const BIN = join(import.meta.dirname, '../../bin/kvroute.mjs');

describe('seed scenario', () => {
  it('reproduces the 0.32-vs-0.77 case: request-weighted ~0.3, block-weighted ~0.77, matching the engines', () => {
    // 1,500 requests keep the test short; the full scenario (4,000) gives 0.318 / 0.768 / 0.769.
    const sc = scenario('seed', 1, 1500);
    const r = runFleet(sc.requests, { ...sc.fleet, policy: 'kv' });
    expect(r.hit.predicted_request_weighted).toBeGreaterThan(0.27);
    expect(r.hit.predicted_request_weighted).toBeLessThan(0.36);
    expect(r.hit.predicted_block_weighted).toBeGreaterThan(0.73);
    expect(r.hit.predicted_block_weighted).toBeLessThan(0.82);
    expect(Math.abs(r.hit.predicted_block_weighted - r.hit.engine_token_weighted)).toBeLessThan(0.03);
    // The fleet is small enough to evict.
    expect(r.blocks_evicted).toBeGreaterThan(0);
  });
});

describe('hybrid engines in the simulator', () => {
  it('mamba state groups: the router predicts what the engines deliver, below the one-group reading', () => {
    const sc = scenario('seed', 1, 800);
    const one = runFleet(sc.requests, { ...sc.fleet, policy: 'kv' });
    const hybrid = runFleet(sc.requests, {
      ...sc.fleet,
      policy: 'kv',
      engine: { cacheGroups: [{ kind: 'full_attention' }, { kind: 'mamba' }] },
    });
    expect(Math.abs(hybrid.hit.predicted_block_weighted - hybrid.hit.engine_token_weighted)).toBeLessThan(0.03);
    expect(hybrid.hit.engine_token_weighted).toBeLessThan(one.hit.engine_token_weighted - 0.05);
  });

  it('kvroute sim --hybrid: a bad layout exits 2 with one line', async () => {
    const err = await run(process.execPath, [BIN, 'sim', '--scenario', 'seed', '--hybrid', 'sliding:64']).catch((e) => e);
    expect(err.code).toBe(2);
    expect(String(err.stderr).trim().split('\n')).toHaveLength(1);
    expect(String(err.stderr)).toMatch(/--hybrid: a hybrid layout needs a full-attention group/);
  });
});

describe('CLI', () => {
  it('trace gen writes a trace that sim replays, with the JSON shape of the issue', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvroute-sim-'));
    const trace = join(dir, 'gsp.jsonl');
    const gen = await run(process.execPath, [
      BIN,
      'trace',
      'gen',
      '--kind',
      'shared-prefix',
      '--groups',
      '6',
      '--prompts-per-group',
      '8',
      '--seed',
      '2',
      '--out',
      trace,
    ]);
    expect(gen.stdout).toContain('requests          48');
    const out = join(dir, 'r.json');
    const svg = join(dir, 'r.svg');
    const sim = await run(process.execPath, [
      BIN,
      'sim',
      '--trace',
      trace,
      '--workers',
      '3',
      '--policy',
      'kv,round-robin',
      '--rate-scale',
      '1,2',
      '--gpu-blocks',
      '4096',
      '--json',
      out,
      '--plot',
      svg,
      '--no-progress',
    ]);
    expect(sim.stdout).toMatch(/oracle .* block-weighted 0\.\d{3}/);
    const rep = JSON.parse(readFileSync(out, 'utf8'));
    expect(rep.trace.requests).toBe(48);
    expect(rep.oracle).toEqual({ block_weighted: expect.any(Number), request_weighted: expect.any(Number) });
    expect(rep.policies.map((p: { name: string; rate_scale: number }) => `${p.name}@${p.rate_scale}`)).toEqual([
      'kv@1',
      'kv@2',
      'round-robin@1',
      'round-robin@2',
    ]);
    for (const p of rep.policies) {
      for (const k of ['predicted_request_weighted', 'predicted_block_weighted', 'available_block_weighted', 'engine_token_weighted']) {
        expect(p.hit[k]).toBeGreaterThanOrEqual(0);
      }
      for (const k of ['p50', 'p90', 'p99']) expect(p.ttft_ms[k]).toBeGreaterThan(0);
      expect(p.imbalance).toBeGreaterThanOrEqual(1);
      expect(p.throughput_tokens_per_s).toBeGreaterThan(0);
    }
    const picture = readFileSync(svg, 'utf8');
    expect(picture.startsWith('<svg')).toBe(true);
    expect(picture).toContain('TTFT p90 (ms) against load');
  });

  it("sim takes serve's admission settings and reports queueing and refusals from the same dispatcher", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvroute-sim-'));
    const trace = join(dir, 'mt.jsonl');
    await run(process.execPath, [
      BIN,
      'trace',
      'gen',
      '--kind',
      'multi-turn',
      '--requests',
      '150',
      '--rate',
      '80',
      '--seed',
      '3',
      '--out',
      trace,
    ]);
    const out = join(dir, 'adm.json');
    const sim = await run(process.execPath, [
      BIN,
      'sim',
      '--trace',
      trace,
      '--workers',
      '2',
      '--policy',
      'kv-pressure',
      '--rate-scale',
      '8',
      '--gpu-blocks',
      '4096',
      '--busy-prefill-tokens',
      '2000',
      '--queue-limit',
      '5',
      '--queue-timeout-ms',
      '300',
      '--retries',
      '1',
      '--engine-failures',
      '0.05',
      '--json',
      out,
      '--no-progress',
    ]);
    expect(sim.stdout).toContain('admission (served / queued / refused / retried attempts');
    const [p] = JSON.parse(readFileSync(out, 'utf8')).policies;
    expect(p.requests.served + p.requests.refused).toBe(150);
    expect(p.requests.queued).toBeGreaterThan(0);
    expect(p.requests.refused).toBeGreaterThan(0);
    expect(p.requests.retried).toBeGreaterThan(0);
    expect(p.queue_wait_ms.p99).toBeLessThanOrEqual(300);
    const bad = await run(process.execPath, [BIN, 'sim', '--scenario', 'seed', '--engine-failures', '1']).catch((e) => e);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--engine-failures must be below 1');
  });

  it('rejects bad options with a clear message and no stack trace', async () => {
    const err = await run(process.execPath, [BIN, 'sim', '--trace', '/nonexistent.jsonl', '--policy', 'nope']).catch((e) => e);
    expect(err.code).toBe(2);
    expect(err.stderr.trim()).toBe(
      'kvroute sim: --policy must be one of kv-pressure, kv, round-robin, random, least-loaded, prefix-hash, ' +
        'dynamo, llmd, llmd-baseline, smg, smg-legacy, aibrix, ps-kvaware, ps-prefixaware, ' +
        'or several separated by commas, got "nope" (from --policy)',
    );
    const err2 = await run(process.execPath, [BIN, 'sim', '--trace', '/nonexistent.jsonl']).catch((e) => e);
    expect(err2.code).toBe(1);
    expect(err2.stderr).toContain('cannot read trace /nonexistent.jsonl');
    expect(err2.stderr).not.toContain('    at ');
  });
});
