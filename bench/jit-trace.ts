/**
 * jit-trace — does V8 keep optimizing or deoptimizing kvroute's code once it is warm? Runs the built `kvroute serve`
 * under `--trace-opt --trace-deopt` in front of the capacity benchmarks' fast upstream, sends 2,048-token-id
 * completions from 16 connections for a warm-up phase and then a steady phase, and counts V8's optimizations and
 * deoptimizations in each phase (by the phase in which each trace line arrived): a warm-up, then --phases steady ones.
 *
 *   npm run build && node --import tsx bench/jit-trace.ts [--stream] [--seconds 15] [--phases 3]
 */
import { usage } from '../scripts/usage.ts';
import { spawn } from 'node:child_process';
import { parseArgs } from 'node:util';
import { startFastUpstream } from './lib/fast-upstream.ts';
import { idsWorkload } from './lib/http-workloads.ts';

usage(import.meta.url);

const { values } = parseArgs({
  options: {
    stream: { type: 'boolean', default: false },
    seconds: { type: 'string', default: '15' },
    phases: { type: 'string', default: '3' },
  },
});
const seconds = Number(values.seconds);
const upstream = await startFastUpstream(4);
const port = 18000 + Math.floor(Math.random() * 2000);
const kv = spawn(
  process.execPath,
  [
    '--trace-opt',
    '--trace-deopt',
    'bin/kvroute.mjs',
    'serve',
    '--port',
    String(port),
    '--worker',
    `http://127.0.0.1:${upstream},model=bench`,
  ],
  { stdio: ['ignore', 'pipe', 'pipe'] },
);
let phase = 'start-up';
const counts = new Map<string, { opt: number; deopt: number; requests: number }>();
const at = (p: string) => counts.get(p) ?? (counts.set(p, { opt: 0, deopt: 0, requests: 0 }), counts.get(p)!);
const read = (d: Buffer) => {
  for (const line of String(d).split('\n')) {
    if (line.includes('[completed optimizing')) at(phase).opt++;
    else if (line.includes('[bailout (kind')) at(phase).deopt++;
  }
};
kv.stdout.on('data', read);
kv.stderr.on('data', read);
const url = `http://127.0.0.1:${port}`;
for (let i = 0; ; i++) {
  if (i === 300) throw new Error('kvroute serve did not answer /health within 60 s');
  if (
    await fetch(`${url}/health`).then(
      (r) => r.ok,
      () => false,
    )
  )
    break;
  await new Promise((r) => setTimeout(r, 200));
}
const work = idsWorkload(2048, 4, values.stream);
let n = 0;
async function load(p: string): Promise<void> {
  phase = p;
  const end = Date.now() + seconds * 1000;
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (Date.now() < end) {
        const r = await fetch(url + work.path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: work.body(n++) });
        await r.arrayBuffer();
        at(p).requests++;
      }
    }),
  );
}
await load('warm-up');
for (let k = 1; k <= Number(values.phases); k++) await load(`steady ${k}`);
phase = 'stop';
kv.kill('SIGTERM');
await new Promise((r) => kv.once('exit', r));
console.log(`jit-trace: ${work.name}, 16 connections, ${seconds} s a phase`);
for (const [p, c] of counts)
  console.log(
    `  ${p.padEnd(9)} requests ${String(c.requests).padStart(6)}  optimized ${String(c.opt).padStart(4)}  deoptimized ${String(c.deopt).padStart(4)}`,
  );
process.exit(0);
