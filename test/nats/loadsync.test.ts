/**
 * Active-load sharing between replicas over core NATS. Two replicas routing alternately must balance load as one
 * router routing everything does; replicas that do not share load (the control) must not. A silent peer's requests
 * expire; a starting replica learns the requests its peers have in flight.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { KvRouter } from '../../src/core/router.ts';
import { quietLog } from '../../src/log.ts';
import { encodeLoad, encodeWorkerEntry, LOAD_SUBJECT, REGISTRY_BUCKET } from '../../src/transport/nats/protocol.ts';
import { NatsReplica } from '../../src/transport/nats/replica.ts';
import { Kvm } from '@nats-io/kv';
import { NatsServer, until } from './nats-server.ts';
import { PromptGen } from './fleet.ts';

const BS = 16;
const WORKERS = ['w0', 'w1', 'w2', 'w3'];
const nats = new NatsServer();
let nc: NatsConnection;
const open: NatsReplica[] = [];

function newRouter(): KvRouter {
  // The plain kv cost: a pure function of load here (no cache, no capacity), so the comparison isolates load sharing.
  // kv-pressure's one-block tie band adds seeded-random tie-breaks that differ between one router and two replicas.
  return new KvRouter({ blockSize: BS, overlay: false, seed: 3, policy: 'kv' });
}

async function replica(
  id: string,
  extra: Partial<ConstructorParameters<typeof NatsReplica>[0]> = {},
): Promise<{ router: KvRouter; replica: NatsReplica }> {
  const router = newRouter();
  const r = new NatsReplica({ servers: nats.url, replicaId: id, log: quietLog, snapshotIntervalMs: 0, ...extra });
  await r.start(router);
  open.push(r);
  return { router, replica: r };
}

beforeAll(async () => {
  await nats.start();
  nc = await connect({ servers: nats.url });
  // Four workers in the registry (no engines needed: no events, routing is by load alone).
  const kv = await new Kvm(nc).create(REGISTRY_BUCKET, { history: 1 });
  for (const w of WORKERS) {
    await kv.put(
      w,
      encodeWorkerEntry({ workerId: w, url: null, model: 'm', blockSize: BS, dpRanks: [0], relayId: 'test', heartbeatAt: Date.now() }),
    );
  }
});

afterAll(async () => {
  for (const r of open) await r.close();
  await nc.close();
  await nats.dispose();
});

interface Req {
  id: string;
  tokens: number[];
  finishAt: number;
  firstAt: number;
}

/** A workload of requests with heterogeneous sizes and lifetimes (in routing steps). */
function workload(n: number, seed: number): Req[] {
  const g = new PromptGen(seed);
  return Array.from({ length: n }, (_, i) => {
    const life = 4 + g.int(40);
    return { id: `r${i}`, tokens: g.tokens(64 + g.int(2000)), finishAt: i + life, firstAt: i + 1 + g.int(3) };
  });
}

/**
 * Runs the workload: step i routes request i on `pick(i)`, then the lifecycle events due at step i happen on the
 * replica that routed each request. Returns the true load picture (per-worker prompt tokens routed, and the mean
 * spread between the most and least loaded worker in active prompt tokens, sampled after every step).
 */
async function run(
  reqs: Req[],
  pick: (i: number) => { router: KvRouter; replica: NatsReplica | null },
  settle: () => Promise<void>,
): Promise<{ tokens: Record<string, number>; spread: number }> {
  const active: Record<string, number> = Object.fromEntries(WORKERS.map((w) => [w, 0]));
  const tokens: Record<string, number> = Object.fromEntries(WORKERS.map((w) => [w, 0]));
  const owner = new Map<string, { router: KvRouter; replica: NatsReplica | null; worker: string; size: number }>();
  let spreadSum = 0;
  for (let i = 0; i < reqs.length; i++) {
    const at = pick(i);
    const q = reqs[i];
    const d = at.router.route({ requestId: q.id, tokens: q.tokens }, Date.now());
    if (d.kind !== 'routed') throw new Error(d.reason);
    at.replica?.routed(d);
    owner.set(q.id, { ...at, worker: d.source.workerId, size: q.tokens.length });
    active[d.source.workerId] += q.tokens.length;
    tokens[d.source.workerId] += q.tokens.length;
    for (const r of reqs.slice(Math.max(0, i - 60), i + 1)) {
      const o = owner.get(r.id);
      if (!o) continue;
      if (r.firstAt === i) {
        o.router.firstToken(r.id, Date.now());
        o.replica?.firstToken(r.id);
      }
      if (r.finishAt === i) {
        o.router.finish(r.id, {}, Date.now());
        o.replica?.finished(r.id);
        active[o.worker] -= o.size;
        owner.delete(r.id);
      }
    }
    await settle();
    const v = Object.values(active);
    spreadSum += Math.max(...v) - Math.min(...v);
  }
  return { tokens, spread: spreadSum / reqs.length };
}

