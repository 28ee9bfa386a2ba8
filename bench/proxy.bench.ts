/**
 * bench:proxy: what kvroute costs on the wire. In one run, against the same streaming upstream (its own process):
 *   1. throughput: autocannon straight at the upstream, then through kvroute (its own process), same load
 *   2. added latency: sequential requests (one at a time) direct vs through kvroute, median of full-response times
 *   3. 1,000 concurrent streams through kvroute held open together, counting errors
 *
 *   npm run bench:proxy [-- --duration 5 --rounds 3 --connections 64 --chunks 16 --chunk-delay-ms 10 --streams 1000]
 *   npm run bench:proxy -- --streams 10000 --streams-only     only part 3, with the router's resident memory
 *
 * The upstream streams `chunks` SSE chunks `chunk-delay-ms` apart, then usage and [DONE], like an engine decoding
 * (10 ms between tokens is already faster than most engines under load). The latency probe asks it for no delay, so
 * the difference is the proxy's own work.
 */
import { numArg, usage } from '../scripts/usage.ts';
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { readFileSync } from 'node:fs';
import autocannon from 'autocannon';
import { Agent, request } from 'undici';
import { waitForLine } from './lib/child.ts';

const args = process.argv.slice(2);

usage(import.meta.url);

// ------------------------------------------------------------------ role: upstream (child process)

async function runUpstream(): Promise<void> {
  const chunks = numArg('chunks', 16);
  const delay = numArg('chunk-delay-ms', 10);
  const payload = (i: number) =>
    `data: {"id":"b","object":"text_completion","model":"bench","choices":[{"index":0,"text":" tok${i}","finish_reason":null}]}\n\n`;
  const usage =
    'data: {"id":"b","object":"text_completion","model":"bench","choices":[],"usage":{"prompt_tokens":64,"completion_tokens":16,"total_tokens":80,"prompt_tokens_details":{"cached_tokens":48}}}\n\n';
  let open = 0;
  let peak = 0;
  const server = createServer((req, res) => {
    if (req.method === 'GET') {
      if (req.url === '/stats') {
        res.end(JSON.stringify({ open, peak }));
        return;
      }
      if (req.url === '/v1/models') {
        res.end('{"object":"list","data":[{"id":"bench","object":"model"}]}');
        return;
      }
      res.end('ok');
      return;
    }
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      const body = JSON.parse(Buffer.concat(parts).toString()) as {
        stream_options?: { include_usage?: boolean };
        hold_ms?: number;
        delay_ms?: number;
      };
      open++;
      peak = Math.max(peak, open);
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const hold = body.hold_ms ?? 0;
      const perChunk = hold > 0 ? hold / chunks : (body.delay_ms ?? delay);
      let i = 0;
      const tick = () => {
        if (res.destroyed) return;
        res.write(payload(i));
        i++;
        if (i < chunks) {
          if (perChunk > 0) setTimeout(tick, perChunk);
          else setImmediate(tick);
          return;
        }
        if (body.stream_options?.include_usage) res.write(usage);
        res.end('data: [DONE]\n\n');
      };
      res.on('close', () => open--);
      tick();
    });
  });
  server.keepAliveTimeout = 65_000;
  server.listen(0, '127.0.0.1', () => {
    process.stdout.write(`PORT ${(server.address() as AddressInfo).port}\n`);
  });
}

// ------------------------------------------------------------------ role: driver

const BODY = JSON.stringify({ model: 'bench', prompt: Array.from({ length: 64 }, (_, i) => i + 1), max_tokens: 16, stream: true });

async function cannon(url: string, connections: number, duration: number) {
  const r = await autocannon({
    url: `${url}/v1/completions`,
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: BODY,
    connections,
    duration,
  });
  return { rps: r.requests.average, p50: r.latency.p50, p99: r.latency.p99, errors: r.errors + r.non2xx, total: r.requests.total };
}

/** Chunks streamed back to back (no decode delay): what remains of the full-response time is HTTP and proxy work. */
const SEQ_BODY = JSON.stringify({
  model: 'bench',
  prompt: Array.from({ length: 64 }, (_, i) => i + 1),
  max_tokens: 16,
  stream: true,
  delay_ms: 0,
});

async function sequentialMedian(url: string, n: number, dispatcher: Agent): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const res = await request(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: SEQ_BODY,
      dispatcher,
    });
    await res.body.text();
    if (i >= 50) times.push(performance.now() - t0); // first 50 warm up connections and JIT
  }
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)];
}

