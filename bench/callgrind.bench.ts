/**
 * bench:callgrind: instructions per request of a proxy process, counted by valgrind's callgrind on a fixed request
 * sequence, so the figure is the same whatever else the machine does (wall-clock CPU on a shared box swings 2x).
 *
 * For each target and workload: the fast upstream (bench/lib/fast-upstream.ts, its own process, not counted) and the
 * proxy under `valgrind --tool=callgrind --instr-atstart=no` (start-up is not instrumented); `--warmup` requests (JIT,
 * caches, the tokenizer's segment cache for warm chat), then instrumentation on (`callgrind_control -i on`), exactly
 * `--requests` requests from `--concurrency` keep-alive connections, a dump (`callgrind_control -d`), and the dump's
 * total instruction count divided by the requests. Every thread of the proxy's process is counted (the tokenizer's
 * too); the kernel's work (syscalls, TCP) is not, so this is the user-space share of the CPU.
 *
 *   kvroute   bin/kvroute.mjs serve (or --compare's build, rows "before"), one worker, the Qwen3 tokenizer loaded
 *   bare      bench/lib/bare-proxy.ts: node:http + one undici Pool, the body passed unread (the floor of a Node proxy)
 *   parse     bench/lib/floor-proxy.ts --rung parse: bare + the body JSON.parse'd (the floor ladder, token-id workloads)
 *   route     bench/lib/floor-proxy.ts --rung route: parse + block hashes + KvRouter.route() + usage + finish
 *   chatnode  bench/lib/floor-proxy.ts --rung chat: the chat rung (warm chat only): parse + kvroute's tokenizer
 *             (template, segment cache) in the event loop's thread + what route does
 *   chatthread  the same through kvroute's tokenizer thread (--rung chatthread; its thread is counted too)
 *
 * Workloads as bench:capacity: completions with --ids token ids (64 distinct prompts, cycled), streamed or not; chat
 * with a shared ~--system-tokens system prompt and a distinct user turn (warm).
 *
 *   npm run bench:callgrind [-- --requests 400 --warmup 300 --only ids,ids-stream,chat --targets kvroute,bare
 *                               --compare <other build>/bin/kvroute.mjs --keep <dir>]
 *
 * With --keep the callgrind dumps are kept there (callgrind_annotate <file> shows where the instructions went). Each
 * row also splits its count: V8's garbage collector, V8's optimizing compilers, and the rest (a major GC lands in a
 * counted window or not, so the rest is the figure to compare between builds).
 */
import { type ChildProcess, execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Counts, countsOf } from './lib/callgrind-counts.ts';
import { waitForLine } from './lib/child.ts';
import { chatWorkload, idsWorkload, prose, type Workload } from './lib/http-workloads.ts';
import { benchArgs, KVROUTE_BIN, listeningUrl, QWEN3_DIR, serveArgs, startUpstreamProcess, stopChild, track } from './lib/proxy-run.ts';
import { RawClient } from './lib/raw-client.ts';

const HELP = `bench:callgrind: instructions per request (valgrind callgrind) of kvroute and the bare Node proxy

usage: npm run bench:callgrind -- [options]

  --requests <n>         counted requests per row (default 400)
  --warmup <n>           requests before counting starts (default 300)
  --concurrency <n>      keep-alive connections sending them (default 8)
  --ids <n>              token ids per completions prompt (default 2048)
  --system-tokens <n>    approximate tokens of the chat system prompt (default 8192)
  --chunks <n>           SSE chunks per streamed answer (default 4)
  --only <list>          workloads: ids,ids-stream,chat (default all)
  --targets <list>       kvroute,bare,parse,route,chatnode,chatthread (default kvroute,bare; parse and route: the
                         floor ladder's rungs, bench/lib/floor-proxy.ts, token-id workloads only; chatnode,
                         chatthread: its chat rungs, the chat workload only)
  --bin <path>           kvroute's bin/kvroute.mjs (default this checkout's)
  --compare <bin>        also count another kvroute build (rows "before")
  --label <name>         the name of --bin's rows (default "kvroute")
  --keep <dir>           keep the callgrind dumps in <dir>
  --processes <n>        run kvroute with --processes <n>: its rows count the primary (the routing core) and the
                         HTTP shells separately (valgrind follows the forked shells; each is counted on its own)
  --predictable          run the proxies' node with V8's --predictable (no concurrent compiler or GC threads:
                         steadier counts between runs, not the production configuration)
  -h, --help             this text`;

