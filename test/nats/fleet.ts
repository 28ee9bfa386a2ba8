/**
 * A test fleet on loopback: mock engines (real HTTP + ZMQ events + replay), one relay each, router replicas, all on
 * a test-owned nats-server. Traffic is routed by the replicas in turn and sent to the chosen engine over HTTP.
 */
import { KvRouter } from '../../src/core/router.ts';
import { quietLog } from '../../src/log.ts';
import { startMocker, type MockerHandle } from '../../src/mocker/server.ts';
import { NatsRelay } from '../../src/transport/nats/relay.ts';
import { NatsReplica } from '../../src/transport/nats/replica.ts';
import { STREAM } from '../../src/transport/nats/protocol.ts';
import { connect } from '@nats-io/transport-node';
import { jetstreamManager } from '@nats-io/jetstream';
import type { NatsServer } from './nats-server.ts';

export const BS = 16;

export function newRouter(): KvRouter {
  // No overlay: the comparisons are about the event-fed index, which must be identical on every replica.
  return new KvRouter({ blockSize: BS, overlay: false, seed: 1 });
}

export interface Engine {
  readonly id: string;
  readonly mocker: MockerHandle;
  relay: NatsRelay | null;
}

export async function startEngine(id: string, numGpuBlocks = 64): Promise<Engine> {
  const mocker = await startMocker({ speedup: 1000, defaultMaxTokens: 2, engine: { blockSize: BS, numGpuBlocks }, seed: 7 });
  return { id, mocker, relay: null };
}

export async function startRelay(
  nats: NatsServer,
  e: Engine,
  extra: Partial<ConstructorParameters<typeof NatsRelay>[0]> = {},
): Promise<NatsRelay> {
  const relay = new NatsRelay({
    servers: nats.url,
    workerId: e.id,
    events: e.mocker.zmqEndpoint!,
    replay: e.mocker.replayEndpoint,
    url: e.mocker.url,
    model: 'mock-model',
    blockSize: BS,
    heartbeatMs: 500,
    log: quietLog,
    ...extra,
  });
  await relay.start();
  e.relay = relay;
  return relay;
}

export async function startReplica(
  nats: NatsServer,
  id: string,
  extra: Partial<ConstructorParameters<typeof NatsReplica>[0]> = {},
): Promise<{ router: KvRouter; replica: NatsReplica }> {
  const router = newRouter();
  const log = process.env.KVROUTE_TEST_LOG
    ? {
        info: (o: object, m: string) => console.log(id, m, JSON.stringify(o)),
        warn: (o: object, m: string) => console.log(id, m, JSON.stringify(o)),
        error: (o: object, m: string) => console.log(id, m, JSON.stringify(o)),
      }
    : quietLog;
  const replica = new NatsReplica({ servers: nats.url, replicaId: id, log, snapshotIntervalMs: 0, ...extra });
  await replica.start(router);
  return { router, replica };
}

/** Deterministic prompt generator: a few shared system prefixes, multi-turn continuations, random tails. */
export class PromptGen {
  private s: number;
  private readonly history: number[][] = [];
  constructor(seed: number) {
    this.s = seed >>> 0;
  }
  rand(): number {
    this.s = (this.s + 0x6d2b79f5) >>> 0;
    let t = this.s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  int(n: number): number {
    return Math.floor(this.rand() * n);
  }
  tokens(n: number): number[] {
    return Array.from({ length: n }, () => 1 + this.int(30000));
  }
  next(): number[] {
    let p: number[];
    if (this.history.length > 0 && this.rand() < 0.4) {
      p = [...this.history[this.int(this.history.length)], ...this.tokens(8 + this.int(40))];
    } else {
      const sys = this.int(4);
      p = [...Array.from({ length: 48 }, (_, i) => 100 + sys * 1000 + i), ...this.tokens(10 + this.int(60))];
    }
    if (p.length > 600) p = p.slice(0, 600);
    this.history.push(p);
    if (this.history.length > 30) this.history.shift();
    return p;
  }
}

export async function complete(url: string, prompt: number[]): Promise<void> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock-model', prompt, max_tokens: 2 }),
  });
  if (!res.ok) throw new Error(`engine answered ${res.status}: ${await res.text()}`);
  await res.arrayBuffer();
}

/** Routes `n` prompts, `concurrency` at a time, on the replicas in turn; each request goes to the chosen engine. */
export async function traffic(
  replicas: Array<{ router: KvRouter; replica: NatsReplica }>,
  engines: Engine[],
  gen: PromptGen,
  n: number,
  concurrency = 4,
): Promise<void> {
  const byId = new Map(engines.map((e) => [e.id, e]));
  let next = 0;
  let turn = 0;
  const worker = async () => {
    while (next < n) {
      const i = next++;
      const r = replicas[turn++ % replicas.length];
      const prompt = gen.next();
      const d = r.router.route({ requestId: `q${i}-${r.replica.replicaId}`, tokens: prompt }, Date.now());
      if (d.kind !== 'routed') throw new Error(`refused: ${d.reason}`);
      r.replica.routed(d);
      await complete(byId.get(d.source.workerId)!.mocker.url, prompt);
      r.router.finish(d.requestId, {}, Date.now());
      r.replica.finished(d.requestId);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
}

/** Blocks (router seq hashes) the router's index holds for a source key (read through its public snapshot). */
export function blocksOf(router: KvRouter, key: string): Set<bigint> {
  const s = router.snapshot().source(key);
  return new Set(s ? s.seqHashes : []);
}

/** Per source key, how many leading blocks of `seqHashes` the index holds (what findMatches counts), when any. */
export function matchesByKey(router: KvRouter, seqHashes: BigUint64Array): Record<string, number> {
  const snap = router.snapshot();
  const out: Record<string, number> = {};
  for (const key of snap.keys) {
    const held = new Set(snap.source(key)?.seqHashes ?? []);
    let n = 0;
    while (n < seqHashes.length && held.has(seqHashes[n])) n++;
    if (n > 0) out[key] = n;
  }
  return out;
}

export function sameSet(a: Set<bigint>, b: Set<bigint>): boolean {
  if (a.size !== b.size) return false;
  for (const x of a) if (!b.has(x)) return false;
  return true;
}

/** Every engine's true cache equals every replica's view of it. */
export function converged(replicas: Array<{ router: KvRouter }>, engines: Engine[]): boolean {
  for (const e of engines) {
    const truth = e.mocker.engine.cachedSeqHashes();
    for (const r of replicas) if (!sameSet(blocksOf(r.router, e.id), truth)) return false;
  }
  return true;
}

export function describeDiff(replicas: Array<{ router: KvRouter; replica: NatsReplica }>, engines: Engine[]): string {
  const lines: string[] = [];
  for (const e of engines) {
    const truth = e.mocker.engine.cachedSeqHashes();
    for (const r of replicas) {
      const mine = blocksOf(r.router, e.id);
      let missing = 0;
      let extra = 0;
      for (const x of truth) if (!mine.has(x)) missing++;
      for (const x of mine) if (!truth.has(x)) extra++;
      if (missing || extra) lines.push(`${r.replica.replicaId} ${e.id}: truth ${truth.size}, missing ${missing}, extra ${extra}`);
    }
  }
  return lines.join('\n');
}

export async function streamLastSeq(url: string): Promise<number> {
  const nc = await connect({ servers: url });
  try {
    const jsm = await jetstreamManager(nc);
    return (await jsm.streams.info(STREAM)).state.last_seq;
  } finally {
    await nc.close();
  }
}
