/**
 * deploy/k8s, linted: every kustomization rendered by the real `kubectl kustomize` (kustomize v5 is built into kubectl;
 * without kubectl on PATH the rendering tests are skipped with a message saying so), every manifest file read by a
 * second, stricter YAML reader (./strict-yaml.ts: what Go's YAML 1.1 refuses or reads differently), every rendered
 * object validated against the Kubernetes API's own schemas (kubernetes-models: the OpenAPI schemas of the Kubernetes
 * API compiled to validators; @kubernetes-models/gateway-api for Gateway and HTTPRoute; the InferencePool CRD's schema
 * in test/fixtures/schemas, checked with ajv), then the references between objects checked: selectors reach pod
 * templates, probes and Services name real container ports, the RBAC grants discovery what it watches, the EPP, the
 * InferencePool and the HTTPRoute name each other, kvroute's flags exist. Like kubeconform without --strict, the
 * schemas do not refuse unknown fields; the reference checks catch the misspellings that matter.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Ajv } from 'ajv';
import { Deployment } from 'kubernetes-models/apps/v1/Deployment';
import { StatefulSet } from 'kubernetes-models/apps/v1/StatefulSet';
import { Role } from 'kubernetes-models/rbac.authorization.k8s.io/v1/Role';
import { RoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1/RoleBinding';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { Service } from 'kubernetes-models/v1/Service';
import { ServiceAccount } from 'kubernetes-models/v1/ServiceAccount';
import { Gateway } from '@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/Gateway';
import { HTTPRoute } from '@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/HTTPRoute';
import { parseAllDocuments, parse as parseYaml } from 'yaml';
import { describe, expect, it } from 'vitest';
import { eppSchema, serveSchema } from '../../src/config/serve.ts';
import { settingsOf, longFlag } from '../../src/config/settings.ts';
import { strictYamlErrors } from './strict-yaml.ts';

type K8sObject = {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
} & Record<string, unknown>;

const KUBECTL = spawnSync('kubectl', ['version', '--client'], { encoding: 'utf8' }).status === 0;
if (!KUBECTL) {
  // The one allowed skip: without kubectl nothing here can render a kustomization as kubectl would.
  console.warn('\n*** test/deploy/manifests.test.ts: kubectl is not on PATH: the kustomize rendering tests are SKIPPED ***\n');
}

/** `kubectl kustomize DIR`, parsed; throws with kubectl's message when it refuses. */
function kustomize(dir: string): K8sObject[] {
  const r = spawnSync('kubectl', ['kustomize', dir], { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 });
  if (r.status !== 0) throw new Error(`kubectl kustomize ${dir} failed: ${r.stderr.trim()}`);
  return parseAllDocuments(r.stdout)
    .map((d) => d.toJS() as K8sObject | null)
    .filter((o): o is K8sObject => o !== null);
}

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const DEPLOY = join(ROOT, 'deploy/k8s');
const OVERLAYS = ['standalone', 'relay', 'epp/envoy-gateway', 'epp/istio', 'epp/kgateway', 'epp/envoy'];

type Validator = { validate(): void };
const MODELS: Record<string, new (o: never) => Validator> = {
  'apps/v1/Deployment': Deployment,
  'apps/v1/StatefulSet': StatefulSet,
  'rbac.authorization.k8s.io/v1/Role': Role,
  'rbac.authorization.k8s.io/v1/RoleBinding': RoleBinding,
  'v1/ConfigMap': ConfigMap,
  'v1/Service': Service,
  'v1/ServiceAccount': ServiceAccount,
  'gateway.networking.k8s.io/v1/Gateway': Gateway,
  'gateway.networking.k8s.io/v1/HTTPRoute': HTTPRoute,
};
const ajv = new Ajv({ allErrors: true });
const inferencePool = ajv.compile(JSON.parse(readFileSync(join(ROOT, 'test/fixtures/schemas/inferencepool-v1.schema.json'), 'utf8')));

/**
 * Istio's DestinationRule (networking.istio.io/v1beta1), only the fields the manifests use, as Istio's API defines them
 * (istio/api networking/v1beta1/destination_rule.proto: host, trafficPolicy.tls.mode, insecureSkipVerify).
 */
