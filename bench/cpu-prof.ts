/**
 * bench:cpu-prof: where the routing core's CPU goes under `kvroute serve --processes N`, from V8's sampling profiler.
 * One fast upstream (bench/lib/fast-upstream.ts), `node --cpu-prof` kvroute serve (its shells inherit the flag and
 * write profiles of their own), the completions workload with --ids token ids from --concurrency keep-alive connections
 * for --warmup-s then --seconds, a graceful stop (the profiles are written at exit), and the primary's profile read
 * from --skip-s seconds on (start-up and warm-up left out): its busy time (not idle) by category, then its functions by
 * self time. Wall-clock samples: shares within one profile are the figure to read, not absolute times (the machine's
 * load moves them).
 *
 *   npm run bench:cpu-prof [-- --processes 2 --seconds 20 --warmup-s 5 --skip-s 8 --concurrency 16 --ids 2048
 *                              --bin <other build>/bin/kvroute.mjs --keep <dir> --top 30]
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { idsWorkload } from './lib/http-workloads.ts';
import { benchArgs, KVROUTE_BIN, listeningUrl, serveArgs, startUpstreamProcess, stopChild, track } from './lib/proxy-run.ts';
import { RawClient } from './lib/raw-client.ts';

const HELP = `bench:cpu-prof: the routing core's CPU profile under kvroute serve --processes N

usage: npm run bench:cpu-prof -- [options]

  --processes <n>     HTTP shells (default 2)
  --seconds <s>       seconds of load profiled (default 20)
  --warmup-s <s>      seconds of load before them (default 5)
  --skip-s <s>        seconds of the primary's profile left out from its start (default 8)
  --concurrency <n>   keep-alive connections (default 16)
  --ids <n>           token ids per completions prompt (default 2048)
  --bin <path>        kvroute's bin/kvroute.mjs (default this checkout's)
  --keep <dir>        write the profiles there and keep them (default: a temporary directory, removed)
  --top <n>           functions listed by self time (default 30)
  -h, --help          this text`;

const { opt, num } = benchArgs('bench:cpu-prof', HELP);
const PROCESSES = num('processes', 2, true);
const SECONDS = num('seconds', 20);
const WARMUP_S = num('warmup-s', 5);
const SKIP_S = num('skip-s', 8);
const CONCURRENCY = num('concurrency', 16, true);
const IDS = num('ids', 2048, true);
const TOP = num('top', 30, true);
const BIN = opt('bin') ?? KVROUTE_BIN;
const KEEP = opt('keep');

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}
interface Profile {
  nodes: { id: number; callFrame: CallFrame; children?: number[] }[];
  samples: number[];
  timeDeltas: number[];
}

/** Categories: the first whose pattern matches the sample's stack (frames `name url`, leaf first, joined by |) wins. */
const CATEGORIES: [string, RegExp | null][] = [
  ['GC', /^\(garbage collector\) /],
  ['block hashing', /(^|\|)(hashRequest|requestSeqHashes|computeSeqHashes\w*|hashBlocks\w*) /],
  ['writing to the shells (Outbox, channel serializer, write)', /(^|\|)flush [^|]*cluster\/protocol/],
  ['reading the shells (channel parser, deserializer)', /(^|\|)\w+ [^|]*child_process\/serialization/],
  ['route(): approximate index record', /(^|\|)record [^|]*core\/approx/],
  ['route(): the rest', /(^|\|)route [^|]*core\/router/],
  ['miss-ratio curve feed', /(^|\|)[^|]* [^|]*runtime\/mrc-feed/],
  ['submission: dispatcher and lifecycle, besides route()', /(^|\|)submit [^|]*runtime\/lifecycle/],
  ['finish path', /(^|\|)finish [^|]*runtime\/lifecycle/],
  ['other shell messages', /(^|\|)onMessage [^|]*cluster\/primary/],
  ['other', null],
];

