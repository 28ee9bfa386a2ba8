/** bench/calibration.bench.ts as a process, on small slices: the rows it prints and how it refuses what it lacks. */
import { describe, expect, it } from 'vitest';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);
const ROOT = join(import.meta.dirname, '../..');
const bench = (...args: string[]) =>
  run(process.execPath, ['--import', 'tsx', 'bench/calibration.bench.ts', ...args], { cwd: ROOT, timeout: 300_000 });

describe('bench:calibration', () => {
  it('mooncake-lru: one engine per capacity, the published share at 3M beside kvroute', async () => {
    const json = join(mkdtempSync(join(tmpdir(), 'kvroute-cal-')), 'rows.json');
    const r = await bench(
      '--experiment',
      'mooncake-lru',
      '--trace',
      'data/traces/mooncake_synthetic_trace.jsonl.gz',
      '--limit',
      '300',
      '--json',
      json,
    );
    expect(r.stdout).toMatch(/^load average \(1\/5\/15 min\) at start: /m);
    expect(r.stdout).toMatch(/synthetic +LRU 3e\+6 tokens +- +reuse 0\.\d{3} +published 0\.304/);
    expect(r.stdout).toMatch(/at 3M tokens: \d+% of kvroute's maximum .*; published 46% of 0\.66/);
    const rows = JSON.parse(readFileSync(json, 'utf8')) as { setup: string; reuse: number }[];
    expect(rows.map((x) => x.setup)).toEqual(['3e+5', '1e+6', '3e+6', '1e+7', '3e+7', '1e+8'].map((c) => `LRU ${c} tokens`));
    // A bigger cache never keeps less.
    for (let i = 1; i < rows.length; i++) expect(rows[i].reuse).toBeGreaterThanOrEqual(rows[i - 1].reuse - 1e-9);
  }, 300_000);

  it('dynamo: runs a generated stand-in without quoting the published figures, and needs the trace otherwise', async () => {
    const r = await bench(
      '--experiment',
      'dynamo',
      '--trace',
      'agentic:requests=150',
      '--concurrency',
      '8',
      '--policies',
      'round-robin,kv',
    );
    expect(r.stdout).toContain('(a stand-in: published figures do not apply)');
    expect(r.stdout).toMatch(/agentic:requests=150 +C=8 +round-robin +reuse 0\.\d{3} +\[cpu/);
    expect(r.stdout).toMatch(/agentic:requests=150 +C=8 +kv +reuse 0\.\d{3} +\[cpu/);
    expect(r.stdout).not.toMatch(/published 0\./);
    const err = await bench('--experiment', 'dynamo').catch((e) => e);
    expect(err.code).toBe(2);
    expect(String(err.stderr).trim().split('\n')).toHaveLength(1);
    expect(String(err.stderr)).toMatch(/needs --trace: Mooncake's FAST25-release\/traces\/toolagent_trace\.jsonl \(not shipped/);
    const bad = await bench('--experiment', 'mooncake-lru', '--policies', 'nope').catch((e) => e);
    expect(bad.code).toBe(2);
    expect(String(bad.stderr)).toMatch(/unknown policy "nope"/);
  }, 300_000);
});