function validateDestinationRule(o: K8sObject): string[] {
  const spec = (o as { spec?: { host?: unknown; trafficPolicy?: { tls?: { mode?: unknown; insecureSkipVerify?: unknown } } } }).spec;
  const errors: string[] = [];
  if (typeof spec?.host !== 'string' || spec.host === '') errors.push('spec.host must be a non-empty string');
  const tls = spec?.trafficPolicy?.tls;
  if (tls && !['DISABLE', 'SIMPLE', 'MUTUAL', 'ISTIO_MUTUAL'].includes(String(tls.mode))) errors.push(`bad tls.mode ${String(tls.mode)}`);
  if (tls && tls.insecureSkipVerify !== undefined && typeof tls.insecureSkipVerify !== 'boolean')
    errors.push('insecureSkipVerify must be a boolean');
  return errors;
}

function validate(o: K8sObject): string[] {
  const key = `${o.apiVersion}/${o.kind}`;
  if (key === 'networking.istio.io/v1beta1/DestinationRule') return validateDestinationRule(o);
  if (key === 'inference.networking.k8s.io/v1/InferencePool') {
    return inferencePool(o) ? [] : (inferencePool.errors ?? []).map((e) => `${e.instancePath} ${e.message}`);
  }
  const Model = MODELS[key];
  if (!Model) return [`no schema for ${key}`];
  try {
    new Model(o as never).validate();
    return [];
  } catch (err) {
    return [(err as Error).message];
  }
}

type Pod = { metadata?: { labels?: Record<string, string> }; spec: { serviceAccountName?: string; containers: Container[] } };
type Container = {
  name: string;
  image: string;
  args?: string[];
  env?: { name: string; value?: string }[];
  ports?: { name?: string; containerPort: number }[];
  readinessProbe?: Probe;
  livenessProbe?: Probe;
};
/** The parts of an Envoy bootstrap (envoy.config.bootstrap.v3) the checks read. */
type EnvoyBootstrap = {
  static_resources: {
    listeners: {
      filter_chains: {
        filters: {
          typed_config: {
            http_filters: {
              name: string;
              typed_config: {
                message_timeout: string;
                processing_mode: Record<string, string>;
                grpc_service: { envoy_grpc: { cluster_name: string } };
              };
            }[];
          };
        }[];
      }[];
    }[];
    clusters: {
      name: string;
      transport_socket?: { name: string };
      original_dst_lb_config?: Record<string, unknown>;
      load_assignment?: { endpoints: { lb_endpoints: { endpoint: { address: { socket_address: unknown } } }[] }[] };
    }[];
  };
};
type Probe = { httpGet?: { port: string | number }; grpc?: { port: number; service?: string } };

const workloads = (objs: K8sObject[]) =>
  objs.filter((o) => o.kind === 'Deployment' || o.kind === 'StatefulSet') as (K8sObject & {
    spec: { selector: { matchLabels: Record<string, string> }; template: Pod };
  })[];
const kvrouteContainers = (objs: K8sObject[]) =>
  workloads(objs).flatMap((w) => w.spec.template.spec.containers.filter((c) => c.image.startsWith('kvroute:')).map((c) => ({ w, c })));
const flagValue = (args: string[], flag: string) => args.find((a) => a.startsWith(`${flag}=`))?.slice(flag.length + 1);

/** Every file under deploy/ with this ending. */
function filesUnder(dir: string, ending: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir)) {
    const p = join(dir, e);
    if (statSync(p).isDirectory()) out.push(...filesUnder(p, ending));
    else if (e.endsWith(ending)) out.push(p);
  }
  return out.sort();
}

const KUSTOMIZATIONS = filesUnder(DEPLOY, 'kustomization.yaml').map((f) => f.slice(DEPLOY.length + 1, -'/kustomization.yaml'.length));
/** The NATS probe as it stood before it was quoted: YAML 1.2 parsers accept it, Go's YAML does not. */
const OLD_NATS_PROBE = 'httpGet: { path: /healthz?js-enabled-only=true, port: 8222 }';

