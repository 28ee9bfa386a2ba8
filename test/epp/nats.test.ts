/**
 * Several `kvroute epp` replicas sharing state over NATS, the way they are deployed behind one gateway: a real
 * nats-server, two mock engines each fed to JetStream by a `kvroute relay` process, and two picker processes with no
 * --worker at all: both discover the workers from the registry and learn the cache from the relayed events, so both
 * send a prompt to the engine that cached it, each with the other engine as fallback.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DESTINATION_HEADER } from '../../src/epp/protocol.ts';
import { type MockerHandle, startMocker } from '../../src/mocker/server.ts';
import { NatsServer } from '../nats/nats-server.ts';
import { EnvoySide } from './envoy-side.ts';
import { CLI, type EppProcess, eventually, metric, metricsText, startEpp } from './picker.ts';

const nats = new NatsServer();
const relays: ChildProcess[] = [];
const pickers: EppProcess[] = [];
const clients: EnvoySide[] = [];
let mockers: MockerHandle[] = [];

beforeAll(async () => {
  await nats.start();
  mockers = await Promise.all(
    [0, 1].map(() => startMocker({ speedup: 1000, defaultMaxTokens: 2, engine: { blockSize: 16, numGpuBlocks: 512 }, seed: 3 })),
  );
}, 60_000);

afterAll(async () => {
  for (const c of clients) c.close();
  await Promise.all(pickers.map((p) => p.stop()));
  for (const p of relays) if (p.exitCode === null) p.kill('SIGKILL');
  await Promise.all(mockers.map((m) => m.close()));
  await nats.dispose();
});

describe('kvroute epp --nats: replicas behind one gateway', () => {
  it('discover the relayed workers, learn the cache from the stream, and pick the engine that holds the prefix', async () => {
    mockers.forEach((m, i) => {
      const args = ['relay', '--nats', nats.url, '--worker', `eng${i}`, '--events', m.zmqEndpoint!, '--replay', m.replayEndpoint!];
      relays.push(
        spawn(process.execPath, [CLI, ...args, '--url', m.url, '--model', 'mock-model', '--log-level', 'warn'], { stdio: 'ignore' }),
      );
    });
    for (const id of ['a', 'b']) {
      pickers.push(await startEpp(['--nats', nats.url, '--replica-id', id, '--no-remote-tokenize', '--health-interval-ms', '0']));
    }
    const envoys = pickers.map((p) => {
      const c = new EnvoySide(p.address);
      clients.push(c);
      return c;
    });
    // Both replicas: the two workers from the registry, readiness SERVING.
    for (const [i, p] of pickers.entries()) {
      await eventually(async () => metric(await metricsText(p), 'router_worker_role') === 2, 20_000);
      expect((await envoys[i].check('readiness')).status).toBe(1);
    }
    // One engine caches a prompt (sent to it directly, past both pickers); its events reach both through NATS.
    const prompt = Array.from({ length: 640 }, (_, i) => (i * 7919) % 50_000);
    const body = JSON.stringify({ model: 'mock-model', prompt, max_tokens: 2 });
    const direct = await fetch(`${mockers[1].url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
    });
    expect(direct.status).toBe(200);
    for (const p of pickers) await eventually(async () => metric(await metricsText(p), 'router_kv_index_blocks') >= 40, 20_000);
    const holder = new URL(mockers[1].url).host;
    const other = new URL(mockers[0].url).host;
    for (const envoy of envoys) {
      const r = await envoy.roundTrip({ body });
      if (!('picked' in r)) throw new Error(`immediate: ${JSON.stringify(r.immediate)}`);
      expect(r.picked.headers[DESTINATION_HEADER]).toBe(`${holder},${other}`);
      expect(Number(r.picked.headers['x-kvroute-overlap-blocks'])).toBe(40);
      expect(JSON.parse(r.response.body).usage.prompt_tokens_details.cached_tokens).toBeGreaterThanOrEqual(624);
    }
  }, 120_000);
});
