/**
 * The event-fed prefix index: which source holds which block, keyed by the router's own sequence hash.
 *
 * Layout (all typed arrays, grown by doubling):
 * - `table`: router seq hash -> block slot.
 * - per slot: its hash (lo/hi), parent slot, and a bitset of the sources holding it (`words` u32 per slot).
 * - per source: engine block id -> slot (the dual key: the engine's hash scheme never matters).
 * About 21 bytes per (block, source) pair plus ~40 per distinct block; see bench/RESULTS.md for the measured figure.
 *
 * Because a sequence hash names a whole prefix, "source s holds blocks 0..k of this request" is a walk down the
 * request's hashes ANDing bitsets, stopping when no source continues.
 */
import { hashBlocksInto, hashSeed } from '../hashing.ts';
import { GPU_MEDIUM, type ApplyResult, type KvEvent, type RejectReason, type StoredEvent } from '../types.ts';
import { joinU64, splitU64, U64Map, u32View } from './u64-map.ts';

export interface KvIndexOptions {
  /** The router's block size in tokens. Events with a multiple of it are split; anything else is rejected. */
  readonly blockSize: number;
  /** Optional cap on distinct indexed blocks; least recently used leaves are pruned past it. */
  readonly maxBlocks?: number;
}

export type IndexRejectReason = RejectReason | 'unsupported_medium';

interface SourceState {
  engineIds: U64Map;
  cachedBlocks: number;
  /** Router blocks per engine block (engine block size / router block size), learned from events. */
  split: number;
  /**
   * Extra engine ids naming a slot this source already held (rare: engines dedupe identical prefixes), so that
   * removing one of them keeps the block until the last is gone.
   */
  aliases: Map<number, number> | null;
}

const NONE = -1;

function ctz(x: number): number {
  return 31 - Math.clz32(x & -x);
}

export class KvIndex {
  readonly blockSize: number;
  readonly maxBlocks: number;
  private readonly table = new U64Map(1024);
  private blockLo = new Uint32Array(1024);
  private blockHi = new Uint32Array(1024);
  private parent = new Int32Array(1024);
  private members: Uint32Array;
  private words = 1;
  private nextSlot = 0;
  private freeSlots: number[] = [];
  private liveBlocks = 0;
  private readonly sources: (SourceState | undefined)[] = [];
  private readonly rejects = new Map<IndexRejectReason, number>();
  private readonly appliedByKind = { stored: 0, removed: 0, cleared: 0 };

  // Only with a cap: recency list, child counts and slot generations (to detect stale engine-id mappings).
  private readonly capped: boolean;
  private lruPrev: Int32Array | null = null;
  private lruNext: Int32Array | null = null;
  private childCount: Uint32Array | null = null;
  private gen: Uint32Array | null = null;
  private lruHead = NONE;
  private lruTail = NONE;

  private seqScratch = new BigUint64Array(256);
  private alive = new Uint32Array(1);
  private scores = new Int32Array(32);

  constructor(options: KvIndexOptions) {
    if (!Number.isInteger(options.blockSize) || options.blockSize <= 0) {
      throw new RangeError(`block size must be a positive integer, got ${options.blockSize}`);
    }
    this.blockSize = options.blockSize;
    this.maxBlocks = options.maxBlocks ?? Infinity;
    this.capped = Number.isFinite(this.maxBlocks);
    this.members = new Uint32Array(1024 * this.words);
    if (this.capped) {
      this.lruPrev = new Int32Array(1024);
      this.lruNext = new Int32Array(1024);
      this.childCount = new Uint32Array(1024);
      this.gen = new Uint32Array(1024);
    }
  }

  // ---------------------------------------------------------------- sources

  /** Makes `source` (a small non-negative integer chosen by the caller) known to the index. Idempotent. */
  addSource(source: number): void {
    if (this.sources[source]) return;
    const needWords = Math.ceil((source + 1) / 32);
    if (needWords > this.words) this.widen(needWords);
    this.sources[source] = { engineIds: new U64Map(64, this.capped), cachedBlocks: 0, split: 1, aliases: null };
    if (this.scores.length < this.words * 32) this.scores = new Int32Array(this.words * 32);
  }

  hasSource(source: number): boolean {
    return this.sources[source] !== undefined;
  }