async function holdStreams(
  url: string,
  n: number,
  holdMs: number,
): Promise<{ ok: number; errors: number; peakUpstream: number; ms: number }> {
  const agent = new Agent({ connections: n + 10, pipelining: 1 });
  const body = JSON.stringify({ model: 'bench', prompt: [1, 2, 3], stream: true, hold_ms: holdMs });
  let ok = 0;
  let errors = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: n }, async () => {
      try {
        const res = await request(`${url}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body,
          dispatcher: agent,
        });
        const text = await res.body.text();
        if (res.statusCode === 200 && text.endsWith('data: [DONE]\n\n') && !text.includes('"error"')) ok++;
        else errors++;
      } catch {
        errors++;
      }
    }),
  );
  const ms = performance.now() - t0;
  await agent.close();
  return { ok, errors, peakUpstream: 0, ms };
}

/** Resident memory of a process in MiB, from /proc (Linux); NaN elsewhere. */
function rssMiB(pid: number | undefined): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : Number.NaN;
  } catch {
    return Number.NaN;
  }
}

async function main(): Promise<void> {
  const self = fileURLToPath(import.meta.url);
  const duration = numArg('duration', 5);
  const connections = numArg('connections', 64);
  const streams = numArg('streams', 1000);
  const passArgs = ['--chunks', String(numArg('chunks', 16)), '--chunk-delay-ms', String(numArg('chunk-delay-ms', 10))];
  const children: ChildProcess[] = [];
  const cleanup = () => {
    for (const c of children) c.kill('SIGTERM');
  };
  process.on('exit', cleanup);
  try {
    const up = spawn(process.execPath, ['--import', 'tsx', self, '--role', 'upstream', ...passArgs], { stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(up);
    const upPort = Number((await waitForLine(up, /PORT (\d+)/))[1]);
    const upstream = `http://127.0.0.1:${upPort}`;
    const cli = fileURLToPath(new URL('../bin/kvroute.mjs', import.meta.url));
    const kv = spawn(
      process.execPath,
      [cli, 'serve', '--port', '0', '--worker', `${upstream},model=bench`, '--log-level', 'info', '--health-interval-ms', '0'],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    children.push(kv);
    const kvUrl = (await waitForLine(kv, /listening on (http:\/\/[\d.:]+)/))[1];
    kv.stdout?.resume();
    kv.stderr?.resume();

    console.log(
      `# bench:proxy  node ${process.version}, loadavg ${loadavg()
        .map((x) => x.toFixed(1))
        .join(' ')}`,
    );
    console.log(
      `upstream: ${numArg('chunks', 16)} chunks, ${numArg('chunk-delay-ms', 10)} ms apart; autocannon ${connections} connections x ${duration} s`,
    );

    if (!args.includes('--streams-only')) {
      // Warm both paths, then alternate direct/proxy twice so drift in machine load hits both alike.
      await cannon(upstream, connections, 2);
      await cannon(kvUrl, connections, 2);
      const rounds = numArg('rounds', 3);
      const direct: Awaited<ReturnType<typeof cannon>>[] = [];
      const proxied: Awaited<ReturnType<typeof cannon>>[] = [];
      for (let r = 0; r < rounds; r++) {
        direct.push(await cannon(upstream, connections, duration));
        proxied.push(await cannon(kvUrl, connections, duration));
      }
      const avg = (xs: { rps: number }[]) => xs.reduce((a, x) => a + x.rps, 0) / xs.length;
      const med = (xs: { p50: number }[]) => xs.map((x) => x.p50).reduce((a, b) => a + b, 0) / xs.length;
      console.log('\n| path | req/s (runs) | mean req/s | p50 ms | p99 ms | errors |');
      console.log('|---|---|---|---|---|---|');
      for (const [name, rs] of [
        ['direct', direct],
        ['kvroute', proxied],
      ] as const) {
        console.log(
          `| ${name} | ${rs.map((r) => r.rps.toFixed(0)).join(', ')} | ${avg(rs).toFixed(0)} | ${med(rs).toFixed(2)} | ${(rs.reduce((a, r) => a + r.p99, 0) / rs.length).toFixed(2)} | ${rs.reduce((a, r) => a + r.errors, 0)} |`,
        );
      }
      const ratios = direct.map((d, i) => proxied[i].rps / d.rps).sort((a, b) => a - b);
      console.log(
        `throughput through kvroute: ${((100 * avg(proxied)) / avg(direct)).toFixed(1)}% of direct (mean of runs); ` +
          `per-round ratios ${ratios.map((r) => `${(100 * r).toFixed(1)}%`).join(', ')}`,
      );

      const agent = new Agent({ connections: 1 });
      const seqN = numArg('sequential', 1000);
      const dSeq = await sequentialMedian(upstream, seqN, agent);
      const pSeq = await sequentialMedian(kvUrl, seqN, agent);
      const dSeq2 = await sequentialMedian(upstream, seqN, agent);
      const pSeq2 = await sequentialMedian(kvUrl, seqN, agent);
      await agent.close();
      const dMed = (dSeq + dSeq2) / 2;
      const pMed = (pSeq + pSeq2) / 2;
      console.log(
        `\nsequential full-response p50 (${seqN} requests x2 each): direct ${dMed.toFixed(3)} ms, kvroute ${pMed.toFixed(3)} ms, added ${(pMed - dMed).toFixed(3)} ms`,
      );
    }

    const hold = numArg('hold-ms', 3000);
    const rssBefore = rssMiB(kv.pid);
    let rssPeak = rssBefore;
    const sampler = setInterval(() => {
      rssPeak = Math.max(rssPeak, rssMiB(kv.pid));
    }, 100);
    const held = await holdStreams(kvUrl, streams, hold);
    clearInterval(sampler);
    const rssAfter = rssMiB(kv.pid);
    const stats = (await (await request(`${upstream}/stats`)).body.json()) as { peak: number };
    console.log(
      `\n${streams} concurrent streams through kvroute, each held ${hold} ms: ${held.ok} complete, ${held.errors} errors, peak ${stats.peak} open at the upstream, all done in ${held.ms.toFixed(0)} ms`,
    );
    console.log(
      `kvroute resident memory: ${rssBefore.toFixed(0)} MiB before, peak ${rssPeak.toFixed(0)} MiB while the streams were open ` +
        `(${(((rssPeak - rssBefore) * 1024) / Math.max(1, streams)).toFixed(1)} KiB per stream), ${rssAfter.toFixed(0)} MiB after`,
    );
    console.log(
      `loadavg after: ${loadavg()
        .map((x) => x.toFixed(1))
        .join(' ')}`,
    );
  } finally {
    cleanup();
  }
}

if (args.includes('--role') && args[args.indexOf('--role') + 1] === 'upstream') await runUpstream();
else await main();
