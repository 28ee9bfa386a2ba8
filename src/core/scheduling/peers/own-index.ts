/**
 * What peer routers without KV events know about the engines' caches: the prefixes they sent each engine themselves
 * (an approximate index that learns only from its own decisions and forgets by its own rule: LRU capacity or TTL).
 * Keys are the request's chained sequence hashes taken every `group` router blocks, so one key names the whole prefix
 * up to a peer block (llm-d's 64-token blocks are every 4th hash at 16-token router blocks).
 */
import type { Rng } from '../../rng.ts';

export interface OwnIndexOptions {
  /** Router blocks per peer block (>= 1). */
  readonly group: number;
  /** Keys kept per source, least recently used dropped first. Default unbounded. */
  readonly capacity?: number;
  /** A key not used for this long no longer matches, ms. Default never. */
  readonly ttlMs?: number;
}

export class OwnIndex {
  private readonly bySource = new Map<string, Map<bigint, number>>();
  readonly group: number;

  constructor(private readonly opts: OwnIndexOptions) {
    this.group = Math.max(1, Math.floor(opts.group));
  }

  /** The request's peer-block keys (complete peer blocks only). */
  keys(seqHashes: BigUint64Array): bigint[] {
    const out: bigint[] = [];
    for (let i = this.group - 1; i < seqHashes.length; i += this.group) out.push(seqHashes[i]);
    return out;
  }

  /** Leading keys `source` holds (live ones, under a TTL). */
  match(source: string, keys: ArrayLike<bigint>, now = 0): number {
    const m = this.bySource.get(source);
    if (!m) return 0;
    const ttl = this.opts.ttlMs;
    let k = 0;
    while (k < keys.length) {
      const at = m.get(keys[k]);
      if (at === undefined || (ttl !== undefined && now - at > ttl)) break;
      k++;
    }
    return k;
  }

  /** The source was sent these keys: each is now its most recently used. */
  record(source: string, keys: Iterable<bigint>, now = 0): void {
    let m = this.bySource.get(source);
    if (!m) {
      m = new Map();
      this.bySource.set(source, m);
    }
    for (const key of keys) {
      m.delete(key);
      m.set(key, now);
    }
    const cap = this.opts.capacity;
    if (cap !== undefined) {
      for (const key of m.keys()) {
        if (m.size <= cap) break;
        m.delete(key);
      }
    }
  }

  size(source: string): number {
    return this.bySource.get(source)?.size ?? 0;
  }
}

/** Router blocks per peer block of `peerTokens` tokens (at least one router block). */
export function groupFor(peerTokens: number, blockSize: number): number {
  return Math.max(1, Math.round(peerTokens / blockSize));
}

/** Candidate indices with the smallest key; uniform random among them. */
export function argminUniform(n: number, key: (i: number) => number, rng: Rng, among?: readonly number[]): number {
  const pool = among ?? Array.from({ length: n }, (_, i) => i);
  let best = Infinity;
  let pick = -1;
  let ties = 0;
  for (const i of pool) {
    const k = key(i);
    if (k < best) {
      best = k;
      pick = i;
      ties = 1;
    } else if (k === best && rng() * ++ties < 1) pick = i; // reservoir sampling: uniform among exact ties
  }
  return pick;
}

/** `first`, then the other candidates by ascending `key` (the order retries take). */
export function withFirst(n: number, first: number, key: (i: number) => number): number[] {
  const rest = Array.from({ length: n }, (_, i) => i).filter((i) => i !== first);
  rest.sort((a, b) => key(a) - key(b) || a - b);
  return [first, ...rest];
}
