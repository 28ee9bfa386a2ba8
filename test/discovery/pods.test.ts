/** The pure side of Kubernetes discovery: selectors, InferencePool specs (both groups), pod verdicts, worker diffs. */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { BadObject, diffWorkers, podVerdict, poolTarget, specKey } from '../../src/discovery/k8s/pods.ts';
import { matchesSelector, parseLabelSelector } from '../../src/config/k8s.ts';
import { workerFromUnknown } from '../../src/config/worker-spec.ts';
import { resolveServeConfig } from '../../src/config/serve.ts';
import { SettingError } from '../../src/config/settings.ts';
import { pod } from '../fixtures/k8s-api.ts';

const DEFAULTS = { ports: [8000], eventsPort: 5557, replayPort: 5558 };
const all = parseLabelSelector('app=vllm');

function bad(fn: () => unknown): BadObject {
  try {
    fn();
  } catch (err) {
    if (err instanceof BadObject) return err;
    throw err;
  }
  throw new Error('expected a BadObject');
}

describe('label selectors', () => {
  it('parses equality and existence terms, matches like the apiserver, refuses set-based and malformed terms', () => {
    const s = parseLabelSelector('app = vllm, tier!=batch,gpu,!canary,llm-d.ai/role==decode');
    expect(s.text).toBe('app=vllm,tier!=batch,gpu,!canary,llm-d.ai/role=decode');
    const base = { app: 'vllm', gpu: 'h100', 'llm-d.ai/role': 'decode' };
    expect(matchesSelector(s, base)).toBe(true);
    expect(matchesSelector(s, { ...base, tier: 'batch' })).toBe(false);
    expect(matchesSelector(s, { ...base, tier: 'online' })).toBe(true);
    expect(matchesSelector(s, { ...base, canary: '' })).toBe(false);
    expect(matchesSelector(s, { app: 'vllm', 'llm-d.ai/role': 'decode' })).toBe(false); // no gpu label
    expect(() => parseLabelSelector('app in (a,b)')).toThrow(/set-based/);
    expect(() => parseLabelSelector('app=,')).toThrow(/empty term/);
    expect(() => parseLabelSelector('-bad=x')).toThrow(/bad label key/);
    expect(() => parseLabelSelector('app=has space')).toThrow(/bad label selector term/);
  });
});

describe('InferencePool specs', () => {
  it('reads v1 (selector.matchLabels, targetPorts) and v1alpha2 (selector, targetPortNumber)', () => {
    const v1 = poolTarget(
      { spec: { selector: { matchLabels: { b: '2', a: '1' } }, targetPorts: [{ number: 8000 }], endpointPickerRef: { name: 'epp' } } },
      'inference.networking.k8s.io',
    );
    expect(v1).toEqual({ selector: expect.objectContaining({ text: 'a=1,b=2' }), ports: [8000], appProtocol: 'http' });
    const alpha = poolTarget({ spec: { selector: { app: 'x' }, targetPortNumber: 9000 } }, 'inference.networking.x-k8s.io');
    expect(alpha.ports).toEqual([9000]);
    expect(alpha.selector.text).toBe('app=x');
  });

  it('v1 target ports: up to 8, each an endpoint (GIE api/v1/inferencepool_types.go @84436a96b9e6); appProtocol http or kubernetes.io/h2c', () => {
    const g = 'inference.networking.k8s.io' as const;
    const spec = (extra: Record<string, unknown>) => ({ spec: { selector: { matchLabels: { app: 'x' } }, ...extra } });
    const many = poolTarget(
      spec({ targetPorts: [{ number: 8000 }, { number: 8001 }, { number: 8002 }], appProtocol: 'kubernetes.io/h2c' }),
      g,
    );
    expect(many).toMatchObject({ ports: [8000, 8001, 8002], appProtocol: 'h2c' });
    const nine = Array.from({ length: 9 }, (_, i) => ({ number: 8000 + i }));
    expect(bad(() => poolTarget(spec({ targetPorts: nine }), g)).message).toMatch(/more than 8/);
    expect(bad(() => poolTarget(spec({ targetPorts: [{ number: 1 }, { number: 1 }] }), g)).message).toMatch(/twice/);
    expect(bad(() => poolTarget(spec({ targetPorts: [{ number: 1 }], appProtocol: 'grpc' }), g)).reason).toBe('bad_pool_spec');
  });

  it('refuses malformed specs with a reason', () => {
    const g = 'inference.networking.k8s.io' as const;
    expect(bad(() => poolTarget('pool', g)).reason).toBe('not_an_object');
    expect(bad(() => poolTarget({}, g)).reason).toBe('bad_pool_spec');
    expect(bad(() => poolTarget({ spec: { selector: { app: 'x' }, targetPorts: [{ number: 1 }] } }, g)).message).toMatch(/matchLabels/);
    expect(bad(() => poolTarget({ spec: { selector: { matchLabels: { a: 'b' } }, targetPorts: [] } }, g)).message).toMatch(/targetPorts/);
    expect(bad(() => poolTarget({ spec: { selector: { matchLabels: { a: 'b' } }, targetPorts: [{ number: 70000 }] } }, g)).reason).toBe(
      'bad_pool_spec',
    );
    expect(bad(() => poolTarget({ spec: { selector: { matchLabels: { a: 5 } }, targetPorts: [{ number: 1 }] } }, g)).reason).toBe(
      'bad_pool_spec',
    );
    expect(bad(() => poolTarget({ spec: { selector: { app: 'x' } } }, 'inference.networking.x-k8s.io')).message).toMatch(
      /targetPortNumber/,
    );
  });
});

