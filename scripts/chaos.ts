/**
 * Chaos soak: the real router (startServer) and 4 real mock engines (HTTP + ZMQ KV events + replay) under a steady
 * load of streaming requests, with injected faults: event drops, engine 500s, engine death and restart mid-stream,
 * a slow engine, client disconnects. At the end it asserts and prints:
 *   - every request completed or got a clear error (none hung);
 *   - no request failed before its first byte while a healthy engine existed (the router retried it);
 *   - active load is back to zero on every worker (GET /debug/state);
 *   - the router's index equals the engines' true caches after recovery (engine dump vs KvIndex.blocksOf);
 *   - heap after the run <= 1.2 x heap after warm-up.
 *
 *   npm run chaos                 # 150 s soak
 *   npm run chaos -- --short      # 30 s (CI; also CHAOS_SHORT=1)
 *   npm run chaos -- --overload [--connections 10000]   # router in a child process, N concurrent connections
 *   npm run chaos -- --nats [--rounds 20]   # the NATS event plane under faults (scripts/chaos-nats.ts)
 *
 * Exit code 1 when a check fails.
 */
import { usage } from './usage.ts';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import pino from 'pino';
import { Agent, request } from 'undici';
import { startMocker, type MockerHandle } from '../src/mocker/server.ts';
import { startServer, type RunningServer } from '../src/server/app.ts';
import { DEFAULTS, type ServeConfig } from '../src/config/serve.ts';
import { createRng } from '../src/core/rng.ts';

usage(import.meta.url);

// ------------------------------------------------------------------------------------------------ helpers

function forceGc(): void {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  gc();
  gc();
}