function report(file: string): void {
  const p = JSON.parse(readFileSync(file, 'utf8')) as Profile;
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const name = (cf: CallFrame) => `${cf.functionName || '(anonymous)'} ${cf.url.split('/').slice(-2).join('/')}:${cf.lineNumber + 1}`;
  const cat = new Map<string, number>();
  const self = new Map<string, number>();
  let t = 0;
  let busy = 0;
  for (let i = 0; i < p.samples.length; i++) {
    const d = p.timeDeltas[i] ?? 0;
    t += d;
    if (t < SKIP_S * 1e6) continue;
    const leaf = byId.get(p.samples[i])!.callFrame;
    if (leaf.functionName === '(idle)') continue;
    busy += d;
    const frames: string[] = [];
    for (let x: number | undefined = p.samples[i]; x !== undefined; x = parent.get(x)) {
      const cf = byId.get(x)!.callFrame;
      frames.push(`${cf.functionName} ${cf.url}`);
    }
    const stack = frames.join('|');
    const c = CATEGORIES.find(([, re]) => re === null || re.test(stack))![0];
    cat.set(c, (cat.get(c) ?? 0) + d);
    self.set(name(leaf), (self.get(name(leaf)) ?? 0) + d);
  }
  const pct = (v: number) => `${((100 * v) / busy).toFixed(1).padStart(5)}%`;
  console.log(`primary busy ${(busy / 1e6).toFixed(2)} s in the profile's window (from ${SKIP_S} s on)\n`);
  for (const [c] of CATEGORIES) if (cat.get(c)) console.log(`${pct(cat.get(c)!)}  ${c}`);
  console.log(`\nby self time (top ${TOP}):`);
  for (const [k, v] of [...self].sort((a, b) => b[1] - a[1]).slice(0, TOP)) console.log(`${pct(v)}  ${k}`);
}

async function main(): Promise<void> {
  const dir = KEEP ?? mkdtempSync(join(tmpdir(), 'kvroute-cpu-prof-'));
  const up = await startUpstreamProcess(4);
  const serve = track(process.execPath, [
    '--cpu-prof',
    '--cpu-prof-dir',
    dir,
    ...serveArgs(BIN, [up.url], ['--processes', String(PROCESSES), '--shell-report-ms', '0']),
  ]);
  const url = await listeningUrl(serve, 60_000);
  const w = idsWorkload(IDS, 4, false);
  const reqs = Array.from({ length: 64 }, (_, i) => RawClient.post(w.path, w.body(i)));
  const client = RawClient.fromUrl(url, CONCURRENCY);
  let sent = 0;
  let bad = 0;
  const load = async (seconds: number) => {
    const end = Date.now() + seconds * 1000;
    let n = 0;
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (Date.now() < end) {
          if ((await client.send(reqs[sent++ % reqs.length])) !== 200) bad++;
          n++;
        }
      }),
    );
    return n;
  };
  console.log(
    `[cpu-prof] loadavg ${loadavg()
      .map((l) => l.toFixed(1))
      .join(' ')}; ${PROCESSES} shells, ${IDS} ids`,
  );
  await load(WARMUP_S);
  const n = await load(SECONDS);
  client.close();
  console.log(`[cpu-prof] ${n} requests in ${SECONDS} s (${bad} not 200); loadavg ${loadavg()[0].toFixed(1)}`);
  await stopChild(serve, 30_000);
  await stopChild(up.child);
  // The primary's profile is the one named with its pid (the shells' carry theirs).
  const primary = readdirSync(dir).find((f) => f.endsWith('.cpuprofile') && f.includes(`.${serve.pid}.`));
  if (!primary) throw new Error(`no profile of the primary (pid ${serve.pid}) in ${dir}`);
  report(join(dir, primary));
  if (KEEP) console.log(`\nprofiles kept in ${dir}`);
  else rmSync(dir, { recursive: true, force: true });
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
