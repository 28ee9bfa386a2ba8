/**
 * bench:capacity: how many requests per second one proxy process handles and what each costs in CPU, side by side in
 * one run on the same upstream (bench/lib/fast-upstream.ts: answers at once, so the proxy is what limits):
 *
 *   direct          the load generator straight at the upstream
 *   nginx           Debian's nginx as a plain reverse proxy (proxy_pass, upstream keepalive, one process)
 *   bare node       the cheapest Node proxy (bench/lib/bare-proxy.ts): the floor under anything on Node's HTTP stack
 *   parse node      the floor ladder (bench/lib/floor-proxy.ts): bare + the body JSON.parse'd, its bytes forwarded
 *   route node      parse + block hashes + KvRouter.route() + the answer's usage from its tail + the router's finish:
 *                   the least a JavaScript router of token ids does (kvroute's own work is the gap above this rung)
 *   chat node       the chat rungs (warm chat): parse + the messages read + kvroute's tokenizer (template, segment
 *                   cache) in the event loop's thread (chat node) or kvroute's tokenizer thread (chat node (thread))
 *                   + what route node does: the least a JavaScript chat router does
 *   kvroute ids     completions given as token ids: parse, hash, match, select, proxy
 *   kvroute chat    chat through the tokenizer: a shared ~8k-token system prompt with distinct user turns (warm), and
 *                   distinct ~8k-token prompts (cold)
 *
 * For each: req/s at saturation (autocannon, closed loop, --connections), CPU milliseconds per request of the proxy's
 * process tree (/proc/<pid>/stat, so the load generator and the upstream are not counted), and the latency the proxy
 * adds at half of its saturation rate (an open-loop generator, bench/lib/raw-client.ts, at that rate against the proxy, then against the
 * upstream directly with the same bodies; p50 and p99 of the difference). The load generator runs in this process and
 * shares the 2 cores with everything else: its CPU per request is printed beside each row, so a row whose generator
 * is near a full core is generator-bound, not proxy-bound.
 *
 *   npm run bench:capacity [-- --duration 5 --connections 32 --ids 2048 --json --only nginx,ids]
 */
