/**
 * `kvroute serve --k8s-selector` / `--k8s-pool` as processes (the built package), watching a fake Kubernetes API
 * through the real @kubernetes/client-node with a kubeconfig that points at it. The pods' endpoints are real mock
 * engines (pod IP 127.0.0.1, distinct ports in annotations). Each change to the cluster (pod ready, unready, deleted,
 * relabelled; the pool's selector changed or the pool deleted) must show in the worker set within a second; the
 * watch survives disconnects, 410 Gone (relist), injected server errors (backoff) and malformed objects (counted).
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startMocker } from '../../src/mocker/server.ts';
import type { MockerHandle } from '../../src/mocker/types.ts';
import { FakeKubeApi, pod } from '../fixtures/k8s-api.ts';
import { freePort, ShellProcess } from '../fixtures/processes.ts';

const ROOT = new URL('../..', import.meta.url).pathname;
const NS = 'inference';
const PODS = FakeKubeApi.podsPath(NS);
const POOLS = FakeKubeApi.poolsPath(NS);
const AUTH = { authorization: 'Bearer adm' };

let api: FakeKubeApi;
let engines: MockerHandle[] = [];
const procs: ShellProcess[] = [];

const portOf = (endpoint: string | null) => endpoint!.slice(endpoint!.lastIndexOf(':') + 1);

/** Pod annotations that point at mock engine i (pod IP 127.0.0.1, its HTTP, event and replay ports). */
function engineAnnotations(i: number, withHttpPort = true): Record<string, string> {
  const e = engines[i];
  return {
    ...(withHttpPort ? { 'kvroute.io/port': new URL(e.url).port } : {}),
    'kvroute.io/events-port': portOf(e.zmqEndpoint),
    'kvroute.io/replay-port': portOf(e.replayEndpoint),
  };
}

async function workerIds(url: string): Promise<string[]> {
  try {
    const res = await fetch(`${url}/admin/workers`, { headers: AUTH });
    if (res.status !== 200) return [`<status ${res.status}>`];
    const body = (await res.json()) as { workers: { id: string }[] };
    return body.workers.map((w) => w.id).sort();
  } catch {
    return ['<unreachable>'];
  }
}

/** Polls /admin/workers until it lists exactly `ids`; returns the milliseconds that took (fails past `ms`). */
async function expectWorkers(url: string, ids: string[], ms = 1000): Promise<number> {
  const t0 = performance.now();
  let seen: string[] = [];
  while (performance.now() - t0 < ms) {
    seen = await workerIds(url);
    if (JSON.stringify(seen) === JSON.stringify([...ids].sort())) return performance.now() - t0;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`workers ${JSON.stringify(seen)} after ${ms} ms, expected ${JSON.stringify(ids)}`);
}

async function metric(url: string, name: string, labels = ''): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels ? `{${labels}}` : ''} `));
  return line ? Number(line.split(' ')[1]) : 0;
}

async function startRouter(args: string): Promise<{ proc: ShellProcess; url: string }> {
  const port = await freePort();
  const proc = new ShellProcess(
    `node bin/kvroute.mjs serve --port ${port} --admin-token adm --health-interval-ms 0 --engine-metrics-interval-ms 0 ` +
      `--no-remote-tokenize --log-level info --kubeconfig ${api.kubeconfig(NS)} ${args}`,
    { cwd: ROOT },
  );
  procs.push(proc);
  await proc.waitFor(/kvroute listening on/, 30_000);
  return { proc, url: `http://127.0.0.1:${port}` };
}

beforeAll(async () => {
  api = await new FakeKubeApi().start();
  engines = await Promise.all(
    [0, 1].map((seed) => startMocker({ speedup: 1000, defaultMaxTokens: 2, engine: { blockSize: 16, numGpuBlocks: 512 }, seed })),
  );
}, 60_000);

afterAll(async () => {
  await Promise.all(procs.map((p) => p.stop()));
  await Promise.all(engines.map((e) => e.close()));
  await api.close();
});

