/**
 * `kvroute relay --k8s-selector` as a process: one relay per Ready pod of a fake Kubernetes API (real client-node,
 * real nats-server, real mock engines as the pods' endpoints), and a `kvroute serve --nats` replica that learns the
 * workers from the registry. A pod that leaves is deregistered, so the replica drops it; its events reach the replica
 * through JetStream, so a repeated prompt is routed back to the engine that cached it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startMocker } from '../../src/mocker/server.ts';
import type { MockerHandle } from '../../src/mocker/types.ts';
import { FakeKubeApi, pod } from '../fixtures/k8s-api.ts';
import { freePort, ShellProcess } from '../fixtures/processes.ts';
import { NatsServer, until } from '../nats/nats-server.ts';

const ROOT = new URL('../..', import.meta.url).pathname;
const NS = 'inference';
const PODS = FakeKubeApi.podsPath(NS);
const AUTH = { authorization: 'Bearer adm' };
const nats = new NatsServer();
let api: FakeKubeApi;
let engines: MockerHandle[] = [];
const procs: ShellProcess[] = [];

const portOf = (endpoint: string | null) => endpoint!.slice(endpoint!.lastIndexOf(':') + 1);
const annotations = (i: number) => ({
  'kvroute.io/port': new URL(engines[i].url).port,
  'kvroute.io/events-port': portOf(engines[i].zmqEndpoint),
  'kvroute.io/replay-port': portOf(engines[i].replayEndpoint),
  'kvroute.io/model': 'mock-model',
});

async function workerIds(url: string): Promise<string[]> {
  try {
    const body = (await (await fetch(`${url}/admin/workers`, { headers: AUTH })).json()) as { workers: { id: string }[] };
    return body.workers.map((w) => w.id).sort();
  } catch {
    return [];
  }
}

beforeAll(async () => {
  await nats.start();
  api = await new FakeKubeApi().start();
  engines = await Promise.all(
    [0, 1].map((seed) => startMocker({ speedup: 1000, defaultMaxTokens: 2, engine: { blockSize: 16, numGpuBlocks: 512 }, seed })),
  );
}, 60_000);

afterAll(async () => {
  await Promise.all(procs.map((p) => p.stop()));
  await Promise.all(engines.map((e) => e.close()));
  await api.close();
  await nats.dispose();
});

describe('kvroute relay --k8s-selector', () => {
  it('relays every Ready pod, deregisters pods that leave; the replica follows and routes by the relayed events', async () => {
    api.put(PODS, pod('eng0', { namespace: NS, labels: { app: 'vllm' }, annotations: annotations(0) }));
    api.put(PODS, pod('eng1', { namespace: NS, labels: { app: 'vllm' }, annotations: annotations(1) }));
    const relay = new ShellProcess(
      `node bin/kvroute.mjs relay --nats ${nats.url} --k8s-selector app=vllm --k8s-namespace ${NS} --kubeconfig ${api.kubeconfig()}`,
      { cwd: ROOT },
    );
    procs.push(relay);
    await relay.waitFor(/relay for eng0 started/, 30_000);
    await relay.waitFor(/relay for eng1 started/, 30_000);
    const port = await freePort();
    const url = `http://127.0.0.1:${port}`;
    const router = new ShellProcess(
      `node bin/kvroute.mjs serve --nats ${nats.url} --port ${port} --admin-token adm --health-interval-ms 0 --no-remote-tokenize --replica-id r1`,
      { cwd: ROOT },
    );
    procs.push(router);
    await until(
      async () => JSON.stringify(await workerIds(url)) === '["eng0","eng1"]',
      40_000,
      `both workers on the replica: ${router.describe()}`,
    );

    // Events cross relay -> JetStream -> replica: the repeated prompt goes back to the engine that cached it.
    const prompt = Array.from({ length: 320 }, (_, i) => (i * 7919) % 50_000);
    const ask = async () => {
      const r = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'mock-model', prompt, max_tokens: 2 }),
      });
      expect(r.status).toBe(200);
      await r.arrayBuffer();
      return { worker: r.headers.get('x-kvroute-worker'), overlap: Number(r.headers.get('x-kvroute-overlap-blocks')) };
    };
    const first = await ask();
    await until(
      async () =>
        ((await (await fetch(`${url}/debug/state`, { headers: AUTH })).json()) as { router: { index: { blocks: number } } }).router.index
          .blocks >= 20,
      20_000,
      'events indexed through NATS',
    );
    const second = await ask();
    expect(second.worker).toBe(first.worker);
    expect(second.overlap).toBe(20);

    // The pod becomes unready: its relay stops and deregisters it; the replica drops the worker.
    api.put(PODS, pod('eng1', { namespace: NS, labels: { app: 'vllm' }, annotations: annotations(1), ready: false }));
    await until(async () => JSON.stringify(await workerIds(url)) === '["eng0"]', 10_000, 'eng1 dropped by the replica');
    api.put(PODS, pod('eng1', { namespace: NS, labels: { app: 'vllm' }, annotations: annotations(1) }));
    await until(async () => JSON.stringify(await workerIds(url)) === '["eng0","eng1"]', 10_000, 'eng1 back');

    expect((await relay.stop()).code).toBe(0);
    expect(relay.stdout).toContain('relay stopped');
  }, 120_000);

  it('refuses --worker with --k8s-selector, and neither (exit 2, one line each)', async () => {
    const both = await new ShellProcess(
      'node bin/kvroute.mjs relay --nats nats://127.0.0.1:1 --worker w --events tcp://127.0.0.1:1 --k8s-selector app=x',
      {
        cwd: ROOT,
      },
    ).exited;
    expect(both.code).toBe(2);
    expect(both.stderr.trim().split('\n')).toEqual([expect.stringContaining('with --k8s-selector or --k8s-pool the pods give them')]);
    const neither = await new ShellProcess('node bin/kvroute.mjs relay --nats nats://127.0.0.1:1', { cwd: ROOT }).exited;
    expect(neither.code).toBe(2);
    expect(neither.stderr.trim().split('\n')).toEqual([expect.stringContaining('--worker and --events are required')]);
  }, 30_000);
});
