/**
 * bench:core — the routing core's own CPU per request, without HTTP and without IPC: what the primary of
 * `serve --processes N` must spend per request however cheap its channel to the shells becomes (issue 29, "Every core").
 *
 * The whole router is started in this process (startServer, default settings, workers that are never called), and each
 * request takes the calls a shell's messages make in the primary: `lifecycle.submit` with the block hashes a shell
 * computed (hashed before the timed loop), `noteRouted`, `firstToken`, `finish`, with `--in-flight` requests open at a
 * time. Two fleets, each timed:
 *   approximate   workers without KV events: the router records each routed prompt's blocks itself
 *   events        workers with KV events: after each request its worker's engine stores the blocks it did not hold
 *                 (`applyEvents` with the blocks' token ids and engine block ids, as the event decoder hands them on;
 *                 the msgpack decode itself is not in the figure)
 *                 Each engine holds `--capacity` blocks and evicts its oldest stored blocks past that (a removed
 *                 event), so the index stays the size of the fleet's caches.
 *   replicas      the approximate fleet with the router a NATS replica (a nats-server started on a free port) and a
 *                 second replica in the same process: every request the first routes is announced on NATS and folded
 *                 into the second's active load (what `--nats` adds per request, both sides). `--peers n`: n such peers,
 *                 each folding everything in (a peer more costs its fold: the difference between --peers 1 and 2).
 * The workload: 2,048-token prompts, each a 1,536-token prefix of one of 64 conversation families and 512 fresh tokens
 * (so ~32 new blocks per request once the families are cached), 8 workers.
 *
 *   npm run bench:core [-- --requests 20000 --warmup 5000 --in-flight 32 --workers 8 --tokens 2048 --fresh 512
 *                          --capacity 16384 --approx-table-mb 64 --only approximate|events|replicas --peers 1]
 *     --approx-table-mb  approximate mode's budget (serve's setting; a small one keeps the table full, evicting)
 *
 * Prints the time inside the core's calls per request (performance.now around them; the prompt, its hashes and the
 * engine's bookkeeping are made outside the timed calls, as the shells and the engines make them), on an idle machine
 * the routing core's CPU per request; and the process's CPU per request over the timed requests (process.cpuUsage:
 * this bench's prompts and hashes included, and for `replicas` the second replica's side), whose difference between
 * `replicas` and `approximate` is what sharing the lifecycle costs. A primary that did only this would saturate at
 * s / p shells for a shell cost s (bench:capacity `--processes 1,2`). The loop yields to I/O every 32 requests.
 */
import { loadavg } from 'node:os';
import { performance } from 'node:perf_hooks';
import pino from 'pino';
import { numArg, usage } from '../scripts/usage.ts';
import { DEFAULTS, type ServeConfig } from '../src/config/serve.ts';
import { requestSeqHashes } from '../src/core/multimodal.ts';
import type { KvEvent } from '../src/core/types.ts';
import { ClientCancel } from '../src/runtime/cancel.ts';
import { attachToServer } from '../src/runtime/nats.ts';
import { startServer } from '../src/server/app.ts';
import { recentDecisionOf } from '../src/server/inference.ts';
import { PeerLoad } from '../src/transport/nats/peer-load.ts';
import type { NatsReplica } from '../src/transport/nats/replica.ts';
import { NatsServer } from '../test/nats/nats-server.ts';

usage(import.meta.url);

const REQUESTS = numArg('requests', 20_000);
const WARMUP = numArg('warmup', 5_000);
const IN_FLIGHT = numArg('in-flight', 32);
const WORKERS = numArg('workers', 8);
const TOKENS = numArg('tokens', 2048);
const FRESH = numArg('fresh', 512);
const CAPACITY = numArg('capacity', 16_384);
const APPROX_MB = numArg('approx-table-mb', DEFAULTS.approxTableMb);
const PEERS = numArg('peers', 1);
const FAMILIES = 64;
const ONLY = (() => {
  const i = process.argv.indexOf('--only');
  return i >= 0 ? process.argv[i + 1] : null;
})();
const BS = DEFAULTS.blockSize;

interface Row {
  fleet: string;
  cpuUs: number;
  coreUs: number;
  applyUs: number;
  foldUs: number;
  newBlocks: number;
  overlap: number;
  /** replicas: NATS messages the routing replica published per request, and lifecycle steps in them. */
  messages: number;
  steps: number;
}