describe('kvroute serve --k8s-selector', () => {
  it('follows pods: ready, unready, relabelled, deleted; survives disconnects, 410 Gone, errors and bad objects', async () => {
    api.put(PODS, pod('eng0', { namespace: NS, labels: { app: 'vllm' }, annotations: engineAnnotations(0) }));
    api.put(PODS, pod('eng1', { namespace: NS, labels: { app: 'vllm' }, annotations: engineAnnotations(1), ready: false }));
    api.put(PODS, pod('other', { namespace: NS, labels: { app: 'web' }, annotations: engineAnnotations(1) }));
    const { proc, url } = await startRouter(`--k8s-selector app=vllm --k8s-namespace ${NS}`);
    // Healthy only once the first list's workers are added (the worker table lists one while its add is still running):
    // then the set is already whole, read once.
    await until(async () => (await fetch(`${url}/health`)).status === 200, 10_000);
    expect(await workerIds(url)).toEqual(['eng0']);

    // The discovered worker is a full worker: its KV events are subscribed, it serves a chat request.
    const listed = (await (await fetch(`${url}/admin/workers`, { headers: AUTH })).json()) as { workers: Record<string, unknown>[] };
    expect(listed.workers[0]).toMatchObject({ id: 'eng0', url: engines[0].url, events: engines[0].zmqEndpoint, mode: 'events' });
    const chat = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'hello' }], max_tokens: 2 }),
    });
    expect(chat.status).toBe(200);
    expect(chat.headers.get('x-kvroute-worker')).toMatch(/^eng0\b/);

    // Ready, unready, relabelled out and back in, deleted: each within a second.
    api.put(PODS, pod('eng1', { namespace: NS, labels: { app: 'vllm' }, annotations: engineAnnotations(1) }));
    await expectWorkers(url, ['eng0', 'eng1']);
    api.put(PODS, pod('eng0', { namespace: NS, labels: { app: 'vllm' }, annotations: engineAnnotations(0), ready: false }));
    await expectWorkers(url, ['eng1']);
    api.put(PODS, pod('eng1', { namespace: NS, labels: { app: 'batch' }, annotations: engineAnnotations(1) }));
    await expectWorkers(url, []);
    api.put(PODS, pod('eng1', { namespace: NS, labels: { app: 'vllm' }, annotations: engineAnnotations(1) }));
    await expectWorkers(url, ['eng1']);
    api.remove(PODS, 'eng1');
    await expectWorkers(url, []);

    // A dropped watch resumes from its resource version: the change made while it was down arrives.
    api.disconnectWatches();
    api.put(PODS, pod('eng0', { namespace: NS, labels: { app: 'vllm' }, annotations: engineAnnotations(0) }));
    await expectWorkers(url, ['eng0'], 3000);

    // A bookmark moves the version on: after compaction the watch resumes from it without a relist.
    const relists0 = await metric(url, 'router_k8s_relists_total', 'resource="pods"');
    api.put(PODS, pod('other', { namespace: NS, labels: { app: 'web' }, annotations: { note: 'unselected change' } }));
    api.bookmark();
    await until(async () => (await metric(url, 'router_k8s_watch_bookmarks_total', 'resource="pods"')) >= 1);
    api.compact();
    api.disconnectWatches();
    await until(async () => api.openWatches > 0);
    api.put(PODS, pod('eng1', { namespace: NS, labels: { app: 'vllm' }, annotations: engineAnnotations(1) }));
    await expectWorkers(url, ['eng0', 'eng1']);
    expect(await metric(url, 'router_k8s_relists_total', 'resource="pods"')).toBe(relists0);

    // 410 Gone: the version the watch holds was compacted away; a relist brings the set back (eng1's deletion
    // happened during the gap and is seen as a deletion), both as an ERROR event and as an HTTP 410.
    for (const http of [false, true]) {
      api.goneAsHttp = http;
      const before = await metric(url, 'router_k8s_relists_total', 'resource="pods"');
      api.disconnectWatches();
      api.remove(PODS, 'eng1');
      api.compact();
      await expectWorkers(url, ['eng0'], 3000);
      expect(await metric(url, 'router_k8s_relists_total', 'resource="pods"')).toBeGreaterThan(before);
      api.put(PODS, pod('eng1', { namespace: NS, labels: { app: 'vllm' }, annotations: engineAnnotations(1) }));
      await expectWorkers(url, ['eng0', 'eng1']);
    }
    api.goneAsHttp = false;

    // Server errors: the watch backs off and recovers.
    const errors0 = await metric(url, 'router_k8s_watch_errors_total', 'resource="pods"');
    api.failNext(3, 500);
    api.disconnectWatches();
    api.remove(PODS, 'eng1');
    await expectWorkers(url, ['eng0'], 10_000);
    expect(await metric(url, 'router_k8s_watch_errors_total', 'resource="pods"')).toBeGreaterThan(errors0);

    // Malformed objects and lines are counted; the watch and the worker set carry on.
    await until(async () => api.openWatches > 0);
    api.rawLine(PODS, 'this is not json');
    api.rawLine(PODS, JSON.stringify({ type: 'ADDED', object: { metadata: {} } }));
    api.rawLine(PODS, JSON.stringify({ type: 'ADDED' }));
    api.put(
      PODS,
      pod('bad-port', { namespace: NS, labels: { app: 'vllm' }, annotations: { 'kvroute.io/events-port': 'five-five-five-seven' } }),
    );
    api.put(PODS, pod('bad-role', { namespace: NS, labels: { app: 'vllm', 'llm-d.ai/role': 'prefiller' } }));
    await until(async () => (await metric(url, 'router_k8s_bad_objects_total', 'reason="bad_annotation"')) >= 1);
    expect(await metric(url, 'router_k8s_bad_objects_total', 'reason="bad_label"')).toBeGreaterThanOrEqual(1);
    expect(await metric(url, 'router_k8s_bad_objects_total', 'reason="no_name"')).toBeGreaterThanOrEqual(1);
    expect(await metric(url, 'router_k8s_bad_watch_events_total', 'resource="pods"')).toBeGreaterThanOrEqual(1);
    api.put(PODS, pod('eng1', { namespace: NS, labels: { app: 'vllm' }, annotations: engineAnnotations(1) }));
    await expectWorkers(url, ['eng0', 'eng1']);
    // The worker set lists a worker while its add is still running; discovery counts it once the add returns.
    await until(async () => (await metric(url, 'router_k8s_workers')) === 2);
    expect(proc.running).toBe(true);
    expect(proc.stderr + proc.stdout).toMatch(
      /kubernetes object ignored: annotation kvroute.io\/events-port=\\?"five-five-five-seven\\?" must be a port/,
    );

    const done = await proc.stop();
    expect(done.code).toBe(0);
    for (const p of ['bad-port', 'bad-role', 'eng0', 'eng1', 'other']) api.remove(PODS, p);
  }, 90_000);
});

