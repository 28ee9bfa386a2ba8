/**
 * `kvroute serve` as a replica through the adapter: two servers with no configured workers learn a mock engine from
 * the NATS registry, proxy requests to it, index its events from the stream, and see each other's requests in flight.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pino from 'pino';
import { startServer, type RunningServer } from '../../src/server/app.ts';
import { DEFAULTS } from '../../src/config/serve.ts';
import { quietLog } from '../../src/log.ts';
import { attachToServer } from '../../src/runtime/nats.ts';
import type { NatsReplica } from '../../src/transport/nats/replica.ts';
import { NatsServer, until } from './nats-server.ts';
import { blocksOf, PromptGen, sameSet, startEngine, startRelay, type Engine } from './fleet.ts';

const nats = new NatsServer();
let engine: Engine;
const servers: Array<{ running: RunningServer; replica: NatsReplica }> = [];

beforeAll(async () => {
  await nats.start();
  engine = await startEngine('srv0');
  for (let i = 0; i < 2; i++) {
    const running = await startServer({ ...DEFAULTS, port: 0, workers: [], logLevel: 'silent' }, { logger: pino({ level: 'silent' }) });
    const replica = await attachToServer(running, { servers: nats.url, replicaId: `srv-rep${i}`, log: quietLog, snapshotIntervalMs: 0 });
    servers.push({ running, replica });
  }
  await startRelay(nats, engine);
});

afterAll(async () => {
  for (const s of servers) {
    await s.replica.close();
    await s.running.close(0);
  }
  await engine.relay?.close();
  await engine.mocker.close();
  await nats.dispose();
});

describe('serve --nats (adapter)', () => {
  it('learns workers from the registry, proxies to them and indexes their events from the stream', async () => {
    await until(() => servers.every((s) => s.running.workers.get('srv0') !== undefined), 10_000, 'worker added from the registry');
    const gen = new PromptGen(21);
    for (let i = 0; i < 12; i++) {
      const s = servers[i % 2];
      const res = await fetch(`${s.running.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'mock-model', prompt: gen.next(), max_tokens: 2 }),
      });
      expect(res.status).toBe(200);
      await res.arrayBuffer();
    }
    for (const s of servers) {
      const src = s.running.router.state().sources.find((x) => x.source === 'srv0')!;
      expect(src.mode).toBe('events');
    }
    await until(
      () => servers.every((s) => sameSet(blocksOf(s.running.router, 'srv0'), engine.mocker.engine.cachedSeqHashes())),
      10_000,
      'both servers index the engine cache',
    );
    expect(engine.mocker.engine.cachedSeqHashes().size).toBeGreaterThan(0);
    // Each server's requests were announced to the other (and all finished there too).
    await until(() => servers.every((s) => s.running.router.state().inFlight === 0), 5000, 'peer finishes');
    for (const s of servers) expect(s.replica.stats().remoteAdded).toBe(6);
    // The replica's counters are on the server's /metrics.
    const text = await (await fetch(`${servers[0].running.url}/metrics`)).text();
    expect(text).toMatch(/^router_nats_ready 1$/m);
    expect(text).toMatch(/^router_nats_degraded 0$/m);
    expect(text).toMatch(/^router_nats_remote_requests_total 6$/m);
    expect(Number(/^router_nats_blocks_applied_total (\d+)$/m.exec(text)?.[1])).toBeGreaterThan(0);
  });
});