const { argv, opt, num } = benchArgs('bench:callgrind', HELP);
const REQUESTS = num('requests', 400, true);
const WARMUP = num('warmup', 300, true);
const CONCURRENCY = num('concurrency', 8, true);
const IDS = num('ids', 2048, true);
const SYSTEM_TOKENS = num('system-tokens', 8192, true);
const CHUNKS = num('chunks', 4, true);
const ONLY = (opt('only') ?? 'ids,ids-stream,chat').split(',');
const TARGETS = (opt('targets') ?? 'kvroute,bare').split(',');
const BIN = opt('bin') ?? KVROUTE_BIN;
const COMPARE = opt('compare');
const KEEP = opt('keep');
const LABEL = opt('label') ?? 'kvroute';
const PROCESSES = num('processes', 1, true);
const NODE_FLAGS = argv.includes('--predictable') ? ['--predictable'] : [];
for (const w of ONLY) {
  if (!['ids', 'ids-stream', 'chat'].includes(w)) {
    console.error(`bench:callgrind: unknown workload "${w}" (ids, ids-stream, chat)`);
    process.exit(2);
  }
}
for (const t of TARGETS) {
  if (!['kvroute', 'bare', 'parse', 'route', 'chatnode', 'chatthread'].includes(t)) {
    console.error(`bench:callgrind: unknown target "${t}" (kvroute, bare, parse, route, chatnode, chatthread)`);
    process.exit(2);
  }
}
try {
  execFileSync('valgrind', ['--version'], { stdio: 'ignore' });
} catch {
  console.error('bench:callgrind: valgrind is not installed (apt-get install -y valgrind)');
  process.exit(2);
}

const progress = (s: string) => process.stderr.write(`[callgrind] ${s}\n`);

// ------------------------------------------------------------------ one count

const VALGRIND = ['--tool=callgrind', '--instr-atstart=no', '--smc-check=all-non-file'];

function startTarget(target: string, bin: string, upstream: string, outFile: string): ChildProcess {
  const multi = target === 'kvroute' && PROCESSES > 1;
  const args =
    target === 'bare'
      ? [process.execPath, ...NODE_FLAGS, '--import', 'tsx', fileURLToPath(new URL('./lib/bare-proxy.ts', import.meta.url)), upstream]
      : target === 'parse' || target === 'route' || target === 'chatnode' || target === 'chatthread'
        ? [
            process.execPath,
            ...NODE_FLAGS,
            '--import',
            'tsx',
            fileURLToPath(new URL('./lib/floor-proxy.ts', import.meta.url)),
            upstream,
            '--rung',
            target === 'chatnode' ? 'chat' : target,
          ]
        : [
            process.execPath,
            ...NODE_FLAGS,
            // Under valgrind the first instrumented requests crawl (every code path is translated again): no client
            // timeout may cut them.
            ...serveArgs(
              bin,
              [upstream],
              [
                '--tokenizer',
                QWEN3_DIR,
                '--header-timeout-ms',
                '600000',
                '--body-timeout-ms',
                '0',
                ...(multi ? ['--processes', String(PROCESSES)] : []),
              ],
            ),
          ];
  // With --processes, valgrind follows the forked shells (node:cluster forks and execs node): one dump file per pid.
  const out = multi ? ['--trace-children=yes', `--callgrind-out-file=${outFile}.%p`] : [`--callgrind-out-file=${outFile}`];
  return track('valgrind', [...VALGRIND, ...out, ...args]);
}