describe('pod verdicts', () => {
  it('a ready, selected pod is a worker with the documented defaults; the spec passes the admin API schema', () => {
    const v = podVerdict(pod('vllm-0', { labels: { app: 'vllm' }, ip: '10.0.0.7' }), all, DEFAULTS);
    expect(v).toEqual({
      kind: 'worker',
      specs: [{ id: 'vllm-0', url: 'http://10.0.0.7:8000', events: 'tcp://10.0.0.7:5557', replay: 'tcp://10.0.0.7:5558' }],
    });
    if (v.kind === 'worker') expect(workerFromUnknown(v.specs[0])).toMatchObject({ id: 'vllm-0', url: 'http://10.0.0.7:8000' });
    // The pool's target port replaces the default; the annotation wins over both.
    const pooled = podVerdict(pod('a', { labels: { app: 'vllm' } }), all, DEFAULTS, { ports: [9000] });
    expect(pooled.kind === 'worker' && pooled.specs.map((x) => x.url)).toEqual(['http://127.0.0.1:9000']);
    const annotated = podVerdict(pod('a', { labels: { app: 'vllm' }, annotations: { 'kvroute.io/port': '7000' } }), all, DEFAULTS, {
      ports: [9000, 9001],
    });
    expect(annotated.kind === 'worker' && annotated.specs.map((x) => x.url)).toEqual(['http://127.0.0.1:7000']);
  });

  it('one worker per target port (podIP:port), with the engine on port i using events, replay and bootstrap ports offset by i', () => {
    const v = podVerdict(
      pod('dp-0', {
        labels: { app: 'vllm', 'llm-d.ai/role': 'prefill' },
        ip: '10.0.0.9',
        annotations: { 'kvroute.io/dp': '2', 'sglang.ai/bootstrap-port': '8998', 'kvroute.io/replay-port': '5600' },
      }),
      all,
      DEFAULTS,
      { ports: [8000, 8001, 8002], appProtocol: 'h2c' },
    );
    if (v.kind !== 'worker') throw new Error('not a worker');
    expect(v.warning).toBeUndefined();
    expect(v.specs.map((x) => [x.id, x.url, x.events, x.replay, x.bootstrap, x.appProtocol])).toEqual([
      ['dp-0-8000', 'http://10.0.0.9:8000', 'tcp://10.0.0.9:5557', 'tcp://10.0.0.9:5600', 8998, 'h2c'],
      ['dp-0-8001', 'http://10.0.0.9:8001', 'tcp://10.0.0.9:5559', 'tcp://10.0.0.9:5602', 8999, 'h2c'],
      ['dp-0-8002', 'http://10.0.0.9:8002', 'tcp://10.0.0.9:5561', 'tcp://10.0.0.9:5604', 9000, 'h2c'],
    ]);
    for (const x of v.specs) expect(workerFromUnknown(x)).toEqual(x);
  });

  it("drops replay, with a warning naming the fix, when the ranks' events and replay ports would meet (the defaults 5557/5558 with dp 2)", () => {
    const v = podVerdict(pod('dp-2', { labels: { app: 'vllm' }, ip: '10.0.0.11', annotations: { 'kvroute.io/dp': '2' } }), all, DEFAULTS);
    if (v.kind !== 'worker') throw new Error('not a worker');
    expect(v.specs.map((x) => [x.events, x.replay])).toEqual([['tcp://10.0.0.11:5557', undefined]]);
    expect(v.warning).toBe(
      'its 2 events ports (5557-5558) and replay ports (5558-5559) overlap: replay is off for it; set kvroute.io/replay-port (or --k8s-replay-port) to 5559 or more, or 0',
    );
    // One engine of one rank: 5557 and 5558 do not meet, replay stays.
    const one = podVerdict(pod('a', { labels: { app: 'vllm' }, ip: '10.0.0.12' }), all, DEFAULTS);
    expect(one.kind === 'worker' && [one.specs[0].replay, one.warning]).toEqual(['tcp://10.0.0.12:5558', undefined]);
  });

  it("selected by label, every --k8s-port is a worker too (the reference picker's --endpoint-target-ports), as a pool's ports are", () => {
    const v = podVerdict(pod('dp-1', { labels: { app: 'vllm' }, ip: '10.0.0.10' }), all, { ...DEFAULTS, ports: [8000, 8001] });
    if (v.kind !== 'worker') throw new Error('not a worker');
    expect(v.specs.map((x) => [x.id, x.url, x.events])).toEqual([
      ['dp-1-8000', 'http://10.0.0.10:8000', 'tcp://10.0.0.10:5557'],
      ['dp-1-8001', 'http://10.0.0.10:8001', 'tcp://10.0.0.10:5558'],
    ]);
  });

  it("llm-d's roles (docs/disaggregation.md @520af47896e5): prefill-decode and the deprecated both are aggregated; encode alone is no target", () => {
    const role = (label: string) => {
      const v = podVerdict(pod('a', { labels: { app: 'vllm', 'llm-d.ai/role': label } }), all, DEFAULTS);
      return v.kind === 'worker' ? (v.specs[0].role ?? 'aggregated') : v.reason;
    };
    expect(role('prefill')).toBe('prefill');
    expect(role('decode')).toBe('decode');
    expect(role('prefill-decode')).toBe('both');
    expect(role('both')).toBe('both');
    expect(role('encode-prefill')).toBe('prefill');
    expect(role('encode-decode')).toBe('decode');
    expect(role('encode-prefill-decode')).toBe('both');
    expect(role('encode')).toBe('encode_only');
    for (const label of ['leader', 'prefill-prefill', 'decode-', '']) {
      expect(bad(() => podVerdict(pod('a', { labels: { app: 'vllm', 'llm-d.ai/role': label } }), all, DEFAULTS)).reason).toBe('bad_label');
    }
  });

  it('TensorRT-LLM pods: engine trtllm, and the disagg-id / ctx-usage annotations', () => {
    const v = podVerdict(
      pod('t', {
        labels: { app: 'vllm' },
        annotations: { 'kvroute.io/engine': 'trtllm', 'kvroute.io/disagg-id': 'off', 'kvroute.io/ctx-usage': 'on' },
      }),
      all,
      DEFAULTS,
    );
    expect(v.kind === 'worker' && v.specs[0]).toMatchObject({ engine: 'trtllm', disaggId: 'off', ctxUsage: 'on' });
    expect(
      bad(() => podVerdict(pod('t', { labels: { app: 'vllm' }, annotations: { 'kvroute.io/disagg-id': 'maybe' } }), all, DEFAULTS)).reason,
    ).toBe('bad_annotation');
  });

  it('reads role, engine, bootstrap port, dp, models, blocks; events-port 0 means approximate mode; IPv6 is bracketed', () => {
    const v = podVerdict(
      pod('sg-0', {
        labels: { app: 'vllm', 'llm-d.ai/role': 'prefill' },
        ip: 'fd00::7',
        annotations: {
          'sglang.ai/bootstrap-port': '8998',
          'kvroute.io/dp': '2',
          'kvroute.io/model': 'Qwen/Qwen3-8B, lora-a',
          'kvroute.io/blocks': '4096',
          'kvroute.io/events-port': '0',
        },
      }),
      all,
      DEFAULTS,
    );
    expect(v).toEqual({
      kind: 'worker',
      specs: [
        {
          id: 'sg-0',
          url: 'http://[fd00::7]:8000',
          dp: 2,
          models: ['Qwen/Qwen3-8B', 'lora-a'],
          blocks: 4096,
          engine: 'sglang',
          role: 'prefill',
          bootstrap: 8998,
        },
      ],
    });
  });

  it('unready, terminating, IP-less and unselected pods are absent, with the reason', () => {
    const reason = (o: unknown) => {
      const v = podVerdict(o, all, DEFAULTS);
      return v.kind === 'absent' ? v.reason : 'worker';
    };
    expect(reason(pod('a', { labels: { app: 'vllm' }, ready: false }))).toBe('not_ready');
    expect(reason(pod('a', { labels: { app: 'web' } }))).toBe('not_selected');
    expect(reason(pod('a', { labels: { app: 'vllm' }, ip: '' }))).toBe('no_ip');
    const terminating = pod('a', { labels: { app: 'vllm' } });
    (terminating.metadata as Record<string, unknown>).deletionTimestamp = '2026-12-01T00:00:00Z';
    expect(reason(terminating)).toBe('terminating');
    const pending = pod('a', { labels: { app: 'vllm' } });
    (pending.status as Record<string, unknown>).phase = 'Pending';
    expect(reason(pending)).toBe('not_ready');
    expect(reason({ metadata: { name: 'a', labels: { app: 'vllm' } } })).toBe('not_ready'); // no status at all
  });

  it('malformed pods are BadObjects with a bounded reason, never exceptions of another kind', () => {
    const r = (o: unknown) => bad(() => podVerdict(o, all, DEFAULTS)).reason;
    expect(r(null)).toBe('not_an_object');
    expect(r({ metadata: {} })).toBe('no_name');
    expect(r({ metadata: { name: 'a b' } })).toBe('no_name');
    expect(r({ metadata: { name: 'a', labels: 'app=vllm' } })).toBe('bad_label');
    expect(r({ metadata: { name: 'a', labels: { app: 3 } } })).toBe('bad_label');
    expect(r(pod('a', { labels: { app: 'vllm', 'llm-d.ai/role': 'leader' } }))).toBe('bad_label');
    for (const annotations of <Record<string, string>[]>[
      { 'kvroute.io/port': '0' },
      { 'kvroute.io/port': '65536' },
      { 'kvroute.io/events-port': '55x' },
      { 'kvroute.io/dp': '0' },
      { 'kvroute.io/blocks': '-1' },
      { 'kvroute.io/engine': 'tgi' }, // not a registered engine (trtllm is: test/engines/registry.test.ts)
      { 'sglang.ai/bootstrap-port': 'auto' },
    ]) {
      expect(r(pod('a', { labels: { app: 'vllm' }, annotations }))).toBe('bad_annotation');
    }
  });
});

