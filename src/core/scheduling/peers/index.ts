/**
 * Peer routers' default decisions as kvroute policies (docs/routing.md, "Peer policies"), each in its own file with its
 * source cited, registered as one registry entry each (registry.ts). A fresh object per router: several keep state
 * (their own approximate index, request counts).
 */
import type { Policy, PolicyDescription, PolicyEntry } from '../policy.ts';
import { AibrixPolicy } from './aibrix.ts';
import { DYNAMO } from './dynamo.ts';
import { LlmdBaselinePolicy, LlmdPolicy } from './llmd.ts';
import { PsKvAwarePolicy, PsPrefixAwarePolicy } from './production-stack.ts';
import { SmgLegacyPolicy, SmgPolicy } from './smg.ts';

const PEER_PICKER = { name: 'peer rule', formula: "the peer's own decision, written out in its cost column" };

/** A peer's rule is not composed from kvroute's scorers: its formula is shown as one line. */
function peer(name: string, summary: string, cost: string, pick: string, make: () => Policy): PolicyEntry {
  const description: PolicyDescription = { name, cost: `${cost}; ${pick}`, scorers: [], picker: PEER_PICKER };
  return {
    name,
    summary,
    create: () => {
      const p = make();
      p.describe = () => description;
      return p;
    },
  };
}

export const PEER_POLICIES: readonly PolicyEntry[] = [
  peer(
    'dynamo',
    "NVIDIA Dynamo's KV router as it ships: no overlay, exact ties at random",
    'max(0, (P + isl)/bs - overlap) + active complete blocks + new complete blocks',
    'min cost, uniform ties',
    () => DYNAMO,
  ),
  peer(
    'llmd',
    "llm-d router's chart profile: queue x2 + KV utilisation x2 + approximate prefix x3, scraped gauges",
    '2 queue + 2 (1 - kv usage) + 3 prefix match (own decisions, 64-token blocks)',
    'max score, uniform ties',
    () => new LlmdPolicy(),
  ),
  peer(
    'llmd-baseline',
    "llm-d 0.8's optimized baseline: prefix-affinity filter at 0.80 unless 18 s behind, then token load",
    '1 - min(1, (in-flight uncached tokens + unmatched tokens) / 4,194,304)',
    'affinity filter, max score',
    () => new LlmdBaselinePolicy(),
  ),
  peer(
    'smg',
    'SGLang model gateway cache_aware (Aug 2026): least-loaded prefix holder above 0.3, spill at 1.5x mean + 64',
    'match rate > 0.3: least in-flight among holders; else least in-flight',
    'spill gate, then argmin',
    () => new SmgPolicy(),
  ),
  peer(
    'smg-legacy',
    'SGLang gateway cache_aware before Aug 2026 (vllm-project/router): global imbalance rule first',
    'imbalanced: least in-flight; match rate > 0.3: the prefix holder; else least in-flight',
    'argmin',
    () => new SmgLegacyPolicy(),
  ),
  peer(
    'aibrix',
    'AIBrix prefix-cache: least running when they differ by > 8, else best match within mean + 1 std',
    'match% desc, running asc, bounded by mean + 1 std of running',
    'first within the bound',
    () => new AibrixPolicy(),
  ),
  peer(
    'ps-kvaware',
    'vLLM production-stack kvaware: the instance with the longest cached prefix, no load term',
    'longest cached prefix (the event index stands in for the LMCache controller)',
    'that instance unless it lacks > 2,000 prompt tokens, else fewest requests in the last 60 s',
    () => new PsKvAwarePolicy(),
  ),
  peer(
    'ps-prefixaware',
    'vLLM production-stack prefixaware: longest prefix the router sent, no eviction, no load term',
    'longest prefix in its own trie',
    'uniform among the longest',
    () => new PsPrefixAwarePolicy(),
  ),
];