async function send(url: string, w: Workload, from: number, count: number): Promise<number> {
  const u = new URL(url);
  const client = new RawClient(u.hostname, Number(u.port), CONCURRENCY);
  const reqs = Array.from({ length: Math.min(count, 64) }, (_, i) => RawClient.post(w.path, w.body(from + i)));
  let next = 0;
  let bad = 0;
  const worker = async () => {
    while (next < count) {
      const i = next++;
      const status = await client.send(count > 64 ? RawClient.post(w.path, w.body(from + i)) : reqs[i]);
      if (status !== 200) bad++;
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  client.close();
  return bad;
}

/** Pids of a process's children (every thread's), from /proc. */
function childPids(pid: number): number[] {
  const out: number[] = [];
  for (const t of readdirSync(`/proc/${pid}/task`)) {
    try {
      const kids = readFileSync(`/proc/${pid}/task/${t}/children`, 'utf8').trim();
      if (kids) out.push(...kids.split(/\s+/).map(Number));
    } catch {
      // the thread ended meanwhile
    }
  }
  return out;
}

/** One row's counts: the (primary) process, and with --processes the shells' sum. */
interface RowCounts {
  main: Counts;
  shells?: Counts;
}

async function count(target: string, bin: string, label: string, upstream: string, w: Workload, dir: string): Promise<RowCounts> {
  const tag = `${label}-${w.name}`.replace(/[^a-z0-9]+/gi, '_');
  const outFile = join(dir, `callgrind.${tag}`);
  const multi = target === 'kvroute' && PROCESSES > 1;
  const child = startTarget(target, bin, upstream, outFile);
  const url =
    target !== 'kvroute' ? `http://127.0.0.1:${(await waitForLine(child, /PORT (\d+)/, 300_000))[1]}` : await listeningUrl(child, 900_000);
  progress(`${label} ${w.name}: warming up (${WARMUP} requests)`);
  const badWarm = await send(url, w, 0, WARMUP);
  if (badWarm > 0) throw new Error(`${label} ${w.name}: ${badWarm} warm-up requests failed`);
  const pid = child.pid as number;
  const shells = multi ? childPids(pid) : [];
  if (multi && shells.length !== PROCESSES) throw new Error(`${label}: ${shells.length} shell processes, expected ${PROCESSES}`);
  for (const p of [pid, ...shells]) execFileSync('callgrind_control', ['-i', 'on', String(p)], { stdio: 'ignore' });
  progress(`${label} ${w.name}: counting ${REQUESTS} requests`);
  const bad = await send(url, w, WARMUP, REQUESTS);
  for (const p of [pid, ...shells]) execFileSync('callgrind_control', ['-d', String(p)], { stdio: 'ignore' });
  await stopChild(child);
  for (const p of shells) {
    try {
      process.kill(p, 'SIGKILL');
    } catch {
      // already gone with the primary
    }
  }
  if (bad > 0) throw new Error(`${label} ${w.name}: ${bad} counted requests failed`);
  const sumOf = (base: string): Counts => {
    const dumps = readdirSync(dir).filter((f) => f.startsWith(`${base}.`));
    const c: Counts = { total: 0, gc: 0, jit: 0 };
    for (const f of dumps) {
      const d = countsOf(join(dir, f));
      c.total += d.total / REQUESTS;
      c.gc += d.gc / REQUESTS;
      c.jit += d.jit / REQUESTS;
    }
    return c;
  };
  const base = `callgrind.${tag}`;
  // The exit dumps (nothing counted after the -d ones: the processes were killed) are not counted.
  const main = sumOf(multi ? `${base}.${pid}` : base);
  const shellCounts = multi ? shells.map((p) => sumOf(`${base}.${p}`)) : [];
  // Without --keep the dumps go now (a later row of the same tag must not sum them); with it they stay for
  // callgrind_annotate, and the next row of this tag (a rerun into the same directory) would find them: refused at the start.
  if (!KEEP)
    for (const f of readdirSync(dir))
      if (f === base || (f.startsWith(`${base}.`) && /^\d+$/.test(f.slice(base.length + 1)))) rmSync(join(dir, f));
  if (!multi) return { main };
  const s: Counts = { total: 0, gc: 0, jit: 0 };
  for (const c of shellCounts) {
    s.total += c.total;
    s.gc += c.gc;
    s.jit += c.jit;
  }
  return { main, shells: s };
}

// ------------------------------------------------------------------ main

async function main() {
  const { url: upstream, child: up } = await startUpstreamProcess(CHUNKS);
  const dir = KEEP ?? mkdtempSync(join(tmpdir(), 'kvroute-callgrind-'));
  mkdirSync(dir, { recursive: true });
  if (KEEP && readdirSync(dir).some((f) => f.startsWith('callgrind.'))) {
    await stopChild(up);
    throw new Error(`--keep ${dir} already holds callgrind dumps: give an empty or new directory (rows would sum old dumps)`);
  }
  const load = loadavg().map((x) => x.toFixed(1));
  progress(`loadavg ${load.join(' ')}; dumps in ${dir}`);

  const workloads: Workload[] = [];
  if (ONLY.includes('ids')) workloads.push(idsWorkload(IDS, CHUNKS, false));
  if (ONLY.includes('ids-stream')) workloads.push(idsWorkload(IDS, CHUNKS, true));
  if (ONLY.includes('chat')) workloads.push(chatWorkload(prose(SYSTEM_TOKENS, 7), CHUNKS));

  const rows: { proxy: string; workload: string; perReq: Counts }[] = [];
  for (const w of workloads) {
    const targets: { target: string; bin: string; label: string }[] = [];
    if (TARGETS.includes('bare') && w.name !== 'chat warm') targets.push({ target: 'bare', bin: '', label: 'bare node' });
    for (const rung of ['parse', 'route'])
      if (TARGETS.includes(rung) && w.name !== 'chat warm') targets.push({ target: rung, bin: '', label: `${rung} node` });
    if (TARGETS.includes('chatnode') && w.name === 'chat warm') targets.push({ target: 'chatnode', bin: '', label: 'chat node' });
    if (TARGETS.includes('chatthread') && w.name === 'chat warm')
      targets.push({ target: 'chatthread', bin: '', label: 'chat node (thread)' });
    if (TARGETS.includes('kvroute') && COMPARE) targets.push({ target: 'kvroute', bin: COMPARE, label: 'kvroute before' });
    if (TARGETS.includes('kvroute')) targets.push({ target: 'kvroute', bin: BIN, label: LABEL });
    for (const t of targets) {
      const { main, shells } = await count(t.target, t.bin, t.label, upstream, w, dir);
      if (!shells) {
        rows.push({ proxy: t.label, workload: w.name, perReq: main });
        progress(`${t.label} ${w.name}: ${(main.total / 1e6).toFixed(3)} M instructions per request`);
        continue;
      }
      rows.push({ proxy: `${t.label} x${PROCESSES}: primary`, workload: w.name, perReq: main });
      rows.push({ proxy: `${t.label} x${PROCESSES}: shells`, workload: w.name, perReq: shells });
      progress(`${t.label} ${w.name}: primary ${(main.total / 1e6).toFixed(3)} M, shells ${(shells.total / 1e6).toFixed(3)} M per request`);
    }
  }
  await stopChild(up);
  if (!KEEP) rmSync(dir, { recursive: true, force: true });

  const bareOf = (w: string) => rows.find((r) => r.proxy === 'bare node' && r.workload === w.replace(/^chat warm$/, `ids ${IDS} stream`));
  console.log(`loadavg at start: ${load.join(' ')} (instruction counts do not depend on it)`);
  console.log(
    `${REQUESTS} counted requests per row after ${WARMUP} warm-up, ${CONCURRENCY} connections${NODE_FLAGS.length ? `, node ${NODE_FLAGS.join(' ')}` : ''}`,
  );
  console.log('');
  const m = (n: number) => (n / 1e6).toFixed(3);
  console.log('| proxy | workload | M instr./req | GC | JIT compiler | the rest | × bare node (all) | × bare node (the rest) |');
  console.log('| ----- | -------- | ------------ | -- | ------------ | -------- | ----------------- | ---------------------- |');
  for (const r of rows) {
    const bare = bareOf(r.workload)?.perReq;
    const c = r.perReq;
    const rest = c.total - c.gc - c.jit;
    const x = bare ? (c.total / bare.total).toFixed(2) : '–';
    const xr = bare ? (rest / (bare.total - bare.gc - bare.jit)).toFixed(2) : '–';
    console.log(`| ${r.proxy} | ${r.workload} | ${m(c.total)} | ${m(c.gc)} | ${m(c.jit)} | ${m(rest)} | ${x} | ${xr} |`);
  }
  console.log('');
  console.log('GC: V8 garbage-collector functions (marking, sweeping, scavenging, evacuation); JIT compiler: V8 optimizing');
  console.log('compilers; the rest: everything else (the JavaScript, V8 runtime, node, libuv, libc). A major GC falls into a');
  console.log('window or not: compare "the rest" for code changes, and read GC over several runs.');
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
