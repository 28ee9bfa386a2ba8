/**
 * bench:epp: what the endpoint picker costs a gateway per request. `kvroute epp` (its own process, the built package)
 * in front of four mock engines with KV events; a gRPC client plays Envoy's side: request headers and the body (a
 * completion with `--tokens` prompt token ids, in one chunk), until the picker's headers response and the body streamed
 * back; then the stream is ended (the request finishes as cancelled: nothing is proxied, only the pick is timed).
 *   1. sequential picks, one at a time: median and p99 of the time from the first message to the whole answer
 *   2. `--concurrency` streams at once for `--requests` picks: picks per second
 *
 * Run twice, side by side: the picker in plaintext (--no-secure-serving) and over TLS (its default), same fleet.
 *
 *   npm run bench:epp [-- --requests 2000 --concurrency 32 --tokens 2048]
 */
import { numArg, usage } from '../scripts/usage.ts';
import { spawn } from 'node:child_process';
import { loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { type MockerHandle, startMocker } from '../src/mocker/server.ts';
import { EnvoySide } from '../test/epp/envoy-side.ts';

usage(import.meta.url);

const REQUESTS = numArg('requests', 2000);
const CONCURRENCY = numArg('concurrency', 32);
const TOKENS = numArg('tokens', 2048);
const CLI = fileURLToPath(new URL('../bin/kvroute.mjs', import.meta.url));

function tokens(n: number, seed: number): number[] {
  let x = seed * 2654435761 + 1;
  return Array.from({ length: n }, () => {
    x = (x * 1103515245 + 12345) % 2147483648;
    return x % 150000;
  });
}

const quantile = (xs: number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
};

/** One picker process (plaintext or TLS) measured alone: sequential latency, then concurrent throughput. */
async function measure(workerArgs: string[], tls: boolean): Promise<string[]> {
  const proc = spawn(
    process.execPath,
    [
      CLI,
      'epp',
      '--port',
      '0',
      '--grpc-health-port',
      '0',
      '--metrics-port',
      '0',
      ...(tls ? [] : ['--no-secure-serving']),
      '--log-level',
      'info',
      ...workerArgs,
    ],
    {
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  );
  let out = '';
  const address = await new Promise<string>((resolve, reject) => {
    proc.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /kvroute epp listening on grpc:\/\/(\S+) \(ext_proc\)/.exec(out);
      if (m) resolve(m[1]);
    });
    proc.once('exit', (code) => reject(new Error(`kvroute epp exited ${code}`)));
  });
  proc.stdout.resume();
  const envoy = new EnvoySide(address, { tls });
  // 16 prefixes shared by the requests (each request = a prefix + its own tail), so the index has work to do.
  const prefixes = Array.from({ length: 16 }, (_, i) => tokens(Math.floor(TOKENS * 0.75), 1000 + i));
  const body = (i: number) =>
    JSON.stringify({ model: 'm', prompt: [...prefixes[i % 16], ...tokens(TOKENS - prefixes[0].length, i)], max_tokens: 1 });
  const pick = async (i: number): Promise<number> => {
    const s = envoy.stream();
    const b = body(i);
    const t0 = performance.now();
    const r = await s.request({ body: b, chunks: 1 });
    const ms = performance.now() - t0;
    if (!('picked' in r)) throw new Error(`immediate response ${r.immediate.status}: ${r.immediate.body}`);
    s.end();
    await s.status;
    return ms;
  };
  for (let i = 0; i < 50; i++) await pick(i); // warm-up

  const seq: number[] = [];
  for (let i = 0; i < Math.min(REQUESTS, 1000); i++) seq.push(await pick(i));
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < REQUESTS) await pick(next++);
    }),
  );
  const s = (performance.now() - t0) / 1000;
  envoy.close();
  proc.kill('SIGTERM');
  await new Promise((r) => proc.once('exit', r));
  const label = tls ? 'TLS (self-signed, the default)' : 'plaintext (--no-secure-serving)';
  return [
    `${label}: sequential picks (${seq.length}, ${TOKENS}-token prompts): median ${quantile(seq, 0.5).toFixed(2)} ms, p99 ${quantile(seq, 0.99).toFixed(2)} ms`,
    `${label}: ${CONCURRENCY} concurrent streams: ${REQUESTS} picks in ${s.toFixed(2)} s = ${(REQUESTS / s).toFixed(0)} picks/s`,
  ];
}

async function main(): Promise<void> {
  const mocks: MockerHandle[] = [];
  for (let i = 0; i < 4; i++) mocks.push(await startMocker({ model: 'm', speedup: 100, seed: i }));
  const workerArgs = mocks.flatMap((m, i) => ['-w', `${m.url},events=${m.zmqEndpoint},id=w${i},model=m`]);
  // Side by side in one run: the same fleet behind a plaintext picker, then a TLS one.
  for (const tls of [false, true]) for (const line of await measure(workerArgs, tls)) console.log(line);
  console.log(`load average during the run: ${loadavg()[0].toFixed(2)} (2 cores)`);
  await Promise.all(mocks.map((m) => m.close()));
}

await main();
