/**
 * The reference picker's command line and plugin configuration in kvroute's terms (src/epp/reference.ts,
 * src/epp/picker-config.ts): flags renamed, switches in the reference's `--flag=false` form, unknown flags (with or
 * without a value) set aside for one log line, the verbosity mapped; plugin configurations mapped to a policy, and
 * nothing ever throws. Flag names from llm-d/llm-d-router pkg/epp/server/options.go @ebab6879; the configurations are
 * the ones llm-d's repositories ship (docs/endpoint-picker.md names them).
 */
import { describe, expect, it } from 'vitest';
import { mapPickerConfig } from '../../src/epp/picker-config.ts';
import { startsAsPicker, translateReferenceArgs } from '../../src/epp/reference.ts';

const own: Record<string, boolean> = {
  '--port': true,
  '--log-level': true,
  '--k8s-namespace': true,
  '--config-file': true,
  '--no-remote-tokenize': false,
};
const known = { takesValue: (f: string) => own[f] };

describe('translateReferenceArgs', () => {
  it('renames, maps switches and verbosity, and sets aside what kvroute has no setting for', () => {
    const t = translateReferenceArgs(
      [
        '--pool-name',
        'qwen',
        '--grpc-port=9102',
        '--secure-serving=false',
        '--metrics-endpoint-auth=false',
        '--v=4',
        '--tracing=false',
        '--total-queued-requests-metric="sglang:num_queue_reqs"',
        '--lora-info-metric',
        '',
        '--some-new-flag',
        'value',
        '--no-remote-tokenize',
        '--config-file',
        '/config/x.yaml',
        '--endpoint-target-ports',
        '8000,8001',
      ],
      known,
      { NAMESPACE: 'ns1' },
    );
    expect(t.argv).toEqual([
      '--k8s-pool',
      'qwen',
      '--port',
      '9102',
      '--no-secure-serving',
      '--metrics-auth',
      'none',
      '--no-remote-tokenize',
      '--config-file',
      '/config/x.yaml',
      '--k8s-port',
      '8000,8001',
      '--log-level',
      'debug',
      '--k8s-namespace',
      'ns1',
    ]);
    expect(t.ignored).toEqual([
      '--tracing=false',
      '--total-queued-requests-metric="sglang:num_queue_reqs"',
      '--lora-info-metric=',
      '--some-new-flag=value',
    ]);
    // Every target port is an endpoint, as in a pool: no port is set aside.
    expect(t.notes.join(' ')).not.toContain('8001');
  });

  it('an explicit --log-level or namespace wins over -v and $NAMESPACE', () => {
    const t = translateReferenceArgs(['-v', '5', '--log-level', 'warn', '--pool-namespace', 'a'], known, { NAMESPACE: 'b' });
    expect(t.argv).toEqual(['--log-level', 'warn', '--k8s-namespace', 'a']);
  });

  it('a command line that starts with a picker flag is the picker’s; kvroute’s own commands are not', () => {
    expect(startsAsPicker(['--pool-name', 'x'])).toBe(true);
    expect(startsAsPicker(['--config-file=/c.yaml'])).toBe(true);
    expect(startsAsPicker(['serve', '--pool-name', 'x'])).toBe(false);
    expect(startsAsPicker(['--help'])).toBe(false);
    expect(startsAsPicker([])).toBe(false);
  });
});

describe('mapPickerConfig', () => {
  const policies = ['kv-pressure', 'kv', 'least-loaded', 'random'];

  it("llm-d's optimized baseline maps to the peer policy when registered, else to kv", () => {
    const yaml = `kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
- type: inflight-load-producer
- type: prefix-cache-affinity-filter
- type: token-load-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: token-load-scorer
`;
    expect(mapPickerConfig(yaml, policies).policy).toBe('kv');
    expect(mapPickerConfig(yaml, [...policies, 'llmd-baseline']).policy).toBe('llmd-baseline');
  });

  it('the precise-prefix guide (2:1:1) maps to kv-pressure and says the weights are not kept', () => {
    const m = mapPickerConfig(
      `plugins:
- type: precise-prefix-cache-scorer
  parameters: { indexerConfig: {} }
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: lora-affinity-scorer
schedulingProfiles:
- name: default
  plugins:
  - { pluginRef: precise-prefix-cache-scorer, weight: 2 }
  - { pluginRef: kv-cache-utilization-scorer, weight: 1 }
  - { pluginRef: queue-scorer, weight: 1 }
`,
      policies,
    );
    expect(m.policy).toBe('kv-pressure');
    expect(m.ignored.join('; ')).toContain('plugin lora-affinity-scorer');
    expect(m.ignored.join('; ')).toContain('precise-prefix-cache-scorer parameters');
    expect(m.ignored.join('; ')).toContain('scorer weights');
  });

  it('load-only and unknown configurations; bad YAML and non-mappings never throw', () => {
    expect(mapPickerConfig('plugins: [{type: active-request-scorer}]', policies).policy).toBe('least-loaded');
    const unknown = mapPickerConfig('plugins: [{type: my-scorer}]', policies);
    expect(unknown.policy).toBeUndefined();
    expect(unknown.ignored).toEqual(['plugin my-scorer']);
    expect(mapPickerConfig('{{{', policies).ignored[0]).toMatch(/^the whole file/);
    expect(mapPickerConfig('- a\n- b', policies).ignored).toEqual(['the whole file (not a mapping)']);
    expect(mapPickerConfig('', policies).policy).toBeUndefined();
  });
});
