/** `kvroute epp` as a process from the built package, and reading its metrics. */
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { sleep } from '../server/helpers.ts';

export const CLI = fileURLToPath(new URL('../../bin/kvroute.mjs', import.meta.url));

export interface EppProcess {
  readonly address: string;
  /** How ext_proc is served, as the start-up line says: "plaintext", "TLS (self-signed certificate)", ... */
  readonly tls: string;
  /** The plaintext gRPC health listener. */
  readonly healthAddress: string;
  readonly metricsUrl: string;
  readonly proc: ChildProcess;
  output(): string;
  stop(): Promise<number | null>;
}

/**
 * Starts `kvroute epp ARGS` on free ports; resolves once it logs its addresses. By default the ext_proc port is
 * plaintext (--no-secure-serving) and /metrics open (--metrics-auth none), with ports on the command line; `exact` runs `kvroute ARGS` (a chart's command line
 * given to the image's `kvroute` entrypoint), the free ports given as variables.
 */
export async function startEpp(
  args: string[],
  options: { tls?: boolean; exact?: boolean; env?: Record<string, string> } = {},
): Promise<EppProcess> {
  const argv = options.exact
    ? args
    : [
        '--port',
        '0',
        '--metrics-port',
        '0',
        '--grpc-health-port',
        '0',
        '--health-interval-ms',
        '200',
        ...(options.tls ? [] : ['--no-secure-serving']),
        // /metrics open, so tests read it without a token (with --k8s-* the default would be Kubernetes token review).
        '--metrics-auth',
        'none',
        ...args,
      ];
  // `exact`: the command line alone, as a container whose entrypoint is `kvroute` runs it (no `epp` word).
  const proc = spawn(process.execPath, options.exact ? [CLI, ...argv] : [CLI, 'epp', ...argv], {
    env: { ...process.env, KVROUTE_LOG_LEVEL: 'info', ...options.env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  proc.stderr!.on('data', (d: Buffer) => {
    out += d.toString();
  });
  const m = await new Promise<RegExpExecArray>((resolve, reject) => {
    // Generous: on a loaded shared machine (load 16 on two cores) a start has taken over 30 s.
    const t = setTimeout(() => {
      // Not started in time: end it, or it outlives the test (and holds a core's share on a shared machine).
      proc.kill('SIGKILL');
      reject(new Error(`kvroute epp did not start: ${out}`));
    }, 60_000);
    proc.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const found =
        /kvroute epp listening on grpc:\/\/(\S+) \(ext_proc\) over (.+?); health on grpc:\/\/(\S+) \(plaintext\); metrics on (https?:\/\/[\d.:]+)/.exec(
          out,
        );
      if (found) {
        clearTimeout(t);
        resolve(found);
      }
    });
    proc.once('exit', (code) => reject(new Error(`kvroute epp exited ${code}: ${out}`)));
  });
  const p: EppProcess = {
    address: m[1],
    tls: m[2],
    healthAddress: m[3],
    metricsUrl: m[4],
    proc,
    output: () => out,
    stop: async () => {
      if (proc.exitCode !== null) return proc.exitCode;
      proc.kill('SIGTERM');
      return new Promise((r) => proc.once('exit', (code) => r(code)));
    },
  };
  return p;
}

export async function metricsText(p: EppProcess): Promise<string> {
  return (await fetch(`${p.metricsUrl}/metrics`)).text();
}

/** The sum of a metric's samples whose labels contain `labels` (all samples when empty); 0 when there is none. */
export function metric(text: string, name: string, labels = ''): number {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (labels && !line.includes(labels)) continue;
    sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return sum;
}

export async function eventually(cond: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await sleep(50);
  }
}
