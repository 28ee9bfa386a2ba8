/**
 * `kvroute epp` as a drop-in for the reference endpoint picker: started from the built package as kvroute's image runs
 * it under the chart (`kvroute` is the entrypoint; the chart gives no command, so the command line is the picker's flags
 * alone) with exactly the arguments and environment the reference picker's Helm chart renders (test/epp/fixtures/helm-chart.ts: llm-d's
 * llm-d-router-gateway chart, and the Inference Extension's last inferencepool chart), its pool from a fake Kubernetes
 * API (test/fixtures/k8s-api.ts, as test/epp/k8s.test.ts uses it). Two things differ from a pod, and only where a test
 * machine must: the ports are free ones (the chart's literal 9003 is replaced, 9002 and 9090 are the defaults the
 * chart relies on, given as variables), and the ConfigMap's mount /config is a temporary folder. Checked: the chart's
 * probes (gRPC health in plaintext), a pick over TLS (the chart gives no certificate: self-signed, as the reference),
 * and /metrics behind the Kubernetes token review the reference's --metrics-endpoint-auth does by default.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULTS } from '../../src/config/serve.ts';
import { eppSchema } from '../../src/config/serve.ts';
import { POLICY_NAMES } from '../../src/core/scheduling/registry.ts';
import { DESTINATION_HEADER } from '../../src/epp/protocol.ts';
import { type MockerHandle, startMocker } from '../../src/mocker/server.ts';
import { FakeKubeApi, pod } from '../fixtures/k8s-api.ts';
import { freePort } from '../fixtures/processes.ts';
import { randomTokens } from '../server/helpers.ts';
import { EnvoySide } from './envoy-side.ts';
import {
  type ChartRender,
  CURRENT,
  CURRENT_HA,
  LEGACY,
  pluginsYamlOf,
  STANDALONE,
  STANDALONE_AGENTGATEWAY,
} from './fixtures/helm-chart.ts';
import { type EppProcess, eventually, metric, startEpp } from './picker.ts';

const NS = 'kvroute';
let api: FakeKubeApi;
let engine: MockerHandle;
const procs: EppProcess[] = [];
const clients: EnvoySide[] = [];

const portOf = (endpoint: string | null) => endpoint!.slice(endpoint!.lastIndexOf(':') + 1);

beforeAll(async () => {
  api = await new FakeKubeApi().start();
  engine = await startMocker({ model: 'm', speedup: 1000, defaultMaxTokens: 2, engine: { blockSize: 16, numGpuBlocks: 512 }, seed: 5 });
  api.put(FakeKubeApi.poolsPath(NS), {
    apiVersion: 'inference.networking.k8s.io/v1',
    kind: 'InferencePool',
    metadata: { name: 'qwen3-8b', namespace: NS },
    spec: { selector: { matchLabels: { app: 'qwen3-8b' } }, targetPorts: [{ number: 8000 }], endpointPickerRef: { name: 'qwen3-8b-epp' } },
  });
  api.put(
    FakeKubeApi.podsPath(NS),
    pod('vllm-0', {
      namespace: NS,
      labels: { app: 'qwen3-8b' },
      annotations: {
        'kvroute.io/port': new URL(engine.url).port,
        'kvroute.io/events-port': portOf(engine.zmqEndpoint),
        'kvroute.io/replay-port': portOf(engine.replayEndpoint),
      },
    }),
  );
  // Prometheus's service account may read /metrics; another account may not.
  api.tokens.set('prometheus-token', { username: 'system:serviceaccount:monitoring:prometheus' });
  api.allowedPaths.set('system:serviceaccount:monitoring:prometheus', new Set(['/metrics']));
  api.tokens.set('other-token', { username: 'system:serviceaccount:default:other' });
}, 60_000);

afterAll(async () => {
  for (const c of clients) c.close();
  await Promise.all(procs.map((p) => p.stop()));
  await engine?.close();
  await api?.close();
});

/** The chart's command line with the test machine's two differences (free ports, the mount folder). */
async function chartProcess(render: ChartRender): Promise<EppProcess> {
  const mount = mkdtempSync(join(tmpdir(), 'kvroute-chart-config-'));
  writeFileSync(join(mount, 'default-plugins.yaml'), pluginsYamlOf(render));
  const [grpc, health, metrics] = [await freePort(), await freePort(), await freePort()];
  const args = render.args.map((a, i) =>
    a.startsWith(`${render.configMount}/`)
      ? join(mount, a.slice(render.configMount.length + 1))
      : render.args[i - 1] === '--grpc-health-port'
        ? String(health)
        : a,
  );
  const p = await startEpp(args, {
    exact: true,
    env: {
      // The pod's: the chart's fieldRefs, and the service account (here the fake API's kubeconfig).
      NAMESPACE: NS,
      POD_NAME: 'qwen3-8b-epp-7c9d-x2x4z',
      KUBECONFIG: api.kubeconfig(NS),
      KVROUTE_PORT: String(grpc),
      KVROUTE_METRICS_PORT: String(metrics),
      ...(args.includes('--grpc-health-port') ? {} : { KVROUTE_GRPC_HEALTH_PORT: String(health) }),
      KVROUTE_HEALTH_INTERVAL_MS: '200',
    },
  });
  procs.push(p);
  return p;
}

