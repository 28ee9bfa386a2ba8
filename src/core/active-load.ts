/**
 * In-flight load per source, from the router's own decisions (docs/protocols.md §5):
 * - prefill tokens (prompt tokens not expected from cache) count from routing until the first output token;
 * - active blocks count from routing until finish; requests sharing a prefix on one source count it once; the
 *   trailing partial block is unique to each request.
 * Requests that never finish (lost clients, crashed shells) are force-freed after a stale limit.
 *
 * No per-block work: a request's blocks form a prefix chain (seq[i] names the whole prefix), so the blocks of q
 * already active on a source are the longest common prefix of q with that source's in-flight requests, and the LCP
 * of two seq-hash arrays is a binary search (equal hashes at block i imply equal hashes at every j < i).
 *
 * The same structure is the predicted overlay: a sibling request sharing a prefix with an in-flight (or just
 * finished) request on a source is credited that prefix before the engine's Stored events arrive. A just finished
 * chain stops crediting what the engine has since said it removed (withdrawRecent, clearRecent: the router calls them
 * from its events).
 */
export interface ActiveRequest {
  readonly requestId: string;
  readonly source: number;
  readonly seqHashes: BigUint64Array;
  /** Blocks counted for this request: full blocks plus a trailing partial one. */
  readonly requestBlocks: number;
  prefillTokens: number;
  readonly startedAt: number;
  firstTokenAt?: number;
}

interface Chain {
  readonly view: Uint32Array;
  readonly blocks: number;
  /**
   * The chain's hash at block `probe` (-1: none yet), kept in the object: the last block a request compared it at.
   * Requests that share a prefix (a system prompt, a conversation) are compared with a source's chains at the same
   * block, the end of what they share, so the next comparison reads these two numbers, not the chain's hash array
   * (a cache and TLB miss per chain, ~30 chains a request on bench:route). Hashes never change, so it is never stale.
   */
  probe: number;
  probeLo: number;
  probeHi: number;
}

/**
 * A finished request's chain in the overlay's grace period. `credit` is the leading blocks it still credits: the
 * engine's removal of one of its blocks cuts it there (withdrawRecent), since a prefix is usable only whole. `blocks`
 * stays the chain's length, as the first-block index counted it.
 */
export interface RecentChain extends Chain {
  credit: number;
  readonly expiresAt: number;
}

interface SourceLoad {
  prefillTokens: number;
  readonly inFlight: Array<ActiveRequest & Chain>;
  /** Distinct full blocks over in-flight requests. */
  distinctBlocks: number;
  /** Trailing partial blocks, one per in-flight request that has one. */
  partialBlocks: number;
  /** Recently finished chains (ring), for the overlay's grace period. */
  readonly recent: RecentChain[];
  recentNext: number;
}

/** What `ActiveLoad.figures` shows of a source's load (its SourceLoad, read-only). */
export interface ActiveFigures {
  readonly prefillTokens: number;
  readonly distinctBlocks: number;
  readonly partialBlocks: number;
  readonly inFlight: readonly unknown[];
}

/** Longest common prefix, in blocks, of two seq-hash chains given as (lo, hi) u32 views. */
export function commonPrefix(a: Uint32Array, an: number, b: Uint32Array, bn: number): number {
  return longerPrefix(a, an, b, bn, 0);
}

/**
 * The longest common prefix of two chains when it is longer than `known` blocks, else `known`: one comparison (at
 * block `known`) settles most chains, and the search starts above `known`. Equal hashes at block i imply equal
 * hashes at every j < i (a seq hash names its whole prefix).
 */
