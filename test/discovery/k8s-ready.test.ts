/**
 * Readiness of Kubernetes discovery: `synced` (what readiness reports as SERVING) turns true only once the first
 * list's workers are in the worker table, not when the list arrives. The worker sink here holds each add until the
 * test releases it, as a slow registration would (the router's add subscribes to the engine's events), so a discovery
 * that reported readiness early is caught every time. Real @kubernetes/client-node against the fake API.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { K8sDiscovery, loadKubeConfig } from '../../src/discovery/k8s/discovery.ts';
import type { WorkerSpec } from '../../src/config/worker-spec.ts';
import { parseLabelSelector } from '../../src/config/k8s.ts';
import { FakeKubeApi, pod } from '../fixtures/k8s-api.ts';

const NS = 'ready';
let api: FakeKubeApi;
const quiet = { info: () => {}, warn: () => {}, error: () => {} };

beforeAll(async () => {
  api = await new FakeKubeApi().start();
});
afterAll(async () => {
  await api.close();
});

/** A sink whose adds wait for `release()`. */
function heldSink() {
  const table = new Set<string>();
  const pending: (() => void)[] = [];
  let adds = 0;
  return {
    table,
    get adds() {
      return adds;
    },
    release() {
      for (const r of pending.splice(0)) r();
    },
    sink: {
      add: async (spec: WorkerSpec) => {
        adds++;
        await new Promise<void>((r) => pending.push(r));
        table.add(spec.id!);
      },
      remove: async (id: string) => void table.delete(id),
    },
  };
}

const until = async (cond: () => boolean, ms = 5000) => {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 5));
  }
};

describe('K8sDiscovery readiness', () => {
  for (const mode of ['selector', 'pool'] as const) {
    it(`(${mode}) is not synced while the first list's workers are still being added`, async () => {
      const app = `app-${mode}`;
      if (mode === 'pool') {
        api.put(FakeKubeApi.poolsPath(NS), {
          apiVersion: 'inference.networking.k8s.io/v1',
          kind: 'InferencePool',
          metadata: { name: app, namespace: NS },
          spec: { selector: { matchLabels: { app } }, targetPorts: [{ number: 8000 }], endpointPickerRef: { name: 'e' } },
        });
      }
      api.put(FakeKubeApi.podsPath(NS), pod(`${app}-0`, { namespace: NS, labels: { app }, ip: '10.0.0.1' }));
      api.put(FakeKubeApi.podsPath(NS), pod(`${app}-1`, { namespace: NS, labels: { app }, ip: '10.0.0.2' }));
      const held = heldSink();
      const d = new K8sDiscovery({
        kubeConfig: loadKubeConfig(api.kubeconfig(NS)),
        namespace: NS,
        ...(mode === 'pool'
          ? { pool: { name: app, group: 'inference.networking.k8s.io' as const } }
          : { selector: parseLabelSelector(`app=${app}`) }),
        defaults: { ports: [8000], eventsPort: 5557, replayPort: 5558 },
        sink: held.sink,
        log: quiet,
      });
      const started = d.start();
      // The list has arrived and the first add is under way, held: not ready, and no worker counted yet.
      await until(() => held.adds === 1);
      await new Promise((r) => setTimeout(r, 50));
      expect(d.synced).toBe(false);
      expect(d.stats().workers).toBe(0);
      // Released one by one: still not ready until the last of the list's workers is in the table.
      held.release();
      await until(() => held.adds === 2);
      expect(d.synced).toBe(false);
      held.release();
      await started;
      expect(d.synced).toBe(true);
      expect(held.table.size).toBe(2);
      expect(d.stats().workers).toBe(2);
      await d.stop();
    });
  }
});