  /** Drops every block of the source and forgets it. */
  removeSource(source: number): void {
    if (!this.sources[source]) return;
    this.clearSource(source);
    this.sources[source] = undefined;
  }

  /** Blocks the source holds (the tie-breaker of the kv policy). */
  cachedBlocks(source: number): number {
    return this.sources[source]?.cachedBlocks ?? 0;
  }

  // ---------------------------------------------------------------- events

  /** Applies one normalised event from `source`. Never throws on bad input: rejects and counts it. */
  apply(source: number, event: KvEvent): ApplyResult {
    const state = this.sources[source];
    if (!state) return this.reject('unknown_source', 1);
    switch (event.kind) {
      case 'stored':
        return this.applyStored(source, state, event);
      case 'removed': {
        if (event.medium !== undefined && event.medium !== GPU_MEDIUM) return this.reject('unsupported_medium', event.engineIds.length);
        let applied = 0;
        let rejected = 0;
        for (const id of event.engineIds) {
          if (this.removeEngineBlock(source, state, id)) applied++;
          else rejected++;
        }
        this.appliedByKind.removed += applied;
        if (rejected > 0) this.count('unknown_block', rejected);
        return rejected > 0 ? { applied, rejected, reason: 'unknown_block' } : { applied, rejected };
      }
      case 'cleared':
        this.clearSource(source);
        this.appliedByKind.cleared++;
        return { applied: 1, rejected: 0 };
      default:
        return this.reject('empty_event', 1);
    }
  }

  private applyStored(source: number, state: SourceState, ev: StoredEvent): ApplyResult {
    const n = ev.engineIds.length;
    if (n === 0) return this.reject('empty_event', 1);
    if (ev.medium !== undefined && ev.medium !== GPU_MEDIUM) return this.reject('unsupported_medium', n);
    const bs = this.blockSize;
    if (!Number.isInteger(ev.blockSize) || ev.blockSize <= 0 || ev.blockSize % bs !== 0) {
      return this.reject('block_size_mismatch', n);
    }
    const split = ev.blockSize / bs;
    const routerBlocks = n * split;

    let parentSlot = NONE;
    let parentSeq: bigint | null = null;
    if (ev.parent !== null && ev.parent !== undefined) {
      parentSlot = this.lookupEngine(state, ev.parent);
      if (parentSlot === NONE && !ev.seqHashes) return this.reject('unknown_parent', n);
      if (parentSlot !== NONE) parentSeq = joinU64(this.blockLo[parentSlot], this.blockHi[parentSlot]);
    }

    let seqs: BigUint64Array;
    if (ev.seqHashes) {
      if (ev.seqHashes.length !== routerBlocks) return this.reject('token_count_mismatch', n);
      seqs = ev.seqHashes;
    } else {
      if (!ev.tokens || ev.tokens.length !== n * ev.blockSize) return this.reject('token_count_mismatch', n);
      if (this.seqScratch.length < routerBlocks) this.seqScratch = new BigUint64Array(routerBlocks * 2);
      seqs = this.seqScratch;
      hashBlocksInto(ev.tokens, 0, routerBlocks * bs, bs, hashSeed(ev.loraName, ev.cacheSalt), parentSeq, seqs, 0);
    }
    state.split = split;

    const view = u32View(seqs);
    const word = source >>> 5;
    const bit = 1 << (source & 31);
    let prev = parentSlot;
    let duplicates = 0;
    for (let j = 0; j < n; j++) {
      let slot = NONE;
      let alreadyHeld = true;
      for (let m = 0; m < split; m++) {
        const i = j * split + m;
        slot = this.slotFor(view[2 * i], view[2 * i + 1], prev);
        const at = slot * this.words + word;
        if ((this.members[at] & bit) === 0) {
          this.members[at] |= bit;
          state.cachedBlocks++;
          alreadyHeld = false;
        }
        prev = slot;
      }
      const [lo, hi] = splitU64(ev.engineIds[j]);
      const known = state.engineIds.find(lo, hi);
      if (known >= 0) {
        duplicates++;
        if (state.engineIds.valueAt(known) === slot) continue;
      } else if (alreadyHeld) {
        // A second engine id for a prefix this source already holds.
        state.aliases ??= new Map();
        state.aliases.set(slot, (state.aliases.get(slot) ?? 0) + 1);
      }
      state.engineIds.set(lo, hi, slot, this.gen ? this.gen[slot] : 0);
    }
    if (this.capped) {
      // Touch deepest first so that, walking from the LRU tail, leaves come before their ancestors.
      for (let i = routerBlocks - 1; i >= 0; i--) {
        const slot = this.table.get(view[2 * i], view[2 * i + 1]);
        if (slot !== NONE) this.touch(slot);
      }
      this.enforceCap();
    }
    this.appliedByKind.stored += n - duplicates;
    if (duplicates > 0) {
      this.count('duplicate_block', duplicates);
      return { applied: n - duplicates, rejected: duplicates, reason: 'duplicate_block' };
    }
    return { applied: n, rejected: 0 };
  }

