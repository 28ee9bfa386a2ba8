/**
 * vLLM production-stack routers (vllm-project/production-stack src/vllm_router/routers/routing_logic.py @a6c01db0):
 *
 * `ps-prefixaware`: a trie of the prefixes the router sent each endpoint (no eviction: "we do not consider the eviction
 *   of prefix cache"); uniform random among the endpoints holding the longest match, all endpoints when nothing
 *   matches (--prefix-min-match-length 0). No load term.
 * `ps-kvaware`: asks the LMCache controller which instance holds the longest cached prefix and how many tokens; if
 *   none, or matched < prompt - 2000 (--kv-aware-threshold), the endpoint with the fewest requests in the last 60 s;
 *   otherwise that instance. No load term. Here the controller's answer is the event index (what the engines hold).
 * Simplifications: the trie hashes 128-character chunks, here router blocks of token ids; the session hash ring of
 * kvaware's fallback is not modelled (the league runs peers without session ids); QPS ties are broken at random.
 */
import type { Policy, PolicyContext, Ranking } from '../policy.ts';
import { argminUniform, OwnIndex, withFirst } from './own-index.ts';

export const PS = { kvAwareThreshold: 2000, qpsWindowMs: 60_000 } as const;

export class PsPrefixAwarePolicy implements Policy {
  readonly name = 'ps-prefixaware';
  readonly overlay = false;
  private readonly trie = new OwnIndex({ group: 1 });

  rank(ctx: PolicyContext): Ranking {
    const n = ctx.candidates.length;
    const matched = ctx.candidates.map((c) => this.trie.match(c.key, ctx.seqHashes));
    const best = Math.max(...matched);
    const pool = [...Array(n).keys()].filter((i) => matched[i] === best);
    const pick = pool[Math.floor(ctx.rng() * pool.length)];
    return { order: withFirst(n, pick, (i) => -matched[i]), costs: matched.map((m) => -m) };
  }

  routed(ctx: PolicyContext, chosen: number): void {
    this.trie.record(ctx.candidates[chosen].key, ctx.seqHashes);
  }
}

export class PsKvAwarePolicy implements Policy {
  readonly name = 'ps-kvaware';
  readonly overlay = false;
  /** Routing times per endpoint within the QPS window. */
  private readonly recent = new Map<string, number[]>();

  private qps(key: string, now: number): number {
    const times = this.recent.get(key);
    if (!times) return 0;
    while (times.length > 0 && now - times[0] > PS.qpsWindowMs) times.shift();
    return times.length;
  }

  rank(ctx: PolicyContext): Ranking {
    const n = ctx.candidates.length;
    const now = ctx.now ?? 0;
    let holder = -1;
    for (let i = 0; i < n; i++) {
      const ov = ctx.candidates[i].overlapBlocks;
      if (ov > 0 && (holder < 0 || ov > ctx.candidates[holder].overlapBlocks)) holder = i;
    }
    const qps = ctx.candidates.map((c) => this.qps(c.key, now));
    let pick = holder;
    if (holder < 0 || ctx.candidates[holder].overlapBlocks * ctx.blockSize < ctx.promptTokens - PS.kvAwareThreshold) {
      pick = argminUniform(n, (i) => qps[i], ctx.rng);
    }
    return { order: withFirst(n, pick, (i) => qps[i]), costs: qps };
  }

  routed(ctx: PolicyContext, chosen: number): void {
    const key = ctx.candidates[chosen].key;
    let times = this.recent.get(key);
    if (!times) {
      times = [];
      this.recent.set(key, times);
    }
    times.push(ctx.now ?? 0);
  }
}
