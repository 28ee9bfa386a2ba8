/**
 * The event-fed prefix index: which source holds which block, keyed by the router's own sequence hash.
 *
 * Layout (all typed arrays, grown by doubling):
 * - `table`: open addressing, cells of [low half of the seq hash, slot + 1] (8 bytes); the high half is checked in the
 *   slot's record. Seq hashes are xxh3 outputs, so the low half alone places them well.
 * - `rec`: one record per block slot, [hash lo, hash hi, parent slot + 1, membership bitset (`words` u32)], so that a
 *   lookup costs two cache misses (table cell, record) rather than one per parallel array. Stored as int32 (hash
 *   halves reinterpreted) so that comparisons and bit operations in the hot walk stay in int32.
 * - per source: engine block id -> slot (the dual key: the engine's hash scheme never matters).
 * Free slots are chained through their parent field. Measured on the Mooncake trace at 64 sources: see
 * bench/RESULTS.md ("Index").
 *
 * Because a sequence hash names a whole prefix, "source s holds blocks 0..k of this request" is a walk down the
 * request's hashes ANDing bitsets, stopping when no source continues.
 */
import { hashBlocksInto, hashSeed } from '../hashing.ts';
import { GPU_MEDIUM, type ApplyResult, type KvEvent, type RejectReason, type StoredEvent } from '../types.ts';
import { joinU64, U64Map } from './u64-map.ts';

export interface KvIndexOptions {
  /** The router's block size in tokens. Events with a multiple of it are split; anything else is rejected. */
  readonly blockSize: number;
  /** Optional cap on distinct indexed blocks; least recently used leaves are pruned past it. */
  readonly maxBlocks?: number;
}

/** Index-level reasons besides the shared ones; 'engine_id_reused' counts re-announced ids (applied, old block dropped). */
export type IndexRejectReason = RejectReason | 'unsupported_medium' | 'engine_id_reused';

interface SourceState {
  engineIds: U64Map;
  cachedBlocks: number;
  /** Router blocks per engine block (engine block size / router block size), learned from events; 0 until then. */
  split: number;
  /**
   * Extra engine ids naming a slot this source already held (rare: engines dedupe identical prefixes), so that
   * removing one of them keeps the block until the last is gone.
   */
  aliases: Map<number, number> | null;
}

const NONE = -1;
const MAX_LOAD = 0.75;
/** Record fields. */
const LO = 0;
const HI = 1;
const PARENT = 2;
const MEMBERS = 3;

// Engine ids are bigints at the edge; these split them into u32 halves without allocating.
const idBuf = new BigUint64Array(1);
const idHalves = new Uint32Array(idBuf.buffer);

function homeOf(lo: number, shift: number): number {
  return Math.imul(lo, 0x9e3779b1) >>> shift;
}

function ctz(x: number): number {
  return 31 - Math.clz32(x & -x);
}

export class KvIndex {
  readonly blockSize: number;
  readonly maxBlocks: number;
  private table = new Int32Array(2 * 2048);
  private tableShift = 32 - 11;
  private rec: Int32Array;
  /** u32 per record: MEMBERS + words. */
  private stride: number;
  private slotCap = 1024;
  private words = 1;
  private nextSlot = 0;
  private freeHead = NONE;
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
  private alive = new Int32Array(1);
  private scores = new Int32Array(32);