  /** Existing slot for a hash, or a new one (with its parent link). */
  private slotFor(lo: number, hi: number, parentSlot: number): number {
    const existing = this.table.get(lo, hi);
    if (existing !== NONE) return existing;
    const slot = this.freeSlots.length > 0 ? this.freeSlots.pop()! : this.nextSlot++;
    if (slot >= this.blockLo.length) this.growBlocks();
    this.blockLo[slot] = lo;
    this.blockHi[slot] = hi;
    this.parent[slot] = parentSlot;
    this.members.fill(0, slot * this.words, (slot + 1) * this.words);
    this.table.set(lo, hi, slot);
    this.liveBlocks++;
    if (this.capped) {
      this.childCount![slot] = 0;
      if (parentSlot !== NONE) this.childCount![parentSlot]++;
      this.lruPrev![slot] = NONE;
      this.lruNext![slot] = NONE;
      this.pushFront(slot);
    }
    return slot;
  }

  /** The slot an engine id of this source maps to, or NONE (unknown, or pruned by the cap since). */
  private lookupEngine(state: SourceState, id: bigint): number {
    const [lo, hi] = splitU64(id);
    const pos = state.engineIds.find(lo, hi);
    if (pos < 0) return NONE;
    const slot = state.engineIds.valueAt(pos);
    if (this.gen && this.gen[slot] !== state.engineIds.auxAt(pos)) {
      state.engineIds.delete(lo, hi);
      return NONE;
    }
    return slot;
  }

  private removeEngineBlock(source: number, state: SourceState, id: bigint): boolean {
    const slot = this.lookupEngine(state, id);
    if (slot === NONE) return false;
    const [lo, hi] = splitU64(id);
    state.engineIds.delete(lo, hi);
    const aliases = state.aliases?.get(slot) ?? 0;
    if (aliases > 0) {
      if (aliases === 1) state.aliases!.delete(slot);
      else state.aliases!.set(slot, aliases - 1);
      return true;
    }
    this.dropChain(source, state, slot, state.split);
    return true;
  }

  /** Clears the source's bit on `slot` and up to `split - 1` ancestors (the router blocks of one engine block). */
  private dropChain(source: number, state: SourceState, slot: number, split: number): void {
    const word = source >>> 5;
    const bit = 1 << (source & 31);
    let s = slot;
    for (let m = 0; m < split && s !== NONE; m++) {
      const next = this.parent[s];
      const at = s * this.words + word;
      if (this.members[at] & bit) {
        this.members[at] &= ~bit;
        state.cachedBlocks--;
        if (this.isEmpty(s)) this.freeSlot(s);
      }
      s = next;
    }
  }

  private clearSource(source: number): void {
    const state = this.sources[source];
    if (!state) return;
    const slots: number[] = [];
    state.engineIds.forEach((_lo, _hi, slot, aux) => {
      if (!this.gen || this.gen[slot] === aux) slots.push(slot);
    });
    state.aliases = null;
    for (const slot of slots) this.dropChain(source, state, slot, state.split);
    state.engineIds.clear();
    state.cachedBlocks = 0;
  }

  private isEmpty(slot: number): boolean {
    const base = slot * this.words;
    for (let w = 0; w < this.words; w++) if (this.members[base + w] !== 0) return false;
    return true;
  }

