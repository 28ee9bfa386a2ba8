/**
 * The league as a user runs it (`kvroute sim --league`, from dist/), sized down with --limit, --seeds, --league-fleets
 * and --league-traces; and its verdict rule on a crafted result.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { type LeagueCell, type LeagueFigures, type LeagueResult, oracleTokenWeighted, verdicts } from '../../src/sim/league.ts';

const run = promisify(execFile);
const ROOT = join(import.meta.dirname, '../..');
const BIN = join(ROOT, 'bin/kvroute.mjs');

/** The documented commands (docs/routing.md, "The league"), run here with size flags appended. */
const LEAGUE_DOC = 'kvroute sim --league --json league.json --markdown league.md';
const ABLATION_DOC = 'kvroute sim --league --league-fleets 8 --policy kv-pressure,dynamo --ablation';
const TINY = ['--limit', '40', '--seeds', '2', '--league-fleets', '4', '--rate-scale', '1', '--league-traces', 'conversation,agentic'];

function argv(doc: string): string[] {
  return doc.split(' ').slice(1);
}

describe('kvroute sim --league (process, dist/)', () => {
  it('runs every policy on the same rows and seeds: Markdown on stdout, the same figures in --json and --markdown', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvroute-league-'));
    const args = argv(LEAGUE_DOC).map((a) =>
      a === 'league.json' ? join(dir, 'league.json') : a === 'league.md' ? join(dir, 'league.md') : a,
    );
    const r = await run(
      process.execPath,
      [BIN, ...args, ...TINY, '--policy', 'kv-pressure,dynamo,smg,aibrix', '--plot', join(dir, 'league.svg')],
      {
        cwd: ROOT,
        maxBuffer: 1 << 24,
      },
    );
    expect(r.stdout).toContain('### conversation, load 1x, 4 engines');
    expect(r.stdout).toContain('### agentic, load 1x, 4 engines');
    expect(r.stdout).toMatch(/\| dynamo \| \d+%/);
    expect(r.stdout).toContain('Peers run without session affinity');
    expect(readFileSync(join(dir, 'league.md'), 'utf8').trim()).toBe(r.stdout.trim());
    const svg = readFileSync(join(dir, 'league.svg'), 'utf8');
    expect(svg.startsWith('<svg')).toBe(true);
    // One cell per row and policy; kvroute's default is its own reference (ratio 1.00).
    expect(svg.match(/<rect /g)).toHaveLength(2 * 4);
    expect(svg).toContain('>1.00 · ');
    const json = JSON.parse(readFileSync(join(dir, 'league.json'), 'utf8')) as LeagueResult;
    expect(json.seeds).toBe(2);
    expect(json.rows.map((row) => `${row.trace} ${row.fleet} ${row.load}`)).toEqual(['conversation 4 1', 'agentic 4 1']);
    for (const row of json.rows) {
      expect(row.cells.map((c) => c.label)).toEqual(['kv-pressure', 'dynamo', 'smg', 'aibrix']);
      for (const c of row.cells) {
        expect(c.perSeed).toHaveLength(2);
        for (const s of c.perSeed) {
          expect(s.hit_of_ideal).toBeGreaterThanOrEqual(0);
          expect(s.hit_of_ideal).toBeLessThanOrEqual(1.001);
          expect(s.ttft_p90).toBeGreaterThan(0);
          expect(s.goodput).toBeGreaterThan(0);
          expect(s.goodput).toBeLessThanOrEqual(1);
        }
      }
      // Two seeds are two different windows / draws: the spread is real.
      expect(row.cells.some((c) => c.sd.ttft_p90 > 0)).toBe(true);
    }
  }, 240_000);

  it('adds the ablation rows', async () => {
    // Repeated options: the last one given wins, so the size flags override the documented fleet.
    const args = [...argv(ABLATION_DOC), ...TINY, '--league-traces', 'agentic'];
    const r = await run(process.execPath, [BIN, ...args], { cwd: ROOT, maxBuffer: 1 << 24 });
    expect(r.stdout).toContain('### agentic, load 1x, 4 engines');
    expect(r.stdout).not.toContain('### conversation');
    for (const label of ['-overlap', '-load', '-decode', '-busy', '-sessions', '-overlay', '+requests'])
      expect(r.stdout).toContain(`| kv-pressure ${label} |`);
    expect(r.stdout).toContain('| dynamo |');
  }, 240_000);

  it('bad input: one clear line, exit 2', async () => {
    const withTrace = await run(process.execPath, [BIN, 'sim', '--league', '--scenario', 'seed'], { cwd: ROOT }).catch((e) => e);
    expect(withTrace.code).toBe(2);
    expect(String(withTrace.stderr)).toMatch(/--league runs its own traces/);
    const bad = await run(process.execPath, [BIN, 'sim', '--league', '--league-traces', 'conversation,bogus'], { cwd: ROOT }).catch(
      (e) => e,
    );
    expect(bad.code).toBe(2);
    expect(String(bad.stderr)).toMatch(/unknown trace bogus/);
    const policy = await run(process.execPath, [BIN, 'sim', '--league', '--policy', 'nope'], { cwd: ROOT }).catch((e) => e);
    expect(policy.code).toBe(2);
  });

  it('outside the repository the Mooncake traces are missing: exit 1 with the path it needs', async () => {
    const r = await run(process.execPath, [BIN, 'sim', '--league', '--league-traces', 'synthetic'], { cwd: tmpdir() }).catch((e) => e);
    expect(r.code).toBe(1);
    expect(String(r.stderr)).toContain('data/traces/mooncake_synthetic_trace.jsonl.gz');
  });
});