describe('load sharing', () => {
  it('two replicas routing alternately balance load as one router does (within 10%)', async () => {
    const reqs = workload(300, 11);
    const single = newRouter();
    for (const w of WORKERS) single.addSource({ workerId: w, dpRank: 0 });
    const one = await run(
      reqs,
      () => ({ router: single, replica: null }),
      async () => {},
    );

    // Heartbeats every 100 ms: after two of them both replicas send their steps in frames (protocol 2).
    const a = await replica('a', { heartbeatMs: 100 });
    const b = await replica('b', { heartbeatMs: 100 });
    await new Promise((resolve) => setTimeout(resolve, 400));
    const both = [a, b];
    const inFlight = (r: KvRouter) => r.state().inFlight;
    const shared = await run(
      reqs,
      (i) => both[i % 2],
      // Each step waits until both replicas track the same requests in flight (the peer's announcements arrived).
      () => until(() => inFlight(a.router) === inFlight(b.router), 5000, 'lifecycle propagation'),
    );
    expect(a.replica.stats().remoteAdded).toBe(150);
    expect(b.replica.stats().remoteAdded).toBe(150);
    for (const r of [a, b]) {
      expect(r.replica.stats().lifecycleDropped).toBe(0);
      expect(r.replica.stats().lifecycleFrames).toBeGreaterThan(100);
    }

    // Control: two routers that do not share load.
    const c = newRouter();
    const d = newRouter();
    for (const w of WORKERS) {
      c.addSource({ workerId: w, dpRank: 0 });
      d.addSource({ workerId: w, dpRank: 0 });
    }
    const blind = await run(
      reqs,
      (i) => ({ router: i % 2 ? d : c, replica: null }),
      async () => {},
    );

    const total = reqs.reduce((n, q) => n + q.tokens.length, 0);
    for (const w of WORKERS) expect(Math.abs(shared.tokens[w] - one.tokens[w]) / (total / WORKERS.length)).toBeLessThan(0.1);
    expect(Math.abs(shared.spread - one.spread) / one.spread).toBeLessThan(0.1);
    // Without sharing, each router sees only half of the load and the fleet is visibly less even.
    expect(blind.spread).toBeGreaterThan(one.spread * 1.1);
    console.log(
      `load spread (mean max-min active prompt tokens): one router ${one.spread.toFixed(0)}, two sharing replicas ${shared.spread.toFixed(0)}, two blind routers ${blind.spread.toFixed(0)}`,
    );
    await a.replica.close();
    await b.replica.close();
  });

  it('a silent peer’s requests expire; a starting replica learns what peers have in flight', async () => {
    const a = await replica('x', { heartbeatMs: 100, peerTtlMs: 600 });
    // A fake peer announces two requests and then goes silent.
    const seq = new BigUint64Array([1n, 2n, 3n]);
    for (const id of ['p1', 'p2']) {
      nc.publish(
        LOAD_SUBJECT,
        encodeLoad({ kind: 'added', replica: 'ghost', requestId: id, sourceKey: 'w1', seqHashes: seq, promptTokens: 48, overlapBlocks: 0 }),
      );
    }
    await until(() => a.router.state().inFlight === 2, 3000, 'ghost requests tracked');
    expect(a.router.state().sources.find((s) => s.source === 'w1')!.activeRequests).toBe(2);
    await until(() => a.router.state().inFlight === 0, 3000, 'ghost requests expired');
    expect(a.replica.stats().remoteExpired).toBe(2);

    // x routes a request that stays in flight; a replica starting later learns it from x's answer to its hello.
    const d = a.router.route({ requestId: 'long', tokens: new PromptGen(5).tokens(200) }, Date.now());
    if (d.kind !== 'routed') throw new Error('refused');
    a.replica.routed(d);
    const late = await replica('late');
    await until(() => late.router.state().inFlight === 1, 3000, 'in-flight request re-announced');
    expect(late.router.state().sources.find((s) => s.source === d.sourceKey)!.activeRequests).toBe(1);
    a.router.finish('long', {}, Date.now());
    a.replica.finished('long');
    await until(() => late.router.state().inFlight === 0, 3000, 'finish propagated');
  });

  it('ignores registry entries that were stale at start and drops workers whose relay stops heartbeating', async () => {
    const kv = await new Kvm(nc).open(REGISTRY_BUCKET);
    await kv.put(
      'gone',
      encodeWorkerEntry({
        workerId: 'gone',
        url: null,
        model: 'm',
        blockSize: BS,
        dpRanks: [0],
        relayId: 'old',
        heartbeatAt: Date.now() - 600_000,
      }),
    );
    await kv.put(
      'w0',
      encodeWorkerEntry({ workerId: 'w0', url: null, model: 'm', blockSize: BS, dpRanks: [0], relayId: 'test', heartbeatAt: Date.now() }),
    );
    const r = await replica('ttl', { workerTtlMs: 800, heartbeatMs: 100 });
    expect(r.router.hasSource('gone')).toBe(false);
    expect(r.router.hasSource('w0')).toBe(true);
    expect(r.router.hasSource('w1')).toBe(false); // written at the start of the file: older than this replica's TTL
    // Nobody heartbeats these entries: after the TTL (while connected) the workers are removed.
    await until(() => r.router.sourceKeys().length === 0, 5000, 'workers expired');
    expect(r.replica.stats().workersRemoved).toBe(1);
    // A fresh heartbeat brings a worker back.
    await kv.put(
      'w1',
      encodeWorkerEntry({ workerId: 'w1', url: null, model: 'm', blockSize: BS, dpRanks: [0], relayId: 'test', heartbeatAt: Date.now() }),
    );
    await until(() => r.router.hasSource('w1'), 3000, 'worker re-registered');
  });
});
