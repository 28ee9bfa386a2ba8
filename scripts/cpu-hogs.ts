/**
 * CPU hogs for the scripts that run something on a busy machine (test-busy.ts, stop-after-replacement.ts): N processes
 * spinning `for (;;) {}`, ended by their pids when this process exits or is interrupted, whatever happens.
 */
import { type ChildProcess, spawn } from 'node:child_process';

const hogs: ChildProcess[] = [];
let hooked = false;

export function endCpuHogs(): void {
  for (const h of hogs) if (h.pid !== undefined && h.exitCode === null && h.signalCode === null) process.kill(h.pid, 'SIGKILL');
}

/** Starts n hogs; returns their pids. */
export function startCpuHogs(n: number): number[] {
  if (!hooked) {
    hooked = true;
    process.on('exit', endCpuHogs);
    for (const sig of ['SIGINT', 'SIGTERM'] as const) {
      process.on(sig, () => {
        endCpuHogs();
        process.exit(130);
      });
    }
  }
  const started = Array.from({ length: n }, () => spawn(process.execPath, ['-e', 'for (;;) {}'], { stdio: 'ignore' }));
  hogs.push(...started);
  return started.map((h) => h.pid ?? -1);
}
