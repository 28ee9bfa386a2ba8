import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterEach, describe, expect, it } from 'vitest';
import { buildReport, formatReport, reportJson, ScrapeError } from '../../src/metrics/hitrate-report.ts';
import { parseDuration, parseEngineArg } from '../../src/cli/hitrate.ts';
import fc from 'fast-check';
import { ReuseLedger } from '../../src/core/ledger.ts';

const fixture = (name: string) => fileURLToPath(new URL(`./fixtures/${name}`, import.meta.url));
const read = (name: string) => readFileSync(fixture(name), 'utf8');
const A = read('router-a.prom');
const B = read('router-b.prom');
const C = read('router-c-restarted.prom');
const bin = fileURLToPath(new URL('../../bin/kvroute.mjs', import.meta.url));
const run = promisify(execFile);

/** Runs the CLI; resolves with stdout, stderr and exit code (never rejects on a non-zero exit). */
async function cli(args: string[]) {
  try {
    const r = await run(process.execPath, [bin, 'hitrate', ...args], { timeout: 20_000 });
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

// Fixture window (b - a), built to reproduce the motivating production case of docs/protocols.md §6:
//   histogram (mean of ratios)   320 / 1000             = 0.320
//   block-weighted               79000 / 100000         = 0.790
//   engine (mirrored counters)   1227200 / 1600000      = 0.767
describe('hit-rate report on saved scrapes', () => {
  it('reads the motivating case: router accurate, histogram pulled down by short requests', () => {
    const r = buildReport({ from: A, to: B, windowS: 300 });
    expect(r.prefix).toBe('dynamo_component_');
    expect(r.engineSource).toBe('mirror');
    expect(r.overall.requests).toBe(1000);
    expect(r.overall.predicted.requestWeighted).toBeCloseTo(0.32, 12);
    expect(r.overall.predicted.blockWeighted).toBeCloseTo(0.79, 12);
    expect(r.overall.available.blockWeighted).toBeCloseTo(0.82, 12);
    expect(r.overall.available.requestWeighted).toBeCloseTo(0.34, 12);
    expect(r.overall.engine.ratio).toBeCloseTo(0.767, 12);
    expect(r.overall.gaps.blockMinusEngine).toBeCloseTo(0.023, 12);
    expect(r.overall.gaps.requestMinusBlock).toBeCloseTo(-0.47, 12);
    expect(r.overall.delivered.requests).toBe(300);
    expect(r.overall.delivered.tokenWeighted).toBeCloseTo(0.76, 12);
    expect(r.overall.delivered.predictedTokenWeighted).toBeCloseTo(0.79, 12);
    expect(r.overall.delivered.requestWeighted).toBeCloseTo(0.5, 12);
    expect(r.verdict).toBe(
      "router view accurate: block-weighted 0.790 vs engine 0.767; the histogram's 0.320 is a mean of ratios pulled " +
        'down by many short requests',
    );
    const [w0, w1] = r.workers;
    expect(w0.name).toBe('w0');
    expect(w0.predicted.blockWeighted).toBeCloseTo(0.8, 12);
    expect(w0.engine.ratio).toBeCloseTo(0.78, 12);
    expect(w1.predicted.requestWeighted).toBeCloseTo(0.35, 12);
    expect(w1.predicted.blockWeighted).toBeCloseTo(0.775, 12);
    expect(w1.engine.ratio).toBeCloseTo(0.7475, 12);
    expect(Number.isNaN(w1.delivered.tokenWeighted)).toBe(true);
    expect(r.resets).toEqual([]);

    const text = formatReport(r);
    expect(text).toMatch(/^overall\s+1000\s+0\.320\s+0\.790\s+0\.820\s+0\.760\s+0\.790\s+0\.767\s+-0\.470\s+\+0\.023\s+\+0\.030$/m);
    expect(text).toMatch(/^w1\s+400\s+0\.350\s+0\.775\s+0\.800\s+-\s+-\s+0\.748/m);
    const json = JSON.parse(reportJson(r));
    expect(json.workers[1].delivered.tokenWeighted).toBeNull(); // unknown, never 0
  });

  it('zero traffic says so instead of dividing by zero', () => {
    const r = buildReport({ from: B, to: B, windowS: 60 });
    expect(r.overall.requests).toBe(0);
    expect(r.verdict).toMatch(/^no traffic in the window/);
    expect(Number.isNaN(r.overall.predicted.blockWeighted)).toBe(true);
    expect(formatReport(r)).toMatch(/^overall\s+0\s+-\s+-/m);
    expect(r.notes.join(' ')).toContain('no prompt tokens queried');
  });

  it('a router restart between the scrapes counts the new values from zero and says so', () => {
    const r = buildReport({ from: B, to: C, windowS: 60 });
    expect(r.resets).toContain('w0');
    expect(r.overall.requests).toBe(10);
    expect(r.overall.predicted.blockWeighted).toBeCloseTo(0.8, 12);
    expect(r.overall.engine.ratio).toBeCloseTo(0.75, 12);
    expect(r.notes.join(' ')).toMatch(/counter resets .*w0/);
  });

  it('without engine metrics, the verdict says there is no truth to compare with', () => {
    const strip = (t: string) =>
      t
        .split('\n')
        .filter(
          (l) =>
            !l.includes('router_engine_') &&
            !l.includes('engine_cached') &&
            !l.includes('engine_prompt') &&
            !l.includes('predicted_cached') &&
            !l.includes('delivered_hit_rate'),
        )
        .join('\n');
    const r = buildReport({ from: strip(A), to: strip(B), windowS: 60 });
    expect(r.engineSource).toBe('none');
    expect(r.verdict).toMatch(/^no engine truth in the window .* block-weighted 0\.790; the histogram's 0\.320/);
  });

  it('reads scrapes without worker labels (overall only) and keeps unlabelled series beside labelled ones', () => {
    const unlabel = (t: string) => t.replace(/,?worker="w[01]"/g, '').replace(/\{\}/g, '');
    // without labels, w0 and w1 collapse into duplicate series that still sum to the overall figures
    const r = buildReport({ from: unlabel(A), to: unlabel(B), windowS: 60 });
    expect(r.workers).toEqual([]);
    expect(r.overall.predicted.blockWeighted).toBeCloseTo(0.79, 12);
    expect(r.overall.engine.ratio).toBeCloseTo(0.767, 12);
    const extra = 'dynamo_component_router_kv_isl_blocks_total 0\n';
    const extraB = 'dynamo_component_router_kv_isl_blocks_total 100\ndynamo_component_router_kv_overlap_blocks_total 50\n';
    const m = buildReport({ from: A + extra, to: B + extraB, windowS: 60 });
    expect(m.workers.map((w) => w.name)).toEqual(['(no worker label)', 'w0', 'w1']);
    expect(m.overall.islBlocks).toBe(100_100);
    expect(m.overall.predicted.blockWeighted).toBeCloseTo(79_050 / 100_100, 12);
  });

  it('rejects a scrape that is not a router', () => {
    expect(() => buildReport({ from: 'vllm:foo 1\n', to: 'vllm:foo 2\n', windowS: 1 })).toThrow(ScrapeError);
  });

  it('parses durations and engine arguments', () => {
    expect(parseDuration('60s')).toBe(60);
    expect(parseDuration('2m')).toBe(120);
    expect(parseDuration('500ms')).toBe(0.5);
    expect(parseDuration('5')).toBe(5);
    expect(() => parseDuration('soon')).toThrow(/--window must be a positive duration/);
    expect(parseEngineArg('w1=http://h:8000')).toEqual({ name: 'w1', url: 'http://h:8000' });
    expect(parseEngineArg('http://h:8000')).toEqual({ name: 'h:8000', url: 'http://h:8000' });
  });
});

const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});

/** Serves the given bodies on /metrics in turn (the last one repeats). */
async function sequence(bodies: string[]): Promise<string> {
  let i = 0;
  const server = createServer((req, res) => {
    if (req.url !== '/metrics') return void res.writeHead(404).end();
    res.writeHead(200, { 'content-type': 'text/plain' }).end(bodies[Math.min(i++, bodies.length - 1)]);
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

describe('kvroute hitrate (the command)', () => {
  it('offline on two saved scrape files, text and JSON', async () => {
    const t = await cli(['--from', fixture('router-a.prom'), '--to', fixture('router-b.prom')]);
    expect(t.code).toBe(0);
    expect(t.stdout).toContain('between two saved scrapes');
    expect(t.stdout).toContain('verdict: router view accurate: block-weighted 0.790 vs engine 0.767');
    const j = await cli(['--from', fixture('router-a.prom'), '--to', fixture('router-b.prom'), '--json']);
    expect(j.code).toBe(0);
    const report = JSON.parse(j.stdout);
    expect(report.overall.predicted.requestWeighted).toBeCloseTo(0.32, 12);
    expect(report.windowS).toBeNull();
  });

  it('live: scrapes the router twice over the window, and engines directly when the router does not mirror them', async () => {
    const noMirror = (t: string) =>
      t
        .split('\n')
        .filter((l) => !l.includes('router_engine_'))
        .join('\n');
    const router = await sequence([noMirror(A), noMirror(B)]);
    const vllm = (q: number, h: number) =>
      `vllm:prefix_cache_queries_total{engine="0",model_name="m"} ${q}\nvllm:prefix_cache_hits_total{engine="0",model_name="m"} ${h}\n`;
    const e0 = await sequence([vllm(1000, 500), vllm(101000, 80500)]);
    const t = await cli(['--router', router, '--window', '200ms', '--engine', `w0=${e0}`, '--json']);
    expect(t.stderr).toBe('');
    expect(t.code).toBe(0);
    const r = JSON.parse(t.stdout);
    expect(r.engineSource).toBe('direct');
    expect(r.windowS).toBeGreaterThanOrEqual(0.19);
    expect(r.overall.engine.ratio).toBeCloseTo(0.8, 12);
    expect(r.workers[0].engine.ratio).toBeCloseTo(0.8, 12);
    expect(r.workers[1].engine.ratio).toBeNull();
  });

  it('clear errors: unreachable router, missing arguments, not a router', async () => {
    const down = await cli(['--router', 'http://127.0.0.1:1', '--window', '10ms']);
    expect(down.code).toBe(1);
    expect(down.stderr).toMatch(/^kvroute hitrate: cannot scrape http:\/\/127\.0\.0\.1:1\/metrics/);
    const none = await cli([]);
    expect(none.code).toBe(2);
    expect(none.stderr).toContain('--router URL is required');
    const engineOnly = await sequence(['vllm:prefix_cache_queries_total 1\n']);
    const wrong = await cli(['--router', engineOnly, '--window', '10ms']);
    expect(wrong.code).toBe(2);
    expect(wrong.stderr).toContain('no router_kv_* metrics');
  });
});

describe('the identity the docs rely on: ratio_of_sums = mean_of_ratios + Cov(n, h) / mean(n)', () => {
  it('worked example: 1 block with 0 hits, 100 blocks with 99 hits', () => {
    const n = [1, 100];
    const h = [0, 0.99];
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
    const cov = mean(n.map((x, i) => x * h[i])) - mean(n) * mean(h);
    expect(mean(h)).toBeCloseTo(0.495, 12);
    expect(cov).toBeCloseTo(24.5025, 12);
    expect(cov / mean(n)).toBeCloseTo(0.485198, 6);
    expect(mean(h) + cov / mean(n)).toBeCloseTo(99 / 101, 12);
  });

  it('holds for the ledger on any traffic (property)', () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.integer({ min: 1, max: 10_000 }), fc.double({ min: 0, max: 1, noNaN: true })), {
          minLength: 1,
          maxLength: 200,
        }),
        (reqs) => {
          const ledger = new ReuseLedger();
          const n: number[] = [];
          const h: number[] = [];
          for (const [blocks, frac] of reqs) {
            const overlap = Math.floor(blocks * frac);
            ledger.routed('w', blocks, overlap, overlap);
            n.push(blocks);
            h.push(overlap / blocks);
          }
          const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
          const cov = mean(n.map((x, i) => x * h[i])) - mean(n) * mean(h);
          const v = ledger.view();
          expect(v.predicted.requestWeighted).toBeCloseTo(mean(h), 9);
          expect(v.predicted.blockWeighted).toBeCloseTo(mean(h) + cov / mean(n), 9);
        },
      ),
      { numRuns: 200 },
    );
  });
});
