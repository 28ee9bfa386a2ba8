/**
 * A relayed TensorRT-LLM fleet gets its events: `kvroute relay --flavor trtllm` (and the relay of a discovered pod with
 * kvroute.io/engine trtllm) polls the engine's POST /kv_cache_events, as serve does, and publishes the decoded events
 * to JetStream; a replica's index then holds what the engine holds. A real nats-server (its own port), a mock
 * TensorRT-LLM engine (`--event-format trtllm`), the relay and replica classes the CLI runs.
 */
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startMocker, type MockerHandle } from '../../src/mocker/server.ts';
import { FleetRelay } from '../../src/transport/nats/fleet-relay.ts';
import { quietLog } from '../../src/log.ts';
import { blocksOf, complete, startReplica, startRelay } from '../nats/fleet.ts';
import { NatsServer, until } from '../nats/nats-server.ts';

const nats = new NatsServer();
const closers: Array<() => Promise<unknown>> = [];
const CLI = new URL('../../bin/kvroute.mjs', import.meta.url).pathname;

beforeAll(async () => {
  await nats.start();
});
afterAll(async () => {
  for (const c of closers.reverse()) await c();
  await nats.dispose();
});

const engine = async (seed: number): Promise<MockerHandle> => {
  const m = await startMocker({
    speedup: 1000,
    defaultMaxTokens: 2,
    engine: { blockSize: 16, numGpuBlocks: 256 },
    seed,
    eventFormat: 'trtllm',
  });
  closers.push(() => m.close());
  return m;
};
const prompt = (seed: number) => Array.from({ length: 96 }, (_, i) => ((seed * 7919 + i) % 30_000) + 1);

describe('relaying a TensorRT-LLM worker', () => {
  it('NatsRelay with flavor trtllm and no ZMQ endpoint polls the engine; the replica holds what the engine holds', async () => {
    const m = await engine(3);
    expect(m.zmqEndpoint).toBeNull();
    const relay = await startRelay(nats, { id: 'trt0', mocker: m, relay: null }, { events: undefined, replay: null, flavor: 'trtllm' });
    closers.push(() => relay.close());
    const { router, replica } = await startReplica(nats, 'trt-r');
    closers.push(() => replica.close());
    await complete(m.url, prompt(1));
    const truth = () => m.engine.cachedSeqHashes();
    await until(() => blocksOf(router, 'trt0').size >= 5, 10_000, "the engine's blocks on the replica");
    for (const h of blocksOf(router, 'trt0')) expect(truth().has(h)).toBe(true);
    // The registry entry says what the worker is (its P/D protocol follows it).
    expect(relay.entry()).toMatchObject({ workerId: 'trt0', url: m.url });
    expect(relay.health()[0].endpoint).toBe(`${m.url}/kv_cache_events`);
  }, 60_000);

  it('a discovered pod with engine trtllm and no events port is relayed by polling', async () => {
    const m = await engine(4);
    const fleet = new FleetRelay([nats.url], { blockSize: 16, heartbeatMs: 500 }, quietLog);
    await fleet.start();
    closers.push(() => fleet.close(500));
    const { router, replica } = await startReplica(nats, 'trt-r2');
    closers.push(() => replica.close());
    await fleet.add({ id: 'pod-trt', url: m.url, engine: 'trtllm', models: ['mock-model'] });
    await complete(m.url, prompt(2));
    await until(() => blocksOf(router, 'pod-trt').size >= 5, 10_000, "the pod's blocks on the replica");
    // A vLLM pod without an events port is still refused: it has no event endpoint at all.
    await expect(fleet.add({ id: 'pod-vllm', url: m.url })).rejects.toThrow(/publishes no KV events/);
  }, 60_000);

  it('kvroute relay --flavor trtllm needs --url instead of --events (exit 2, one line)', () => {
    const r = spawnSync(process.execPath, [CLI, 'relay', '--nats', nats.url, '--worker', 't', '--flavor', 'trtllm'], { encoding: 'utf8' });
    expect(r.status).toBe(2);
    expect(r.stderr.trim().split('\n')).toEqual([expect.stringMatching(/--flavor trtllm .*--url is required/)]);
    const help = spawnSync(process.execPath, [CLI, 'relay', '--help'], { encoding: 'utf8' });
    expect(help.stdout.replace(/\s+/g, ' ')).toContain('vllm, sglang or trtllm');
  });
});
