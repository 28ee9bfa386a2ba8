/**
 * The policy registry: every policy a router can run, by name. Policy names, the settings' choices, per-request
 * validation, /debug/state and the docs' policy table all come from here. A new policy is one file exporting a
 * PolicyEntry and one line in POLICY_REGISTRY below.
 */
import { BUILT_IN_POLICIES, PD_DECODE_POLICY, PD_PREFILL_POLICY } from './policies.ts';
import { PEER_POLICIES } from './peers/index.ts';
import type { Policy, PolicyDescription, PolicyEntry } from './policy.ts';

export { PD_DECODE_POLICY, PD_PREFILL_POLICY };

export const POLICY_REGISTRY: readonly PolicyEntry[] = [
  ...BUILT_IN_POLICIES,
  // Peer routers' defaults (scheduling/peers/): one entry each.
  ...PEER_POLICIES,
];

const BY_NAME = new Map(POLICY_REGISTRY.map((e) => [e.name, e]));
if (BY_NAME.size !== POLICY_REGISTRY.length) throw new Error('two registered policies share a name');

/** The names a request or the settings may choose (P/D leg policies are the Dispatcher's). */
export const POLICY_NAMES = POLICY_REGISTRY.filter((e) => e.leg === undefined).map((e) => e.name) as unknown as readonly [
  string,
  ...string[],
];
export const DEFAULT_POLICY = 'kv-pressure';
/** What `kvroute sim` compares when not told: the default, the prefix-only kv policy and a load-blind baseline. */
export const COMPARED_POLICIES: readonly string[] = [DEFAULT_POLICY, 'kv', 'round-robin'];
export type PolicyName = string;

export function isPolicyName(name: string): boolean {
  return BY_NAME.has(name);
}

/** Whether a request or the settings may name this policy. */
export function isSelectablePolicy(name: string): boolean {
  const e = BY_NAME.get(name);
  return e !== undefined && e.leg === undefined;
}

export function unknownPolicyMessage(name: string): string {
  return `unknown policy "${name}"; known: ${POLICY_NAMES.join(', ')}`;
}

export function createPolicy(name: string): Policy {
  const e = BY_NAME.get(name);
  if (!e) throw new RangeError(unknownPolicyMessage(name));
  return e.create();
}

/** A policy's stages and formula; plug-ins without describe() show their name only. */
export function describePolicy(p: Policy): PolicyDescription {
  return p.describe?.() ?? { name: p.name, cost: '(plug-in)', scorers: [], picker: { name: '(plug-in)', formula: '' } };
}

export interface PolicyRow extends PolicyDescription {
  readonly summary: string;
  readonly leg?: 'prefill' | 'decode';
  readonly loadOrdered: boolean;
}

/** Every registered policy with its formula, in registry order (docs table, /debug/state). */
export function describeRegistry(): PolicyRow[] {
  return POLICY_REGISTRY.map((e) => {
    const p = e.create();
    return { ...describePolicy(p), summary: e.summary, ...(e.leg ? { leg: e.leg } : {}), loadOrdered: p.loadOrdered ?? false };
  });
}
