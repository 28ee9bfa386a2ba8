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
 * - Hybrid models keep every cache group in this one pool, as vLLM does: a block of another group is keyed by its
 *   hash mixed with the group (./hybrid.ts), so groups never share a block and evict from one LRU queue.
 *
 * Keys are the router's sequence hashes (src/core/hashing.ts) so the cache and the router agree on identity; the engine
 * ids announced in events come from a separate chain (engine.ts). All per-block state lives in typed arrays and the hash
 * table is a U64Map: a cache of 100k+ blocks gives the GC no objects to trace and lookups allocate nothing.
 */
import { U64Map, splitU64, u32View } from '../../core/index/u64-map.ts';

/** Who computed a block: the LoRA adapter and cache salt that fed its hash (interned per pool). */
export interface BlockIdentity {
  readonly loraName: string | null;
  readonly cacheSalt: string | null;
}

/** Called when a cached block is evicted, before its state is cleared (read engineIdOf(block) in it). */
export type EvictListener = (pool: BlockPool, block: number) => void;

const CACHED = 1;
const HAS_PARENT = 2;

export class BlockPool {
  readonly numBlocks: number;
  private readonly ref: Int32Array;
  /** Free-queue doubly linked list; index `numBlocks` is the sentinel. */
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private readonly queued: Uint8Array;
  private free = 0;
  private readonly seqHash: BigUint64Array;
  private readonly seq32: Uint32Array;
  private readonly engineId: BigUint64Array;
  private readonly parentId: BigUint64Array;
  private readonly flags: Uint8Array;
  private readonly ident: Int32Array;
  /** Cache group of each block (hybrid models: one pool for every group, as vLLM's; ./hybrid.ts). */
  private readonly group: Uint8Array;
  private readonly identities: BlockIdentity[] = [];
  private readonly identIndex = new Map<string, number>();
  private readonly byHash: U64Map;
  private cached = 0;

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
    this.seqHash = new BigUint64Array(numBlocks);
    this.seq32 = u32View(this.seqHash);
    this.engineId = new BigUint64Array(numBlocks);
    this.parentId = new BigUint64Array(numBlocks);
    this.flags = new Uint8Array(numBlocks);
    this.ident = new Int32Array(numBlocks);
    this.group = new Uint8Array(numBlocks);
    this.byHash = new U64Map(Math.min(numBlocks, 1 << 16));
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
    return this.cached;
  }

  refCount(block: number): number {
    return this.ref[block];
  }

  isCached(block: number): boolean {
    return (this.flags[block] & CACHED) !== 0;
  }

  engineIdOf(block: number): bigint {
    return this.engineId[block];
  }

  parentIdOf(block: number): bigint | null {
    return this.flags[block] & HAS_PARENT ? this.parentId[block] : null;
  }

  seqHashOf(block: number): bigint {
    return this.seqHash[block];
  }

  /** The cache group a cached block belongs to (0 for a model with one group). */
  groupOf(block: number): number {
    return this.group[block];
  }

  identityOf(block: number): BlockIdentity {
    return this.identities[this.ident[block]];
  }

  /** Interned id of a (lora, salt) identity, to pass to register. */
  identity(loraName: string | null, cacheSalt: string | null): number {
    const key = `${loraName ?? ''}\u0000${cacheSalt ?? ''}`;
    let id = this.identIndex.get(key);
    if (id === undefined) {
      id = this.identities.length;
      this.identities.push({ loraName, cacheSalt });
      this.identIndex.set(key, id);
    }
    return id;
  }

  /** Physical block holding the hash given as (lo, hi) halves, or -1. */
  lookup32(lo: number, hi: number): number {
    return this.byHash.get(lo, hi);
  }

  /** Physical block holding `seqHash`, or -1. */
  lookup(seqHash: bigint): number {
    const [lo, hi] = splitU64(seqHash);
    return this.byHash.get(lo, hi);
  }

  /** Physical blocks of the longest cached prefix of `seqHashes`, at most `maxBlocks` long. */
  matchPrefix(seqHashes: BigUint64Array, maxBlocks: number): number[] {
    const out: number[] = [];
    const v = u32View(seqHashes);
    const n = Math.min(maxBlocks, seqHashes.length);
    for (let i = 0; i < n; i++) {
      const b = this.byHash.get(v[2 * i], v[2 * i + 1]);
      if (b < 0) break;
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
    if (this.flags[b] & CACHED) {
      this.onEvict(this, b);
      this.byHash.delete(this.seq32[2 * b], this.seq32[2 * b + 1]);
      this.flags[b] = 0;
      this.cached--;
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
        if (this.flags[b] & CACHED) this.pushTail(b);
        else this.pushHead(b);
      }
    }
  }

  /**
   * Registers a block (in use by the caller) under the hash (seqLo, seqHi). Returns false when another block already
   * holds that hash (the caller keeps the existing one instead) or this block already has a hash.
   */
  register(block: number, seqLo: number, seqHi: number, engineId: bigint, parentId: bigint | null, identity: number, group = 0): boolean {
    if (this.flags[block] & CACHED || this.byHash.get(seqLo, seqHi) >= 0) return false;
    this.group[block] = group;
    this.seq32[2 * block] = seqLo;
    this.seq32[2 * block + 1] = seqHi;
    this.engineId[block] = engineId;
    this.parentId[block] = parentId ?? 0n;
    this.flags[block] = CACHED | (parentId === null ? 0 : HAS_PARENT);
    this.ident[block] = identity;
    this.byHash.set(seqLo, seqHi, block);
    this.cached++;
    return true;
  }

  /** Every cached block (in use or evictable). */
  cachedBlockList(): number[] {
    const out: number[] = [];
    for (let b = 0; b < this.numBlocks; b++) if (this.flags[b] & CACHED) out.push(b);
    return out;
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
