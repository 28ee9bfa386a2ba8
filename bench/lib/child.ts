/** Child processes of the benchmarks: wait for the line a child prints once it is ready. */
import type { ChildProcess } from 'node:child_process';

/** Resolves with the first match of `re` in the child's stdout + stderr; rejects on timeout or exit (with its output). */
export function waitForLine(child: ChildProcess, re: RegExp, timeoutMs = 60_000): Promise<RegExpExecArray> {
  return new Promise((resolve, reject) => {
    let buf = '';
    const t = setTimeout(() => reject(new Error(`timed out waiting for ${re}; output so far: ${buf.slice(-800)}`)), timeoutMs);
    const on = (d: Buffer) => {
      buf += d.toString();
      const m = re.exec(buf);
      if (m) {
        clearTimeout(t);
        child.stdout?.off('data', on);
        child.stderr?.off('data', on);
        child.stdout?.resume();
        child.stderr?.resume();
        resolve(m);
      }
    };
    child.stdout?.on('data', on);
    child.stderr?.on('data', on);
    child.once('exit', (code) => reject(new Error(`exited with ${code} before printing ${re}: ${buf.slice(-800)}`)));
  });
}