  private freeSlot(slot: number): void {
    this.table.delete(this.blockLo[slot], this.blockHi[slot]);
    this.liveBlocks--;
    if (this.capped) {
      this.unlink(slot);
      const p = this.parent[slot];
      if (p !== NONE && this.childCount![p] > 0) this.childCount![p]--;
      this.gen![slot]++;
    }
    this.parent[slot] = NONE;
    this.freeSlots.push(slot);
  }

  // ---------------------------------------------------------------- lookups

  /**
   * For each source, the number of leading blocks of `seqHashes` it holds (contiguous from block 0). Returns a view
   * indexed by source number, valid until the next call; sources beyond its length hold 0.
   */
  findMatches(seqHashes: BigUint64Array): Int32Array {
    const scores = this.scores;
    scores.fill(0);
    const n = seqHashes.length;
    if (n === 0 || this.liveBlocks === 0) return scores;
    const view = u32View(seqHashes);
    const W = this.words;
    if (this.alive.length < W) this.alive = new Uint32Array(W);
    const alive = this.alive;
    const members = this.members;
    let i = 0;
    for (; i < n; i++) {
      const slot = this.table.get(view[2 * i], view[2 * i + 1]);
      if (slot === NONE) break;
      const base = slot * W;
      let any = 0;
      for (let w = 0; w < W; w++) {
        const m = members[base + w];
        if (i === 0) {
          alive[w] = m;
        } else {
          const next = alive[w] & m;
          let dropped = alive[w] & ~next;
          while (dropped !== 0) {
            scores[w * 32 + ctz(dropped)] = i;
            dropped &= dropped - 1;
          }
          alive[w] = next;
        }
        any |= alive[w];
      }
      if (any === 0) {
        i = -1;
        break;
      }
    }
    if (i > 0) {
      for (let w = 0; w < W; w++) {
        let rest = alive[w];
        while (rest !== 0) {
          scores[w * 32 + ctz(rest)] = i;
          rest &= rest - 1;
        }
      }
    }
    if (this.capped) this.touchMatched(view, scores);
    return scores;
  }

  private touchMatched(view: Uint32Array, scores: Int32Array): void {
    let deepest = 0;
    for (let s = 0; s < scores.length; s++) if (scores[s] > deepest) deepest = scores[s];
    for (let i = deepest - 1; i >= 0; i--) {
      const slot = this.table.get(view[2 * i], view[2 * i + 1]);
      if (slot !== NONE) this.touch(slot);
    }
  }

  // ---------------------------------------------------------------- cap (LRU leaves)

  private pushFront(slot: number): void {
    const prev = this.lruPrev!;
    const next = this.lruNext!;
    prev[slot] = NONE;
    next[slot] = this.lruHead;
    if (this.lruHead !== NONE) prev[this.lruHead] = slot;
    this.lruHead = slot;
    if (this.lruTail === NONE) this.lruTail = slot;
  }

  private unlink(slot: number): void {
    const prev = this.lruPrev!;
    const next = this.lruNext!;
    const p = prev[slot];
    const q = next[slot];
    if (p !== NONE) next[p] = q;
    else if (this.lruHead === slot) this.lruHead = q;
    if (q !== NONE) prev[q] = p;
    else if (this.lruTail === slot) this.lruTail = p;
    prev[slot] = NONE;
    next[slot] = NONE;
  }

  private touch(slot: number): void {
    if (this.lruHead === slot) return;
    this.unlink(slot);
    this.pushFront(slot);
  }

  private enforceCap(): void {
    let cursor = this.lruTail;
    while (this.liveBlocks > this.maxBlocks && cursor !== NONE) {
      const prevInList = this.lruPrev![cursor];
      if (this.childCount![cursor] === 0) this.prune(cursor);
      cursor = prevInList;
    }
  }

  /** Removes a block from every source. Engine-id mappings to it go stale and are detected by generation. */
  private prune(slot: number): void {
    const base = slot * this.words;
    for (let w = 0; w < this.words; w++) {
      let bits = this.members[base + w];
      while (bits !== 0) {
        const s = w * 32 + ctz(bits);
        const state = this.sources[s];
        if (state) state.cachedBlocks--;
        bits &= bits - 1;
      }
      this.members[base + w] = 0;
    }
    this.prunedBlocks++;
    this.freeSlot(slot);
  }

  private prunedBlocks = 0;

  // ---------------------------------------------------------------- growth