function prompt(i: number): number[] {
  const fam = i % FAMILIES;
  const out = new Array<number>(TOKENS);
  for (let j = 0; j < TOKENS - FRESH; j++) out[j] = (fam * 7_919 + j * 31) % 151_000;
  for (let j = TOKENS - FRESH; j < TOKENS; j++) out[j] = (i * 1_003 + j * 17) % 151_000;
  return out;
}

type Fleet = 'approximate' | 'events' | 'replicas';

// The peers' side of `replicas`: time in PeerLoad.onMessage (decode + fold into the active load), summed over them here.
let foldMs = 0;
const onMessage = PeerLoad.prototype.onMessage;
PeerLoad.prototype.onMessage = function (this: PeerLoad, data: Uint8Array): void {
  const t = performance.now();
  onMessage.call(this, data);
  foldMs += performance.now() - t;
};

async function run(fleet: Fleet): Promise<Row> {
  const total = WARMUP + REQUESTS;
  const config: ServeConfig = {
    ...DEFAULTS,
    port: 0,
    healthIntervalMs: 0,
    remoteTokenize: false,
    engineMetricsIntervalMs: 0,
    logLevel: 'silent',
    approxTableMb: APPROX_MB,
    // Never connected to: the decisions are made, no request is sent. A ZMQ endpoint nobody binds makes the worker an
    // event-fed one (the subscriber waits quietly).
    workers: Array.from({ length: WORKERS }, (_, w) => ({
      url: `http://127.0.0.1:${9 + w}`,
      id: `w${w}`,
      models: ['bench'],
      ...(fleet === 'events' ? { events: `tcp://127.0.0.1:${20_000 + w}` } : {}),
    })),
  };
  const server = await startServer(config, { logger: pino({ level: 'silent' }) });
  const { lifecycle, router } = server;
  // replicas: this router and --peers peers (same workers), all NATS replicas; only this one routes.
  const nats = fleet === 'replicas' ? new NatsServer() : null;
  const peers = [];
  for (let i = 0; nats && i < PEERS; i++) peers.push(await startServer(config, { logger: pino({ level: 'silent' }) }));
  const attached: NatsReplica[] = [];
  if (nats) {
    await nats.start();
    for (const [i, s] of [server, ...peers].entries()) {
      // Heartbeats every 100 ms: a replica sends frames once it has heard every peer's version (two heartbeat periods).
      attached.push(await attachToServer(s, { servers: nats.url, replicaId: `bench-${i}`, snapshotIntervalMs: 0, heartbeatMs: 100 }));
    }
    await new Promise((resolve) => setTimeout(resolve, 400));
  }
  // Per worker, the engine: the block id of each block hash it holds, and the order it stored them in (oldest first).
  const engines = new Map<string, { ids: Map<bigint, bigint>; order: bigint[]; head: number }>();
  let nextEngineId = 1n;
  const open: string[] = [];
  let coreMs = 0;
  let applyMs = 0;
  let newBlocks = 0;
  let overlap = 0;
  let cpu0 = process.cpuUsage();
  let published0 = 0;
  let steps0 = 0;
  for (let i = 0; i < total; i++) {
    if (i === WARMUP) {
      published0 = attached[0]?.stats().lifecyclePublished ?? 0;
      steps0 = attached[0]?.stats().lifecycleSteps ?? 0;
      coreMs = 0;
      applyMs = 0;
      foldMs = 0;
      newBlocks = 0;
      overlap = 0;
      cpu0 = process.cpuUsage();
    }
    // Let I/O in (the NATS client's writes and reads, timers), as a server's event loop would between requests.
    if (i % 32 === 0) await new Promise((resolve) => setImmediate(resolve));
    const id = `r${i}`;
    // The shell's part: the prompt and its block hashes.
    const tokens = prompt(i);
    const hashes = requestSeqHashes(tokens, BS);
    const t0 = performance.now();
    const step = await lifecycle.submit(
      { requestId: id, model: 'bench', seqHashes: hashes, promptTokens: TOKENS },
      new ClientCancel().flowSignal,
    );
    if (step.kind !== 'dispatch') throw new Error(`request ${i} was not routed: ${JSON.stringify(step)}`);
    const d = step.decision;
    server.inference.noteRouted(recentDecisionOf(step, 'completions', Date.now()));
    lifecycle.firstToken(id);
    open.push(id);
    if (open.length > IN_FLIGHT) lifecycle.finish(open.shift() as string, { outcome: 'ok', cachedTokens: d.overlapBlocks * BS });
    coreMs += performance.now() - t0;
    overlap += d.overlapBlocks;
    if (fleet !== 'events') continue;
    // The engine stores the blocks the decision said it lacked, and evicts its oldest past its capacity.
    let engine = engines.get(d.sourceKey);
    if (!engine) {
      engine = { ids: new Map(), order: [], head: 0 };
      engines.set(d.sourceKey, engine);
    }
    const from = d.overlapBlocks;
    const to = hashes.length;
    if (to <= from) continue;
    const ids: bigint[] = [];
    for (let b = from; b < to; b++) {
      const e = nextEngineId++;
      ids.push(e);
      engine.ids.set(hashes[b], e);
      engine.order.push(hashes[b]);
    }
    const events: KvEvent[] = [
      {
        kind: 'stored',
        parent: from > 0 ? (engine.ids.get(hashes[from - 1]) ?? null) : null,
        engineIds: ids,
        tokens: tokens.slice(from * BS, to * BS),
        blockSize: BS,
      },
    ];
    const evicted: bigint[] = [];
    while (engine.order.length - engine.head > CAPACITY) {
      const h = engine.order[engine.head++];
      const e = engine.ids.get(h);
      if (e !== undefined) evicted.push(e);
      engine.ids.delete(h);
    }
    if (engine.head > 65_536) {
      engine.order = engine.order.slice(engine.head);
      engine.head = 0;
    }
    if (evicted.length > 0) events.push({ kind: 'removed', engineIds: evicted });
    newBlocks += to - from;
    const t1 = performance.now();
    router.applyEvents(d.sourceKey, events);
    applyMs += performance.now() - t1;
  }
  for (const id of open) lifecycle.finish(id, { outcome: 'ok' });
  // Until every peer has folded every announced request in (their remote-request counts stop moving).
  for (const peer of peers) {
    for (let last = -1, now = 0; now !== last; ) {
      await new Promise((resolve) => setTimeout(resolve, 200));
      last = now;
      now = Number((await peer.metrics.registry.getSingleMetricAsString('router_nats_remote_requests_total')).split(' ').pop());
    }
  }
  const cpu = process.cpuUsage(cpu0);
  const published = (attached[0]?.stats().lifecyclePublished ?? 0) - published0;
  const steps = (attached[0]?.stats().lifecycleSteps ?? 0) - steps0;
  for (const a of attached) await a.close();
  await server.close();
  for (const peer of peers) await peer.close();
  await nats?.dispose();
  return {
    fleet,
    cpuUs: (cpu.user + cpu.system) / REQUESTS,
    coreUs: (coreMs * 1000) / REQUESTS,
    applyUs: (applyMs * 1000) / REQUESTS,
    foldUs: (foldMs * 1000) / REQUESTS,
    newBlocks: newBlocks / REQUESTS,
    overlap: overlap / REQUESTS,
    messages: published / REQUESTS,
    steps: steps / REQUESTS,
  };
}

