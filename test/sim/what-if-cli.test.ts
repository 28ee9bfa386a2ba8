/**
 * `kvroute sim --what-if` as a process from the built package: the curve's answers beside the run's measured hit, and
 * with --what-if-check each fleet simulated; every measured figure must be what a plain `kvroute sim` of that fleet
 * measures (same trace, same settings), the errors predicted - measured, and the JSON shape stable.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { generateFromSpec } from '../../src/sim/traces/spec.ts';
import { recordingHeader, recordingOf } from '../fixtures/recordings.ts';

const run = promisify(execFile);
const BIN = join(import.meta.dirname, '../../bin/kvroute.mjs');
const BASE = ['--trace', 'agentic:requests=120', '--policy', 'kv-pressure'];
const TRACE = [...BASE, '--workers', '2', '--gpu-blocks', '384'];
// The commands docs/cache-sizing.md shows, run verbatim (test/docs/commands.test.ts checks they are here).
const DOC_CHECK =
  'kvroute sim --trace agentic:requests=120 --workers 2 --gpu-blocks 384 --policy kv-pressure --what-if --what-if-check --what-if-host-blocks 512';
const DOC_HOST = 'kvroute sim --trace agentic:requests=120 --workers 2 --gpu-blocks 384 --policy kv-pressure --host-blocks 512';
const argv = (doc: string) => doc.split(' ').slice(2);

interface Answer {
  kind: string;
  label: string;
  engines: number;
  gpu_blocks: number;
  host_blocks: number;
  predicted: number | null;
  measured: number | null;
  error: number | null;
}

async function sim(args: string[]): Promise<{ stdout: string; stderr: string }> {
  return run(process.execPath, [BIN, 'sim', ...args], { maxBuffer: 64 << 20 });
}

/** The delivered block-weighted hit a plain run of a fleet measures. */
async function plain(extra: string[]): Promise<number> {
  const doc = JSON.parse((await sim([...BASE, ...extra, '--json', '-', '--no-progress'])).stdout);
  expect(doc.policies).toHaveLength(1);
  return doc.policies[0].hit.delivered_block_weighted;
}