function longerPrefix(a: Uint32Array, an: number, b: Uint32Array, bn: number, known: number): number {
  // Most chains are other conversations or shorter matches: a different block at `known` settles it without a search.
  const k0 = 2 * known;
  if (an <= known || bn <= known || a[k0] !== b[k0] || a[k0 + 1] !== b[k0 + 1]) return known;
  let lo = known + 1;
  let hi = Math.min(an, bn);
  while (lo < hi) {
    const mid = (lo + hi + 1) >>> 1;
    const k = 2 * (mid - 1);
    if (a[k] === b[k] && a[k + 1] === b[k + 1]) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/**
 * longerPrefix of the request `a` (an blocks) and chain `c` (its first `cn` blocks), reading c's hash at block `known`
 * from its probe when it was compared there before.
 */
function chainPrefix(a: Uint32Array, an: number, c: Chain, cn: number, known: number): number {
  if (an <= known || cn <= known) return known;
  const k0 = 2 * known;
  if (c.probe !== known) {
    c.probe = known;
    c.probeLo = c.view[k0];
    c.probeHi = c.view[k0 + 1];
  }
  if (a[k0] !== c.probeLo || a[k0 + 1] !== c.probeHi) return known;
  return longerPrefix(a, an, c.view, cn, known);
}

function maxPrefix(view: Uint32Array, n: number, chains: readonly Chain[], skip?: Chain): number {
  let best = 0;
  for (const c of chains) {
    if (c === skip || best >= n) continue;
    best = chainPrefix(view, n, c, c.blocks, best);
  }
  return best;
}

const NO_CHAINS: readonly RecentChain[] = [];

const u32 = (h: BigUint64Array) => new Uint32Array(h.buffer, h.byteOffset, h.length * 2);

/** A chain's first block as a number (53 of its 64 bits): collisions only add candidates, never lose one. */
const firstKey = (view: Uint32Array): number => view[0] + (view[1] & 0x1fffff) * 4294967296;

export interface ActiveLoadOptions {
  /** How long a finished request still counts in the overlay (covers event delay after finish), ms. */
  readonly graceMs?: number;
  /** Finished chains remembered per source for the grace period. */
  readonly recentPerSource?: number;
  /**
   * Called with a chain's hash view when the active load stops holding it (freed without a grace entry, or its grace
   * entry expired, was replaced or cleared): the router counts its recycled hash buffers' holders with it.
   */
  readonly onRelease?: (view: Uint32Array) => void;
}

/** Recently finished requests the overlay keeps per source, by default (the oldest is replaced by the next). */
export const RECENT_PER_SOURCE = 32;

export class ActiveLoad {
  private readonly requests = new Map<string, ActiveRequest & Chain>();
  private readonly sources = new Map<number, SourceLoad>();
  /**
   * Sources holding an in-flight or recently finished chain, by the chain's first block (with a count per source):
   * selection over thousands of sources looks only at those that can share a prefix with the request.
   */
  private readonly byFirstBlock = new Map<number, Map<number, number>>();
  private readonly graceMs: number;
  private readonly recentPerSource: number;
  private readonly onRelease: (view: Uint32Array) => void;

  constructor(options: ActiveLoadOptions = {}) {
    this.graceMs = options.graceMs ?? 0;
    this.recentPerSource = options.recentPerSource ?? RECENT_PER_SOURCE;
    this.onRelease = options.onRelease ?? (() => {});
  }

  private load(source: number): SourceLoad {
    let s = this.sources.get(source);
    if (!s) {
      s = { prefillTokens: 0, inFlight: [], distinctBlocks: 0, partialBlocks: 0, recent: [], recentNext: 0 };
      this.sources.set(source, s);
    }
    return s;
  }

  private indexChain(source: number, chain: Chain, delta: 1 | -1): void {
    if (chain.blocks === 0) return;
    const k = firstKey(chain.view);
    let m = this.byFirstBlock.get(k);
    if (!m) {
      if (delta < 0) return;
      m = new Map();
      this.byFirstBlock.set(k, m);
    }
    const n = (m.get(source) ?? 0) + delta;
    if (n > 0) m.set(source, n);
    else {
      m.delete(source);
      if (m.size === 0) this.byFirstBlock.delete(k);
    }
  }

  /**
   * Sources with an in-flight or recent chain starting with the same block as `view` (may include false positives),
   * as a map whose keys are those sources; undefined when there are none. Any other source shares no prefix with the
   * request: its activePrefix and predictedPrefix are 0 without looking at its chains.
   */
  firstBlockSharers(view: Uint32Array, blocks: number): ReadonlyMap<number, number> | undefined {
    return blocks === 0 ? undefined : this.byFirstBlock.get(firstKey(view));
  }

  /** Sources with an in-flight or recent chain starting with the same block as `view` (may include false positives). */
  sourcesSharingFirstBlock(view: Uint32Array, blocks: number): Iterable<number> {
    if (blocks === 0) return [];
    return this.byFirstBlock.get(firstKey(view))?.keys() ?? [];
  }

  has(requestId: string): boolean {
    return this.requests.has(requestId);
  }

  get(requestId: string): ActiveRequest | undefined {
    return this.requests.get(requestId);
  }

  add(request: ActiveRequest): void {
    const req = Object.assign(request, {
      view: u32(request.seqHashes),
      blocks: request.seqHashes.length,
      probe: -1,
      probeLo: 0,
      probeHi: 0,
    });
    const s = this.load(req.source);
    s.prefillTokens += req.prefillTokens;
    s.distinctBlocks += req.blocks - maxPrefix(req.view, req.blocks, s.inFlight);
    if (req.requestBlocks > req.blocks) s.partialBlocks++;
    s.inFlight.push(req);
    this.indexChain(req.source, req, 1);
    this.requests.set(req.requestId, req);
  }

  /** Prefill is done: the request's prefill tokens stop counting. Idempotent. */
  firstToken(requestId: string, now: number): ActiveRequest | undefined {
    const req = this.requests.get(requestId);
    if (!req || req.firstTokenAt !== undefined) return req;
    req.firstTokenAt = now;
    this.load(req.source).prefillTokens -= req.prefillTokens;
    return req;
  }

  /** Frees everything the request holds. Returns it, or undefined when unknown (already freed). */
  free(requestId: string, now = -Infinity): ActiveRequest | undefined {
    const req = this.requests.get(requestId);
    if (!req) return undefined;
    this.requests.delete(requestId);
    const s = this.load(req.source);
    if (req.firstTokenAt === undefined) s.prefillTokens -= req.prefillTokens;
    const at = s.inFlight.indexOf(req);
    s.inFlight[at] = s.inFlight[s.inFlight.length - 1];
    s.inFlight.pop();
    this.indexChain(req.source, req, -1);
    s.distinctBlocks -= req.blocks - maxPrefix(req.view, req.blocks, s.inFlight);
    if (req.requestBlocks > req.blocks) s.partialBlocks--;
    if (this.graceMs > 0 && req.blocks > 0 && now > -Infinity) {
      const chain: RecentChain = {
        view: req.view,
        blocks: req.blocks,
        probe: req.probe,
        probeLo: req.probeLo,
        probeHi: req.probeHi,
        credit: req.blocks,
        expiresAt: now + this.graceMs,
      };
      if (s.recent.length < this.recentPerSource) s.recent.push(chain);
      else {
        const old = s.recent[s.recentNext];
        this.indexChain(req.source, old, -1);
        s.recent[s.recentNext] = chain;
        this.onRelease(old.view);
      }
      this.indexChain(req.source, chain, 1);
      s.recentNext = (s.recentNext + 1) % this.recentPerSource;
    } else this.onRelease(req.view);
    return req;
  }

  /**
   * The recently finished chains of `source` still crediting blocks at `now` (the objects themselves, to hand back to
   * withdrawRecent). Empty for most sources: only requests finished less than the grace period ago are kept.
   */
  recentOn(source: number, now: number): readonly RecentChain[] {
    const s = this.sources.get(source);
    if (!s || s.recent.length === 0) return NO_CHAINS;
    const out: RecentChain[] = [];
    for (const c of s.recent) if (c.credit > 0 && c.expiresAt > now) out.push(c);
    return out;
  }

  /**
   * The engine removed block `blocks` (or an earlier one) of a recent chain: the chain credits its first `blocks`
   * blocks at most from now on. It stays in the first-block index until it expires or is replaced (a false positive
   * there costs a look at the source's chains; taking it out and back would churn the index at every finish).
   */
  withdrawRecent(chain: RecentChain, blocks: number): void {
    if (blocks < chain.credit) chain.credit = Math.max(0, blocks);
  }

  /** The source's cache was cleared (engine reset or restart): its recently finished chains credit nothing. */
  clearRecent(source: number): void {
    const s = this.sources.get(source);
    if (!s) return;
    for (const c of s.recent) {
      this.indexChain(source, c, -1);
      this.onRelease(c.view);
    }
    s.recent.length = 0;
    s.recentNext = 0;
  }

  /** Force-frees requests older than `staleMs`; returns their ids. */
  sweep(now: number, staleMs: number): string[] {
    const stale: string[] = [];
    for (const req of this.requests.values()) if (now - req.startedAt > staleMs) stale.push(req.requestId);
    for (const id of stale) this.free(id);
    for (const [source, s] of this.sources) {
      for (let i = s.recent.length - 1; i >= 0; i--) {
        if (s.recent[i].expiresAt > now) continue;
        this.indexChain(source, s.recent[i], -1);
        this.onRelease(s.recent[i].view);
        s.recent.splice(i, 1);
      }
      s.recentNext = s.recent.length % this.recentPerSource;
    }
    return stale;
  }

  /** All requests on a source (when it is removed). */
  requestsOn(source: number): string[] {
    return (this.sources.get(source)?.inFlight ?? []).map((r) => r.requestId);
  }

  removeSource(source: number): void {
    for (const id of this.requestsOn(source)) this.free(id);
    for (const c of this.sources.get(source)?.recent ?? []) {
      this.indexChain(source, c, -1);
      this.onRelease(c.view);
    }
    this.sources.delete(source);
  }

  /**
   * A source's in-flight figures in one lookup (undefined: nothing was ever in flight there): route() reads them for
   * every source of every request. activeBlocks = distinctBlocks + partialBlocks; activeRequests = inFlight.length.
   */
  figures(source: number): ActiveFigures | undefined {
    return this.sources.get(source);
  }

  prefillTokens(source: number): number {
    return this.sources.get(source)?.prefillTokens ?? 0;
  }

  activeBlocks(source: number): number {
    const s = this.sources.get(source);
    return s ? s.distinctBlocks + s.partialBlocks : 0;
  }

  activeRequests(source: number): number {
    return this.sources.get(source)?.inFlight.length ?? 0;
  }

  /** Leading blocks of `seqHashes` already active on `source` (they add no new decode blocks there). */
  activePrefix(source: number, seqHashes: BigUint64Array, view: Uint32Array = u32(seqHashes)): number {
    const s = this.sources.get(source);
    return s ? maxPrefix(view, seqHashes.length, s.inFlight) : 0;
  }

  /**
   * Leading blocks shared with in-flight requests or requests finished less than the grace period ago, at least
   * `activePrefix` (pass it when already known, to skip the in-flight walk).
   */
  predictedPrefix(source: number, seqHashes: BigUint64Array, now: number, view: Uint32Array = u32(seqHashes), activePrefix = -1): number {
    const s = this.sources.get(source);
    if (!s) return 0;
    let best = activePrefix >= 0 ? activePrefix : maxPrefix(view, seqHashes.length, s.inFlight);
    for (const c of s.recent) {
      if (c.expiresAt <= now || best >= seqHashes.length) continue;
      best = chainPrefix(view, seqHashes.length, c, c.credit, best);
    }
    return best;
  }

  get size(): number {
    return this.requests.size;
  }
}
