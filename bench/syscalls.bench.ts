/**
 * bench:syscalls: system calls per request of a proxy process (every thread), counted by `strace -f -c` on a fixed
 * request sequence. Instruction counts (bench:callgrind) leave the kernel out, and on loopback a socket write or a
 * thread wake-up costs the sender the receiver's TCP processing too; this counts those calls, per kind.
 *
 * For each target and workload: the fast upstream (its own process, not counted), the proxy, `--warmup` requests, then
 * strace attached to the proxy's threads for exactly `--requests` requests from `--concurrency` keep-alive connections,
 * then detached; its summary divided by the requests. strace slows the proxy down: with several connections more
 * requests wait per event-loop turn than they would without it, so anything batched per turn is batched more here; at
 * `--concurrency 1` nothing is.
 *
 *   npm run bench:syscalls [-- --requests 500 --warmup 500 --concurrency 8 --only ids,ids-stream,chat
 *                              --targets kvroute,bare --compare <other build>/bin/kvroute.mjs]
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { waitForLine } from './lib/child.ts';
import { chatWorkload, idsWorkload, prose, type Workload } from './lib/http-workloads.ts';
import { benchArgs, KVROUTE_BIN, listeningUrl, QWEN3_DIR, serveArgs, startUpstreamProcess, stopChild, track } from './lib/proxy-run.ts';
import { RawClient } from './lib/raw-client.ts';

const HELP = `bench:syscalls: system calls per request (strace -f -c) of kvroute and the bare Node proxy

usage: npm run bench:syscalls -- [options]

  --requests <n>         counted requests per row (default 500)
  --warmup <n>           requests before counting starts (default 500)
  --concurrency <n>      keep-alive connections sending them (default 8)
  --ids <n>              token ids per completions prompt (default 2048)
  --system-tokens <n>    approximate tokens of the chat system prompt (default 8192)
  --only <list>          workloads: ids,ids-stream,chat (default all)
  --targets <list>       kvroute,bare (default both; bare has no chat row)
  --compare <bin>        also count another kvroute build (rows "before")
  -h, --help             this text`;

const { opt, num } = benchArgs('bench:syscalls', HELP);
const REQUESTS = num('requests', 500, true);
const WARMUP = num('warmup', 500, true);
const CONCURRENCY = num('concurrency', 8, true);
const IDS = num('ids', 2048, true);
const SYSTEM_TOKENS = num('system-tokens', 8192, true);
const ONLY = (opt('only') ?? 'ids,ids-stream,chat').split(',');
const TARGETS = (opt('targets') ?? 'kvroute,bare').split(',');
const COMPARE = opt('compare');
const CHUNKS = 4;
try {
  execFileSync('strace', ['-V'], { stdio: 'ignore' });
} catch {
  console.error('bench:syscalls: strace is not installed (apt-get install -y strace)');
  process.exit(2);
}
const progress = (s: string) => process.stderr.write(`[syscalls] ${s}\n`);

async function send(url: string, w: Workload, from: number, count: number): Promise<number> {
  const client = RawClient.fromUrl(url, CONCURRENCY);
  const reqs = Array.from({ length: Math.min(count, 256) }, (_, i) => RawClient.post(w.path, w.body(from + i)));
  let next = 0;
  let bad = 0;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < count) {
        const i = next++;
        if ((await client.send(reqs[i % reqs.length])) !== 200) bad++;
      }
    }),
  );
  client.close();
  return bad;
}

/** strace -c's summary: calls per syscall name. */
function parseSummary(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    // % time  seconds  usecs/call  calls  [errors]  syscall
    const m = /^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?([a-z_0-9]+)\s*$/.exec(line);
    if (m && m[2] !== 'total') out.set(m[2], Number(m[1]));
  }
  return out;
}