describe('deploy/ manifests read as Go reads YAML', () => {
  it('every kustomization folder is an overlay or a base some overlay uses', () => {
    expect([...KUSTOMIZATIONS].sort()).toEqual(['base', 'engines', 'epp/base', ...OVERLAYS].sort());
  });

  it('every manifest file passes the strict YAML 1.1 reading', () => {
    const files = filesUnder(join(ROOT, 'deploy'), '.yaml');
    expect(files.length).toBeGreaterThan(15);
    const errors = files.flatMap((f) => strictYamlErrors(readFileSync(f, 'utf8')).map((e) => `${f.slice(ROOT.length)}: ${e}`));
    expect(errors).toEqual([]);
  });

  it('the strict reading refuses what Go refuses: the old NATS probe, YAML 1.1 booleans and octals, duplicate keys', () => {
    expect(strictYamlErrors(`probe:\n  ${OLD_NATS_PROBE}\n`).join(' ')).toMatch(
      /"\/healthz\?js-enabled-only=true" inside a flow collection/,
    );
    expect(strictYamlErrors('probe:\n  httpGet: { path: "/healthz?js-enabled-only=true", port: 8222 }\n')).toEqual([]);
    expect(strictYamlErrors('spec:\n  paused: no\n').join(' ')).toMatch(/\/spec\/paused: YAML 1.1/);
    expect(strictYamlErrors('mode: 0644\n').join(' ')).toMatch(/\/mode: YAML 1.1/);
    expect(strictYamlErrors('a: 1\na: 2\n').join(' ')).toMatch(/unique/i);
    expect(strictYamlErrors('a: "fine"\nb: [x, z]\n')).toEqual([]);
    expect(strictYamlErrors('b: [x, y]\n').join(' ')).toMatch(/\/b\/1: YAML 1.1/); // y is true in YAML 1.1
  });

  it.skipIf(!KUBECTL)('kubectl kustomize renders every kustomization under deploy/', () => {
    for (const k of KUSTOMIZATIONS) expect(kustomize(join(DEPLOY, k)).length, k).toBeGreaterThan(0);
  });

  it.skipIf(!KUBECTL)('kubectl kustomize refuses the old NATS probe line, as the strict reading does', () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvroute-kustomize-'));
    try {
      writeFileSync(
        join(dir, 'kustomization.yaml'),
        'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - pod.yaml\n',
      );
      writeFileSync(
        join(dir, 'pod.yaml'),
        `apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n    - name: c\n      image: nats\n      readinessProbe:\n        ${OLD_NATS_PROBE}\n`,
      );
      expect(() => kustomize(dir)).toThrow(/did not find expected ',' or '}'/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe.skipIf(!KUBECTL)('deploy/k8s overlays, rendered by kubectl kustomize', () => {
  for (const overlay of OVERLAYS) {
    describe(overlay, () => {
      const objs = kustomize(join(DEPLOY, overlay));

      it('renders, and every object is valid against its Kubernetes schema', () => {
        expect(objs.length).toBeGreaterThan(3);
        const errors = objs.flatMap((o) => validate(o).map((e) => `${o.kind} ${o.metadata.name}: ${e}`));
        expect(errors).toEqual([]);
        expect(new Set(objs.map((o) => o.metadata.namespace))).toEqual(new Set(['kvroute']));
      });

      it('selectors reach pod templates; Services and probes name real container ports; kvroute runs with probes', () => {
        for (const w of workloads(objs)) {
          const labels = w.spec.template.metadata?.labels ?? {};
          for (const [k, v] of Object.entries(w.spec.selector.matchLabels)) expect(labels[k], `${w.metadata.name} selector ${k}`).toBe(v);
          for (const c of w.spec.template.spec.containers) {
            const names = new Set((c.ports ?? []).map((p) => p.name));
            const numbers = new Set((c.ports ?? []).map((p) => p.containerPort));
            for (const probe of [c.readinessProbe, c.livenessProbe]) {
              const port = probe?.httpGet?.port ?? probe?.grpc?.port;
              if (port !== undefined)
                expect(typeof port === 'string' ? names.has(port) : numbers.has(port), `${c.name} probe port ${port}`).toBe(true);
            }
          }
        }
        for (const svc of objs.filter((o) => o.kind === 'Service') as (K8sObject & {
          spec: { selector: Record<string, string>; ports: { name: string; targetPort?: string | number; port: number }[] };
        })[]) {
          const backing = workloads(objs).filter((w) =>
            Object.entries(svc.spec.selector).every(([k, v]) => w.spec.template.metadata?.labels?.[k] === v),
          );
          expect(backing.length, `Service ${svc.metadata.name} selects no workload`).toBeGreaterThan(0);
          for (const p of svc.spec.ports) {
            const target = p.targetPort ?? p.port;
            const ok = backing.some((w) =>
              w.spec.template.spec.containers.some((c) => (c.ports ?? []).some((cp) => cp.name === target || cp.containerPort === target)),
            );
            expect(ok, `Service ${svc.metadata.name} port ${p.name} -> ${target}`).toBe(true);
          }
        }
        for (const { w, c } of kvrouteContainers(objs)) {
          if (c.args?.[0] === 'relay') continue; // a sidecar: the engine's pod has the probes
          expect(c.readinessProbe, `${w.metadata.name} readiness`).toBeDefined();
          expect(c.livenessProbe, `${w.metadata.name} liveness`).toBeDefined();
          expect(c.ports?.some((p) => p.name === 'metrics') || c.args?.[0] === 'serve', `${w.metadata.name} metrics port`).toBe(true);
        }
      });

      it("kvroute's flags exist, and discovery has the RBAC for what it watches", () => {
        const serveFlags = new Set(settingsOf(serveSchema).map((s) => longFlag(s.entry)));
        const eppFlags = new Set(settingsOf(eppSchema).map((s) => longFlag(s.entry)));
        const relayFlags = new Set([
          '--nats',
          '--worker',
          '--events',
          '--replay',
          '--model',
          '--url',
          '--block-size',
          '--replicas',
          '--dp',
        ]);
        for (const { w, c } of kvrouteContainers(objs)) {
          const [command, ...args] = c.args ?? [];
          expect(['serve', 'relay', 'epp']).toContain(command);
          for (const a of args) {
            const flag = a.split('=')[0];
            // epp composes serve's settings and its own (listeners, TLS: docs/endpoint-picker.md).
            const known = command === 'relay' ? relayFlags.has(flag) : command === 'epp' ? eppFlags.has(flag) : serveFlags.has(flag);
            expect(known, `${w.metadata.name}: kvroute ${command} ${flag}`).toBe(true);
          }
          const discovers = args.some((a) => a.startsWith('--k8s-selector=') || a.startsWith('--k8s-pool='));
          if (!discovers) continue;
          const pod = w.spec.template.spec;
          expect(pod.serviceAccountName, `${w.metadata.name} runs as the discovery service account`).toBe('kvroute');
          const binding = objs.find(
            (o) =>
              o.kind === 'RoleBinding' &&
              (o.subjects as { kind: string; name: string }[]).some((s) => s.kind === 'ServiceAccount' && s.name === 'kvroute'),
          ) as (K8sObject & { roleRef: { name: string }; subjects: { namespace?: string }[] }) | undefined;
          expect(binding).toBeDefined();
          expect(binding!.subjects[0].namespace).toBe('kvroute');
          const role = objs.find((o) => o.kind === 'Role' && o.metadata.name === binding!.roleRef.name) as
            | (K8sObject & { rules: { apiGroups: string[]; resources: string[]; verbs: string[] }[] })
            | undefined;
          const grants = (group: string, resource: string) =>
            role?.rules.some(
              (r) =>
                r.apiGroups.includes(group) && r.resources.includes(resource) && ['get', 'list', 'watch'].every((v) => r.verbs.includes(v)),
            );
          expect(grants('', 'pods')).toBe(true);
          if (args.some((a) => a.startsWith('--k8s-pool='))) expect(grants('inference.networking.k8s.io', 'inferencepools')).toBe(true);
          // What discovery selects exists: the selector's pods, or the pool.
          const selector = flagValue(args, '--k8s-selector');
          if (selector) {
            const [k, v] = selector.split('=');
            expect(
              workloads(objs).some((x) => x.spec.template.metadata?.labels?.[k] === v),
              `pods for ${selector}`,
            ).toBe(true);
          }
        }
      });

      if (overlay.startsWith('epp/')) {
        it('the EPP, the InferencePool and the HTTPRoute name each other; the pool selects the engines on their port', () => {
          const pool = objs.find((o) => o.kind === 'InferencePool') as K8sObject & {
            spec: {
              selector: { matchLabels: Record<string, string> };
              targetPorts: { number: number }[];
              endpointPickerRef: { name: string; port: { number: number } };
            };
          };
          const epp = kvrouteContainers(objs).find(({ c }) => c.args?.[0] === 'epp')!;
          expect(flagValue(epp.c.args!, '--k8s-pool')).toBe(pool.metadata.name);
          expect(flagValue(epp.c.args!, '--port')).toBe(String(pool.spec.endpointPickerRef.port.number));
          expect(epp.c.readinessProbe?.grpc?.service).toBe('readiness');
          expect(epp.c.livenessProbe?.grpc?.service).toBe('liveness');
          const svc = objs.find((o) => o.kind === 'Service' && o.metadata.name === pool.spec.endpointPickerRef.name) as K8sObject & {
            spec: { selector: Record<string, string>; ports: { port: number }[] };
          };
          expect(svc, 'the Service endpointPickerRef names').toBeDefined();
          expect(svc.spec.ports.map((p) => p.port)).toContain(pool.spec.endpointPickerRef.port.number);
          expect(Object.entries(svc.spec.selector).every(([k, v]) => epp.w.spec.template.metadata?.labels?.[k] === v)).toBe(true);
          const engines = workloads(objs).filter((w) =>
            Object.entries(pool.spec.selector.matchLabels).every(([k, v]) => w.spec.template.metadata?.labels?.[k] === v),
          );
          expect(engines.map((e) => e.metadata.name)).toEqual(['vllm']);
          expect(engines[0].spec.template.spec.containers[0].ports?.map((p) => p.containerPort)).toContain(pool.spec.targetPorts[0].number);
          const route = objs.find((o) => o.kind === 'HTTPRoute') as K8sObject & {
            spec: {
              parentRefs: { name: string }[];
              rules: { backendRefs: { group: string; kind: string; name: string }[]; timeouts?: { request?: string } }[];
            };
          };
          expect(route.spec.rules[0].backendRefs).toEqual([
            { group: 'inference.networking.k8s.io', kind: 'InferencePool', name: pool.metadata.name },
          ]);
          // The picker gives up (503, dropped reason) before the route does, and before Envoy AI Gateway's InferencePool
          // ext_proc filter (message_timeout 300 s: envoyproxy/ai-gateway#1251) would fail the request itself.
          const bound = Number(flagValue(epp.c.args!, '--decision-timeout-ms') ?? eppSchema.parse({}).decisionTimeoutMs);
          const routeTimeout = /^(\d+)s$/.exec(route.spec.rules[0].timeouts?.request ?? '');
          expect(routeTimeout, 'the HTTPRoute sets a request timeout in seconds').not.toBeNull();
          expect(bound).toBeLessThan(Number(routeTimeout![1]) * 1000);
          expect(bound).toBeLessThan(300_000);
          // kgateway's InferencePool filter waits 5 s, not a setting (docs/endpoint-picker.md): the overlay bounds the picker below it.
          if (overlay === 'epp/kgateway') expect(bound).toBeLessThan(5_000);
          // The picker serves TLS (its default); Istio and the plain Envoy are told to reach it so, unverified. Neither
          // the switch nor its variable turns it off (the reference's --secure-serving=false is refused as unknown above).
          const tls = settingsOf(eppSchema, ['secureServing'])[0].entry;
          expect(epp.c.args).not.toContain(longFlag(tls));
          expect(epp.c.env?.find((e) => e.name === tls.env)?.value ?? 'true').toBe('true');
          if (overlay === 'epp/envoy') {
            // No gateway: Envoy's own ext_proc filter, set as the reference setups set it.
            const cm = objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name === 'envoy-config') as K8sObject & {
              data: Record<string, string>;
            };
            const envoy = parseYaml(cm.data['envoy.yaml']) as EnvoyBootstrap;
            const hcm = envoy.static_resources.listeners[0].filter_chains[0].filters[0].typed_config;
            const extProc = hcm.http_filters.find((f) => f.name === 'envoy.filters.http.ext_proc')!.typed_config;
            expect(extProc.message_timeout).toBe('1000s');
            // The picker's own bound on its wait stays below Envoy's.
            expect(bound).toBeLessThan(1000 * 1000);
            expect(extProc.processing_mode).toEqual({
              request_header_mode: 'SEND',
              response_header_mode: 'SEND',
              request_body_mode: 'FULL_DUPLEX_STREAMED',
              response_body_mode: 'FULL_DUPLEX_STREAMED',
              request_trailer_mode: 'SEND',
              response_trailer_mode: 'SEND',
            });
            const cluster = envoy.static_resources.clusters.find((c) => c.name === extProc.grpc_service.envoy_grpc.cluster_name)!;
            const target = cluster.load_assignment!.endpoints[0].lb_endpoints[0].endpoint.address.socket_address;
            expect(target).toEqual({ address: svc.metadata.name, port_value: pool.spec.endpointPickerRef.port.number });
            expect(cluster.transport_socket?.name).toBe('envoy.transport_sockets.tls');
            const dst = envoy.static_resources.clusters.find((c) => c.name === 'original_destination_cluster')!;
            expect(dst.original_dst_lb_config).toEqual({ use_http_header: true, http_header_name: 'x-gateway-destination-endpoint' });
            return;
          }
          const gateway = objs.find((o) => o.kind === 'Gateway') as K8sObject & { spec: { gatewayClassName: string } };
          expect(route.spec.parentRefs[0].name).toBe(gateway.metadata.name);
          expect(gateway.spec.gatewayClassName).toBe(
            { 'epp/envoy-gateway': 'eg', 'epp/istio': 'istio', 'epp/kgateway': 'kgateway' }[overlay],
          );
          if (overlay === 'epp/istio') {
            const dr = objs.find((o) => o.kind === 'DestinationRule') as K8sObject & {
              spec: { host: string; trafficPolicy: { tls: { mode: string; insecureSkipVerify: boolean } } };
            };
            expect(dr.spec.host).toBe(`${svc.metadata.name}.kvroute.svc.cluster.local`);
            expect(dr.spec.trafficPolicy.tls).toEqual({ mode: 'SIMPLE', insecureSkipVerify: true });
          }
        });
      }
    });
  }

  it('the validators refuse what they should: a bad field type, a missing required field, a bad pool', () => {
    const [router] = kustomize(join(DEPLOY, 'standalone')).filter((o) => o.kind === 'Deployment');
    const broken = structuredClone(router) as K8sObject & {
      spec: { replicas: unknown; template: { spec: { containers: { ports: unknown[] }[] } } };
    };
    broken.spec.replicas = 'two';
    broken.spec.template.spec.containers[0].ports = [{ name: 'http' }];
    expect(validate(broken).join(' ')).toMatch(/replicas must be integer/);
    expect(validate(broken).join(' ')).toMatch(/containerPort/);
    const [pool] = kustomize(join(DEPLOY, 'epp/istio')).filter((o) => o.kind === 'InferencePool');
    const badPool = structuredClone(pool) as K8sObject & { spec: Record<string, unknown> };
    badPool.spec.targetPorts = [{ number: 70000 }];
    delete badPool.spec.endpointPickerRef;
    expect(validate(badPool).join(' ')).toMatch(/must have required property 'endpointPickerRef'/);
    expect(validate(badPool).join(' ')).toMatch(/targetPorts\/0\/number must be <= 65535/);
    expect(validate({ apiVersion: 'example.com/v1', kind: 'Widget', metadata: { name: 'w' } })).toEqual([
      'no schema for example.com/v1/Widget',
    ]);
  });
});