const metricsWith = (p: EppProcess, token?: string) =>
  fetch(`${p.metricsUrl}/metrics`, token ? { headers: { authorization: `Bearer ${token}` } } : {});

it("kvroute epp's defaults are the chart's container ports", () => {
  const epp = eppSchema.parse({});
  expect({ grpc: epp.port, 'grpc-health': epp.grpcHealthPort, metrics: epp.metricsPort }).toEqual(CURRENT.ports);
  expect(epp.secureServing).toBe(true);
  // serve's own defaults are untouched.
  expect(DEFAULTS.port).toBe(8080);
});

describe.each([
  ['llm-d-router-gateway (current)', CURRENT],
  ['llm-d-router-gateway, two replicas, extra flags', CURRENT_HA],
  ['the Inference Extension inferencepool chart (legacy)', LEGACY],
  ['llm-d-router-standalone without a pool (Envoy sidecar)', STANDALONE],
  ['llm-d-router-standalone without a pool (agentgateway)', STANDALONE_AGENTGATEWAY],
] as const)('the %s chart runs kvroute epp unchanged', (_name, render) => {
  let p: EppProcess;

  beforeAll(async () => {
    p = await chartProcess(render);
  }, 60_000);

  it('passes its probes: gRPC health in plaintext on the health port, for the services the chart names', async () => {
    const health = new EnvoySide(p.healthAddress);
    clients.push(health);
    for (const { service } of [render.probes.liveness, render.probes.readiness]) {
      await eventually(async () => (await health.check(service)).status === 1, 20_000);
    }
  }, 30_000);

  it('picks the pool’s pod over TLS (self-signed, as the reference without --cert-path), or in plaintext where the chart says so', async () => {
    const secure = !render.args.includes('--secure-serving=false');
    expect(p.tls).toBe(secure ? 'TLS (self-signed certificate)' : 'plaintext');
    const envoy = new EnvoySide(p.address, { tls: secure });
    clients.push(envoy);
    await eventually(async () => (await envoy.check('readiness')).status === 1, 20_000);
    // The standalone chart's Envoy health-checks the ext_proc port itself, over the same connection kind.
    if (render.proxyHealthService) expect((await envoy.check(render.proxyHealthService)).status).toBe(1);
    const r = await envoy.roundTrip({ body: JSON.stringify({ model: 'm', prompt: randomTokens(64, 1), max_tokens: 2 }) });
    if (!('picked' in r)) throw new Error(`immediate: ${JSON.stringify(r.immediate)}`);
    expect(r.picked.headers[DESTINATION_HEADER]).toBe(new URL(engine.url).host);
    expect(r.response.status).toBe(200);
  }, 30_000);

  it('serves /metrics to an authorized bearer token only; /health stays open', async () => {
    expect((await metricsWith(p)).status).toBe(401);
    expect((await metricsWith(p, 'nobody')).status).toBe(401);
    expect((await metricsWith(p, 'other-token')).status).toBe(403);
    const ok = await metricsWith(p, 'prometheus-token');
    expect(ok.status).toBe(200);
    expect(metric(await ok.text(), 'epp_requests_total', 'result="routed"')).toBe(1);
    expect((await fetch(`${p.metricsUrl}/health`)).status).toBe(200);
  });

  it('says in one line what it ignores, maps the plugin configuration, and never failed on either', () => {
    const out = p.output();
    expect(out).toContain('ignoring');
    expect(out).toContain('--tracing=false');
    const policy = (POLICY_NAMES as readonly string[]).includes('llmd') ? 'llmd' : 'kv-pressure';
    expect(out).toContain(
      `plugin configuration: llm-d's built-in default (queue 2, kv-cache utilization 2, prefix cache 3) -> policy ${policy}`,
    );
    if (render.args.includes('--ha-enable-leader-election')) expect(out).toContain('active-active');
    expect(p.proc.exitCode).toBe(null);
  });
});
