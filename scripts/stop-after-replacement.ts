/**
 * How long `kvroute serve --processes 2` takes to stop after one of its HTTP shells was SIGKILLed and replaced (the
 * "nothing hung" check of a rolling update): `npm run stop:replaced -- [--runs 5] [--hogs 2] [--grace-ms 30000]
 * [--cli PATH ...]`.
 *
 * Each run: two fake engines with slow streams (40 chunks, 50 ms apart), `serve --processes 2`, four streams, SIGKILL
 * of the first shell, then as soon as the primary says "replaced by" (the replacement is forked, not yet listening):
 * ten requests and a /metrics scrape, then SIGTERM; it prints the milliseconds until the process exited and whether
 * the primary had to kill a shell at the end of the grace. `--sigterm-at-fork` sends SIGTERM right at "replaced by"
 * instead. Several `--cli` (default: this checkout's bin/kvroute.mjs, which runs dist/: `npm run build` first) are
 * measured in turn within each run, so an A/B shares the machine's load. `--hogs N` starts N CPU hogs (`node -e
 * 'for(;;){}'`) for the whole measurement and ends them by pid. Exit code 1 when a stop took longer than half the grace.
 */
import { usage } from './usage.ts';
import { spawn } from 'node:child_process';
import { request } from 'node:http';
import { loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { endCpuHogs, startCpuHogs } from './cpu-hogs.ts';
import { FakeEngine } from '../test/server/fake-engine.ts';

usage(import.meta.url);

const opts = { runs: 5, hogs: 0, graceMs: 30_000, clis: [] as string[], atFork: false };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  if (a === '--runs') opts.runs = Number(argv[++i]);
  else if (a === '--hogs') opts.hogs = Number(argv[++i]);
  else if (a === '--grace-ms') opts.graceMs = Number(argv[++i]);
  else if (a === '--cli') opts.clis.push(argv[++i]);
  else if (a === '--sigterm-at-fork') opts.atFork = true;
  else {
    console.error(`stop:replaced: unknown argument ${a}`);
    process.exit(2);
  }
}
if (opts.clis.length === 0) opts.clis.push(fileURLToPath(new URL('../bin/kvroute.mjs', import.meta.url)));

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const la = () =>
  loadavg()
    .map((x) => x.toFixed(2))
    .join(' ');

function post(url: string, body: unknown): Promise<number> {
  return new Promise((resolve) => {
    const req = request(
      `${url}/v1/completions`,
      { method: 'POST', agent: false, headers: { 'content-type': 'application/json' } },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
        res.on('error', () => resolve(0));
      },
    );
    req.on('error', () => resolve(0));
    req.end(JSON.stringify(body));
  });
}

function tokens(n: number, seed: number): number[] {
  return Array.from({ length: n }, (_, i) => ((seed * 7919 + i * 104729) % 50_000) + 10);
}

async function until(what: string, f: () => boolean | Promise<boolean>, ms = 60_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await f())) {
    if (Date.now() > end) throw new Error(`timed out waiting until ${what}`);
    await sleep(20);
  }
}

interface Stop {
  readonly ms: number;
  readonly code: number | null;
  readonly killed: boolean;
}

async function once(cli: string, run: number): Promise<Stop> {
  const engines = await Promise.all([0, 1].map(() => new FakeEngine({ chunks: 40, chunkDelayMs: 50 }).start()));
  const args = [cli, 'serve', '--port', '0', '--health-interval-ms', '0', '--engine-metrics-interval-ms', '0'];
  args.push('--shutdown-grace-ms', String(opts.graceMs), '--processes', '2', ...engines.flatMap((e) => ['--worker', e.url]));
  const proc = spawn(process.execPath, args, { env: { ...process.env, KVROUTE_LOG_LEVEL: 'info' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  proc.stderr?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  try {
    await until('listening', () => /kvroute listening on/.test(out));
    const url = /kvroute listening on (http:\/\/[\d.:]+)/.exec(out)?.[1] ?? '';
    const shells = (JSON.parse(/\{[^\n]*"shells":\[[\d,]+\][^\n]*\}/.exec(out)?.[0] ?? '{}') as { shells: number[] }).shells;
    const streams = [0, 1, 2, 3].map((i) =>
      post(url, { model: 'fake-model', prompt: tokens(64, run * 10 + i), max_tokens: 40, stream: true }),
    );
    await until('four streams at the engines', () => engines.reduce((a, e) => a + e.active, 0) === 4);
    process.kill(shells[0], 'SIGKILL');
    await Promise.all(streams);
    await until('a replacement forked', () => /replaced by \d+/.test(out));
    if (!opts.atFork) {
      for (let i = 0; i < 10; i++) await post(url, { model: 'fake-model', prompt: tokens(32, run * 100 + i), max_tokens: 1 });
      await (await fetch(`${url}/metrics`)).text();
    }
    const exited = new Promise<void>((r) => proc.once('exit', () => r()));
    const t0 = Date.now();
    proc.kill('SIGTERM');
    await exited;
    return { ms: Date.now() - t0, code: proc.exitCode, killed: /did not stop within the grace period/.test(out) };
  } finally {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
    await Promise.all(engines.map((e) => e.stop()));
  }
}

startCpuHogs(opts.hogs);
console.log(`stop after a shell replacement: ${opts.runs} runs, ${opts.hogs} CPU hogs, grace ${opts.graceMs} ms; load ${la()}`);
const all = new Map<string, number[]>(opts.clis.map((c) => [c, []]));
let slow = false;
for (let run = 1; run <= opts.runs; run++) {
  for (const cli of opts.clis) {
    const s = await once(cli, run);
    all.get(cli)?.push(s.ms);
    slow ||= s.ms > opts.graceMs / 2;
    console.log(
      `run ${run} ${cli}: stop ${s.ms} ms, exit ${s.code}${s.killed ? ', a shell killed at the end of the grace' : ''}; load ${la()}`,
    );
  }
}
endCpuHogs();
for (const [cli, ms] of all) {
  const sorted = [...ms].sort((a, b) => a - b);
  console.log(`${cli}: stops ${sorted.join(', ')} ms (median ${sorted[Math.floor(sorted.length / 2)]})`);
}
process.exit(slow ? 1 : 0);
