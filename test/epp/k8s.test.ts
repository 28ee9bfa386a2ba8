/**
 * `kvroute epp --k8s-pool` as a process (the built package): the picker's endpoints are the InferencePool's Ready pods,
 * watched through the real @kubernetes/client-node against a fake Kubernetes API. A pod that joins the pool is picked,
 * one that leaves is never picked again, and readiness follows the first list. A pool with several target ports is one
 * endpoint per podIP:port (kubernetes-sigs/gateway-api-inference-extension api/v1/inferencepool_types.go @84436a96b9e6),
 * so the proxy's subset hint may name any of them.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DESTINATION_HEADER } from '../../src/epp/protocol.ts';
import { startMocker, type MockerHandle } from '../../src/mocker/server.ts';
import { FakeKubeApi, pod } from '../fixtures/k8s-api.ts';
import { randomTokens } from '../server/helpers.ts';
import { EnvoySide } from './envoy-side.ts';
import { type EppProcess, eventually, metric, metricsText, startEpp } from './picker.ts';

const NS = 'inference';
const PODS = FakeKubeApi.podsPath(NS);
const POOLS = FakeKubeApi.poolsPath(NS);

let api: FakeKubeApi;
let engines: MockerHandle[] = [];
let picker: EppProcess | null = null;
let envoy: EnvoySide | null = null;

const portOf = (endpoint: string | null) => endpoint!.slice(endpoint!.lastIndexOf(':') + 1);
const annotations = (e: MockerHandle) => ({
  'kvroute.io/port': new URL(e.url).port,
  'kvroute.io/events-port': portOf(e.zmqEndpoint),
  'kvroute.io/replay-port': portOf(e.replayEndpoint),
});

beforeAll(async () => {
  api = await new FakeKubeApi().start();
  engines = await Promise.all(
    [0, 1].map((seed) =>
      startMocker({ model: 'm', speedup: 1000, defaultMaxTokens: 2, engine: { blockSize: 16, numGpuBlocks: 512 }, seed }),
    ),
  );
}, 60_000);

afterAll(async () => {
  envoy?.close();
  await picker?.stop();
  await Promise.all(engines.map((e) => e.close()));
  await api.close();
});

describe('kvroute epp --k8s-pool', () => {
  it('picks only among the pool’s Ready pods, as they come and go', async () => {
    api.put(POOLS, {
      apiVersion: 'inference.networking.k8s.io/v1',
      kind: 'InferencePool',
      metadata: { name: 'qwen', namespace: NS },
      spec: { selector: { matchLabels: { pool: 'qwen' } }, targetPorts: [{ number: 8000 }], endpointPickerRef: { name: 'qwen-epp' } },
    });
    api.put(PODS, pod('p0', { namespace: NS, labels: { pool: 'qwen' }, annotations: annotations(engines[0]) }));
    api.put(PODS, pod('p1', { namespace: NS, labels: { pool: 'other' }, annotations: annotations(engines[1]) }));
    picker = await startEpp(['--kubeconfig', api.kubeconfig(NS), '--k8s-pool', 'qwen', '--k8s-namespace', NS, '--no-remote-tokenize']);
    envoy = new EnvoySide(picker.address);
    const e = envoy;
    await eventually(async () => (await e.check('readiness')).status === 1, 15_000);
    // Ready only once the first list's workers are added (a ready picker with no worker would give the gateway 503s):
    // read once, right after readiness (test/discovery/k8s-ready.test.ts holds the add back to prove the order).
    expect(metric(await metricsText(picker), 'router_k8s_workers')).toBe(1);
    let seed = 0;
    const pick = async () => {
      const r = await e.roundTrip({ body: JSON.stringify({ model: 'm', prompt: randomTokens(64, ++seed), max_tokens: 2 }) });
      if (!('picked' in r)) throw new Error(`immediate response: ${JSON.stringify(r.immediate)}`);
      return r.picked.headers[DESTINATION_HEADER].split(',');
    };
    // Only p0 is in the pool: it is the pick, with no fallback outside the pool.
    expect(await pick()).toEqual([new URL(engines[0].url).host]);

    // p1 joins the pool (relabelled), p0 becomes unready: every pick is p1's endpoint.
    api.put(PODS, pod('p1', { namespace: NS, labels: { pool: 'qwen' }, annotations: annotations(engines[1]) }));
    api.put(PODS, pod('p0', { namespace: NS, labels: { pool: 'qwen' }, annotations: annotations(engines[0]), ready: false }));
    await eventually(
      async () => metric(await metricsText(picker!), 'router_k8s_workers') === 1 && (await pick())[0] === new URL(engines[1].url).host,
    );
    for (let i = 0; i < 4; i++) expect(await pick()).toEqual([new URL(engines[1].url).host]);

    // The pool's last pod is deleted: no endpoint can serve, the picker answers 503 and readiness drops.
    api.remove(PODS, 'p1');
    await eventually(async () => metric(await metricsText(picker!), 'router_k8s_workers') === 0);
    const r = await e.roundTrip({ body: JSON.stringify({ model: 'm', prompt: randomTokens(64, ++seed), max_tokens: 2 }) });
    if (!('immediate' in r)) throw new Error('picked with no pod in the pool');
    expect(r.immediate.status).toBe(503);
    expect(await picker.stop()).toBe(0);
    picker = null;
  }, 90_000);

  it('a pool with two target ports: the subset hint may name either podIP:port, and the pick is that one', async () => {
    // One pod, two engines on two target ports (vLLM's multi-port data parallelism); no events (approximate mode).
    const hosts = engines.map((e) => new URL(e.url).host);
    api.put(POOLS, {
      apiVersion: 'inference.networking.k8s.io/v1',
      kind: 'InferencePool',
      metadata: { name: 'multi', namespace: NS },
      spec: {
        selector: { matchLabels: { pool: 'multi' } },
        targetPorts: engines.map((e) => ({ number: Number(new URL(e.url).port) })),
        endpointPickerRef: { name: 'multi-epp' },
      },
    });
    api.put(PODS, pod('m0', { namespace: NS, labels: { pool: 'multi' } }));
    picker = await startEpp([
      '--kubeconfig',
      api.kubeconfig(NS),
      '--k8s-pool',
      'multi',
      '--k8s-namespace',
      NS,
      '--k8s-events-port',
      '0',
      '--no-remote-tokenize',
    ]);
    envoy?.close();
    envoy = new EnvoySide(picker.address);
    const e = envoy;
    await eventually(async () => metric(await metricsText(picker!), 'router_k8s_workers') === 2, 15_000);
    let seed = 100;
    for (const host of hosts) {
      for (let n = 0; n < 2; n++) {
        const r = await e.roundTrip({
          body: JSON.stringify({ model: 'm', prompt: randomTokens(64, ++seed), max_tokens: 2 }),
          subset: [host],
        });
        if (!('picked' in r)) throw new Error(`subset ${host}: immediate response ${JSON.stringify(r.immediate)}`);
        expect(r.picked.headers[DESTINATION_HEADER]).toBe(host);
        expect(r.response.status).toBe(200);
      }
    }
    // A port the pool does not list is no endpoint: 503, as the protocol says for a subset with none eligible.
    const r = await e.roundTrip({
      body: JSON.stringify({ model: 'm', prompt: randomTokens(64, ++seed), max_tokens: 2 }),
      subset: ['127.0.0.1:1'],
    });
    if (!('immediate' in r)) throw new Error('picked outside the subset');
    expect(r.immediate.status).toBe(503);
    api.remove(PODS, 'm0');
    api.remove(POOLS, 'multi');
    expect(await picker.stop()).toBe(0);
    picker = null;
  }, 90_000);

  it("without a pool, the reference's --endpoint-selector and --endpoint-target-ports: every listed port of the pod is an endpoint", async () => {
    const hosts = engines.map((e) => new URL(e.url).host);
    api.put(PODS, pod('s0', { namespace: NS, labels: { app: 'standalone' } }));
    picker = await startEpp([
      '--kubeconfig',
      api.kubeconfig(NS),
      '--endpoint-selector',
      'app=standalone',
      '--endpoint-target-ports',
      engines.map((e) => new URL(e.url).port).join(','),
      '--k8s-namespace',
      NS,
      '--k8s-events-port',
      '0',
      '--no-remote-tokenize',
    ]);
    envoy?.close();
    envoy = new EnvoySide(picker.address);
    const e = envoy;
    await eventually(async () => metric(await metricsText(picker!), 'router_k8s_workers') === 2, 15_000);
    let seed = 200;
    for (const host of hosts) {
      const r = await e.roundTrip({
        body: JSON.stringify({ model: 'm', prompt: randomTokens(64, ++seed), max_tokens: 2 }),
        subset: [host],
      });
      if (!('picked' in r)) throw new Error(`subset ${host}: immediate response ${JSON.stringify(r.immediate)}`);
      expect(r.picked.headers[DESTINATION_HEADER]).toBe(host);
      expect(r.response.status).toBe(200);
    }
    api.remove(PODS, 's0');
    expect(await picker.stop()).toBe(0);
    picker = null;
  }, 90_000);
});