const fig = (goodput: number, ttftP90: number): LeagueFigures => ({
  hit_of_ideal: 0.9,
  predicted_of_ideal: 0.9,
  ttft_p50: 100,
  ttft_p90: ttftP90,
  ttft_p99: 900,
  itl_p90: 7,
  goodput,
  imbalance: 1.1,
  queued: 0,
  refused: 0,
});

const cell = (label: string, seeds: LeagueFigures[]): LeagueCell => ({
  label,
  perSeed: seeds,
  mean: fig(seeds.reduce((a, s) => a + s.goodput, 0) / seeds.length, seeds.reduce((a, s) => a + s.ttft_p90, 0) / seeds.length),
  sd: fig(0, 0),
});

describe('verdicts', () => {
  it('a peer beats the default beyond the spread only when it is better on every seed', () => {
    const res: LeagueResult = {
      seeds: 3,
      requests: 10,
      slo: { ttftMs: 2000, itlMs: 50 },
      rows: [
        {
          trace: 'agentic',
          load: 1,
          fleet: 8,
          requests: 10,
          cells: [
            cell('kv-pressure', [fig(0.9, 500), fig(0.8, 600), fig(0.85, 550)]),
            // Better on average, worse on one seed: within the spread.
            cell('smg', [fig(0.99, 400), fig(0.95, 300), fig(0.84, 560)]),
            // Better on every seed.
            cell('dynamo', [fig(0.91, 490), fig(0.81, 590), fig(0.86, 540)]),
            // Ablations are not peers.
            cell('kv-pressure -load', [fig(1, 1), fig(1, 1), fig(1, 1)]),
          ],
        },
      ],
    };
    const [v] = verdicts(res);
    expect(v.beatenOnGoodput.map((b) => b.label)).toEqual(['dynamo']);
    expect(v.beatenOnTtftP90.map((b) => b.label)).toEqual(['dynamo']);
    expect(v.goodputRank).toBe(3);
    expect(v.beatenOnGoodput[0].by).toBeCloseTo(0.01);
  });
});

describe('oracleTokenWeighted', () => {
  it('credits leading trace blocks seen before, up to the prompt less one token', () => {
    const reqs = [
      { timestamp: 0, inputLength: 1000, outputLength: 1, hashIds: [1, 2] },
      // Both blocks seen: 1,024 reusable tokens, capped at 999.
      { timestamp: 1, inputLength: 1000, outputLength: 1, hashIds: [1, 2] },
      // First block seen, then a new one: 512.
      { timestamp: 2, inputLength: 1024, outputLength: 1, hashIds: [1, 3] },
    ];
    expect(oracleTokenWeighted(reqs)).toBeCloseTo((999 + 512) / 3024);
  });
});