import type { ChildProcess } from 'node:child_process';
import { cpus, loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import { LocalTokenizer } from '../src/tokenizer/local.ts';
import { findNginx, NGINX_INSTALL_HINT, startNginx } from './lib/nginx.ts';
import { ownCpuMs, procAvailable, treeCpuMs } from './lib/proc-cpu.ts';
import { RawClient } from './lib/raw-client.ts';
import { waitForLine } from './lib/child.ts';
import { chatWorkload, idsWorkload, prose, type Workload } from './lib/http-workloads.ts';
import { benchArgs, KVROUTE_BIN, listeningUrl, QWEN3_DIR, serveArgs, startUpstreamProcess, stopChild, track } from './lib/proxy-run.ts';

const HELP = `bench:capacity: req/s, CPU per request and added latency of direct, nginx and kvroute on one fast upstream

usage: npm run bench:capacity -- [options]

  --duration <s>         seconds of each saturation run (default 5)
  --latency-duration <s> seconds of each half-rate latency probe (default 3)
  --connections <n>      autocannon connections at saturation (default 32)
  --ids <n>              token ids per completions prompt (default 2048)
  --system-tokens <n>    approximate tokens of the chat system prompt (default 8192)
  --chunks <n>           SSE chunks per streamed answer (default 4)
  --rounds <n>           saturation runs per proxy, alternating between proxies; the median is reported (default 1)
  --warmup <s>           seconds of unmeasured saturation per proxy and workload before its rounds (default 1). kvroute
                         is still tiering up its code (V8's optimizing compiler, on a thread counted in its CPU) for
                         its first ~10,000 requests, and its first workload's rounds fall in that: a longer warm-up
                         measures every workload warm
  --processes <list>     kvroute --processes values to run, comma-separated (default 1)
  --tokenizer-threads <list>
                         kvroute --tokenizer-threads values to run, comma-separated (default 1: the tokenizer in its
                         thread; 0: in the event loop's thread, rows "inline tokenizer")
  --compare <bin>        also run another kvroute build (its bin/kvroute.mjs), rows marked "before"
  --only <list>          rows to run: direct,nginx,bare,parse,route,chatnode,chatthread,ids,chat,cold (default all;
                         bare: the cheapest Node proxy; parse, route: the floor ladder's token-id rungs above it;
                         chatnode, chatthread: its chat rungs, tokenizing in the event loop's thread or in kvroute's
                         tokenizer thread, run on the warm chat with the bare proxy: bench/lib/floor-proxy.ts)
  --nginx <path>         the nginx binary (default: found in ${'/usr/sbin'} and similar)
  --json                 print the results as JSON after the table
  -h, --help             this text

Progress goes to stderr, the table to stdout. Compare figures only within one run: the machine is shared.`;

const { argv, opt, num } = benchArgs('bench:capacity', HELP);
const DURATION = num('duration', 5);
const LAT_DURATION = num('latency-duration', 3);
const WARMUP = num('warmup', 1);
const CONNECTIONS = num('connections', 32);
const IDS = num('ids', 2048);
const SYSTEM_TOKENS = num('system-tokens', 8192);
const CHUNKS = num('chunks', 4);
const ROUNDS = num('rounds', 1);
const PROCESSES = (opt('processes') ?? '1').split(',').map(Number);
const TOKENIZER_THREADS = (opt('tokenizer-threads') ?? '1').split(',').map(Number);
const COMPARE = opt('compare');
const ONLY = new Set((opt('only') ?? 'direct,nginx,bare,parse,route,chatnode,chatthread,ids,chat,cold').split(','));
/** The floor ladder: the bare proxy and the rungs asked for, run together (rounds alternate between them). The token-id
 * rungs run the token-id workloads, the chat rungs the warm chat (and the bare proxy both, when chat rungs run). */
const floorRung = (rung: string) => (up: string) => [fileURLToPath(new URL('./lib/floor-proxy.ts', import.meta.url)), up, '--rung', rung];
const LADDER = [
  {
    key: 'bare',
    proxy: 'bare node',
    on: ['ids', 'chat'],
    args: (up: string) => [fileURLToPath(new URL('./lib/bare-proxy.ts', import.meta.url)), up],
  },
  { key: 'parse', proxy: 'parse node', on: ['ids'], args: floorRung('parse') },
  { key: 'route', proxy: 'route node', on: ['ids'], args: floorRung('route') },
  { key: 'chatnode', proxy: 'chat node', on: ['chat'], args: floorRung('chat') },
  { key: 'chatthread', proxy: 'chat node (thread)', on: ['chat'], args: floorRung('chatthread') },
].filter((r) => ONLY.has(r.key));
/** A chat rung asked for: the warm chat is built, and the bare proxy runs it too. */
const CHAT_RUNGS = LADDER.some((r) => r.key !== 'bare' && r.on.includes('chat'));
const JSON_OUT = argv.includes('--json');

const progress = (s: string) => process.stderr.write(`[capacity] ${s}\n`);

// ------------------------------------------------------------------ processes

async function startKvroute(
  bin: string,
  upstream: string,
  processes: number,
  tokenizerThreads = 1,
): Promise<{ url: string; child: ChildProcess }> {
  const child = track(
    process.execPath,
    serveArgs(
      bin,
      [upstream],
      [
        '--tokenizer',
        QWEN3_DIR,
        ...(processes > 1 ? ['--processes', String(processes)] : []),
        ...(tokenizerThreads === 1 ? [] : ['--tokenizer-threads', String(tokenizerThreads)]),
      ],
    ),
  );
  return { url: await listeningUrl(child), child };
}

// ------------------------------------------------------------------ workloads

// ------------------------------------------------------------------ load

interface Saturation {
  rps: number;
  requests: number;
  errors: number;
  proxyCpuMsPerReq: number | null;
  /** The proxy's top process alone (with --processes: the primary, the routing core). */
  topCpuMsPerReq: number | null;
  loadgenCpuMsPerReq: number;
}

async function saturate(url: string, w: Workload, duration: number, pid: number | null): Promise<Saturation> {
  let n = 0;
  const cpu0 = pid === null ? 0 : treeCpuMs(pid);
  const top0 = pid === null ? 0 : ownCpuMs(pid);
  const gen0 = process.cpuUsage();
  const t0 = performance.now();
  const r = await autocannon({
    url: `${url}${w.path}`,
    method: 'POST',
    connections: CONNECTIONS,
    duration,
    headers: { 'content-type': 'application/json' },
    requests: [
      {
        setupRequest: (req) => ({ ...req, body: w.body(n++) }),
      },
    ],
  });
  const secs = (performance.now() - t0) / 1000;
  const gen = process.cpuUsage(gen0);
  const ok = r['2xx'];
  const cpu = pid === null ? null : treeCpuMs(pid) - cpu0;
  const top = pid === null ? null : ownCpuMs(pid) - top0;
  return {
    rps: ok / secs,
    requests: ok,
    errors: r.errors + r.non2xx + r.timeouts,
    proxyCpuMsPerReq: cpu === null || ok === 0 ? null : cpu / ok,
    topCpuMsPerReq: top === null || ok === 0 ? null : top / ok,
    loadgenCpuMsPerReq: ok === 0 ? 0 : (gen.user + gen.system) / 1000 / ok,
  };
}

/** Open loop at `rate` req/s for `seconds`: latencies (ms) of the answers in full (bench/lib/raw-client.ts). */
async function paced(url: string, w: Workload, rate: number, seconds: number): Promise<{ lat: number[]; errors: number }> {
  const client = RawClient.fromUrl(url, 512);
  const lat: number[] = [];
  let errors = 0;
  let sent = 0;
  const total = Math.max(1, Math.round(rate * seconds));
  // Request bytes built ahead (a few hundred distinct bodies, cycled), so building them is not timed.
  const distinct = Math.min(total, 256);
  const requests = Array.from({ length: distinct }, (_, n) => RawClient.post(w.path, w.body(n)));
  const inflight: Promise<void>[] = [];
  const t0 = performance.now();
  const one = async (n: number) => {
    const s = performance.now();
    try {
      const status = await client.send(requests[n % distinct]);
      if (status === 200) lat.push(performance.now() - s);
      else errors++;
    } catch {
      errors++;
    }
  };
  while (sent < total) {
    const due = Math.min(total, Math.floor(((performance.now() - t0) / 1000) * rate) + 1);
    while (sent < due) inflight.push(one(sent++));
    await new Promise((r) => setTimeout(r, 1));
  }
  await Promise.all(inflight);
  client.close();
  return { lat, errors };
}

function pct(xs: number[], p: number): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
}

