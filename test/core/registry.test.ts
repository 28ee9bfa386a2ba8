/**
 * The policy registry is where names come from: the settings' choices, per-request validation (router and request
 * flow), /debug/state's description, and createPolicy all read it.
 */
import { describe, expect, it } from 'vitest';
import { routingSchema } from '../../src/config/routing.ts';
import { KvRouter } from '../../src/core/router.ts';
import {
  createPolicy,
  DEFAULT_POLICY,
  describeRegistry,
  isSelectablePolicy,
  POLICY_NAMES,
  POLICY_REGISTRY,
  PD_DECODE_POLICY,
  PD_PREFILL_POLICY,
} from '../../src/core/scheduling/registry.ts';

describe('policy registry', () => {
  it('every entry builds a policy of its own name, with a description; P/D legs are registered but not selectable', () => {
    for (const e of POLICY_REGISTRY) {
      const p = createPolicy(e.name);
      expect(p.name).toBe(e.name);
      expect(p.describe?.().name).toBe(e.name);
    }
    expect(POLICY_NAMES).toContain(DEFAULT_POLICY);
    expect(POLICY_NAMES).not.toContain(PD_PREFILL_POLICY);
    expect(isSelectablePolicy(PD_DECODE_POLICY)).toBe(false);
    expect(() => createPolicy(PD_PREFILL_POLICY)).not.toThrow();
    expect(() => createPolicy('nope')).toThrow(/unknown policy "nope"; known: kv-pressure, kv/);
  });

  it('round-robin keeps its turn per instance: each router gets a fresh policy', () => {
    const a = createPolicy('round-robin');
    const b = createPolicy('round-robin');
    expect(a).not.toBe(b);
  });

  it('load-ordered policies are the ones sampled selection may use', () => {
    const rows = describeRegistry();
    const ordered = rows.filter((r) => r.loadOrdered).map((r) => r.name);
    expect(ordered).toEqual(expect.arrayContaining(['kv', 'kv-pressure', 'least-loaded']));
    expect(ordered).not.toContain('round-robin');
    expect(ordered).not.toContain('prefix-hash');
  });

  it("the settings' --policy choices are the registry's selectable names", () => {
    for (const name of POLICY_NAMES) expect(routingSchema.safeParse({ policy: name }).success).toBe(true);
    expect(routingSchema.safeParse({ policy: PD_PREFILL_POLICY }).success).toBe(false);
    expect(routingSchema.safeParse({ policy: 'nope' }).success).toBe(false);
  });

  it('a router refuses an unknown per-request policy with the registry message, and describes the policies it ran', () => {
    const r = new KvRouter({ blockSize: 4 });
    r.addSource({ workerId: 'w', dpRank: 0 }, { mode: 'events' });
    expect(() => r.route({ requestId: 'x', tokens: [1, 2, 3, 4], policy: 'nope' }, 0)).toThrow(/unknown policy "nope"; known:/);
    r.route({ requestId: 'a', tokens: [1, 2, 3, 4], policy: 'kv' }, 0);
    const described = r.state().policies;
    expect(described.map((d) => d.name)).toEqual([DEFAULT_POLICY, 'kv']);
    expect(described[1].cost).toBe('prefillLoadScale * prefill-load + 1 * decode-load');
    expect(described[1].picker.name).toBe('min-cost');
  });
});
