/**
 * What a proxy leaves to V8's young-generation collector per request (issue 29): the proxy under `node
 * --trace-gc-nvp` in front of the fast upstream (fast-upstream.ts), bench:capacity's 2,048-id completions from
 * autocannon (32 connections) for a warm-up, then a measured phase whose scavenges are summed: bytes allocated, bytes
 * that survived (copied within the young generation) and bytes promoted to the old generation, per request, and the
 * collectors' pauses. Survivors are what an in-flight request keeps alive; they, not the allocation, make a scavenge
 * dear. Bytes are counted by V8 and do not depend on the machine's load; the pauses (µs) do.
 *
 *   node --import tsx bench/lib/gc-survivors.ts [--bin <dir>/bin/kvroute.mjs | --rung bare|parse|route|chat|chatthread]
 *       [--stream | --chat] [--warmup 4] [--seconds 5] [--connections 32]
 *
 * --bin: `kvroute serve` of that build (default this checkout's), with the Qwen3 tokenizer; --rung: the floor ladder's
 * proxies instead (bare, parse, route: token ids; chat, chatthread: with --chat); --chat: bench:capacity's warm chat (a
 * ~7k-token system prompt, distinct user turns).
 */
import type { ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import { usage } from '../../scripts/usage.ts';
import { waitForLine } from './child.ts';
import { chatWorkload, idsWorkload, prose } from './http-workloads.ts';
import { benchArgs, KVROUTE_BIN, listeningUrl, QWEN3_DIR, serveArgs, startUpstreamProcess, stopChild, track } from './proxy-run.ts';

usage(import.meta.url);
const { argv, opt, num } = benchArgs('gc-survivors', '');
const RUNG = opt('rung');
const BIN = opt('bin') ?? KVROUTE_BIN;
const STREAM = argv.includes('--stream');
const CHAT = argv.includes('--chat');
const WARMUP = num('warmup', 4);
const SECONDS = num('seconds', 5);
const CONNECTIONS = num('connections', 32, true);

const { url: upstream, child: up } = await startUpstreamProcess(4);
let child: ChildProcess;
let url: string;
if (RUNG === undefined) {
  child = track(process.execPath, ['--trace-gc-nvp', ...serveArgs(BIN, [upstream], ['--tokenizer', QWEN3_DIR])]);
  url = await listeningUrl(child);
} else {
  const file = RUNG === 'bare' ? './bare-proxy.ts' : './floor-proxy.ts';
  const args = [fileURLToPath(new URL(file, import.meta.url)), upstream, ...(RUNG === 'bare' ? [] : ['--rung', RUNG])];
  child = track(process.execPath, ['--trace-gc-nvp', '--import', 'tsx', ...args]);
  url = `http://127.0.0.1:${(await waitForLine(child, /PORT (\d+)/))[1]}`;
}
let lines: string[] = [];
child.stdout?.on('data', (d: Buffer) => lines.push(...String(d).split('\n')));

const w = CHAT ? chatWorkload(prose(8192, 12345), 4) : idsWorkload(2048, 4, STREAM);
const load = async (seconds: number): Promise<number> => {
  let n = 0;
  const r = await autocannon({
    url: `${url}${w.path}`,
    method: 'POST',
    connections: CONNECTIONS,
    duration: seconds,
    headers: { 'content-type': 'application/json' },
    requests: [{ setupRequest: (req) => ({ ...req, body: w.body(n++) }) }],
  });
  return r['2xx'];
};
await load(WARMUP);
lines = [];
const ok = await load(SECONDS);
await new Promise((r) => setTimeout(r, 200));
await stopChild(child);
await stopChild(up);

const field = (l: string, f: string) => Number(new RegExp(` ${f}=([\\d.]+)`).exec(l)?.[1] ?? 0);
const sum = (ls: string[], f: string) => ls.reduce((a, l) => a + field(l, f), 0);
const scavenges = lines.filter((l) => l.includes(' gc=s '));
const others = lines.filter((l) => / gc=\w/.test(l) && !l.includes(' gc=s '));
const kb = (x: number) => (x / ok / 1024).toFixed(2);
console.log(
  `${RUNG ? `${RUNG} node` : `kvroute ${BIN}`} ${w.name}: ${ok} requests; ${((scavenges.length / ok) * 1000).toFixed(2)} scavenges per 1,000; ` +
    `per request: allocated ${kb(sum(scavenges, 'allocated'))} kB, survived ${kb(sum(scavenges, 'new_space_survived'))} kB, ` +
    `promoted ${kb(sum(scavenges, 'promoted'))} kB; pauses per request: scavenges ${((sum(scavenges, 'pause') * 1000) / ok).toFixed(1)} µs, ` +
    `${others.length} other GCs ${((sum(others, 'pause') * 1000) / ok).toFixed(1)} µs`,
);
process.exit(0);
