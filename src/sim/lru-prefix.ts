/**
 * An exact LRU prefix cache of a fixed number of blocks, shared by the whole stream it is fed: the reference that the
 * miss-ratio-curve estimator (src/core/mrc.ts) is validated against. No sampling, no approximation.
 *
 *   look-up  a request's hit blocks are the longest leading run of its sequence hashes that the cache holds (an engine's
 *            prefix look-up stops at the first miss); the hit is counted against ceil(prompt tokens / block size)
 *   insert   then every block of the request is touched, last block first (vLLM frees a request's blocks tail first,
 *            so a prefix outlives its extensions), and the least recently touched blocks are evicted past capacity
 */
export class LruPrefixCache {
  /** Insertion order is recency order: the first key is the least recently touched. */
  private readonly blocks = new Map<bigint, true>();
  hitBlocks = 0;
  promptBlocks = 0;
  requests = 0;

  constructor(readonly capacityBlocks: number) {
    if (!Number.isInteger(capacityBlocks) || capacityBlocks < 0) {
      throw new RangeError(`capacity must be a non-negative integer, got ${capacityBlocks}`);
    }
  }

  /** Feeds one request; returns its hit blocks. */
  access(seqHashes: BigUint64Array, promptBlocks: number): number {
    let hit = 0;
    while (hit < seqHashes.length && this.blocks.has(seqHashes[hit])) hit++;
    this.requests++;
    this.hitBlocks += hit;
    this.promptBlocks += Math.max(promptBlocks, seqHashes.length);
    if (this.capacityBlocks === 0) return hit;
    for (let i = seqHashes.length - 1; i >= 0; i--) {
      const h = seqHashes[i];
      this.blocks.delete(h);
      this.blocks.set(h, true);
    }
    while (this.blocks.size > this.capacityBlocks) {
      const oldest = this.blocks.keys().next().value as bigint;
      this.blocks.delete(oldest);
    }
    return hit;
  }

  /** Block-weighted hit ratio so far (NaN before any prompt block). */
  get hitRatio(): number {
    return this.promptBlocks > 0 ? this.hitBlocks / this.promptBlocks : NaN;
  }

  get size(): number {
    return this.blocks.size;
  }
}