// ------------------------------------------------------------------ run

interface Row {
  proxy: string;
  workload: string;
  rps: number;
  errors: number;
  proxyCpuMsPerReq: number | null;
  /** Of which the top process alone (the primary with --processes), same round. */
  topCpuMsPerReq?: number | null;
  /** CPU ms/request of each saturation round (the median is proxyCpuMsPerReq). */
  cpuRounds?: number[];
  loadgenCpuMsPerReq: number;
  /** At half of saturation: the proxy's p50/p99 minus direct's at the same rate, same bodies (ms). */
  addedP50Ms: number | null;
  addedP99Ms: number | null;
  rateProbed: number | null;
}

async function main(): Promise<void> {
  if (!procAvailable()) {
    console.error('bench:capacity: /proc is not readable: CPU per request needs Linux');
    process.exit(1);
  }
  progress(
    `node ${process.version}, ${cpus().length} cores, loadavg ${loadavg()
      .map((x) => x.toFixed(1))
      .join(' ')}`,
  );
  const { url: upstream, child: up } = await startUpstreamProcess(CHUNKS);
  progress(`upstream ${upstream} (pid ${up.pid})`);

  const rows: Row[] = [];
  const notes: string[] = [];
  const workloads: { key: string; w: Workload }[] = [
    { key: 'ids', w: idsWorkload(IDS, CHUNKS, false) },
    { key: 'ids', w: idsWorkload(IDS, CHUNKS, true) },
  ];
  if (ONLY.has('chat') || ONLY.has('cold') || CHAT_RUNGS) {
    const system = prose(SYSTEM_TOKENS, 12345);
    const tok = await LocalTokenizer.load(QWEN3_DIR);
    const n = tok.encodeCold(system).length;
    notes.push(`chat system prompt: ${n} tokens (Qwen3 tokenizer), ${system.length} characters`);
    if (ONLY.has('chat') || CHAT_RUNGS) workloads.push({ key: 'chat', w: chatWorkload(system, CHUNKS, false) });
    if (ONLY.has('cold')) workloads.push({ key: 'cold', w: chatWorkload(system, CHUNKS, true) });
  }
  const selected = workloads.filter(
    (x) =>
      ONLY.has(x.key) ||
      (x.key === 'ids' && (ONLY.has('direct') || ONLY.has('nginx') || LADDER.length > 0)) ||
      (x.key === 'chat' && CHAT_RUNGS),
  );

  // Direct: the baseline each proxy's latency is compared with (measured again at each probed rate).
  const direct = new Map<string, Saturation>();
  if (ONLY.has('direct') || ONLY.has('nginx') || ONLY.has('ids')) {
    for (const { w } of selected.filter((x) => x.key === 'ids')) {
      progress(`direct ${w.name}: saturation ${DURATION} s`);
      await saturate(upstream, w, 1, null);
      const s = await saturate(upstream, w, DURATION, up.pid as number);
      direct.set(w.name, s);
      rows.push({
        proxy: 'direct',
        workload: w.name,
        rps: s.rps,
        errors: s.errors,
        proxyCpuMsPerReq: null,
        loadgenCpuMsPerReq: s.loadgenCpuMsPerReq,
        addedP50Ms: 0,
        addedP99Ms: 0,
        rateProbed: null,
      });
      notes.push(`upstream CPU ${w.name}: ${s.proxyCpuMsPerReq?.toFixed(3)} ms/request (direct run)`);
    }
  }

  /** Saturation `ROUNDS` times per target, alternating targets round by round (drift in machine load hits all alike);
   * the median round per target; then each target's latency at half of its median rate. */
  const probeAll = async (targets: { proxy: string; url: string; pid: number }[], w: Workload) => {
    const runs = new Map<string, Saturation[]>(targets.map((t) => [t.proxy, []]));
    for (const t of targets) await saturate(t.url, w, WARMUP, null); // warm-up (JIT, connections)
    for (let r = 0; r < ROUNDS; r++) {
      for (const t of targets) {
        progress(`${t.proxy} ${w.name}: saturation ${DURATION} s${ROUNDS > 1 ? ` (round ${r + 1}/${ROUNDS})` : ''}`);
        runs.get(t.proxy)?.push(await saturate(t.url, w, DURATION, t.pid));
      }
    }
    for (const t of targets) {
      const all = (runs.get(t.proxy) ?? []).sort((a, b) => (a.proxyCpuMsPerReq ?? 0) - (b.proxyCpuMsPerReq ?? 0));
      const s = all[Math.floor((all.length - 1) / 2)];
      const rpsAll = all.map((x) => x.rps).sort((a, b) => a - b);
      const rps = rpsAll[Math.floor((rpsAll.length - 1) / 2)];
      const rate = Math.max(1, Math.floor(rps / 2));
      progress(`${t.proxy} ${w.name}: ${rps.toFixed(0)} req/s; latency at ${rate} req/s, ${LAT_DURATION} s each, proxy then direct`);
      const viaProxy = await paced(t.url, w, rate, LAT_DURATION);
      const viaDirect = await paced(upstream, w, rate, LAT_DURATION);
      rows.push({
        proxy: t.proxy,
        workload: w.name,
        rps,
        errors: all.reduce((a, x) => a + x.errors, 0) + viaProxy.errors,
        proxyCpuMsPerReq: s.proxyCpuMsPerReq,
        topCpuMsPerReq: s.topCpuMsPerReq,
        cpuRounds: all.map((x) => x.proxyCpuMsPerReq ?? Number.NaN),
        loadgenCpuMsPerReq: s.loadgenCpuMsPerReq,
        addedP50Ms: pct(viaProxy.lat, 0.5) - pct(viaDirect.lat, 0.5),
        addedP99Ms: pct(viaProxy.lat, 0.99) - pct(viaDirect.lat, 0.99),
        rateProbed: rate,
      });
    }
  };

  if (ONLY.has('nginx')) {
    const bin = findNginx(opt('nginx'));
    if (!bin) {
      const msg = `nginx row skipped: no nginx binary found (looked for ${opt('nginx') ?? '/usr/sbin/nginx and similar'}); install it with \`${NGINX_INSTALL_HINT}\` or pass --nginx <path>`;
      progress(msg);
      notes.push(msg);
    } else {
      const ng = await startNginx(bin, Number(new URL(upstream).port));
      notes.push(`nginx: ${bin}, one process (master_process off), proxy_pass with upstream keepalive 256, proxy_buffering off`);
      try {
        for (const { w } of selected.filter((x) => x.key === 'ids')) await probeAll([{ proxy: 'nginx', url: ng.url, pid: ng.pid }], w);
      } finally {
        await ng.stop();
      }
    }
  }

  // The floor ladder's proxies and every kvroute variant run at once (an idle one costs nothing: no health probes, no
  // metrics scrapes), and each workload's rounds alternate between all the proxies that run it: the rungs and kvroute
  // side by side in the same minutes of a shared machine.
  const ladder: { proxy: string; url: string; pid: number; child: ChildProcess; on: string[] }[] = [];
  const running: { proxy: string; url: string; pid: number; child: ChildProcess }[] = [];
  const builds: { label: string; bin: string }[] = [];
  if (COMPARE) builds.push({ label: 'before', bin: COMPARE });
  builds.push({ label: '', bin: KVROUTE_BIN });
  const kvWorkloads = selected.filter((x) => ONLY.has(x.key));
  try {
    for (const r of LADDER) {
      const child = track(process.execPath, ['--import', 'tsx', ...r.args(upstream)]);
      const url = `http://127.0.0.1:${(await waitForLine(child, /PORT (\d+)/))[1]}`;
      ladder.push({ proxy: r.proxy, url, pid: child.pid as number, child, on: r.on });
    }
    if (ONLY.has('bare'))
      notes.push('bare node proxy: bench/lib/bare-proxy.ts (node:http + one undici Pool, body passed unread): the floor of a Node proxy');
    if (ONLY.has('parse') || ONLY.has('route'))
      notes.push(
        "floor ladder: bench/lib/floor-proxy.ts; parse node = bare + JSON.parse of the body; route node = parse + block hashes + KvRouter.route() + the answer's usage from its tail + the router's finish",
      );
    if (CHAT_RUNGS)
      notes.push(
        "chat rungs: bench/lib/floor-proxy.ts; chat node = parse + parseChatInput + kvroute's LocalTokenizer (template, segment cache) in the event loop's thread + block hashes + KvRouter.route() + usage + finish; chat node (thread) = the same through kvroute's tokenizer thread (threadTokenizer)",
      );
    if (kvWorkloads.length > 0) {
      for (const b of builds) {
        // An earlier build may predate --processes: it runs as one process.
        for (const p of b.label ? [1] : PROCESSES) {
          for (const tt of TOKENIZER_THREADS) {
            const proxy = `kvroute${p > 1 ? ` x${p}` : ''}${tt === 0 ? ' (inline tokenizer)' : ''}${b.label ? ` (${b.label})` : ''}`;
            const kv = await startKvroute(b.bin, upstream, p, tt);
            progress(`${proxy}: ${kv.url} (pid ${kv.child.pid})`);
            running.push({ proxy, url: kv.url, pid: kv.child.pid as number, child: kv.child });
          }
        }
      }
    }
    for (const { key, w } of selected) {
      // The bare proxy runs the warm chat only beside a chat rung (CHAT_RUNGS), the token-id rungs only token ids.
      const rungs = ladder.filter((r) => r.on.includes(key) && (key !== 'chat' || CHAT_RUNGS));
      const kv = ONLY.has(key) ? running : [];
      if (rungs.length + kv.length > 0) await probeAll([...rungs, ...kv], w);
    }
  } finally {
    for (const r of [...ladder, ...running]) await stopChild(r.child, 10_000);
  }
  await stopChild(up, 10_000);

  // ------------------------------------------------------------------ report
  const nginxCpu = new Map(rows.filter((r) => r.proxy === 'nginx').map((r) => [r.workload, r]));
  const idsNginx = (workload: string) => nginxCpu.get(workload) ?? nginxCpu.get(`ids ${IDS} stream`);
  // The bare proxy's figure for the same workload; chat rows: its non-streamed token-id completions' (issue 29's measure;
  // the bare proxy's own chat warm row, when the chat rungs ran, is in the table beside them).
  const bareCpu = new Map(rows.filter((r) => r.proxy === 'bare node').map((r) => [r.workload, r.proxyCpuMsPerReq]));
  const idsBare = (workload: string) =>
    (workload.startsWith('chat') ? undefined : bareCpu.get(workload)) ?? bareCpu.get(`ids ${IDS}`) ?? null;
  const f = (x: number | null, d = 3) => (x === null || Number.isNaN(x) ? '-' : x.toFixed(d));
  console.log(
    `# bench:capacity  node ${process.version}, ${cpus().length} cores, loadavg ${loadavg()
      .map((x) => x.toFixed(1))
      .join(' ')}`,
  );
  console.log(
    `saturation: autocannon ${CONNECTIONS} connections x ${DURATION} s after ${WARMUP} s of warm-up per proxy and workload; added latency: open loop at half of saturation, ${LAT_DURATION} s, proxy minus direct`,
  );
  for (const n of notes) console.log(`- ${n}`);
  console.log('');
  console.log(
    '| proxy | workload | req/s | CPU ms/req (proxy) | × bare CPU | × nginx CPU | req/s ÷ nginx | added p50 ms | added p99 ms | at req/s | loadgen CPU ms/req | errors | CPU ms/req by round | of which top process |',
  );
  console.log('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|');
  for (const r of rows) {
    const ng = r.proxy === 'direct' ? undefined : idsNginx(r.workload);
    const cpuRatio = ng?.proxyCpuMsPerReq && r.proxyCpuMsPerReq ? r.proxyCpuMsPerReq / ng.proxyCpuMsPerReq : null;
    const rpsRatio = ng ? r.rps / ng.rps : null;
    const bare = r.proxy === 'direct' ? null : idsBare(r.workload);
    const bareRatio = bare && r.proxyCpuMsPerReq ? r.proxyCpuMsPerReq / bare : null;
    console.log(
      `| ${r.proxy} | ${r.workload} | ${r.rps.toFixed(0)} | ${f(r.proxyCpuMsPerReq)} | ${f(bareRatio, 2)} | ${f(cpuRatio, 1)} | ${f(rpsRatio, 2)} | ${f(r.addedP50Ms)} | ${f(r.addedP99Ms)} | ${r.rateProbed ?? '-'} | ${f(r.loadgenCpuMsPerReq)} | ${r.errors} | ${r.cpuRounds?.map((x) => f(x)).join(', ') ?? '-'} | ${f(r.topCpuMsPerReq ?? null)} |`,
    );
  }
  if (rows.some((r) => r.workload.startsWith('chat'))) {
    console.log(
      "\n(chat rows are compared with nginx and the bare proxy on the same-sized token-id completions, issue 29's measure; the bare proxy's own chat warm row, when the chat rungs ran, is the floor of forwarding the chat's bytes)",
    );
  }
  if (JSON_OUT)
    console.log(
      JSON.stringify({ node: process.version, cores: cpus().length, connections: CONNECTIONS, duration: DURATION, notes, rows }, null, 2),
    );
}

await main();
