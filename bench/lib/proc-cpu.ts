/**
 * CPU time of a process and its descendants from /proc/<pid>/stat (utime + stime, fields 14 and 15, in clock ticks of
 * 10 ms on Linux's usual USER_HZ = 100). Children that exit between two readings take their time with them, so the
 * measured processes must outlive the window (they do: proxies run for the whole benchmark).
 */
import { readdirSync, readFileSync } from 'node:fs';

const TICK_MS = 10;

function stat(pid: number): { ppid: number; ticks: number } | null {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name (field 2) is in parentheses and may hold spaces: split after its closing one.
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return { ppid: Number(f[1]), ticks: Number(f[11]) + Number(f[12]) };
  } catch {
    return null;
  }
}

/** Whether /proc is readable here (Linux). */
export function procAvailable(): boolean {
  return stat(process.pid) !== null;
}

/** The pid and every descendant alive now. */
export function processTree(pid: number): number[] {
  const parent = new Map<number, number[]>();
  for (const name of readdirSync('/proc')) {
    const p = Number(name);
    if (!Number.isInteger(p)) continue;
    const s = stat(p);
    if (!s) continue;
    const list = parent.get(s.ppid) ?? [];
    list.push(p);
    parent.set(s.ppid, list);
  }
  const out: number[] = [];
  const todo = [pid];
  while (todo.length > 0) {
    const p = todo.pop() as number;
    out.push(p);
    todo.push(...(parent.get(p) ?? []));
  }
  return out;
}

/** CPU milliseconds used so far by the pid and its descendants (threads are counted in their process). */
export function treeCpuMs(pid: number): number {
  let ticks = 0;
  for (const p of processTree(pid)) ticks += stat(p)?.ticks ?? 0;
  return ticks * TICK_MS;
}

/** CPU milliseconds used so far by the pid alone (its threads included, its child processes not). */
export function ownCpuMs(pid: number): number {
  return (stat(pid)?.ticks ?? 0) * TICK_MS;
}