describe('kvroute sim --what-if', () => {
  it('--what-if-check: measured equals a plain run of each fleet, error = predicted - measured, JSON shape', async () => {
    const { stdout, stderr } = await sim([...argv(DOC_CHECK), '--json', '-']);
    const doc = JSON.parse(stdout);
    const w = doc.what_if;
    expect(w.checked).toBe(true);
    expect(w.policy).toBe('kv-pressure');
    expect(w.tier_credit).toBe(false);
    expect(w.requests).toBe(120);
    expect(w.method).toMatch(/SHARDS/);
    expect(w.curve.fleetBlocks).toBe(2 * 384);
    const answers = w.answers as Answer[];
    expect(answers.map((a) => a.label)).toEqual([
      'today',
      '0.5x KV per engine',
      '2x KV per engine',
      '4x KV per engine',
      '+1 engine',
      '+2 engines',
      '+4 engines',
      '+host tier (not credited)',
    ]);
    for (const a of answers) {
      expect(a.predicted).toBeGreaterThanOrEqual(0);
      expect(a.predicted).toBeLessThanOrEqual(1);
      expect(a.measured).toBeGreaterThanOrEqual(0);
      expect(a.error).toBeCloseTo((a.predicted as number) - (a.measured as number), 12);
    }
    expect(w.worst_error).toBeCloseTo(Math.max(...answers.map((a) => Math.abs(a.error as number))), 12);
    // Today's measured is the run's own delivered hit (the report's only policy row).
    expect(doc.policies).toHaveLength(1);
    expect(answers[0].measured).toBe(doc.policies[0].hit.delivered_block_weighted);
    // The fleets, as a plain `kvroute sim` runs them.
    expect(answers[2]).toMatchObject({ engines: 2, gpu_blocks: 768, host_blocks: 0 });
    expect(answers[2].measured).toBe(await plain(['--workers', '2', '--gpu-blocks', '768']));
    expect(answers[4]).toMatchObject({ engines: 3, gpu_blocks: 384 });
    expect(answers[4].measured).toBe(await plain(['--workers', '3', '--gpu-blocks', '384']));
    expect(answers[7]).toMatchObject({ engines: 2, gpu_blocks: 384, host_blocks: 512 });
    const host = JSON.parse((await sim([...argv(DOC_HOST), '--json', '-', '--no-progress'])).stdout);
    expect(host.fleet.host_blocks).toBe(512);
    expect(host.policies[0].host_tier).toMatchObject({ blocks_per_engine: 512 });
    expect(host.policies[0].host_tier.loaded).toBeGreaterThan(0);
    expect(answers[7].measured).toBe(host.policies[0].hit.delivered_block_weighted);
    // A line per run on stderr (8 runs).
    expect(stderr.match(/what-if run \d\/8/g)).toHaveLength(8);
  }, 240_000);

  it('the human table: the curve answers beside today measured, and how to check them', async () => {
    const { stdout } = await sim([...TRACE, '--what-if', '--no-progress']);
    expect(stdout).toMatch(/what-if \(policy kv-pressure\): the live miss-ratio curves/);
    expect(stdout).toMatch(/^today\s+2 x 384 blocks\s+0\.\d{3}\s+0\.\d{3}\s+[+-]0\.\d{3}$/m);
    expect(stdout).toMatch(/^2x KV per engine\s+2 x 768 blocks\s+0\.\d{3}\s+-\s+-$/m);
    expect(stdout).toMatch(/^\+host tier \(not credited\)\s+2 x 384 blocks \+ 384 host\s+0\.\d{3}\s+-\s+-$/m);
    expect(stdout).toMatch(/--what-if-check simulates each fleet too/);
  }, 120_000);

  it('answers on a recording of `kvroute serve --record` (its own hashes and block size), measured as a plain replay', async () => {
    const bs = 32;
    const lines = recordingOf(generateFromSpec('agentic:requests=100', 3), bs);
    const file = join(mkdtempSync(join(tmpdir(), 'kvroute-whatif-')), 'traffic.jsonl');
    writeFileSync(file, `${[recordingHeader(bs), ...lines].join('\n')}\n`);
    const fleet = ['--trace', file, '--workers', '2', '--gpu-blocks', '256', '--policy', 'kv-pressure', '--json', '-', '--no-progress'];
    const doc = JSON.parse((await sim([...fleet, '--what-if'])).stdout);
    expect(doc.fleet.block_size).toBe(bs);
    expect(doc.what_if.requests).toBe(100);
    expect(doc.what_if.checked).toBe(false);
    const today = doc.what_if.answers[0] as Answer;
    expect(today.measured).toBeGreaterThan(0);
    expect(doc.what_if.answers.slice(1).every((a: Answer) => a.measured === null && a.error === null && a.predicted !== null)).toBe(true);
    const replay = JSON.parse((await sim(fleet)).stdout);
    expect(today.measured).toBe(replay.policies[0].hit.delivered_block_weighted);
  }, 120_000);

  it('refuses what it cannot answer, with one line and exit 2', async () => {
    const cases: [string[], RegExp][] = [
      [[...TRACE, '--what-if-check'], /--what-if-check and --what-if-host-blocks go with --what-if/],
      [[...TRACE, '--what-if', '--policy', 'kv,round-robin'], /--what-if answers for one run/],
      [[...TRACE, '--what-if', '--host-blocks', '64'], /without a host tier today/],
      [[...TRACE, '--what-if', '--prefill-workers', '1', '--decode-workers', '1'], /aggregated fleets only/],
    ];
    for (const [args, message] of cases) {
      const err = await sim([...args, '--no-progress']).catch((e) => e);
      expect(err.code, args.join(' ')).toBe(2);
      expect(String(err.stderr).trim().split('\n')).toHaveLength(1);
      expect(String(err.stderr)).toMatch(message);
    }
  }, 120_000);
});