describe('kvroute serve --k8s-pool', () => {
  it("follows an InferencePool: its selector and target port, a changed selector, the pool's deletion; roles from llm-d's label", async () => {
    const enginePort = (i: number) => Number(new URL(engines[i].url).port);
    api.put(POOLS, {
      apiVersion: 'inference.networking.k8s.io/v1',
      kind: 'InferencePool',
      metadata: { name: 'qwen', namespace: NS },
      spec: {
        selector: { matchLabels: { pool: 'qwen' } },
        targetPorts: [{ number: enginePort(0) }],
        endpointPickerRef: { name: 'qwen-epp', port: { number: 9002 } },
      },
    });
    // p0 takes the pool's target port; p1 overrides it with its annotation and is a decode worker.
    api.put(PODS, pod('p0', { namespace: NS, labels: { pool: 'qwen' }, annotations: engineAnnotations(0, false) }));
    api.put(PODS, pod('p1', { namespace: NS, labels: { pool: 'qwen', 'llm-d.ai/role': 'decode' }, annotations: engineAnnotations(1) }));
    api.put(PODS, pod('p2', { namespace: NS, labels: { pool: 'llama' }, annotations: engineAnnotations(1) }));
    const { proc, url } = await startRouter(`--k8s-pool qwen --k8s-namespace ${NS}`);
    await expectWorkers(url, ['p0', 'p1'], 10_000);
    const listed = (await (await fetch(`${url}/admin/workers`, { headers: AUTH })).json()) as { workers: Record<string, unknown>[] };
    const byId = Object.fromEntries(listed.workers.map((w) => [w.id, w]));
    expect(byId.p0).toMatchObject({ url: `http://127.0.0.1:${enginePort(0)}`, role: 'both' });
    expect(byId.p1).toMatchObject({ url: engines[1].url, role: 'decode' });

    // The pool now selects other pods: the pod watch restarts with the new selector.
    const pool = api.get(POOLS, 'qwen')!;
    api.put(POOLS, { ...pool, spec: { ...(pool.spec as object), selector: { matchLabels: { pool: 'llama' } } } });
    await expectWorkers(url, ['p2']);
    // A malformed pool spec selects nothing (counted); the pool's deletion empties the set.
    api.put(POOLS, { ...pool, spec: { selector: { matchLabels: { pool: 'qwen' } }, targetPorts: [{ number: 'eight' }] } });
    await expectWorkers(url, []);
    expect(await metric(url, 'router_k8s_bad_objects_total', 'reason="bad_pool_spec"')).toBeGreaterThanOrEqual(1);
    api.put(POOLS, pool);
    await expectWorkers(url, ['p0', 'p1']);
    api.remove(POOLS, 'qwen');
    await expectWorkers(url, []);
    expect((await fetch(`${url}/health`)).status).toBe(503);
    expect((await proc.stop()).code).toBe(0);
    for (const p of ['p0', 'p1', 'p2']) api.remove(PODS, p);
  }, 60_000);

  it('a pool with several target ports: one worker per podIP:port; prefill-decode is aggregated, encode is counted, not routed', async () => {
    const ports = [0, 1].map((i) => Number(new URL(engines[i].url).port));
    api.put(POOLS, {
      apiVersion: 'inference.networking.k8s.io/v1',
      kind: 'InferencePool',
      metadata: { name: 'multi', namespace: NS },
      spec: {
        selector: { matchLabels: { pool: 'multi' } },
        targetPorts: ports.map((number) => ({ number })),
        endpointPickerRef: { name: 'multi-epp', port: { number: 9002 } },
      },
    });
    api.put(PODS, pod('m0', { namespace: NS, labels: { pool: 'multi', 'llm-d.ai/role': 'prefill-decode' } }));
    api.put(PODS, pod('enc', { namespace: NS, labels: { pool: 'multi', 'llm-d.ai/role': 'encode' } }));
    const { proc, url } = await startRouter(`--k8s-pool multi --k8s-namespace ${NS} --k8s-events-port 0`);
    await expectWorkers(
      url,
      ports.map((p) => `m0-${p}`),
      10_000,
    );
    const listed = (await (await fetch(`${url}/admin/workers`, { headers: AUTH })).json()) as { workers: Record<string, unknown>[] };
    expect(listed.workers.map((w) => [w.url, w.role]).sort()).toEqual(ports.map((p) => [`http://127.0.0.1:${p}`, 'both']).sort());
    expect(await metric(url, 'router_k8s_pods_not_routed', 'reason="encode_only"')).toBe(1);
    expect(await metric(url, 'router_k8s_bad_objects_total', 'reason="bad_label"')).toBe(0);
    // Both ports serve: requests reach each engine.
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'mock-model', prompt: 'hello there', max_tokens: 2 }),
    });
    expect(res.status).toBe(200);
    expect(ports.map((p) => `m0-${p}`)).toContain(res.headers.get('x-kvroute-worker'));
    expect((await proc.stop()).code).toBe(0);
    for (const p of ['m0', 'enc']) api.remove(PODS, p);
    api.remove(POOLS, 'multi');
  }, 60_000);

  it('refuses --k8s-pool with --k8s-selector (exit 2, one line), and a kubeconfig that cannot load (exit non-zero, one line)', async () => {
    const both = new ShellProcess('node bin/kvroute.mjs serve --k8s-pool a --k8s-selector app=b --port 0', { cwd: ROOT });
    const r1 = await both.exited;
    expect(r1.code).toBe(2);
    expect(r1.stderr.trim().split('\n')).toEqual([expect.stringMatching(/--k8s-pool .*and --k8s-selector .*exclude each other/)]);
    const sel = new ShellProcess('node bin/kvroute.mjs serve --k8s-selector "app in (a,b)" --port 0', { cwd: ROOT });
    const r2 = await sel.exited;
    expect(r2.code).toBe(2);
    expect(r2.stderr.trim().split('\n')).toHaveLength(1);
    const missing = new ShellProcess('node bin/kvroute.mjs serve --k8s-selector app=b --kubeconfig /nonexistent/kubeconfig --port 0', {
      cwd: ROOT,
    });
    const r3 = await missing.exited;
    expect(r3.code).not.toBe(0);
    expect(r3.stderr.trim().split('\n')).toEqual([expect.stringMatching(/^kvroute serve: .*\/nonexistent\/kubeconfig/)]);
    // No kubeconfig anywhere and no service account: one line, not a watch of client-node's http://localhost:8080.
    const home = mkdtempSync(join(tmpdir(), 'kvroute-home-'));
    const none = new ShellProcess('node bin/kvroute.mjs serve --k8s-selector app=b --port 0', {
      cwd: ROOT,
      env: { HOME: home, KUBECONFIG: '' },
    });
    const r4 = await none.exited;
    expect(r4.code).not.toBe(0);
    expect(r4.stderr.trim().split('\n')).toEqual([
      'kvroute serve: no Kubernetes credentials: set --kubeconfig, $KUBECONFIG, ~/.kube/config, or run in a pod with a service account',
    ]);
  }, 60_000); // four process starts one after another: 22 s at load 17, over 30 s at times
});

async function until(check: () => Promise<boolean>, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 20));
  }
}
