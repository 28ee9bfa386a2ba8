/**
 * Paged KV cache with prefix caching by full block, modelled on vLLM v1's BlockPool.
 *
 * - `numBlocks` physical blocks. A block in use has refCount > 0. A block whose refCount drops to 0 stays cached (its
 *   hash still maps to it) and joins the free queue; it is evicted only when `allocate` needs a block and it is at the
 *   head of the queue (LRU).
 * - Blocks freed without a hash (partial or duplicate blocks) go to the HEAD of the queue: reusing them costs no cached
 *   prefix. (vLLM appends them to the tail; that only evicts cached blocks earlier than necessary.)
 * - A request frees its blocks in reverse order, so its tail blocks are evicted before its prefix (a child never
 *   outlives its parent in the cache).
 * - At most one physical block per hash: the engine swaps a duplicate for the cached block (see engine.ts).
 *
 * Keys are the router's sequence hashes (src/core/hashing.ts) so the cache and the router agree on identity; the engine
 * ids announced in events come from a separate chain (engine.ts) stored in the block's metadata.
 */

/** What a cached block carries; kept until the block is evicted. */
export interface CachedBlockMeta {
  /** Router-compatible sequence hash (core hashing, seed from lora name and cache salt). The cache key. */
  readonly seqHash: bigint;
  /** Engine id (see engineBlockId in engine.ts); announced as is (u64/i64) or as engineIdBytes(id) (bytes). */
  readonly engineId: bigint;
  readonly parentEngineId: bigint | null;
  readonly loraName: string | null;
  readonly cacheSalt: string | null;
}

export type EvictListener = (meta: CachedBlockMeta) => void;

export class BlockPool {
  readonly numBlocks: number;
  private readonly ref: Int32Array;
  /** Free-queue doubly linked list; index `numBlocks` is the sentinel. */
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private readonly queued: Uint8Array;
  private free = 0;
  private readonly meta: (CachedBlockMeta | null)[];
  private readonly byHash = new Map<bigint, number>();

  constructor(
    numBlocks: number,
    private readonly onEvict: EvictListener = () => {},
  ) {
    if (!Number.isInteger(numBlocks) || numBlocks < 1) throw new RangeError(`numBlocks must be a positive integer, got ${numBlocks}`);
    this.numBlocks = numBlocks;
    this.ref = new Int32Array(numBlocks);
    this.prev = new Int32Array(numBlocks + 1);
    this.next = new Int32Array(numBlocks + 1);
    this.queued = new Uint8Array(numBlocks);
    this.meta = new Array(numBlocks).fill(null);
    const s = numBlocks;
    this.prev[s] = s;
    this.next[s] = s;
    for (let b = 0; b < numBlocks; b++) this.pushTail(b);
  }

  /** Blocks with refCount 0 (empty or cached-but-evictable). */
  get freeBlocks(): number {
    return this.free;
  }

  /** Blocks in use (refCount > 0). */
  get usedBlocks(): number {
    return this.numBlocks - this.free;
  }

  get cachedBlocks(): number {
    return this.byHash.size;
  }

  refCount(block: number): number {
    return this.ref[block];
  }

  metaOf(block: number): CachedBlockMeta | null {
    return this.meta[block];
  }

  /** Physical block holding `seqHash`, or -1. */
  lookup(seqHash: bigint): number {
    return this.byHash.get(seqHash) ?? -1;
  }

  /** Physical blocks of the longest cached prefix of `seqHashes`, at most `maxBlocks` long. */
  matchPrefix(seqHashes: ArrayLike<bigint>, maxBlocks: number): number[] {
    const out: number[] = [];
    const n = Math.min(maxBlocks, seqHashes.length);
    for (let i = 0; i < n; i++) {
      const b = this.byHash.get(seqHashes[i]);
      if (b === undefined) break;
      out.push(b);
    }
    return out;
  }

  /** Takes a reference on a block (a prefix hit, or a duplicate swap); a free cached block leaves the free queue. */
  touch(block: number): void {
    if (this.ref[block] === 0) this.unlink(block);
    this.ref[block]++;
  }

  /** A fresh block with refCount 1, evicting the LRU cached block if needed; -1 when every block is in use. */
  allocate(): number {
    const s = this.numBlocks;
    const b = this.next[s];
    if (b === s) return -1;
    this.unlink(b);
    const m = this.meta[b];
    if (m !== null) {
      this.byHash.delete(m.seqHash);
      this.meta[b] = null;
      this.onEvict(m);
    }
    this.ref[b] = 1;
    return b;
  }

  /** Drops one reference on each block, last block first (so a sequence's tail is evicted before its prefix). */
  release(blocks: readonly number[]): void {
    for (let i = blocks.length - 1; i >= 0; i--) {
      const b = blocks[i];
      if (this.ref[b] <= 0) throw new Error(`block ${b} released with refCount ${this.ref[b]}`);
      if (--this.ref[b] === 0) {
        if (this.meta[b] !== null) this.pushTail(b);
        else this.pushHead(b);
      }
    }
  }

  /**
   * Registers a block (in use by the caller) under `meta.seqHash`. Returns false when another block already holds
   * that hash (the caller keeps the existing one instead) or this block already has a hash.
   */
  register(block: number, meta: CachedBlockMeta): boolean {
    if (this.meta[block] !== null || this.byHash.has(meta.seqHash)) return false;
    this.meta[block] = meta;
    this.byHash.set(meta.seqHash, block);
    return true;
  }

  /** Every cached block (in use or evictable). */
  *cached(): IterableIterator<{ block: number; meta: CachedBlockMeta; refCount: number }> {
    for (const [, block] of this.byHash) yield { block, meta: this.meta[block]!, refCount: this.ref[block] };
  }

  /** Free queue order, head (next to be evicted) first: for tests. */
  freeQueue(): number[] {
    const out: number[] = [];
    const s = this.numBlocks;
    for (let b = this.next[s]; b !== s; b = this.next[b]) out.push(b);
    return out;
  }

  private pushTail(b: number): void {
    const s = this.numBlocks;
    const last = this.prev[s];
    this.next[last] = b;
    this.prev[b] = last;
    this.next[b] = s;
    this.prev[s] = b;
    this.queued[b] = 1;
    this.free++;
  }

  private pushHead(b: number): void {
    const s = this.numBlocks;
    const first = this.next[s];
    this.prev[first] = b;
    this.next[b] = first;
    this.prev[b] = s;
    this.next[s] = b;
    this.queued[b] = 1;
    this.free++;
  }

  private unlink(b: number): void {
    if (!this.queued[b]) throw new Error(`block ${b} is not in the free queue`);
    const p = this.prev[b];
    const n = this.next[b];
    this.next[p] = n;
    this.prev[n] = p;
    this.queued[b] = 0;
    this.free--;
  }
}