const load0 = loadavg()[0].toFixed(1);
const rows: Row[] = [];
for (const fleet of (['approximate', 'events', 'replicas'] as const).filter((f) => ONLY === null || f === ONLY)) {
  console.error(`[core] ${fleet}: ${WARMUP} warm-up + ${REQUESTS} timed requests`);
  rows.push(await run(fleet));
}
console.log(
  `# bench:core  node ${process.version}, ${TOKENS}-token prompts (${FRESH} fresh), ${WORKERS} workers, ${IN_FLIGHT} in flight, ` +
    `${REQUESTS} timed requests, loadavg ${load0} -> ${loadavg()[0].toFixed(1)}`,
);
console.log('');
console.log(
  '| fleet | µs in submit + routed + first token + finish | µs applying KV events | routing core µs/request | ' +
    'process CPU µs/request | peer: µs folding in | load messages (steps)/request | new blocks/request | overlap blocks/request |',
);
console.log('|---|---:|---:|---:|---:|---:|---:|---:|---:|');
for (const r of rows) {
  console.log(
    `| ${r.fleet} | ${r.coreUs.toFixed(1)} | ${r.fleet === 'events' ? r.applyUs.toFixed(1) : '-'} | ${(r.coreUs + r.applyUs).toFixed(1)} | ` +
      `${r.cpuUs.toFixed(1)} | ${r.fleet === 'replicas' ? r.foldUs.toFixed(1) : '-'} | ` +
      `${r.fleet === 'replicas' ? `${r.messages.toFixed(3)} (${r.steps.toFixed(2)})` : '-'} | ` +
      `${r.fleet === 'events' ? r.newBlocks.toFixed(1) : '-'} | ${r.overlap.toFixed(1)} |`,
  );
}
process.exit(0);