  constructor(options: KvIndexOptions) {
    if (!Number.isInteger(options.blockSize) || options.blockSize <= 0) {
      throw new RangeError(`block size must be a positive integer, got ${options.blockSize}`);
    }
    this.blockSize = options.blockSize;
    this.maxBlocks = options.maxBlocks ?? Infinity;
    this.capped = Number.isFinite(this.maxBlocks);
    this.stride = MEMBERS + this.words;
    this.rec = new Int32Array(this.slotCap * this.stride);
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
    this.sources[source] = { engineIds: new U64Map(64, this.capped), cachedBlocks: 0, split: 0, aliases: null };
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

  /**
   * The router's sequence hash of the block a source's engine id names, or null when the id is unknown. Offload
   * tiers use it: a CPU/disk Stored carries only engine ids, of blocks the GPU tier announced with tokens before.
   */
  seqHashOfEngineId(source: number, id: bigint): bigint | null {
    const state = this.sources[source];
    if (!state) return null;
    const slot = this.lookupEngine(state, id);
    return slot === NONE ? null : joinU64(this.rec[slot * this.stride + LO], this.rec[slot * this.stride + HI]);
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
    // An engine's block size is fixed: once learned, a different one is quarantined, never mixed (removals and
    // clears walk `split` router blocks per engine block).
    if (state.split !== 0 && state.split !== split) return this.reject('block_size_mismatch', n);
    const routerBlocks = n * split;

    let parentSlot = NONE;
    let parentSeq: bigint | null = null;
    if (ev.parent !== null && ev.parent !== undefined) {
      parentSlot = this.lookupEngine(state, ev.parent);
      if (parentSlot === NONE && !ev.seqHashes) return this.reject('unknown_parent', n);
      if (parentSlot !== NONE) parentSeq = joinU64(this.rec[parentSlot * this.stride + LO], this.rec[parentSlot * this.stride + HI]);
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

    const view = this.viewOf(seqs);
    const memberAt = MEMBERS + (source >>> 5);
    const bit = 1 << (source & 31);
    const engineIds = state.engineIds;
    let prev = parentSlot;
    let duplicates = 0;
    for (let j = 0; j < n; j++) {
      idBuf[0] = ev.engineIds[j];
      const lo = idHalves[0];
      const hi = idHalves[1];
      const knownSlot = engineIds.find(lo, hi) >= 0 ? this.lookupEngine(state, ev.engineIds[j]) : NONE;
      if (knownSlot !== NONE) {
        const last = j * split + split - 1;
        if (this.findSlot(view[2 * last], view[2 * last + 1]) === knownSlot) {
          // The same block announced again: nothing changes.
          duplicates++;
          prev = knownSlot;
          continue;
        }
        // The id now names other content: the engine dropped the old block without a Removed we saw. Drop it too,
        // so no bit is left unreachable from an engine id.
        this.removeEngineBlock(source, state, ev.engineIds[j]);
        this.count('engine_id_reused', 1);
        if (prev !== NONE && this.isEmpty(prev)) prev = NONE;
      }
      let slot = NONE;
      let alreadyHeld = true;
      for (let m = 0; m < split; m++) {
        const i = j * split + m;
        slot = this.slotFor(view[2 * i], view[2 * i + 1], prev);
        // slotFor may have grown `rec`: read the field afterwards.
        const at = slot * this.stride + memberAt;
        const word = this.rec[at];
        if ((word & bit) === 0) {
          this.rec[at] = word | bit;
          state.cachedBlocks++;
          alreadyHeld = false;
        }
        prev = slot;
      }
      if (alreadyHeld) {
        // A second engine id for a prefix this source already holds.
        state.aliases ??= new Map();
        state.aliases.set(slot, (state.aliases.get(slot) ?? 0) + 1);
      }
      engineIds.set(lo, hi, slot, this.gen ? this.gen[slot] : 0);
    }
    if (this.capped) {
      // Touch deepest first so that, walking from the LRU tail, leaves come before their ancestors.
      for (let i = routerBlocks - 1; i >= 0; i--) {
        const slot = this.findSlot(view[2 * i], view[2 * i + 1]);
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

  /** The slot holding a seq hash, or NONE. */
  private findSlot(lo: number, hi: number): number {
    const table = this.table;
    const rec = this.rec;
    const stride = this.stride;
    const mask = (table.length >>> 1) - 1;
    let i = homeOf(lo, this.tableShift);
    for (;;) {
      const v = table[2 * i + 1];
      if (v === 0) return NONE;
      if (table[2 * i] === lo && rec[(v - 1) * stride + HI] === hi) return v - 1;
      i = (i + 1) & mask;
    }
  }

  /** Existing slot for a hash, or a new one (with its parent link). */
  private slotFor(lo: number, hi: number, parentSlot: number): number {
    const table = this.table;
    const rec = this.rec;
    const stride = this.stride;
    const mask = (table.length >>> 1) - 1;
    let i = homeOf(lo, this.tableShift);
    for (;;) {
      const v = table[2 * i + 1];
      if (v === 0) break;
      if (table[2 * i] === lo && rec[(v - 1) * stride + HI] === hi) return v - 1;
      i = (i + 1) & mask;
    }
    let slot: number;
    if (this.freeHead !== NONE) {
      slot = this.freeHead;
      this.freeHead = rec[slot * stride + PARENT] - 1;
    } else {
      slot = this.nextSlot++;
      if (slot >= this.slotCap) this.growBlocks();
    }
    const r = this.rec;
    const at = slot * stride;
    r[at + LO] = lo;
    r[at + HI] = hi;
    r[at + PARENT] = parentSlot + 1;
    for (let w = 0; w < this.words; w++) r[at + MEMBERS + w] = 0;
    this.liveBlocks++;
    if (this.liveBlocks > (table.length >>> 1) * MAX_LOAD) {
      this.growTable();
      this.tableInsert(lo, slot);
    } else {
      table[2 * i] = lo;
      table[2 * i + 1] = slot + 1;
    }
    if (this.capped) {
      this.childCount![slot] = 0;
      if (parentSlot !== NONE) this.childCount![parentSlot]++;
      this.lruPrev![slot] = NONE;
      this.lruNext![slot] = NONE;
      this.pushFront(slot);
    }
    return slot;
  }

  /** Puts a slot known to be absent into the table. */
  private tableInsert(lo: number, slot: number): void {
    const table = this.table;
    const mask = (table.length >>> 1) - 1;
    let i = homeOf(lo, this.tableShift);
    while (table[2 * i + 1] !== 0) i = (i + 1) & mask;
    table[2 * i] = lo;
    table[2 * i + 1] = slot + 1;
  }

  /** Removes a slot's cell; backward shift keeps every probe chain intact without tombstones. */
  private tableDelete(slot: number): void {
    const table = this.table;
    const mask = (table.length >>> 1) - 1;
    const shift = this.tableShift;
    const lo = this.rec[slot * this.stride + LO];
    let hole = homeOf(lo, shift);
    while (table[2 * hole + 1] !== slot + 1) hole = (hole + 1) & mask;
    let i = (hole + 1) & mask;
    for (;;) {
      const v = table[2 * i + 1];
      if (v === 0) break;
      const h = homeOf(table[2 * i], shift);
      // Move cell i into the hole unless its home lies cyclically in (hole, i].
      const inRange = hole <= i ? h > hole && h <= i : h > hole || h <= i;
      if (!inRange) {
        table[2 * hole] = table[2 * i];
        table[2 * hole + 1] = v;
        hole = i;
      }
      i = (i + 1) & mask;
    }
    table[2 * hole + 1] = 0;
  }

  /** The slot an engine id of this source maps to, or NONE (unknown, or pruned by the cap since). */
  private lookupEngine(state: SourceState, id: bigint): number {
    idBuf[0] = id;
    const pos = state.engineIds.find(idHalves[0], idHalves[1]);
    if (pos < 0) return NONE;
    const slot = state.engineIds.valueAt(pos);
    if (this.gen && this.gen[slot] !== state.engineIds.auxAt(pos)) {
      state.engineIds.deleteAt(pos);
      return NONE;
    }
    return slot;
  }

  private removeEngineBlock(source: number, state: SourceState, id: bigint): boolean {
    idBuf[0] = id;
    const pos = state.engineIds.find(idHalves[0], idHalves[1]);
    if (pos < 0) return false;
    const slot = state.engineIds.valueAt(pos);
    const generation = state.engineIds.auxAt(pos);
    state.engineIds.deleteAt(pos);
    // A mapping to a block the cap pruned since is stale: the block is already gone.
    if (this.gen && this.gen[slot] !== generation) return false;
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
    const memberAt = MEMBERS + (source >>> 5);
    const bit = 1 << (source & 31);
    const rec = this.rec;
    const stride = this.stride;
    let s = slot;
    for (let m = 0; m < split && s !== NONE; m++) {
      const next = rec[s * stride + PARENT] - 1;
      const at = s * stride + memberAt;
      if (rec[at] & bit) {
        rec[at] &= ~bit;
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
    state.split = 0; // nothing held: a restarted engine may announce another block size
  }

  private isEmpty(slot: number): boolean {
    const base = slot * this.stride + MEMBERS;
    for (let w = 0; w < this.words; w++) if (this.rec[base + w] !== 0) return false;
    return true;
  }

  private freeSlot(slot: number): void {
    this.tableDelete(slot);
    this.liveBlocks--;
    const at = slot * this.stride + PARENT;
    if (this.capped) {
      this.unlink(slot);
      const p = this.rec[at] - 1;
      if (p !== NONE && this.childCount![p] > 0) this.childCount![p]--;
      this.gen![slot]++;
    }
    // Free slots are chained through the parent field.
    this.rec[at] = this.freeHead + 1;
    this.freeHead = slot;
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
    const view = this.viewOf(seqHashes);
    if (this.words <= 2) this.walkNarrow(view, n, scores);
    else this.walkWide(view, n, scores);
    if (this.capped) this.touchMatched(view, scores);
    return scores;
  }

  /**
   * A (lo, hi) u32 view of a hash array. The last one is reused: repeated lookups of one prompt and the hashing
   * scratch then allocate nothing (fewer scavenges on the hot path).
   */
  private viewOf(hashes: BigUint64Array): Int32Array {
    if (hashes !== this.lastHashes || this.lastView.length !== hashes.length * 2) {
      this.lastHashes = hashes;
      this.lastView = new Int32Array(hashes.buffer, hashes.byteOffset, hashes.length * 2);
    }
    return this.lastView;
  }

  private lastHashes: BigUint64Array | null = null;
  private lastView: Int32Array = new Int32Array(0);

  /**
   * The walk for up to 64 sources (the router's hot path): the alive set in two locals, the table probe inlined.
   * Per block: one table cell and one record, both usually one cache line.
   */
  private walkNarrow(view: Int32Array, n: number, scores: Int32Array): void {
    const rec = this.rec;
    const table = this.table;
    const stride = this.stride;
    const wide = this.words === 2;
    const shift = this.tableShift;
    const cellMask = table.length - 2;
    let alive0 = 0;
    let alive1 = 0;
    let i = 0;
    for (; i < n; i++) {
      const lo = view[2 * i];
      const hi = view[2 * i + 1];
      // c: offset of the cell (two int32 per cell).
      let c = homeOf(lo, shift) << 1;
      let at = -1;
      for (;;) {
        const v = table[c + 1];
        if (v === 0) break;
        if (table[c] === lo) {
          const r = (v - 1) * stride;
          if (rec[r + HI] === hi) {
            at = r + MEMBERS;
            break;
          }
        }
        c = (c + 2) & cellMask;
      }
      if (at < 0) break;
      const m0 = rec[at];
      const m1 = wide ? rec[at + 1] : 0;
      if (i === 0) {
        alive0 = m0;
        alive1 = m1;
        continue;
      }
      const next0 = alive0 & m0;
      const next1 = alive1 & m1;
      if (((next0 ^ alive0) | (next1 ^ alive1)) !== 0) {
        // Sources dropping out here hold exactly i leading blocks.
        for (let d = alive0 & ~next0; d !== 0; d &= d - 1) scores[ctz(d)] = i;
        for (let d = alive1 & ~next1; d !== 0; d &= d - 1) scores[32 + ctz(d)] = i;
        alive0 = next0;
        alive1 = next1;
        if ((alive0 | alive1) === 0) return;
      }
    }
    for (let d = alive0; d !== 0; d &= d - 1) scores[ctz(d)] = i;
    for (let d = alive1; d !== 0; d &= d - 1) scores[32 + ctz(d)] = i;
  }

  /** The same walk for any number of membership words. */
  private walkWide(view: Int32Array, n: number, scores: Int32Array): void {
    const W = this.words;
    if (this.alive.length < W) this.alive = new Int32Array(W);
    const alive = this.alive;
    let i = 0;
    let any = 0;
    for (; i < n; i++) {
      const slot = this.findSlot(view[2 * i], view[2 * i + 1]);
      if (slot === NONE) break;
      const base = slot * this.stride + MEMBERS;
      any = 0;
      for (let w = 0; w < W; w++) {
        const m = this.rec[base + w];
        if (i === 0) {
          alive[w] = m;
        } else {
          const next = alive[w] & m;
          for (let d = alive[w] & ~next; d !== 0; d &= d - 1) scores[w * 32 + ctz(d)] = i;
          alive[w] = next;
        }
        any |= alive[w];
      }
      if (any === 0) return;
    }
    for (let w = 0; w < W && i > 0; w++) {
      for (let d = alive[w]; d !== 0; d &= d - 1) scores[w * 32 + ctz(d)] = i;
    }
  }

  private touchMatched(view: Int32Array, scores: Int32Array): void {
    let deepest = 0;
    for (let s = 0; s < scores.length; s++) if (scores[s] > deepest) deepest = scores[s];
    for (let i = deepest - 1; i >= 0; i--) {
      const slot = this.findSlot(view[2 * i], view[2 * i + 1]);
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
    const base = slot * this.stride + MEMBERS;
    for (let w = 0; w < this.words; w++) {
      let bits = this.rec[base + w];
      while (bits !== 0) {
        const s = w * 32 + ctz(bits);
        const state = this.sources[s];
        if (state) state.cachedBlocks--;
        bits &= bits - 1;
      }
      this.rec[base + w] = 0;
    }
    this.prunedBlocks++;
    this.freeSlot(slot);
  }

  private prunedBlocks = 0;

  // ---------------------------------------------------------------- growth

  private growBlocks(): void {
    const cap = this.slotCap * 2;
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
    const rec = new Int32Array(cap * this.stride);
    rec.set(this.rec);
    this.rec = rec;
    this.slotCap = cap;
    if (this.capped) {
      this.lruPrev = growI32(this.lruPrev!);
      this.lruNext = growI32(this.lruNext!);
      this.childCount = grow32(this.childCount!);
      this.gen = grow32(this.gen!);
    }
  }

  private growTable(): void {
    const old = this.table;
    this.table = new Int32Array(old.length * 2);
    this.tableShift--;
    for (let c = 0; c < old.length; c += 2) if (old[c + 1] !== 0) this.tableInsert(old[c], old[c + 1] - 1);
  }

  /** More sources than the bitsets hold: re-lay the records with more membership words. */
  private widen(words: number): void {
    const stride = MEMBERS + words;
    const rec = new Int32Array(this.slotCap * stride);
    for (let slot = 0; slot < this.nextSlot; slot++) {
      for (let f = 0; f < this.stride; f++) rec[slot * stride + f] = this.rec[slot * this.stride + f];
    }
    this.rec = rec;
    this.words = words;
    this.stride = stride;
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
    let bytes = this.table.byteLength + this.rec.byteLength;
    if (this.capped) bytes += this.lruPrev!.byteLength * 4;
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
          chain.push(joinU64(this.rec[s * this.stride + LO], this.rec[s * this.stride + HI]));
          s = this.rec[s * this.stride + PARENT] - 1;
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
    const memberAt = MEMBERS + (source >>> 5);
    const bit = 1 << (source & 31);
    if (!this.sources[source]) return out;
    for (let slot = 0; slot < this.nextSlot; slot++) {
      const at = slot * this.stride;
      if (this.rec[at + memberAt] & bit) out.add(joinU64(this.rec[at + LO], this.rec[at + HI]));
    }
    return out;
  }
}
