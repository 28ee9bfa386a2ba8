/**
 * bench:cpu-profile: where kvroute's CPU per request goes, by category. Runs `kvroute serve` (this checkout's build, or
 * --bin's) under `node --cpu-prof` in front of the capacity benchmarks' fast upstream (bench/lib/fast-upstream.ts),
 * sends one workload of bench:capacity from --connections keep-alive connections for a warm-up and then a measured
 * phase, stops kvroute (the profiles are written at exit) and reads the samples of the measured phase only (by the
 * profiles' monotonic timestamps: start-up and warm-up are left out, in every process).
 *
 * With --processes N > 1 it runs `serve --processes N`: the shells inherit --cpu-prof and write profiles of their own.
 * The primary (the routing core: every route() and lifecycle step) gets the full report, per thread; the N shells
 * (HTTP parsing, proxying) are summarised as one category table, their main threads summed, without function lists.
 *
 * Each busy sample is put in the category of its innermost kvroute frame (the file, or for a few files the function:
 * the table CATEGORIES below), except in node's IPC channel between the primary and the shells (--processes): a
 * sample in node:internal/child_process below a kvroute frame is an IPC write, one with no kvroute frame an IPC read.
 * Any other sample with no kvroute frame on its stack goes to V8's garbage collector, node's HTTP (node:_http_*,
 * node:net, node:stream), undici, or node's other internals. A worker thread (the tokenizer's) has its own profile
 * and its own rows. µs per request = the category's sampled time / requests answered in the phase: a sampled-wall-time
 * estimate of on-CPU time (on a loaded machine it includes time the thread was runnable but not running), so read the
 * shares, and compare µs only within one run.
 *
 *   npm run build && npm run bench:cpu-profile -- [--only ids|ids-stream|chat] [--processes 1] [--warmup 8]
 *                    [--seconds 10] [--connections 16] [--top 25] [--bin <other>/bin/kvroute.mjs] [--keep <dir>]
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { chatWorkload, idsWorkload, prose, type Workload } from './lib/http-workloads.ts';
import { benchArgs, KVROUTE_BIN, listeningUrl, QWEN3_DIR, serveArgs, startUpstreamProcess, stopChild, track } from './lib/proxy-run.ts';
import { RawClient } from './lib/raw-client.ts';

const HELP = `bench:cpu-profile: kvroute's CPU per request by category (node --cpu-prof), one workload

usage: npm run bench:cpu-profile -- [options]

  --only <workload>      ids | ids-stream | chat (default ids)
  --processes <n>        serve --processes n: n > 1 reports the primary (the routing core) in full and the shells
                         summed (default 1: one process)
  --warmup <s>           seconds of load before the measured phase (default 8)
  --seconds <s>          seconds measured (default 10)
  --connections <n>      keep-alive connections (default 16)
  --ids <n>              token ids per completions prompt (default 2048)
  --system-tokens <n>    approximate tokens of the chat system prompt (default 8192)
  --top <n>              also list the n kvroute functions with the most samples (innermost kvroute frame) and the
                         n functions with the most self time, per thread of kvroute (the primary) (default 25)
  --bin <path>           kvroute's bin/kvroute.mjs (default this checkout's)
  --keep <dir>           write the .cpuprofile files there and keep them (CPU.<date>.<time>.<pid>.<thread>.<n>)
  -h, --help             this text`;

const { opt, num } = benchArgs('bench:cpu-profile', HELP);
const ONLY = opt('only') ?? 'ids';
const PROCESSES = num('processes', 1, true);
const WARMUP = num('warmup', 8);
const SECONDS = num('seconds', 10);
const CONNECTIONS = num('connections', 16, true);
const IDS = num('ids', 2048, true);
const SYSTEM_TOKENS = num('system-tokens', 8192, true);
const TOP = num('top', 25, true);
const BIN = opt('bin') ?? KVROUTE_BIN;
const KEEP = opt('keep');
const CHUNKS = 4;

const workloads: Record<string, () => Workload> = {
  ids: () => idsWorkload(IDS, CHUNKS, false),
  'ids-stream': () => idsWorkload(IDS, CHUNKS, true),
  chat: () => chatWorkload(prose(SYSTEM_TOKENS, 12345), CHUNKS),
};
if (!workloads[ONLY]) {
  console.error(`bench:cpu-profile: unknown workload "${ONLY}" (ids, ids-stream, chat)`);
  process.exit(2);
}
const progress = (s: string) => process.stderr.write(`[cpu-profile] ${s}\n`);

// ------------------------------------------------------------------ categories

/** kvroute source files (under src/, without the extension) or `file:function` -> category; first match wins. */
const CATEGORIES: [RegExp, string][] = [
  [
    /^runtime\/request-flow:parseBody$|^apis\/.*-request$|^runtime\/security\/|^http\/body$/,
    'parse (body read, depth check, JSON.parse, validation)',
  ],
  [/^tokenizer\/service$/, 'tokenizer thread calls (post, reply)'],
  [/^tokenizer\//, 'tokenizer (template, segments)'],
  [/^core\/hashing$|^core\/wasm\//, 'hash (block hashes)'],
  [/^core\/mrc$|^runtime\/mrc-feed$/, 'miss-ratio curves'],
  [/^core\/index\/|^core\/approx$/, 'index walk'],
  [/^core\/scheduling\//, 'scoring'],
  [/^core\/dispatch\/|^core\/router$|^core\/active-load$|^core\/ledger$|^core\/tiers$/, 'route(), dispatcher, active load'],
  [/^metrics\//, 'metrics'],
  [/^server\/cluster\//, 'cluster messages (primary.ts, shell.ts, protocol checks)'],
  [/^runtime\/lifecycle$|^runtime\/request-flow$|^runtime\/identity$|^runtime\/refusals$/, 'lifecycle and request flow'],
  [/^server\/proxy$|^apis\/sse$|^engines\//, 'proxying upstream (proxy.ts, SSE relay)'],
  [/^server\/|^apis\/|^http\//, 'HTTP server side (routes, inference.ts, listener)'],
];
const OTHER_KV = 'kvroute other';

interface Node {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: Node[];
  startTime: number;
  samples: number[];
  timeDeltas: number[];
}

/** A file of kvroute's build (dist/ mirrors src/). */
const SRC = /\/dist\/(?:src\/)?(.+)\.js$/;

function kvFile(url: string): string | null {
  if (url.includes('/node_modules/')) return null;
  const m = SRC.exec(url);
  return m ? m[1] : null;
}

const IPC_WRITES = 'IPC writes (send: serializer, channel write)';
const IPC_READS = 'IPC reads (channel parser, deserializer; no kvroute frame)';

function categorize(leaf: Node, parent: Map<number, Node>): { cat: string; fn: string | null } | null {
  const name = leaf.callFrame.functionName;
  if (name === '(idle)') return null;
  // Inside node's IPC channel (serve --processes): a send made by kvroute code above it, or a read with none.
  let ipc = false;
  for (let n: Node | undefined = leaf; n; n = parent.get(n.id)) {
    if (n.callFrame.url.startsWith('node:internal/child_process')) ipc = true;
    const file = kvFile(n.callFrame.url);
    if (!file) continue;
    const key = `${file}:${n.callFrame.functionName || '(anonymous)'}`;
    if (ipc) return { cat: IPC_WRITES, fn: key };
    for (const [re, cat] of CATEGORIES) if (re.test(key) || re.test(file)) return { cat, fn: key };
    return { cat: OTHER_KV, fn: key };
  }
  if (ipc) return { cat: IPC_READS, fn: null };
  if (name === '(garbage collector)') return { cat: 'GC', fn: null };
  if (name === '(program)') return { cat: 'V8 (program)', fn: null };
  for (let n: Node | undefined = leaf; n; n = parent.get(n.id)) {
    const u = n.callFrame.url;
    if (u.startsWith('node:internal/child_process'))
      return { cat: 'IPC channel (node:internal/child_process; no kvroute frame)', fn: null };
    if (u.includes('/undici/')) return { cat: 'undici (no kvroute frame)', fn: null };
    if (/^node:(_http_|http|net|stream|internal\/(http|stream|net|streams))/.test(u))
      return { cat: 'node:http, net, streams (no kvroute frame)', fn: null };
  }
  if (name === 'writev' || name === 'writeBuffer' || name === 'writeUtf8String')
    return { cat: 'socket writes (no kvroute frame)', fn: null };
  return { cat: 'node internals (event loop, timers, other)', fn: null };
}

function analyse(p: Profile, from: number, to: number) {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, Node>();
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n);
  const cats = new Map<string, number>();
  const fns = new Map<string, number>();
  const leaves = new Map<string, number>();
  let t = p.startTime;
  let busy = 0;
  for (let i = 0; i < p.samples.length; i++) {
    t += p.timeDeltas[i];
    if (t < from || t > to) continue;
    // A sample's time: the gap to the next sample (the interval it stands for).
    const dt = i + 1 < p.timeDeltas.length ? p.timeDeltas[i + 1] : 0;
    const leaf = byId.get(p.samples[i]);
    if (!leaf) continue;
    const c = categorize(leaf, parent);
    if (!c) continue;
    busy += dt;
    cats.set(c.cat, (cats.get(c.cat) ?? 0) + dt);
    if (c.fn) fns.set(c.fn, (fns.get(c.fn) ?? 0) + dt);
    const lf = `${leaf.callFrame.functionName || '(anonymous)'} ${leaf.callFrame.url.replace(/.*\/(dist|node_modules)\//, '')}:${leaf.callFrame.lineNumber + 1}`;
    leaves.set(lf, (leaves.get(lf) ?? 0) + dt);
  }
  return { cats, fns, leaves, busy };
}

// ------------------------------------------------------------------ run

async function load(url: string, w: Workload, seconds: number, from: number): Promise<number> {
  const client = RawClient.fromUrl(url, CONNECTIONS);
  const reqs = Array.from({ length: 256 }, (_, i) => RawClient.post(w.path, w.body(from + i)));
  let n = 0;
  let ok = 0;
  const end = performance.now() + seconds * 1000;
  await Promise.all(
    Array.from({ length: CONNECTIONS }, async () => {
      while (performance.now() < end) {
        const status = await client.send(reqs[n++ % reqs.length]);
        if (status === 200) ok++;
        else throw new Error(`status ${status}`);
      }
    }),
  );
  client.close();
  return ok;
}

type Analysis = ReturnType<typeof analyse>;

/** A profile file's process and thread: node names them CPU.<date>.<time>.<pid>.<thread id>.<n>.cpuprofile. */
function pidTid(file: string): { pid: number; tid: number } {
  const m = /\.(\d+)\.(\d+)\.\d+\.cpuprofile$/.exec(file);
  if (!m) throw new Error(`unexpected profile name ${file}`);
  return { pid: Number(m[1]), tid: Number(m[2]) };
}

function sum(rs: Analysis[]): Analysis {
  const out: Analysis = { cats: new Map(), fns: new Map(), leaves: new Map(), busy: 0 };
  for (const r of rs) {
    out.busy += r.busy;
    for (const k of ['cats', 'fns', 'leaves'] as const) for (const [n, v] of r[k]) out[k].set(n, (out[k].get(n) ?? 0) + v);
  }
  return out;
}

async function main() {
  const dir = KEEP ?? mkdtempSync(join(tmpdir(), 'kvroute-prof-'));
  const load0 = loadavg().map((x) => x.toFixed(1));
  const w = workloads[ONLY]();
  const { url: upstream, child: up } = await startUpstreamProcess(CHUNKS);
  const extra = ONLY === 'chat' ? ['--tokenizer', QWEN3_DIR] : [];
  // The shells' periodic metrics reports off: the profile is of the requests' work.
  if (PROCESSES > 1) extra.push('--processes', String(PROCESSES), '--shell-report-ms', '0');
  const kv = track(process.execPath, ['--cpu-prof', '--cpu-prof-dir', dir, ...serveArgs(BIN, [upstream], extra)]);
  const url = await listeningUrl(kv, 120_000);
  progress(`${w.name}: warm-up ${WARMUP} s, then ${SECONDS} s measured, ${CONNECTIONS} connections (loadavg ${load0.join(' ')})`);
  await load(url, w, WARMUP, 0);
  // V8's profile timestamps are CLOCK_MONOTONIC microseconds, as process.hrtime is (Linux), in every process.
  const from = Number(process.hrtime.bigint() / 1000n);
  const requests = await load(url, w, SECONDS, 1000);
  const to = Number(process.hrtime.bigint() / 1000n);
  const load1 = loadavg().map((x) => x.toFixed(1));
  await stopChild(kv, 30_000);
  await stopChild(up);
  const files = readdirSync(dir).filter((f) => f.endsWith('.cpuprofile'));
  if (files.length === 0) throw new Error(`no profile written in ${dir}`);
  // kvroute's process (the primary with --processes) is the child this bench started; any other pid is a shell.
  const profiles = files.map((f) => ({
    ...pidTid(f),
    r: analyse(JSON.parse(readFileSync(join(dir, f), 'utf8')) as Profile, from, to),
  }));
  const mine = profiles.filter((p) => p.pid === kv.pid).sort((a, b) => a.tid - b.tid);
  if (mine.length === 0) throw new Error(`no profile of kvroute's process (pid ${kv.pid}) in ${dir}`);
  const shells = profiles.filter((p) => p.pid !== kv.pid);
  const multi = PROCESSES > 1;
  console.log(
    `bench:cpu-profile: ${w.name}, ${requests} requests in ${SECONDS} s after ${WARMUP} s of warm-up, ${CONNECTIONS} connections` +
      (multi ? `, serve --processes ${PROCESSES}` : ''),
  );
  console.log(`loadavg ${load0.join(' ')} at the start, ${load1.join(' ')} at the end; bin ${BIN === KVROUTE_BIN ? 'this checkout' : BIN}`);
  const us = (x: number) => (x / requests).toFixed(1);
  let all = 0;
  for (const { r } of profiles) all += r.busy;
  console.log(`\nsampled busy time, all threads${multi ? ' of all processes' : ''}: ${us(all)} µs per request\n`);
  const table = (r: Analysis) => {
    console.log('| where | share of the thread | µs/request |');
    console.log('| ----- | ------------------: | ---------: |');
    for (const [c, v] of [...r.cats].sort((a, b) => b[1] - a[1])) console.log(`| ${c} | ${((100 * v) / r.busy).toFixed(1)}% | ${us(v)} |`);
  };
  const tok = ONLY === 'chat' ? ' (tokenizer)' : '';
  for (const { tid, r } of mine) {
    if (r.busy === 0) continue;
    const who = multi ? 'primary (the routing core), ' : '';
    console.log(`### ${who}${tid === 0 ? 'main thread' : `worker thread ${tid}${tok}`}: ${us(r.busy)} µs per request\n`);
    table(r);
    console.log(`\ntop kvroute functions (innermost kvroute frame, callees included):\n`);
    for (const [f, v] of [...r.fns].sort((a, b) => b[1] - a[1]).slice(0, TOP))
      console.log(`  ${((100 * v) / r.busy).toFixed(1).padStart(5)}%  ${us(v).padStart(6)} µs  ${f}`);
    console.log(`\ntop leaf functions (self time):\n`);
    for (const [f, v] of [...r.leaves].sort((a, b) => b[1] - a[1]).slice(0, TOP))
      console.log(`  ${((100 * v) / r.busy).toFixed(1).padStart(5)}%  ${us(v).padStart(6)} µs  ${f}`);
    console.log('');
  }
  // The shells, summarised: their main threads summed, then their worker threads summed (no function lists).
  const pids = new Set(shells.map((p) => p.pid));
  for (const [label, group] of [
    ['main threads', shells.filter((p) => p.tid === 0)],
    [`worker threads${tok}`, shells.filter((p) => p.tid !== 0)],
  ] as const) {
    const r = sum(group.map((p) => p.r));
    if (r.busy === 0) continue;
    console.log(`### the ${pids.size} shells' ${label}, summed: ${us(r.busy)} µs per request\n`);
    table(r);
    console.log('');
  }
  if (KEEP) console.log(`profiles kept in ${dir}`);
  else rmSync(dir, { recursive: true, force: true });
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