async function count(target: string, bin: string, label: string, upstream: string, w: Workload): Promise<Map<string, number>> {
  const child: ChildProcess =
    target === 'bare'
      ? track(process.execPath, ['--import', 'tsx', fileURLToPath(new URL('./lib/bare-proxy.ts', import.meta.url)), upstream])
      : track(process.execPath, serveArgs(bin, [upstream], ['--tokenizer', QWEN3_DIR]));
  const url = target === 'bare' ? `http://127.0.0.1:${(await waitForLine(child, /PORT (\d+)/))[1]}` : await listeningUrl(child, 120_000);
  progress(`${label} ${w.name}: warming up (${WARMUP} requests)`);
  if ((await send(url, w, 0, WARMUP)) > 0) throw new Error(`${label} ${w.name}: warm-up requests failed`);
  const dir = mkdtempSync(join(tmpdir(), 'kvroute-strace-'));
  const out = join(dir, 'summary');
  const st = spawn('strace', ['-f', '-c', '-o', out, '-p', String(child.pid)], { stdio: ['ignore', 'ignore', 'pipe'] });
  // strace says "Process N attached" once per thread; give it the moment it needs.
  await new Promise((r) => setTimeout(r, 1500));
  progress(`${label} ${w.name}: counting ${REQUESTS} requests`);
  const bad = await send(url, w, WARMUP, REQUESTS);
  const done = new Promise((r) => st.once('exit', r));
  st.kill('SIGINT');
  await done;
  await stopChild(child);
  if (bad > 0) throw new Error(`${label} ${w.name}: ${bad} counted requests failed`);
  const calls = parseSummary(readFileSync(out, 'utf8'));
  rmSync(dir, { recursive: true, force: true });
  return calls;
}

async function main() {
  const { url: upstream, child: up } = await startUpstreamProcess(CHUNKS);
  const load = loadavg().map((x) => x.toFixed(1));
  const workloads: Workload[] = [];
  if (ONLY.includes('ids')) workloads.push(idsWorkload(IDS, CHUNKS, false));
  if (ONLY.includes('ids-stream')) workloads.push(idsWorkload(IDS, CHUNKS, true));
  if (ONLY.includes('chat')) workloads.push(chatWorkload(prose(SYSTEM_TOKENS, 12345), CHUNKS));
  const rows: { proxy: string; workload: string; calls: Map<string, number> }[] = [];
  for (const w of workloads) {
    const targets: { target: string; bin: string; label: string }[] = [];
    if (TARGETS.includes('bare') && w.name !== 'chat warm') targets.push({ target: 'bare', bin: '', label: 'bare node' });
    if (TARGETS.includes('kvroute') && COMPARE) targets.push({ target: 'kvroute', bin: COMPARE, label: 'kvroute before' });
    if (TARGETS.includes('kvroute')) targets.push({ target: 'kvroute', bin: KVROUTE_BIN, label: 'kvroute' });
    for (const t of targets) rows.push({ proxy: t.label, workload: w.name, calls: await count(t.target, t.bin, t.label, upstream, w) });
  }
  await stopChild(up);
  // Columns: the syscalls that make up most of the calls in any row, the rest summed.
  const totals = new Map<string, number>();
  for (const r of rows) for (const [k, v] of r.calls) totals.set(k, (totals.get(k) ?? 0) + v);
  const cols = [...totals]
    .sort((a, b) => b[1] - a[1])
    .slice(0, 8)
    .map(([k]) => k);
  console.log(`loadavg at start: ${load.join(' ')} (counts do not depend on it)`);
  console.log(`${REQUESTS} counted requests per row after ${WARMUP} warm-up, ${CONCURRENCY} connections\n`);
  console.log(`| proxy | workload | syscalls/req | ${cols.join(' | ')} | other |`);
  console.log(`| ----- | -------- | -----------: | ${cols.map(() => '---:').join(' | ')} | ---: |`);
  const f = (n: number) => (n / REQUESTS).toFixed(2);
  for (const r of rows) {
    let all = 0;
    for (const v of r.calls.values()) all += v;
    const shown = cols.map((c) => r.calls.get(c) ?? 0);
    const other = all - shown.reduce((a, b) => a + b, 0);
    console.log(`| ${r.proxy} | ${r.workload} | ${f(all)} | ${shown.map(f).join(' | ')} | ${f(other)} |`);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
