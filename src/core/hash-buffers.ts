/**
 * Recycled memory for the block hashes route() computes (bench/RESULTS.md, "Issue 29: the hash phase's tail").
 *
 * A fresh 16 KiB BigUint64Array per 32k-token prompt is kept by the active load, the overlay's ring and the caller for
 * seconds, so it is promoted and freed only at a mark-compact: every new one lands on pages never touched, and the
 * page faults were the hash phase's tail. Buffers handed out here go back to a free list once nobody holds them:
 *
 * - the caller's hold, taken when route() hashes into the buffer and given back by `KvRouter.releaseHashes` (the
 *   dispatcher does when the request's task ends). A caller that never gives it back keeps the array as before: it is
 *   ordinary garbage then, never reused;
 * - one hold per active-load entry (in flight, then the overlay's recently-finished ring), taken by the router when it
 *   adds the request and given back by the active load when the chain leaves it.
 *
 * Only buffers made here are counted: arrays a caller brings (`RouteRequest.seqHashes`, remote load) are untouched.
 * Each request gets a new view object, so identity caches keyed by the array (peers/llmd.ts) never see a reused one.
 */
export class HashBuffers {
  /** Free buffers by capacity in blocks (a power of two, at least MIN_BLOCKS). */
  private readonly free = new Map<number, ArrayBuffer[]>();
  /**
   * Holds on the buffers handed out (absent: not one of ours, or back in the free list). Weak: a buffer whose caller
   * never gives it back is collected with its last view, as any array would be.
   */
  private readonly holds = new WeakMap<ArrayBuffer, number>();
  /** Buffers whose caller hold is still out. */
  private readonly withCaller = new WeakSet<ArrayBuffer>();
  private freeBytes = 0;

  /** `maxFreeBytes`: the free list's bound; buffers given back beyond it are left to the collector. */
  constructor(private readonly maxFreeBytes = 16 * 1024 * 1024) {}

  /** A zero-length-or-more view for `blocks` hashes, held by the caller (and by nothing else yet). */
  take(blocks: number): BigUint64Array {
    const cap = capacityOf(blocks);
    const list = this.free.get(cap);
    let buffer = list?.pop();
    if (buffer) this.freeBytes -= buffer.byteLength;
    else buffer = new ArrayBuffer(cap * 8);
    this.holds.set(buffer, 1);
    this.withCaller.add(buffer);
    return new BigUint64Array(buffer, 0, blocks);
  }

  /** One more holder of `hashes` (no-op for arrays not made here). */
  retain(hashes: ArrayBufferView): void {
    const n = this.holds.get(hashes.buffer as ArrayBuffer);
    if (n !== undefined) this.holds.set(hashes.buffer as ArrayBuffer, n + 1);
  }

  /** A holder other than the caller lets go (no-op for arrays not made here). */
  drop(hashes: ArrayBufferView): void {
    this.let(hashes.buffer as ArrayBuffer);
  }

  /** The caller lets go; a second call for the same hold, or for an array not made here, does nothing. */
  releaseCaller(hashes: ArrayBufferView): void {
    const buffer = hashes.buffer as ArrayBuffer;
    if (this.withCaller.delete(buffer)) this.let(buffer);
  }

  /** Whether `hashes` is one of the buffers handed out and not yet back (tests). */
  isHeld(hashes: ArrayBufferView): boolean {
    return this.holds.has(hashes.buffer as ArrayBuffer);
  }

  private let(buffer: ArrayBuffer): void {
    const n = this.holds.get(buffer);
    if (n === undefined) return;
    if (n > 1) {
      this.holds.set(buffer, n - 1);
      return;
    }
    this.holds.delete(buffer);
    if (this.freeBytes + buffer.byteLength > this.maxFreeBytes) return;
    const cap = buffer.byteLength / 8;
    let list = this.free.get(cap);
    if (!list) {
      list = [];
      this.free.set(cap, list);
    }
    list.push(buffer);
    this.freeBytes += buffer.byteLength;
  }
}

const MIN_BLOCKS = 64;

function capacityOf(blocks: number): number {
  let cap = MIN_BLOCKS;
  while (cap < blocks) cap *= 2;
  return cap;
}