describe('worker diffs', () => {
  it('adds new workers, removes gone ones, and replaces a worker whose spec changed', () => {
    const a = { id: 'a', url: 'http://10.0.0.1:8000' };
    const b = { id: 'b', url: 'http://10.0.0.2:8000' };
    const applied = new Map([
      ['a', specKey(a)],
      ['b', specKey(b)],
    ]);
    const moved = { ...b, url: 'http://10.0.0.9:8000' };
    const c = { id: 'c', url: 'http://10.0.0.3:8000', role: 'decode' as const };
    const diff = diffWorkers(
      applied,
      new Map([
        ['b', moved],
        ['c', c],
      ]),
    );
    expect(diff.remove).toEqual(['a', 'b']);
    expect(diff.add).toEqual([moved, c]);
    expect(
      diffWorkers(
        applied,
        new Map([
          ['a', a],
          ['b', b],
        ]),
      ),
    ).toEqual({ remove: [], add: [] });
  });
});

describe("--k8s-port: the engines' ports of a selected pod", () => {
  const refused = async (p: Promise<unknown>) => {
    const err = await p.then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(SettingError);
    return (err as Error).message;
  };

  it('one port or several, from a flag, the environment or a config file (a single number there too)', async () => {
    expect((await resolveServeConfig({})).config.k8sPort).toEqual([8000]);
    expect((await resolveServeConfig({ flags: { k8sPort: ['8000,8001', '8002'] } })).config.k8sPort).toEqual([8000, 8001, 8002]);
    expect((await resolveServeConfig({ env: { KVROUTE_K8S_PORT: '9000' } })).config.k8sPort).toEqual([9000]);
    const dir = mkdtempSync(join(tmpdir(), 'kvroute-k8s-port-'));
    writeFileSync(join(dir, 'one.yaml'), 'k8sPort: 8100\n');
    writeFileSync(join(dir, 'two.yaml'), 'k8sPort: [8100, 8101]\n');
    expect((await resolveServeConfig({ configPath: join(dir, 'one.yaml') })).config.k8sPort).toEqual([8100]);
    expect((await resolveServeConfig({ configPath: join(dir, 'two.yaml') })).config.k8sPort).toEqual([8100, 8101]);
  });

  it('refuses a bad port, a port twice and more than an InferencePool allows, in one line naming the setting', async () => {
    for (const bad of ['0', '8000,x', '8000,8000', '1,2,3,4,5,6,7,8,9']) {
      const message = await refused(resolveServeConfig({ flags: { k8sPort: [bad] } }));
      expect(message).toMatch(/^--k8s-port \(KVROUTE_K8S_PORT\)/);
      expect(message).not.toContain('\n');
    }
  });
});