  private growBlocks(): void {
    const cap = this.blockLo.length * 2;
    const grow32 = (a: Uint32Array) => {
      const b = new Uint32Array(cap);
      b.set(a);
      return b;
    };
    const growI32 = (a: Int32Array) => {
      const b = new Int32Array(cap);
      b.set(a);
      return b;
    };
    this.blockLo = grow32(this.blockLo);
    this.blockHi = grow32(this.blockHi);
    this.parent = growI32(this.parent);
    const members = new Uint32Array(cap * this.words);
    members.set(this.members);
    this.members = members;
    if (this.capped) {
      this.lruPrev = growI32(this.lruPrev!);
      this.lruNext = growI32(this.lruNext!);
      this.childCount = grow32(this.childCount!);
      this.gen = grow32(this.gen!);
    }
  }

  /** More sources than the bitsets hold: re-lay the membership array with more words per block. */
  private widen(words: number): void {
    const cap = this.blockLo.length;
    const members = new Uint32Array(cap * words);
    for (let slot = 0; slot < this.nextSlot; slot++) {
      for (let w = 0; w < this.words; w++) members[slot * words + w] = this.members[slot * this.words + w];
    }
    this.members = members;
    this.words = words;
  }

  // ---------------------------------------------------------------- introspection

  private count(reason: IndexRejectReason, n: number): void {
    this.rejects.set(reason, (this.rejects.get(reason) ?? 0) + n);
  }

  private reject(reason: IndexRejectReason, blocks: number): ApplyResult {
    this.count(reason, blocks);
    return { applied: 0, rejected: blocks, reason: reason as RejectReason };
  }

  stats(): {
    blocks: number;
    pairs: number;
    sources: number;
    bytes: number;
    pruned: number;
    applied: { stored: number; removed: number; cleared: number };
    rejected: Record<string, number>;
  } {
    let pairs = 0;
    let sources = 0;
    let bytes =
      this.table.byteLength + this.blockLo.byteLength * 2 + this.parent.byteLength + this.members.byteLength;
    for (const s of this.sources) {
      if (!s) continue;
      sources++;
      pairs += s.cachedBlocks;
      bytes += s.engineIds.byteLength;
    }
    const rejected: Record<string, number> = {};
    for (const [k, v] of this.rejects) rejected[k] = v;
    return { blocks: this.liveBlocks, pairs, sources, bytes, pruned: this.prunedBlocks, applied: { ...this.appliedByKind }, rejected };
  }

  /**
   * Events that rebuild an identical index from empty (same blocks per source, same engine-id mappings), carrying
   * the router's hashes so no tokens are needed. Used for snapshots.
   */
  dump(): Array<{ source: number; event: StoredEvent }> {
    const out: Array<{ source: number; event: StoredEvent }> = [];
    this.sources.forEach((state, source) => {
      if (!state) return;
      const ids: bigint[] = [];
      const hashes: bigint[] = [];
      const split = state.split;
      state.engineIds.forEach((lo, hi, slot, aux) => {
        if (this.gen && this.gen[slot] !== aux) return;
        const chain: bigint[] = [];
        let s = slot;
        for (let m = 0; m < split && s !== NONE; m++) {
          chain.push(joinU64(this.blockLo[s], this.blockHi[s]));
          s = this.parent[s];
        }
        if (chain.length !== split) return;
        ids.push(joinU64(lo, hi));
        for (let m = chain.length - 1; m >= 0; m--) hashes.push(chain[m]);
      });
      if (ids.length === 0) return;
      out.push({
        source,
        event: {
          kind: 'stored',
          parent: null,
          engineIds: ids,
          tokens: null,
          blockSize: split * this.blockSize,
          seqHashes: BigUint64Array.from(hashes),
        },
      });
    });
    return out;
  }

  /** Router hashes a source holds (for tests and debugging; not a hot path). */
  blocksOf(source: number): Set<bigint> {
    const out = new Set<bigint>();
    const word = source >>> 5;
    const bit = 1 << (source & 31);
    if (!this.sources[source]) return out;
    for (let slot = 0; slot < this.nextSlot; slot++) {
      if (this.members[slot * this.words + word] & bit) out.add(joinU64(this.blockLo[slot], this.blockHi[slot]));
    }
    return out;
  }
}