function heapMB(): number {
  forceGc();
  return process.memoryUsage().heapUsed / 2 ** 20;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function percentile(xs: number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

/** The seeded dice (mulberry32), so a run replays. */
const rng = createRng;

function isOpenAiError(text: string): boolean {
  try {
    const e = (JSON.parse(text) as { error?: { message?: unknown; type?: unknown } }).error;
    return !!e && typeof e.message === 'string' && typeof e.type === 'string';
  } catch {
    return false;
  }
}

// ------------------------------------------------------------------------------------------------ chaos soak

export interface ChaosOptions {
  durationS: number;
  warmupS: number;
  /** Fault-free tail of the run during which everything recovers. */
  recoveryS: number;
  concurrency: number;
  /** Engine wall-time speedup. */
  speedup: number;
  seed: number;
  /** A request without an answer for this long counts as hung. */
  hangMs: number;
  log: (line: string) => void;
}

export const SHORT: Omit<ChaosOptions, 'log'> = {
  durationS: 28,
  warmupS: 6,
  recoveryS: 7,
  concurrency: 8,
  speedup: 20,
  seed: 1,
  hangMs: 20_000,
};
/** The vitest run (test/reliability/chaos-short.test.ts): a test file stays under ~20 s on the shared cores. */
export const TEST: Omit<ChaosOptions, 'log'> = {
  durationS: 14,
  warmupS: 4,
  recoveryS: 4,
  concurrency: 6,
  speedup: 20,
  seed: 2,
  hangMs: 10_000,
};
export const LONG: Omit<ChaosOptions, 'log'> = {
  durationS: 150,
  warmupS: 15,
  recoveryS: 15,
  concurrency: 24,
  speedup: 20,
  seed: 1,
  hangMs: 30_000,
};

type Outcome =
  | 'ok'
  | 'inband_error' // stream cut after the first byte, error frame sent (the status line was already out)
  | 'http_error' // a status >= 400 with an OpenAI error body
  | 'reset' // the connection was closed without a clear answer
  | 'client_abort' // our own disconnect
  | 'hung';

export interface Check {
  name: string;
  ok: boolean;
  detail: string;
}

export interface ChaosReport {
  options: Omit<ChaosOptions, 'log'>;
  requests: number;
  outcomes: Record<Outcome, number>;
  httpStatuses: Record<string, number>;
  /** Pre-first-byte failures answered while at least one engine was alive and not injecting failures. */
  lostWhileHealthy: string[];
  ttftMs: { p50: number; p99: number };
  latencyMs: { p50: number; p99: number };
  engineRequests: number[];
  faults: { droppedBatches: number; injected500s: number; deaths: number; restarts: number; clientAborts: number };
  ingest: { gaps: number; replays: number; resets: number; resetsBySource: Record<string, Record<string, number>> };
  index: Array<{ worker: string; engineBlocks: number; routerBlocks: number; missing: number; extra: number }>;
  heap: { afterWarmupMB: number; afterRunMB: number; ratio: number };
  checks: Check[];
}

const MODEL = 'm';
const BLOCK = 16;

export async function runChaos(opts: ChaosOptions): Promise<ChaosReport> {
  const log = opts.log;
  const dice = rng(opts.seed);
  const engines: MockerHandle[] = [];
  for (let i = 0; i < 4; i++) {
    engines.push(
      await startMocker({
        model: MODEL,
        speedup: opts.speedup,
        seed: opts.seed * 100 + i,
        // A small cache fills during warm-up, so the heap after warm-up already holds a full index (and eviction runs).
        engine: { blockSize: BLOCK, numGpuBlocks: 1024, seed: i },
        defaultMaxTokens: 8,
        // The replay buffer lives in this process too: kept small so it is full by the end of warm-up and the heap
        // comparison measures the router, not a growing engine buffer (~100 batches/s: 5 s of history).
        bufferSteps: 500,
      }),
    );
  }
  const config: ServeConfig = {
    ...DEFAULTS,
    port: 0,
    host: '127.0.0.1',
    blockSize: BLOCK,
    remoteTokenize: false,
    healthIntervalMs: 250,
    healthTimeoutMs: 500,
    ejectAfter: 2,
    breakerThreshold: 3,
    breakerCooldownMs: 1_000,
    logLevel: 'silent',
    workers: engines.map((e, i) => ({ url: e.url, id: `engine${i}`, models: [MODEL], events: e.zmqEndpoint!, replay: e.replayEndpoint! })),
  };
  const server: RunningServer = await startServer(config, { logger: pino({ level: 'silent' }) });
  const agent = new Agent({ connections: opts.concurrency * 2, pipelining: 1 });
  log(
    `chaos: router ${server.url}, 4 engines, ${opts.concurrency} streaming clients, ${opts.durationS} s (warm-up ${opts.warmupS} s, recovery ${opts.recoveryS} s)`,
  );

  // Shared prefixes (system prompts / documents) so caches and routing matter; a unique tail per request.
  const prefixes = Array.from({ length: 12 }, (_, p) => Array.from({ length: 128 }, (_, k) => ((p * 7919 + k * 104_729) % 30_000) + 1));
  const outcomes: Record<Outcome, number> = { ok: 0, inband_error: 0, http_error: 0, reset: 0, client_abort: 0, hung: 0 };
  const httpStatuses: Record<string, number> = {};
  const lost: string[] = [];
  const ttfts: number[] = [];
  const latencies: number[] = [];
  let requests = 0;
  let disconnectFraction = 0;
  const dead = new Set<number>();
  const faultsState = { deaths: 0, restarts: 0 };
  const healthyEngineExists = () => engines.some((e, i) => !dead.has(i) && !e.dead && e.faults.failRequestFraction === 0);

  async function oneRequest(n: number): Promise<void> {
    requests++;
    const prefix = prefixes[Math.floor(dice() * prefixes.length)];
    const tail = Array.from({ length: 16 + Math.floor(dice() * 40) }, () => 1 + Math.floor(dice() * 29_999));
    const body = JSON.stringify({ model: MODEL, prompt: [...prefix, ...tail], max_tokens: 4 + Math.floor(dice() * 12), stream: true });
    const ac = new AbortController();
    const disconnect = dice() < disconnectFraction;
    let hung = false;
    const hangTimer = setTimeout(() => {
      hung = true;
      ac.abort();
    }, opts.hangMs);
    const dropTimer = disconnect ? setTimeout(() => ac.abort(), 2 + dice() * 60) : null;
    const t0 = performance.now();
    let gotFirst = false;
    try {
      const r = await request(`${server.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body,
        signal: ac.signal,
        dispatcher: agent,
      });
      if (r.statusCode !== 200) {
        const text = await r.body.text();
        httpStatuses[r.statusCode] = (httpStatuses[r.statusCode] ?? 0) + 1;
        if (!isOpenAiError(text)) {
          outcomes.reset++;
          lost.push(`#${n}: ${r.statusCode} without an OpenAI error body: ${text.slice(0, 120)}`);
          return;
        }
        outcomes.http_error++;
        if (r.statusCode >= 500 && healthyEngineExists()) lost.push(`#${n}: ${r.statusCode} ${text.slice(0, 160)}`);
        return;
      }
      let text = '';
      for await (const chunk of r.body) {
        if (!gotFirst) {
          gotFirst = true;
          ttfts.push(performance.now() - t0);
        }
        text += (chunk as Buffer).toString();
      }
      if (text.includes('"error"')) outcomes.inband_error++;
      else if (text.includes('data: [DONE]')) {
        outcomes.ok++;
        latencies.push(performance.now() - t0);
      } else outcomes.reset++;
    } catch {
      if (hung) outcomes.hung++;
      else if (disconnect && ac.signal.aborted) outcomes.client_abort++;
      else outcomes.reset++;
    } finally {
      clearTimeout(hangTimer);
      if (dropTimer) clearTimeout(dropTimer);
    }
  }

  // Steady load: `concurrency` clients, each sending one request after the other.
  let loadOn = true;
  let seq = 0;
  const clients = Array.from({ length: opts.concurrency }, async () => {
    while (loadOn) await oneRequest(++seq);
  });

  const t0 = Date.now();
  const at = (s: number) => sleep(Math.max(0, t0 + s * 1000 - Date.now()));

  await at(opts.warmupS);
  const heapWarm = heapMB();
  log(`chaos: warm-up done (${requests} requests), heap ${heapWarm.toFixed(1)} MB; faults on`);

  const faultStart = opts.warmupS;
  const faultEnd = opts.durationS - opts.recoveryS;
  const span = faultEnd - faultStart;
  engines[0].faults.dropEventFraction = 0.2;
  engines[1].faults.failRequestFraction = 0.1;
  engines[3].faults.slowdown = 5;
  disconnectFraction = 0.05;

  const killAndRestart = async (when: number, downS: number) => {
    await at(when);
    // Die mid-stream: wait (briefly) for the engine to be generating.
    const until = Date.now() + 1_000;
    while (engines[2].engine.numRunning === 0 && Date.now() < until) await sleep(2);
    dead.add(2);
    faultsState.deaths++;
    log(`chaos: t=${((Date.now() - t0) / 1000).toFixed(1)} s engine2 dies (in-flight streams: ${engines[2].engine.numRunning})`);
    await engines[2].die();
    await sleep(downS * 1000);
    await engines[2].restart();
    dead.delete(2);
    faultsState.restarts++;
    log(`chaos: t=${((Date.now() - t0) / 1000).toFixed(1)} s engine2 restarted (empty cache, seq from 0)`);
  };
  const schedule = (async () => {
    await killAndRestart(faultStart + span * 0.25, Math.min(3, span * 0.1));
    await at(faultStart + span * 0.4);
    engines[3].faults.slowdown = 1;
    await killAndRestart(faultStart + span * 0.6, Math.min(3, span * 0.1));
  })();

  await at(faultEnd);
  await schedule;
  for (const e of engines) {
    e.faults.dropEventFraction = 0;
    e.faults.failRequestFraction = 0;
    e.faults.slowdown = 1;
  }
  disconnectFraction = 0;
  log(`chaos: t=${((Date.now() - t0) / 1000).toFixed(1)} s faults off; recovering under load`);
  await at(opts.durationS);
  loadOn = false;
  await Promise.all(clients);
  log(`chaos: load stopped after ${requests} requests`);

  // One fresh request straight to every engine: a batch dropped just before the faults stopped is only noticed as a
  // gap when the next batch arrives.
  await Promise.all(
    engines.map(async (e, i) => {
      const r = await request(`${e.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: MODEL, prompt: prefixes[i], max_tokens: 2 }),
      });
      await r.body.text();
    }),
  );

  // ------------------------------------------------------------------ end-state checks
  const checks: Check[] = [];
  const check = (name: string, ok: boolean, detail: string) => checks.push({ name, ok, detail });

  // Active load back to zero (the router's view through its own debug endpoint).
  let state: DebugState | null = null;
  const deadline = Date.now() + 5_000;
  for (;;) {
    state = (await (await fetch(`${server.url}/debug/state`)).json()) as DebugState;
    // state.inFlight counts the GET /debug/state request itself.
    const busy =
      state.inFlight -
      1 +
      state.router.inFlight +
      state.router.sources.reduce((a, s) => a + s.activeRequests + s.activeBlocks + s.activePrefillTokens, 0);
    if (busy === 0 || Date.now() > deadline) break;
    await sleep(100);
  }
  const loads = state.router.sources.map(
    (s) => `${s.source}: ${s.activeRequests} req / ${s.activeBlocks} blocks / ${s.activePrefillTokens} prefill`,
  );
  const workerInFlight = state.workers.map((w) => w.inFlight);
  check(
    'active load back to zero on every worker (GET /debug/state)',
    state.inFlight === 1 &&
      state.router.inFlight === 0 &&
      state.router.sources.every((s) => s.activeRequests === 0 && s.activeBlocks === 0 && s.activePrefillTokens === 0) &&
      workerInFlight.every((x) => x === 0),
    `server in flight ${state.inFlight - 1} (besides this GET), router records ${state.router.inFlight}, worker in-flight ${workerInFlight.join('/')}; ${loads.join('; ')}`,
  );

  // Index vs the engines' true caches, polled until equal (replays finish asynchronously) or 3 s.
  const compare = () =>
    engines.map((e, i) => {
      const key = `engine${i}`;
      const truth = e.engine.cachedSeqHashes();
      // The router's blocks for that engine, through its public snapshot (a copy of the index, then one source's arrays).
      const source = server.router.sourceKeys().find((k) => k.startsWith(key));
      const blocks = source ? server.router.snapshot().source(source) : null;
      const held = new Set<bigint>(blocks ? blocks.seqHashes : []);
      let missing = 0;
      let extra = 0;
      for (const h of truth) if (!held.has(h)) missing++;
      for (const h of held) if (!truth.has(h)) extra++;
      return { worker: key, engineBlocks: truth.size, routerBlocks: held.size, missing, extra };
    });
  let index = compare();
  const idxDeadline = Date.now() + 3_000;
  while (index.some((x) => x.missing + x.extra > 0) && Date.now() < idxDeadline) {
    await sleep(200);
    index = compare();
  }
  if (process.env.CHAOS_DEBUG) {
    for (const h of state.events) log(`ingest ${JSON.stringify(h)}`);
    log(`index rejected ${JSON.stringify(server.router.state().index)}`);
  }
  check(
    'index equals the engines’ true caches after recovery',
    index.every((x) => x.missing === 0 && x.extra === 0 && x.engineBlocks > 0),
    index.map((x) => `${x.worker}: engine ${x.engineBlocks}, router ${x.routerBlocks}, missing ${x.missing}, extra ${x.extra}`).join('; '),
  );

  const total = Object.values(outcomes).reduce((a, b) => a + b, 0);
  check(
    'every request completed or got a clear error (none hung)',
    outcomes.hung === 0 && total === requests,
    `${requests} requests: ${JSON.stringify(outcomes)}`,
  );
  check(
    'no request failed before its first byte while a healthy engine existed',
    lost.length === 0,
    lost.length === 0 ? `HTTP errors: ${JSON.stringify(httpStatuses)}` : `${lost.length}: ${lost.slice(0, 5).join(' | ')}`,
  );
  const faults = {
    droppedBatches: engines.reduce((a, e) => a + e.stats.droppedBatches, 0),
    injected500s: engines.reduce((a, e) => a + e.stats.failedRequests, 0),
    deaths: faultsState.deaths,
    restarts: faultsState.restarts,
    clientAborts: outcomes.client_abort,
  };
  check(
    'faults were actually injected',
    faults.droppedBatches > 0 && faults.injected500s > 0 && faults.deaths >= 2 && faults.clientAborts > 0,
    JSON.stringify(faults),
  );

  await agent.close();
  const ingestHealth = state.events;
  const ingest = {
    gaps: ingestHealth.reduce((a, h) => a + (h.gaps ?? 0), 0),
    replays: ingestHealth.reduce((a, h) => a + (h.replaysRequested ?? h.replays ?? 0), 0),
    resets: ingestHealth.reduce((a, h) => a + (h.resets ?? 0), 0),
    resetsBySource: Object.fromEntries(ingestHealth.map((h) => [h.workerId ?? '?', h.resetsByReason ?? {}])),
  };
  const heapAfter = heapMB();
  const ratio = heapAfter / heapWarm;
  check(
    'heap after the run <= 1.2 x heap after warm-up',
    ratio <= 1.2,
    `${heapWarm.toFixed(1)} MB -> ${heapAfter.toFixed(1)} MB (x${ratio.toFixed(2)})`,
  );

  await server.close(500);
  await Promise.all(engines.map((e) => e.close()));

  return {
    options: { ...opts, log: undefined } as unknown as Omit<ChaosOptions, 'log'>,
    requests,
    outcomes,
    httpStatuses,
    lostWhileHealthy: lost,
    ttftMs: { p50: percentile(ttfts, 50), p99: percentile(ttfts, 99) },
    latencyMs: { p50: percentile(latencies, 50), p99: percentile(latencies, 99) },
    engineRequests: engines.map((e) => e.stats.requests),
    faults,
    ingest,
    index,
    heap: { afterWarmupMB: heapWarm, afterRunMB: heapAfter, ratio },
    checks,
  };
}

interface DebugState {
  inFlight: number;
  router: {
    inFlight: number;
    sources: Array<{ source: string; activeRequests: number; activeBlocks: number; activePrefillTokens: number }>;
  };
  workers: Array<{ id: string; inFlight: number }>;
  events: Array<{
    workerId?: string;
    gaps?: number;
    replaysRequested?: number;
    replays?: number;
    resets?: number;
    resetsByReason?: Record<string, number>;
  }>;
}

export function printReport(r: ChaosReport, log: (s: string) => void): void {
  log('');
  log(
    `requests ${r.requests}: ${Object.entries(r.outcomes)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ')}; HTTP errors ${JSON.stringify(r.httpStatuses)}`,
  );
  log(
    `per engine ${r.engineRequests.join(' / ')}; TTFT p50 ${r.ttftMs.p50.toFixed(0)} ms p99 ${r.ttftMs.p99.toFixed(0)} ms; completed streams p50 ${r.latencyMs.p50.toFixed(0)} ms p99 ${r.latencyMs.p99.toFixed(0)} ms`,
  );
  log(`faults ${JSON.stringify(r.faults)}; ingest ${JSON.stringify(r.ingest)}`);
  for (const c of r.checks) log(`${c.ok ? 'PASS' : 'FAIL'}  ${c.name}: ${c.detail}`);
}

// ------------------------------------------------------------------------------------------------ overload

/** Child mode: router + 4 engines in their own process (own fd table), prints its URL as one JSON line. */
async function serveChild(): Promise<void> {
  const engines = await Promise.all(
    [0, 1, 2, 3].map((i) =>
      startMocker({ model: MODEL, speedup: 10, seed: i, zmqEndpoint: null, replayEndpoint: null, defaultMaxTokens: 8 }),
    ),
  );
  const queueLimit = Number(process.env.CHAOS_QUEUE_LIMIT ?? 1000);
  const server = await startServer(
    {
      ...DEFAULTS,
      port: 0,
      remoteTokenize: false,
      healthIntervalMs: 1000,
      logLevel: 'silent',
      busyPrefillTokens: 256,
      queueLimit,
      queueTimeoutMs: 5_000,
      workers: engines.map((e, i) => ({ url: e.url, id: `engine${i}`, models: [MODEL] })),
    },
    { logger: pino({ level: 'silent' }) },
  );
  process.stdout.write(`${JSON.stringify({ url: server.url, queueLimit })}\n`);
  process.on('SIGTERM', () => {
    void server
      .close(200)
      .then(() => Promise.all(engines.map((e) => e.close())))
      .then(() => process.exit(0));
  });
}

/** Kernel count of connections dropped because a listen queue was full (all sockets of the host). */
function listenOverflows(): number {
  try {
    const lines = readFileSync('/proc/net/netstat', 'utf8').split('\n');
    for (let i = 0; i + 1 < lines.length; i += 2) {
      if (!lines[i].startsWith('TcpExt:')) continue;
      const keys = lines[i].split(/\s+/);
      const vals = lines[i + 1].split(/\s+/);
      const k = keys.indexOf('ListenOverflows');
      return k >= 0 ? Number(vals[k]) : NaN;
    }
  } catch {
    /* not Linux */
  }
  return NaN;
}

function rssMBOf(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : NaN;
  } catch {
    return NaN;
  }
}

export interface OverloadReport {
  connections: number;
  wallS: number;
  statuses: Record<string, number>;
  admittedMs: { p50: number; p99: number };
  missingRetryAfter: number;
  clientErrors: Record<string, number>;
  routerRssMB: { idle: number; peak: number; after: number };
  aliveAfter: boolean;
  activeAfter: number;
  /** Host-wide TcpExt ListenOverflows during the run: SYNs/ACKs dropped because the accept queue was full. */
  listenOverflows: number;
}

export async function runOverload(connections: number, log: (s: string) => void): Promise<OverloadReport> {
  const script = fileURLToPath(import.meta.url);
  const child = spawn(process.execPath, ['--import', 'tsx', script, '--serve-child'], { stdio: ['ignore', 'pipe', 'inherit'] });
  const { url } = await new Promise<{ url: string }>((resolve, reject) => {
    let buf = '';
    child.stdout!.on('data', (d: Buffer) => {
      buf += d.toString();
      const nl = buf.indexOf('\n');
      if (nl >= 0) resolve(JSON.parse(buf.slice(0, nl)) as { url: string });
    });
    child.once('exit', (code) => reject(new Error(`router child exited with ${code}`)));
  });
  const pid = child.pid!;
  const idle = rssMBOf(pid);
  log(`overload: router child pid ${pid} at ${url}, RSS ${idle.toFixed(0)} MB; opening ${connections} connections`);
  let peak = idle;
  const rssTimer = setInterval(() => (peak = Math.max(peak, rssMBOf(pid))), 100);
  const statuses: Record<string, number> = {};
  const clientErrors: Record<string, number> = {};
  const admitted: number[] = [];
  let missingRetryAfter = 0;
  const overflows0 = listenOverflows();
  const u = new URL(url);
  const t0 = performance.now();

  // Phase 1: open every connection first (at most 256 handshakes in flight, so the kernel's accept queue is not the
  // thing measured) and hold them all open at once.
  const sockets: Socket[] = new Array(connections);
  let next = 0;
  await Promise.all(
    Array.from({ length: 256 }, async () => {
      while (next < connections) {
        const i = next++;
        sockets[i] = await new Promise<Socket>((resolve) => {
          const c = connect(Number(u.port), u.hostname, () => resolve(c));
          c.once('error', (err) => {
            clientErrors[`connect ${(err as NodeJS.ErrnoException).code}`] =
              (clientErrors[`connect ${(err as NodeJS.ErrnoException).code}`] ?? 0) + 1;
            resolve(c);
          });
        });
      }
    }),
  );
  const connectS = (performance.now() - t0) / 1000;
  log(`overload: ${connections} connections open in ${connectS.toFixed(1)} s; sending one request on each at once`);

  // Phase 2: one request per connection, all written in the same tick; `connection: close` so the end of the answer
  // is the end of the socket (no HTTP parser needed for streams).
  const t1 = performance.now();
  await Promise.all(
    sockets.map(
      (c, i) =>
        new Promise<void>((resolve) => {
          if (c.destroyed) return resolve();
          const ids = Array.from({ length: 64 }, (_, k) => ((i * 7919 + k * 104_729) % 30_000) + 1);
          const body = JSON.stringify({ model: MODEL, prompt: ids, max_tokens: 4, stream: i % 2 === 0 });
          const chunks: Buffer[] = [];
          const t = performance.now();
          const timer = setTimeout(() => {
            clientErrors.timeout_50s = (clientErrors.timeout_50s ?? 0) + 1;
            c.destroy();
          }, 50_000);
          c.on('data', (d: Buffer) => chunks.push(d));
          c.once('error', () => undefined);
          c.once('close', () => {
            clearTimeout(timer);
            const text = Buffer.concat(chunks).toString('latin1');
            const m = /^HTTP\/1\.1 (\d{3})/.exec(text);
            if (!m) {
              if (!clientErrors.timeout_50s || text.length > 0)
                clientErrors.closed_without_answer = (clientErrors.closed_without_answer ?? 0) + 1;
              return resolve();
            }
            const status = m[1];
            statuses[status] = (statuses[status] ?? 0) + 1;
            if (status === '200') admitted.push(performance.now() - t);
            else if ((status === '503' || status === '429') && !/\r\nretry-after: *[1-9]/i.test(text)) missingRetryAfter++;
            resolve();
          });
          c.write(
            `POST /v1/completions HTTP/1.1\r\nHost: ${u.host}\r\nContent-Type: application/json\r\nConnection: close\r\n` +
              `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
          );
        }),
    ),
  );
  const wallS = (performance.now() - t1) / 1000;
  const overflows = listenOverflows() - overflows0;
  clearInterval(rssTimer);
  let aliveAfter = false;
  let activeAfter = -1;
  try {
    aliveAfter = (await fetch(`${url}/health`)).status === 200;
    await sleep(300);
    const st = (await (await fetch(`${url}/debug/state`)).json()) as DebugState;
    activeAfter = st.inFlight - 1 + st.router.inFlight; // inFlight counts this GET itself
  } catch {
    aliveAfter = false;
  }
  const after = rssMBOf(pid);
  child.kill('SIGTERM');
  await new Promise((r) => child.once('exit', r));
  return {
    connections,
    wallS,
    statuses,
    admittedMs: { p50: percentile(admitted, 50), p99: percentile(admitted, 99) },
    missingRetryAfter,
    clientErrors,
    routerRssMB: { idle, peak, after },
    aliveAfter,
    activeAfter,
    listenOverflows: overflows,
  };
}

// ------------------------------------------------------------------------------------------------ CLI

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  if (args.includes('--serve-child')) return serveChild();
  const log = (s: string) => console.log(s);
  if (args.includes('--overload')) {
    const i = args.indexOf('--connections');
    const n = i >= 0 ? Number(args[i + 1]) : 10_000;
    const r = await runOverload(n, log);
    const answered = Object.values(r.statuses).reduce((a, b) => a + b, 0);
    log(
      `overload: ${r.connections} connections in ${r.wallS.toFixed(1)} s: statuses ${JSON.stringify(r.statuses)}, client errors ${JSON.stringify(r.clientErrors)}; ` +
        `admitted p50 ${r.admittedMs.p50.toFixed(0)} ms p99 ${r.admittedMs.p99.toFixed(0)} ms; router RSS idle ${r.routerRssMB.idle.toFixed(0)} MB, ` +
        `peak ${r.routerRssMB.peak.toFixed(0)} MB, after ${r.routerRssMB.after.toFixed(0)} MB; alive after: ${r.aliveAfter}; in flight after: ${r.activeAfter}; ` +
        `kernel listen-queue overflows ${r.listenOverflows}`,
    );
    const checks: Check[] = [
      { name: 'every connection answered', ok: answered === r.connections, detail: `${answered}/${r.connections}` },
      { name: '503/429 carry Retry-After', ok: r.missingRetryAfter === 0, detail: `${r.missingRetryAfter} without` },
      { name: 'refusals past the limits', ok: (r.statuses['503'] ?? 0) + (r.statuses['429'] ?? 0) > 0, detail: JSON.stringify(r.statuses) },
      {
        name: 'no 5xx other than 503',
        ok: Object.keys(r.statuses).every((s) => Number(s) < 500 || s === '503'),
        detail: JSON.stringify(r.statuses),
      },
      {
        name: 'router alive, nothing in flight after',
        ok: r.aliveAfter && r.activeAfter === 0,
        detail: `alive ${r.aliveAfter}, in flight ${r.activeAfter}`,
      },
    ];
    for (const c of checks) log(`${c.ok ? 'PASS' : 'FAIL'}  ${c.name}: ${c.detail}`);
    process.exit(checks.every((c) => c.ok) ? 0 : 1);
  }
  if (args.includes('--nats')) {
    const { runNatsChaos } = await import('./chaos-nats.ts');
    const i = args.indexOf('--rounds');
    const rounds = i >= 0 ? Number(args[i + 1]) : 20;
    if (!Number.isInteger(rounds) || rounds < 1) throw new Error(`--rounds must be a positive integer, got ${args[i + 1]}`);
    const r = await runNatsChaos(rounds, log);
    process.exit(r.lost === 0 && r.rounds.every((x) => x.healedMs !== null) ? 0 : 1);
  }
  const short = args.includes('--short') || process.env.CHAOS_SHORT === '1';
  const r = await runChaos({ ...(short ? SHORT : LONG), log });
  printReport(r, log);
  process.exit(r.checks.every((c) => c.ok) ? 0 : 1);
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  main().catch((err) => {
    console.error(err);
    process.exit(1);
  });
}
