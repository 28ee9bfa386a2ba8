/**
 * Mock engine fleet in one process: 8 mockers (HTTP + ZMQ events), 200 concurrent streaming requests per engine at a
 * high speedup. The load generator (raw HTTP clients and one ZMQ subscriber per engine) runs in a forked child process, as a
 * router and its clients would; the engines' process measures its own event-loop delay (perf_hooks
 * monitorEventLoopDelay, 1 ms resolution) from the first request to the last. Target: p99 < 50 ms.
 *
 *   npm run bench:mocker
 *   npm run bench:mocker -- --engines 8 --concurrency 200 --speedup 200 --prompt 512 --max-tokens 64
 *
 *   npm run bench:mocker -- --engine-only      # the pure engine model alone (what the fleet simulator drives)
 *
 * At any speedup >= 1 this load asks for far more tokens per second than two cores can stream (1,600 streams with
 * ~6 ms modelled decode steps), so the engines run CPU-bound: the figure shows the loop stays responsive at saturation.
 */
import { usage } from '../scripts/usage.ts';
import { fork } from 'node:child_process';
import { loadavg } from 'node:os';
import { PerformanceObserver, monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { connect } from 'node:net';
import * as zmq from 'zeromq';
import { startMocker, type MockerHandle } from '../src/mocker/server.ts';
import { MockEngine } from '../src/mocker/engine/index.ts';

usage(import.meta.url);

const { values } = parseArgs({
  options: {
    engines: { type: 'string', default: '8' },
    concurrency: { type: 'string', default: '200' },
    speedup: { type: 'string', default: '200' },
    prompt: { type: 'string', default: '512' },
    'max-tokens': { type: 'string', default: '64' },
    client: { type: 'boolean', default: false },
    'engine-only': { type: 'boolean', default: false },
  },
});
const ENGINES = Number(values.engines);
const CONC = Number(values.concurrency);
const SPEEDUP = Number(values.speedup);
const PROMPT = Number(values.prompt);
const MAX_TOKENS = Number(values['max-tokens']);

interface ClientResult {
  requests: number;
  badRequests: number;
  wallSeconds: number;
  sseChunks: number;
  eventMessages: number;
  cachedTokens: number;
  promptTokens: number;
  wallTtftMsP50: number;
}

/** Child process: the load generator. */
async function client(urls: string[], zmqEndpoints: string[]): Promise<ClientResult> {
  let eventMessages = 0;
  const subs = zmqEndpoints.map((ep) => {
    const s = new zmq.Subscriber({ linger: 0 });
    s.connect(ep);
    s.subscribe();
    void (async () => {
      try {
        for await (const _ of s) eventMessages++;
      } catch {
        // closed
      }
    })();
    return s;
  });
  await new Promise((r) => setTimeout(r, 300));
  const targets = urls.map((u) => new URL(u));
  let chunks = 0;
  let cachedTokens = 0;
  let promptTokens = 0;
  let bad = 0;
  const ttfts: number[] = [];
  // A deliberately cheap client (raw HTTP/1.1 over net, counting SSE events without parsing them; only the final usage
  // chunk is parsed), so the load generator takes as little of the two cores as possible from the engines.
  const one = (e: number, i: number): Promise<void> =>
    new Promise((resolve) => {
      // Half of each engine's requests share a 256-token system prefix, so the cache and events see real reuse.
      const shared = i % 2 === 0 ? Array.from({ length: 256 }, (_, k) => 10 + k) : [];
      const own = Array.from({ length: PROMPT - shared.length }, (_, k) => 1000 + ((e * 7919 + i * 104729 + k * 31) % 30000));
      const body = JSON.stringify({
        prompt: [...shared, ...own],
        max_tokens: MAX_TOKENS,
        stream: true,
        stream_options: { include_usage: true },
      });
      const start = performance.now();
      const sock = connect(Number(targets[e].port), targets[e].hostname);
      sock.setNoDelay(true);
      sock.write(
        `POST /v1/completions HTTP/1.1\r\nHost: ${targets[e].host}\r\nContent-Type: application/json\r\n` +
          `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
      );
      let carry = '';
      let tail = '';
      let status = '';
      let first = true;
      sock.setEncoding('utf8');
      sock.on('data', (d: string) => {
        if (status === '') status = d.slice(9, 12);
        const text = carry + d;
        let n = 0;
        for (let k = text.indexOf('data: {'); k >= 0; k = text.indexOf('data: {', k + 7)) n++;
        if (n > 0 && first) {
          ttfts.push(performance.now() - start);
          first = false;
        }
        chunks += n;
        carry = text.slice(-6);
        tail = (tail + d).slice(-4096);
        if (tail.endsWith('data: [DONE]\n\n\r\n') || tail.endsWith('0\r\n\r\n')) sock.end();
      });
      let ended = false;
      const finish = () => {
        if (ended) return;
        ended = true;
        const k = tail.lastIndexOf('data: {');
        try {
          const j = JSON.parse(tail.slice(k + 6, tail.indexOf('\n\n', k)));
          cachedTokens += j.usage.prompt_tokens_details.cached_tokens;
          promptTokens += j.usage.prompt_tokens;
          if (j.usage.completion_tokens !== MAX_TOKENS) bad++;
        } catch {
          bad++;
        }
        if (status !== '200') bad++;
        resolve();
      };
      sock.on('end', finish);
      sock.on('error', () => {
        bad++;
        resolve();
      });
    });
  process.send!({ phase: 'start' });
  const t0 = performance.now();
  const all: Promise<void>[] = [];
  // Clients arrive over a few ms (a batch per event-loop turn), not in one synchronous burst.
  for (let i = 0; i < CONC; i++) {
    for (let e = 0; e < urls.length; e++) all.push(one(e, i));
    if (i % 10 === 9) await new Promise((r) => setImmediate(r));
  }
  await Promise.all(all);
  const wallSeconds = (performance.now() - t0) / 1000;
  await new Promise((r) => setTimeout(r, 200)); // trailing events
  for (const s of subs) s.close();
  ttfts.sort((a, b) => a - b);
  return {
    requests: all.length,
    badRequests: bad,
    wallSeconds,
    sseChunks: chunks,
    eventMessages,
    cachedTokens,
    promptTokens,
    wallTtftMsP50: ttfts[Math.floor(ttfts.length / 2)],
  };
}

/**
 * The engine model alone, on its virtual clock: 2,000 requests of 4,096 tokens (half of each prompt shared by one of 10
 * groups) with 50 output tokens, on a 30,000-block cache, so it prefills, hits, evicts and announces blocks.
 */
function engineOnly(): void {
  const e = new MockEngine({ numGpuBlocks: 30_000, maxNumSeqs: 256, maxNumBatchedTokens: 8192 });
  const N = 2000;
  const prompts = Array.from({ length: N }, (_, i) => [
    ...Array.from({ length: 2048 }, (_, k) => (i % 10) * 100_000 + k),
    ...Array.from({ length: 2048 }, (_, k) => 1_000_000 + i * 5000 + k),
  ]);
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  for (let i = 0; i < N; i++) e.addRequest({ requestId: `r${i}`, promptTokens: prompts[i], maxTokens: 50 }, 0);
  const t1 = performance.now();
  let t = 0;
  let events = 0;
  while (e.hasWork()) {
    const r = e.step(t);
    events += r.events.length;
    t += r.durationMs;
  }
  const t2 = performance.now();
  const cpu = process.cpuUsage(cpu0);
  const c = e.counters;
  console.log(
    JSON.stringify(
      {
        command: 'npm run bench:mocker -- --engine-only',
        node: process.version,
        loadAverage1mAtStart: +loadavg()[0].toFixed(1),
        requests: N,
        promptTokens: c.promptTokens,
        addRequestMs: +(t1 - t0).toFixed(0),
        stepLoopMs: +(t2 - t1).toFixed(0),
        cpuSeconds: +((cpu.user + cpu.system) / 1e6).toFixed(2),
        steps: c.steps,
        stepsPerSecond: Math.round(c.steps / ((t2 - t1) / 1000)),
        blocksStored: c.blocksStored,
        blocksEvicted: c.blocksEvicted,
        eventsEmitted: events,
        generationTokens: c.generationTokens,
        engineHitRate: +(c.prefixCacheHits / c.prefixCacheQueries).toFixed(3),
        modelledSeconds: +(t / 1000).toFixed(1),
      },
      null,
      2,
    ),
  );
}

async function main(): Promise<void> {
  if (values['engine-only']) {
    engineOnly();
    return;
  }
  if (values.client) {
    const { urls, zmq: eps } = JSON.parse(process.env.MOCKER_BENCH!);
    const r = await client(urls, eps);
    process.send!({ phase: 'done', result: r });
    process.disconnect();
    return;
  }
  const mockers: MockerHandle[] = [];
  for (let i = 0; i < ENGINES; i++) {
    mockers.push(await startMocker({ speedup: SPEEDUP, engine: { numGpuBlocks: 16384, maxNumSeqs: 256 }, replayEndpoint: null }));
  }
  const h = monitorEventLoopDelay({ resolution: 1 });
  let cpu0 = process.cpuUsage();
  // GC pauses of the engines' process during the load (they count in the event-loop delay).
  const gc = { count: 0, totalMs: 0, maxMs: 0, on: false };
  const gcObs = new PerformanceObserver((list) => {
    if (!gc.on) return;
    for (const e of list.getEntries()) {
      gc.count++;
      gc.totalMs += e.duration;
      gc.maxMs = Math.max(gc.maxMs, e.duration);
    }
  });
  gcObs.observe({ entryTypes: ['gc'] });
  const load0 = loadavg()[0];
  const child = fork(fileURLToPath(import.meta.url), [...process.argv.slice(2), '--client'], {
    execArgv: ['--import', 'tsx'],
    env: { ...process.env, MOCKER_BENCH: JSON.stringify({ urls: mockers.map((m) => m.url), zmq: mockers.map((m) => m.zmqEndpoint) }) },
  });
  const result = await new Promise<ClientResult>((resolve, reject) => {
    child.on('message', (m: { phase: string; result?: ClientResult }) => {
      if (m.phase === 'start') {
        cpu0 = process.cpuUsage();
        gc.on = true;
        h.enable();
      }
      if (m.phase === 'done') {
        h.disable();
        gc.on = false;
        cpu0 = process.cpuUsage(cpu0);
        resolve(m.result!);
      }
    });
    child.on('exit', (code) => reject(new Error(`client exited with ${code}`)));
  });
  const ms = (ns: number) => +(ns / 1e6).toFixed(2);
  const out = {
    command: `npm run bench:mocker -- --engines ${ENGINES} --concurrency ${CONC} --speedup ${SPEEDUP} --prompt ${PROMPT} --max-tokens ${MAX_TOKENS}`,
    node: process.version,
    loadAverage1mAtStart: +load0.toFixed(1),
    requests: result.requests,
    badRequests: result.badRequests,
    wallSeconds: +result.wallSeconds.toFixed(2),
    sseChunks: result.sseChunks,
    outputTokensPerSecond: Math.round((result.requests * MAX_TOKENS) / result.wallSeconds),
    // CPU of the engines' process (all threads, libzmq included) during the load: stable under other processes' noise.
    engineProcessCpuSeconds: +((cpu0.user + cpu0.system) / 1e6).toFixed(2),
    outputTokensPerEngineCpuSecond: Math.round((result.requests * MAX_TOKENS) / ((cpu0.user + cpu0.system) / 1e6)),
    eventBatchesPublished: mockers.reduce((a, m) => a + m.stats.publishedBatches, 0),
    eventMessagesReceived: result.eventMessages,
    engineStepsPerEngine: Math.round(mockers.reduce((a, m) => a + m.engine.counters.steps, 0) / mockers.length),
    engineHitRate: +(result.cachedTokens / result.promptTokens).toFixed(3),
    wallTtftMsP50: +result.wallTtftMsP50.toFixed(1),
    eventLoopDelayMs: { p50: ms(h.percentile(50)), p99: ms(h.percentile(99)), max: ms(h.max) },
    gcPauses: { count: gc.count, totalMs: +gc.totalMs.toFixed(1), maxMs: +gc.maxMs.toFixed(1) },
    pass: ms(h.percentile(99)) < 50 && result.badRequests === 0,
  };
  console.log(JSON.stringify(out, null, 2));
  gcObs.disconnect();
  await Promise.all(mockers.map((m) => m.close()));
  if (!out.pass) process.exitCode = 1;
}

await main();
