/**
 * Mock engine fleet in one process: 8 mockers (HTTP + ZMQ events with a live subscriber each), 200 concurrent streaming
 * requests per engine at a high speedup, clients in the same process. Reports the event-loop delay (perf_hooks
 * monitorEventLoopDelay) while the load runs; the target is p99 < 50 ms.
 *
 *   npm run bench:mocker                      # defaults below
 *   npm run bench:mocker -- --engines 8 --concurrency 200 --speedup 200 --prompt 512 --max-tokens 64
 */
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { Pool } from 'undici';
import * as zmq from 'zeromq';
import { startMocker, type MockerHandle } from '../src/mocker/server.ts';

const { values } = parseArgs({
  options: {
    engines: { type: 'string', default: '8' },
    concurrency: { type: 'string', default: '200' },
    speedup: { type: 'string', default: '200' },
    prompt: { type: 'string', default: '512' },
    'max-tokens': { type: 'string', default: '64' },
  },
});
const ENGINES = Number(values.engines);
const CONC = Number(values.concurrency);
const SPEEDUP = Number(values.speedup);
const PROMPT = Number(values.prompt);
const MAX_TOKENS = Number(values['max-tokens']);

async function main(): Promise<void> {
  const mockers: MockerHandle[] = [];
  for (let i = 0; i < ENGINES; i++) {
    mockers.push(await startMocker({ speedup: SPEEDUP, engine: { numGpuBlocks: 16384, maxNumSeqs: 256 }, replayEndpoint: null }));
  }
  // A live subscriber per engine, so events are really encoded, sent and received.
  let eventMessages = 0;
  const subs = mockers.map((m) => {
    const s = new zmq.Subscriber({ linger: 0 });
    s.connect(m.zmqEndpoint!);
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

  const pools = mockers.map((m) => new Pool(m.url, { connections: CONC, pipelining: 1 }));
  const h = monitorEventLoopDelay({ resolution: 1 });
  h.enable();
  const t0 = performance.now();
  let chunks = 0;
  let cachedTokens = 0;
  let promptTokens = 0;
  let bad = 0;
  const ttfts: number[] = [];

  const one = async (e: number, i: number): Promise<void> => {
    // Half of each engine's requests share a 256-token system prefix, so the cache and events see real reuse.
    const shared = i % 2 === 0 ? Array.from({ length: 256 }, (_, k) => 10 + k) : [];
    const own = Array.from({ length: PROMPT - shared.length }, (_, k) => 1000 + ((e * 7919 + i * 104729 + k * 31) % 30000));
    const start = performance.now();
    const res = await pools[e].request({
      path: '/v1/completions',
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: [...shared, ...own], max_tokens: MAX_TOKENS, stream: true, stream_options: { include_usage: true } }),
    });
    let buf = '';
    let first = true;
    for await (const c of res.body) {
      if (first) {
        ttfts.push(performance.now() - start);
        first = false;
      }
      buf += (c as Buffer).toString('utf8');
      let k: number;
      while ((k = buf.indexOf('\n\n')) >= 0) {
        const line = buf.slice(0, k);
        buf = buf.slice(k + 2);
        if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
        chunks++;
        const j = JSON.parse(line.slice(6));
        if (j.usage) {
          cachedTokens += j.usage.prompt_tokens_details.cached_tokens;
          promptTokens += j.usage.prompt_tokens;
          if (j.usage.completion_tokens !== MAX_TOKENS) bad++;
        }
      }
    }
    if (res.statusCode !== 200) bad++;
  };

  const all: Promise<void>[] = [];
  for (let e = 0; e < ENGINES; e++) for (let i = 0; i < CONC; i++) all.push(one(e, i));
  await Promise.all(all);
  const wallS = (performance.now() - t0) / 1000;
  h.disable();

  const requests = ENGINES * CONC;
  ttfts.sort((a, b) => a - b);
  const ms = (ns: number) => +(ns / 1e6).toFixed(2);
  const out = {
    command: `npm run bench:mocker -- --engines ${ENGINES} --concurrency ${CONC} --speedup ${SPEEDUP} --prompt ${PROMPT} --max-tokens ${MAX_TOKENS}`,
    node: process.version,
    requests,
    badRequests: bad,
    wallSeconds: +wallS.toFixed(2),
    sseChunks: chunks,
    outputTokensPerSecond: Math.round((requests * MAX_TOKENS) / wallS),
    eventMessages,
    engineHitRate: +(cachedTokens / promptTokens).toFixed(3),
    wallTtftMsP50: +ttfts[Math.floor(ttfts.length * 0.5)].toFixed(1),
    eventLoopDelayMs: { p50: ms(h.percentile(50)), p99: ms(h.percentile(99)), max: ms(h.max) },
    pass: ms(h.percentile(99)) < 50 && bad === 0,
  };
  console.log(JSON.stringify(out, null, 2));
  for (const p of pools) await p.close();
  for (const s of subs) s.close();
  await Promise.all(mockers.map((m) => m.close()));
  if (!out.pass) process.exitCode = 1;
}

await main();
