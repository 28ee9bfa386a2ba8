/**
 * In-flight load per source, from the router's own decisions (REFERENCE section 5):
 * - prefill tokens (prompt tokens not expected from cache) count from routing until the first output token;
 * - active blocks count from routing until finish, as refcounted sequence hashes, so requests sharing a prefix on the
 *   same source count the shared blocks once; the trailing partial block is unique to each request.
 * Requests that never finish (lost clients, crashed shells) are force-freed after `staleMs`.
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

interface SourceLoad {
  prefillTokens: number;
  /** Sequence hash -> number of active requests holding it. */
  readonly blocks: Map<bigint, number>;
  /** Partial trailing blocks, one per request that has one. */
  partialBlocks: number;
  requests: number;
}

export class ActiveLoad {
  private readonly requests = new Map<string, ActiveRequest>();
  private readonly sources = new Map<number, SourceLoad>();

  private load(source: number): SourceLoad {
    let s = this.sources.get(source);
    if (!s) {
      s = { prefillTokens: 0, blocks: new Map(), partialBlocks: 0, requests: 0 };
      this.sources.set(source, s);
    }
    return s;
  }

  has(requestId: string): boolean {
    return this.requests.has(requestId);
  }

  get(requestId: string): ActiveRequest | undefined {
    return this.requests.get(requestId);
  }

  add(req: ActiveRequest): void {
    const s = this.load(req.source);
    s.prefillTokens += req.prefillTokens;
    s.requests++;
    for (let i = 0; i < req.seqHashes.length; i++) {
      const h = req.seqHashes[i];
      s.blocks.set(h, (s.blocks.get(h) ?? 0) + 1);
    }
    if (req.requestBlocks > req.seqHashes.length) s.partialBlocks++;
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
  free(requestId: string): ActiveRequest | undefined {
    const req = this.requests.get(requestId);
    if (!req) return undefined;
    this.requests.delete(requestId);
    const s = this.load(req.source);
    if (req.firstTokenAt === undefined) s.prefillTokens -= req.prefillTokens;
    s.requests--;
    for (let i = 0; i < req.seqHashes.length; i++) {
      const h = req.seqHashes[i];
      const c = s.blocks.get(h) ?? 0;
      if (c <= 1) s.blocks.delete(h);
      else s.blocks.set(h, c - 1);
    }
    if (req.requestBlocks > req.seqHashes.length) s.partialBlocks--;
    return req;
  }

  /** Force-frees requests older than `staleMs`; returns their ids. */
  sweep(now: number, staleMs: number): string[] {
    const stale: string[] = [];
    for (const req of this.requests.values()) if (now - req.startedAt > staleMs) stale.push(req.requestId);
    for (const id of stale) this.free(id);
    return stale;
  }

  /** All requests on a source (when it is removed). */
  requestsOn(source: number): string[] {
    const ids: string[] = [];
    for (const req of this.requests.values()) if (req.source === source) ids.push(req.requestId);
    return ids;
  }

  prefillTokens(source: number): number {
    return this.sources.get(source)?.prefillTokens ?? 0;
  }

  activeBlocks(source: number): number {
    const s = this.sources.get(source);
    return s ? s.blocks.size + s.partialBlocks : 0;
  }

  activeRequests(source: number): number {
    return this.sources.get(source)?.requests ?? 0;
  }

  /** Leading blocks of `seqHashes` already active on `source` (they add no new decode blocks there). */
  activePrefix(source: number, seqHashes: BigUint64Array): number {
    const s = this.sources.get(source);
    if (!s || s.blocks.size === 0) return 0;
    let i = 0;
    while (i < seqHashes.length && s.blocks.has(seqHashes[i])) i++;
    return i;
  }

  get size(): number {
    return this.requests.size;
  }
}
