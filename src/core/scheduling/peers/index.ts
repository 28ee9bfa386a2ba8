/**
 * Peer routers' default decisions as kvroute policies (docs/routing.md, "Peer policies"), each in its own file with its
 * source cited. A fresh object per router: several keep state (their own approximate index, request counts).
 */
import type { Policy } from '../policy.ts';
import { AibrixPolicy } from './aibrix.ts';
import { DYNAMO } from './dynamo.ts';
import { LlmdBaselinePolicy, LlmdPolicy } from './llmd.ts';
import { PsKvAwarePolicy, PsPrefixAwarePolicy } from './production-stack.ts';
import { SmgLegacyPolicy, SmgPolicy } from './smg.ts';

export const PEER_POLICY_NAMES = [
  'dynamo',
  'llmd',
  'llmd-baseline',
  'smg',
  'smg-legacy',
  'aibrix',
  'ps-kvaware',
  'ps-prefixaware',
] as const;

export function createPeerPolicy(name: string): Policy | undefined {
  switch (name) {
    case 'dynamo':
      return DYNAMO;
    case 'llmd':
      return new LlmdPolicy();
    case 'llmd-baseline':
      return new LlmdBaselinePolicy();
    case 'smg':
      return new SmgPolicy();
    case 'smg-legacy':
      return new SmgLegacyPolicy();
    case 'aibrix':
      return new AibrixPolicy();
    case 'ps-kvaware':
      return new PsKvAwarePolicy();
    case 'ps-prefixaware':
      return new PsPrefixAwarePolicy();
    default:
      return undefined;
  }
}
