/**
 * The event-fed prefix index: which source holds which block, keyed by the router's own sequence hash.
 *
 * Layout (all typed arrays; README.md in this folder has the whole picture):
 * - `seq`: a U64Map from seq hash to block slot (12-byte cells).
 * - `rec`: one record per block slot, [hash lo, hash hi, parent slot + 1, holder-set id] (16 bytes). The holders are
 *   an id in a SetTable (./set-table.ts): each distinct holder set is stored once, and prefix chains share them.
 *   Slots are stable (engine ids, parent links, the LRU cap and snapshots refer to them) and a stored run of blocks
 *   takes neighbouring slots, so the walk finds most blocks by reading the next record, without a table probe.
 *   Free slots carry the empty set (id 0) and are chained through their parent field.
 * - per source: engine block id -> slot (the dual key: the engine's hash scheme never matters).
 * Membership costs 4 bytes per block plus the distinct sets; measured on the Mooncake trace from 64 to 4,096
 * sources: bench/RESULTS.md ("Index").
 *
 * Because a sequence hash names a whole prefix, "source s holds blocks 0..k of this request" is a walk down the
 * request's hashes, stopping when no source continues.
 */
import { hashBlocksInto, hashSeed } from '../hashing.ts';
import { GPU_MEDIUM, type ApplyResult, type KvEvent, type RejectReason, type StoredEvent } from '../types.ts';
import { BITS, LIST, MAX_SOURCES } from './holders.ts';
import { EMPTY_SET, SetTable } from './set-table.ts';
import { IndexCapture, type SourceBlocks } from './snapshot.ts';
import { copySteps, homeOfHashed, joinU64, U64Map } from './u64-map.ts';

export interface KvIndexOptions {
  /** The router's block size in tokens. Events with a multiple of it are split; anything else is rejected. */
  readonly blockSize: number;
  /** Optional cap on distinct indexed blocks; least recently used leaves are pruned past it. */
  readonly maxBlocks?: number;
}

/**
 * Index-level reasons besides the shared ones; 'engine_id_reused' counts re-announced ids (applied, old block
 * dropped); 'invalid_snapshot' counts snapshot entries that cannot be restored (bad parent positions).
 */
export type IndexRejectReason = RejectReason | 'unsupported_medium' | 'engine_id_reused' | 'invalid_snapshot';

export interface IndexApplyResult {
  readonly applied: number;
  readonly rejected: number;
  readonly reason?: IndexRejectReason;
}

interface SourceState {
  engineIds: U64Map;
  cachedBlocks: number;
  /** Router blocks per engine block (engine block size / router block size), learned from events; 0 until then. */
  split: number;
  /**
   * Extra references to router blocks this source already held when another of its engine blocks covered them too
   * (rare: a second engine id for the same prefix, or, with engine blocks of several router blocks, two engine blocks
   * sharing their first router blocks), so that removing one engine block keeps what the others still cover.
   */
  refs: Map<number, number> | null;
}

const NONE = -1;
/** Slot record fields: [hash lo, hash hi, parent slot + 1, holder set id] (16 bytes: four per cache line). */
const REC = 4;
const LO = 0;
const HI = 1;
const PARENT = 2;
/** The block's holder-set id (./set-table.ts); 0 (the empty set) on a free slot, never on a live one. */
const SET = 3;
/** Seq table cell: [lo, hi, slot + 1]. */
const CELL = 3;
const SLOT_GROWTH = 1.5;
/** Words copied per step of a stepped capture: 1 MiB, under a millisecond. */
const CAPTURE_STEP = 1 << 18;
/**
 * The sequence-hash table: keys are xxh3 outputs (homes from the low half as is), placed Robin Hood style. First-come
 * placement leaves the newest blocks, the ones prompts look up, at the ends of their runs: walks were ~1.3x slower in
 * an A/B run, for ~10% less CPU per inserted block.
 */
const SEQ_TABLE = { robinHood: true, hashedKeys: true } as const;

// Engine ids are bigints at the edge; these split them into u32 halves without allocating.
const idBuf = new BigUint64Array(1);
const idHalves = new Int32Array(idBuf.buffer);

function ctz(x: number): number {
  return 31 - Math.clz32(x & -x);
}

export class KvIndex {
  readonly blockSize: number;
  readonly maxBlocks: number;
  private readonly seq = new U64Map(1024, 0, SEQ_TABLE);
  private readonly sets = new SetTable();
  private rec: Int32Array;
  private slotCap = 1024;
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
  private gen: Int32Array | null = null;
  private lruHead = NONE;
  private lruTail = NONE;
  private prunedBlocks = 0;
  /** Bumped by every call that may change blocks (apply, restoreSource, removeSource): see captureSteps. */
  private changes = 0;

  private seqScratch = new BigUint64Array(256);
  /** Per source number: the walk's answer, its list of sources still matching, and a holder scratch. */
  private scores = new Int32Array(32);
  private alive = new Int32Array(32);
  private ids = new Int32Array(32);
  private aliveBits = new Int32Array(1);
  private aliveCount = 0;
  /** The set id and record offset of the block the dense walk handed the alive list over at. */
  private aliveSet = EMPTY_SET;
  private aliveAt = 0;
  private mark = new Int32Array(32);
  private stamp = 0;

  constructor(options: KvIndexOptions) {
    if (!Number.isInteger(options.blockSize) || options.blockSize <= 0) {
      throw new RangeError(`block size must be a positive integer, got ${options.blockSize}`);
    }
    this.blockSize = options.blockSize;
    this.maxBlocks = options.maxBlocks ?? Infinity;
    this.capped = Number.isFinite(this.maxBlocks);
    this.rec = new Int32Array(this.slotCap * REC);
    if (this.capped) {
      this.lruPrev = new Int32Array(this.slotCap);
      this.lruNext = new Int32Array(this.slotCap);
      this.childCount = new Uint32Array(this.slotCap);
      this.gen = new Int32Array(this.slotCap);
    }
  }

  // ---------------------------------------------------------------- sources

  /** Makes `source` (a small non-negative integer chosen by the caller, below 32,767) known to the index. Idempotent. */
  addSource(source: number): void {
    if (!Number.isInteger(source) || source < 0 || source >= MAX_SOURCES) {
      throw new RangeError(`source number must be an integer in [0, ${MAX_SOURCES - 1}], got ${source}`);
    }
    if (this.sources[source]) return;
    this.sets.fleet(source);
    this.sources[source] = { engineIds: new U64Map(64, this.capped), cachedBlocks: 0, split: 0, refs: null };
    if (this.scores.length <= source) {
      const n = Math.max(source + 1, 2 * this.scores.length);
      this.scores = new Int32Array(n);
      this.alive = new Int32Array(n);
      this.ids = new Int32Array(n);
      this.mark = new Int32Array(n);
      this.stamp = 0;
    }
  }

  hasSource(source: number): boolean {
    return this.sources[source] !== undefined;
  }

  /** Drops every block of the source and forgets it. */
  removeSource(source: number): void {
    if (!this.sources[source]) return;
    this.changes++;
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
    idBuf[0] = id;
    const slot = this.lookupEngine(state, idHalves[0], idHalves[1]);
    return slot === NONE ? null : joinU64(this.rec[slot * REC + LO], this.rec[slot * REC + HI]);
  }

  // ---------------------------------------------------------------- events

  /** Applies one normalised event from `source`. Never throws on bad input: rejects and counts it. */
  apply(source: number, event: KvEvent): ApplyResult {
    const state = this.sources[source];
    if (!state) return this.reject('unknown_source', 1);
    this.changes++;
    switch (event.kind) {
      case 'stored':
        return this.applyStored(source, state, event);
      case 'removed': {
        if (event.medium !== undefined && event.medium !== GPU_MEDIUM) return this.reject('unsupported_medium', event.engineIds.length);
        let applied = 0;
        let rejected = 0;
        for (const id of event.engineIds) {
          idBuf[0] = id;
          if (this.removeEngineBlock(source, state, idHalves[0], idHalves[1])) applied++;
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
      idBuf[0] = ev.parent;
      parentSlot = this.lookupEngine(state, idHalves[0], idHalves[1]);
      if (parentSlot === NONE && !ev.seqHashes) return this.reject('unknown_parent', n);
      if (parentSlot !== NONE) parentSeq = joinU64(this.rec[parentSlot * REC + LO], this.rec[parentSlot * REC + HI]);
    }

    let seqs: BigUint64Array;
    if (ev.seqHashes) {
      if (ev.seqHashes.length !== routerBlocks) return this.reject('token_count_mismatch', n);
      seqs = ev.seqHashes;
    } else {
      if (!ev.tokens || ev.tokens.length !== n * ev.blockSize) return this.reject('token_count_mismatch', n);
      if (this.seqScratch.length < routerBlocks) this.seqScratch = new BigUint64Array(routerBlocks * 2);
      seqs = this.seqScratch;
      hashBlocksInto({
        tokens: ev.tokens,
        from: 0,
        count: routerBlocks * bs,
        blockSize: bs,
        seed: hashSeed(ev.loraName, ev.cacheSalt),
        parentSeq,
        outSeq: seqs,
        outOffset: 0,
      });
    }
    state.split = split;

    const view = this.viewOf(seqs);
    let prev = parentSlot;
    let duplicates = 0;
    for (let j = 0; j < n; j++) {
      idBuf[0] = ev.engineIds[j];
      const lo = idHalves[0];
      const hi = idHalves[1];
      const knownSlot = this.lookupEngine(state, lo, hi);
      if (knownSlot !== NONE) {
        const last = j * split + split - 1;
        if (this.findSlot(view[2 * last], view[2 * last + 1]) === knownSlot) {
          // The same block announced again: nothing changes.
          duplicates++;
          prev = knownSlot;
          continue;
        }
        // The id now names other content: the engine dropped the old block without a Removed we saw. Drop it too,
        // so no holder is left unreachable from an engine id.
        this.removeEngineBlock(source, state, lo, hi);
        this.count('engine_id_reused', 1);
        if (prev !== NONE && !this.isLive(prev)) prev = NONE;
      }
      const slot = this.holdChain(source, state, view, j * split, split, prev);
      this.setEngineId(state, lo, hi, slot);
      prev = slot;
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

  /**
   * Makes `source` hold router blocks view[from .. from + split) (one engine block) chained below `prev`; returns the
   * last block's slot. A block the source already holds gains a reference instead.
   */
  private holdChain(source: number, state: SourceState, view: Int32Array, from: number, split: number, prev: number): number {
    let slot = prev;
    for (let i = from; i < from + split; i++) {
      slot = this.slotFor(view[2 * i], view[2 * i + 1], slot);
      if (i === from) this.chainFirst = slot;
      if (this.addHolder(slot, source)) state.cachedBlocks++;
      else {
        state.refs ??= new Map();
        state.refs.set(slot, (state.refs.get(slot) ?? 0) + 1);
      }
    }
    return slot;
  }

  /** The first block's slot of the last holdChain. */
  private chainFirst = NONE;

  /** Adds `source` to the holders of the block in `slot`; false when it was one already. */
  private addHolder(slot: number, source: number): boolean {
    const at = slot * REC + SET;
    const id = this.rec[at];
    if (this.sets.has(id, source)) return false;
    const next = this.sets.changed(id, source, 1);
    this.sets.retain(next);
    this.sets.release(id);
    this.rec[at] = next;
    return true;
  }

  /** Removes `source` from the holders of the block in `slot`; false when it was not one. */
  private removeHolder(slot: number, source: number): boolean {
    const at = slot * REC + SET;
    const id = this.rec[at];
    if (!this.sets.has(id, source)) return false;
    const next = this.sets.changed(id, source, -1);
    this.sets.retain(next);
    this.sets.release(id);
    this.rec[at] = next;
    return true;
  }

  private setEngineId(state: SourceState, lo: number, hi: number, slot: number): void {
    state.engineIds.set(lo, hi, slot, this.gen ? this.gen[slot] : 0);
  }

  /** The slot holding a seq hash, or NONE. */
  private findSlot(lo: number, hi: number): number {
    return this.seq.get(lo, hi);
  }

  /** False for a freed slot (a stale parent link may name one). */
  private isLive(slot: number): boolean {
    return this.seq.get(this.rec[slot * REC + LO], this.rec[slot * REC + HI]) === slot;
  }

  /** The slot of a hash, created (linked to its parent, no holders yet) when absent. One table probe either way. */
  private slotFor(lo: number, hi: number, parentSlot: number): number {
    // The slot a new block would get, offered to the table; taken only if the hash was absent.
    const fresh = this.freeHead !== NONE ? this.freeHead : this.nextSlot;
    const found = this.seq.insert(lo, hi, fresh);
    if (found >= 0) return found;
    const slot = fresh;
    if (slot === this.freeHead) this.freeHead = this.rec[slot * REC + PARENT] - 1;
    else {
      this.nextSlot++;
      if (slot >= this.slotCap) this.growBlocks();
    }
    const r = this.rec;
    const at = slot * REC;
    r[at + LO] = lo;
    r[at + HI] = hi;
    r[at + PARENT] = parentSlot + 1;
    r[at + SET] = EMPTY_SET;
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
  private lookupEngine(state: SourceState, lo: number, hi: number): number {
    const pos = state.engineIds.find(lo, hi);
    if (pos < 0) return NONE;
    const slot = state.engineIds.valueAt(pos);
    if (this.gen && this.gen[slot] !== state.engineIds.auxAt(pos)) {
      state.engineIds.deleteAt(pos);
      return NONE;
    }
    return slot;
  }

  private removeEngineBlock(source: number, state: SourceState, lo: number, hi: number): boolean {
    const pos = state.engineIds.find(lo, hi);
    if (pos < 0) return false;
    const slot = state.engineIds.valueAt(pos);
    const generation = state.engineIds.auxAt(pos);
    state.engineIds.deleteAt(pos);
    // A mapping to a block the cap pruned since is stale: the block is already gone.
    if (this.gen && this.gen[slot] !== generation) return false;
    this.dropChain(source, state, slot, state.split);
    return true;
  }

  /**
   * Removes the source from `slot` and up to `split - 1` ancestors (the router blocks of one engine block), except
   * from blocks another of its engine blocks still covers (a reference is dropped instead).
   */
  private dropChain(source: number, state: SourceState, slot: number, split: number): void {
    let s = slot;
    for (let m = 0; m < split && s !== NONE; m++) {
      const next = this.rec[s * REC + PARENT] - 1;
      // Past the first block the slot comes from a parent link, which may be stale (its block freed since).
      if (m > 0 && !this.isLive(s)) break;
      const refs = state.refs?.get(s) ?? 0;
      if (refs > 0) {
        if (refs === 1) state.refs!.delete(s);
        else state.refs!.set(s, refs - 1);
      } else {
        if (this.removeHolder(s, source)) {
          state.cachedBlocks--;
          if (this.rec[s * REC + SET] === EMPTY_SET) this.freeSlot(s);
        }
      }
      s = next;
    }
  }

  private clearSource(source: number): void {
    const state = this.sources[source];
    if (!state) return;
    const map = state.engineIds;
    const positions = new Int32Array(map.size);
    const n = map.positions(positions, false);
    const slots = new Int32Array(n);
    let k = 0;
    for (let j = 0; j < n; j++) {
      const slot = map.valueAt(positions[j]);
      if (!this.gen || this.gen[slot] === map.auxAt(positions[j])) slots[k++] = slot;
    }
    state.refs = null;
    for (let j = 0; j < k; j++) this.dropChain(source, state, slots[j], state.split);
    map.clear();
    state.cachedBlocks = 0;
    state.split = 0; // nothing held: a restarted engine may announce another block size
  }

  /** Frees a block: its hash leaves the table, its slot goes to the free list. */
  private freeSlot(slot: number): void {
    const r = slot * REC;
    // A free slot carries the empty set: the walk's neighbour guess (see walk) tells live slots by it.
    this.sets.release(this.rec[r + SET]);
    this.rec[r + SET] = EMPTY_SET;
    this.seq.delete(this.rec[r + LO], this.rec[r + HI]);
    this.liveBlocks--;
    const at = r + PARENT;
    if (this.capped) {
      this.unlink(slot);
      const p = this.rec[at] - 1;
      if (p !== NONE && this.childCount![p] > 0) this.childCount![p]--;
      this.gen![slot]++;
    }
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
    const deepest = this.walk(view, n, scores);
    if (this.capped && deepest > 0) this.touchPrefix(view, deepest);
    return scores;
  }

  /**
   * A (lo, hi) int32 view of a hash array. The last one is reused: repeated lookups of one prompt and the hashing
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
   * The walk. `alive` lists the sources holding every block so far; a source missing block i drops out with i, its
   * answer, and the survivors get the depth reached at the end. A block is found in the slot after the previous
   * block's when that slot holds its hash (a stored run of blocks takes neighbouring slots, so along a cached prefix
   * this is a sequential read), else by one probe of the sequence table. Its record carries its holder-set id
   * (./set-table.ts): a block with the same id as the last block that changed the alive set (the common case along a
   * prefix) changes nothing; otherwise `alive` is intersected with the set's members. So a block costs one record
   * read, a change of holders costs the holders, not the fleet, and nothing per source is written between blocks.
   * Returns the depth reached.
   */
  private walk(view: Int32Array, n: number, scores: Int32Array): number {
    const seq = this.seq;
    const cells = seq.cells;
    const rec = this.rec;
    const sets = this.sets;
    const setCells = sets.cells;
    const alive = this.alive;
    const data = sets.holders.data;
    const first = seq.get(view[0], view[1]);
    if (first < 0) return 0;
    // The record offset of the last block found, and the set id of the last block that changed the alive set
    // (alive is always within its members).
    let at = first * REC;
    let lastSet = rec[at + SET];
    let count: number;
    let i: number;
    if (setCells[2 * lastSet] === BITS) {
      // A first block most of a large fleet holds: bitsets ANDed word by word while the set stays that large.
      const r = this.walkDense(view, n, scores, first);
      if (r < 0) return -r - 1;
      i = r;
      count = this.aliveCount;
      lastSet = this.aliveSet;
      at = this.aliveAt;
    } else {
      count = sets.collect(lastSet, alive);
      if (count === 0) return 0;
      i = 1;
    }
    // The table's probe, inlined with its parameters in locals: this loop is the router's hot path.
    const cap = seq.capacity;
    const shift = seq.homeShift;
    const mult = seq.homeMult;
    const end = this.nextSlot * REC;
    for (; i < n; i++) {
      const lo = view[2 * i];
      const hi = view[2 * i + 1];
      at += REC;
      if (at >= end || rec[at] !== lo || rec[at + 1] !== hi || rec[at + SET] === EMPTY_SET) {
        let c = homeOfHashed(lo, shift, mult);
        at = -1;
        for (;;) {
          const q = c * CELL;
          const v = cells[q + 2];
          if (v === 0) break;
          if (cells[q] === lo && cells[q + 1] === hi) {
            at = (v - 1) * REC;
            break;
          }
          if (++c === cap) c = 0;
        }
        if (at < 0) break;
      }
      const id = rec[at + SET];
      if (id === lastSet) continue;
      lastSet = id;
      const m0 = setCells[2 * id];
      const m1 = setCells[2 * id + 1];
      let next = 0;
      if (m0 >= 0) {
        // Up to four inline holders (an empty half reads as -1).
        const h0 = (m0 & 0xffff) - 1;
        const h1 = (m0 >>> 16) - 1;
        const h2 = (m1 & 0xffff) - 1;
        const h3 = (m1 >>> 16) - 1;
        for (let j = 0; j < count; j++) {
          const s = alive[j];
          if (s === h0 || s === h1 || s === h2 || s === h3) alive[next++] = s;
          else scores[s] = i;
        }
      } else if (m0 === LIST) {
        const k = data[m1];
        const mark = this.mark;
        const stamp = this.nextStamp();
        for (let j = 0; j < k; j++) mark[data[m1 + 2 + j]] = stamp;
        for (let j = 0; j < count; j++) {
          const s = alive[j];
          if (mark[s] === stamp) alive[next++] = s;
          else scores[s] = i;
        }
      } else {
        const width = data[m1 + 1];
        for (let j = 0; j < count; j++) {
          const s = alive[j];
          const w = s >>> 5;
          if (w < width && (data[m1 + 2 + w] & (1 << (s & 31))) !== 0) alive[next++] = s;
          else scores[s] = i;
        }
      }
      if (next === 0) return i;
      count = next;
    }
    for (let j = 0; j < count; j++) scores[alive[j]] = i;
    return i;
  }

  /** A fresh stamp for `mark` (a set membership test without clearing the array each time). */
  private nextStamp(): number {
    if (this.stamp === 0x7fffffff) {
      this.mark.fill(0);
      this.stamp = 0;
    }
    return ++this.stamp;
  }

  /**
   * The walk while blocks are held by more sources than a list holds: the alive set is a bitset, ANDed with each
   * block's, and sources dropping out at block i get i. At the first smaller block the survivors become the alive
   * list (aliveCount of them); returns the next block then, or -(depth + 1) when done.
   */
  private walkDense(view: Int32Array, n: number, scores: Int32Array, first: number): number {
    const seq = this.seq;
    const rec = this.rec;
    const sets = this.sets;
    const setCells = sets.cells;
    const data = sets.holders.data;
    const W = sets.holders.width;
    if (this.aliveBits.length < W) this.aliveBits = new Int32Array(W);
    const alive = this.aliveBits;
    alive.fill(0, 0, W);
    let at = first * REC;
    let lastSet = rec[at + SET];
    let off = setCells[2 * lastSet + 1];
    let width = data[off + 1];
    for (let w = 0; w < width; w++) alive[w] = data[off + 2 + w];
    // Words [lo, hi) may be non-zero.
    let lo = 0;
    let hi = width;
    const end = this.nextSlot * REC;
    let i = 1;
    for (; i < n; i++) {
      // The neighbouring slot first, else the table (as in walk).
      at += REC;
      if (at >= end || rec[at] !== view[2 * i] || rec[at + 1] !== view[2 * i + 1] || rec[at + SET] === EMPTY_SET) {
        const slot = seq.get(view[2 * i], view[2 * i + 1]);
        if (slot < 0) break;
        at = slot * REC;
      }
      const id = rec[at + SET];
      // The same holders as the last change: nobody drops out.
      if (id === lastSet) continue;
      lastSet = id;
      if (setCells[2 * id] === BITS) {
        off = setCells[2 * id + 1];
        width = data[off + 1];
        let newLo = -1;
        let newHi = 0;
        for (let w = lo; w < hi; w++) {
          const cur = alive[w];
          if (cur === 0) continue;
          const kept = w < width ? cur & data[off + 2 + w] : 0;
          for (let d = cur & ~kept; d !== 0; d &= d - 1) scores[(w << 5) + ctz(d)] = i;
          alive[w] = kept;
          if (kept !== 0) {
            if (newLo < 0) newLo = w;
            newHi = w + 1;
          }
        }
        if (newLo < 0) return -i - 1;
        lo = newLo;
        hi = newHi;
        continue;
      }
      // Fewer holders: survivors (holders still alive) continue as the alive list; everyone else stops at i.
      const list = this.alive;
      const k = sets.collect(id, this.ids);
      let next = 0;
      for (let j = 0; j < k; j++) {
        const s = this.ids[j];
        if ((alive[s >>> 5] & (1 << (s & 31))) !== 0) list[next++] = s;
      }
      for (let w = lo; w < hi; w++) for (let d = alive[w]; d !== 0; d &= d - 1) scores[(w << 5) + ctz(d)] = i;
      if (next === 0) return -i - 1;
      this.aliveCount = next;
      this.aliveSet = id;
      this.aliveAt = at;
      return i + 1;
    }
    for (let w = lo; w < hi; w++) for (let d = alive[w]; d !== 0; d &= d - 1) scores[(w << 5) + ctz(d)] = i;
    return -i - 1;
  }

  private touchPrefix(view: Int32Array, deepest: number): void {
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
    const k = this.sets.collect(this.rec[slot * REC + SET], this.ids);
    for (let j = 0; j < k; j++) {
      const state = this.sources[this.ids[j]];
      if (!state) continue;
      state.cachedBlocks--;
      state.refs?.delete(slot); // the slot will be reused: a reference left here would protect another block
    }
    this.prunedBlocks++;
    this.freeSlot(slot);
  }

  // ---------------------------------------------------------------- growth

  private growBlocks(): void {
    const cap = Math.ceil(this.slotCap * SLOT_GROWTH);
    const rec = new Int32Array(cap * REC);
    rec.set(this.rec);
    this.rec = rec;
    this.slotCap = cap;
    if (this.capped) {
      const grow = <T extends Int32Array | Uint32Array>(a: T, b: T): T => {
        b.set(a);
        return b;
      };
      this.lruPrev = grow(this.lruPrev!, new Int32Array(cap));
      this.lruNext = grow(this.lruNext!, new Int32Array(cap));
      this.childCount = grow(this.childCount!, new Uint32Array(cap));
      this.gen = grow(this.gen!, new Int32Array(cap));
    }
  }

  // ---------------------------------------------------------------- snapshots

  /**
   * A consistent copy of what a snapshot needs (slot records and each source's engine-id table): typed-array copies
   * only, so the synchronous cost is a memory copy; the per-source arrays are built from the copy later, in pieces,
   * while this index goes on changing.
   */
  capture(): IndexCapture {
    const steps = this.captureSteps(Number.POSITIVE_INFINITY);
    let r = steps.next();
    while (!r.done) r = steps.next();
    return r.value!;
  }

  /**
   * The same copy in steps of at most `budget` words (1 MiB by default: under a millisecond), for a caller that must not stall.
   * The copy is only consistent if the index does not change until the generator returns: the caller holds back
   * its events meanwhile (routing only reads the index). Any change that happens anyway (apply, restoreSource,
   * removeSource) is detected and the result is null: take it again later.
   */
  *captureSteps(budget = CAPTURE_STEP): Generator<void, IndexCapture | null, void> {
    const start = this.changes;
    const maps = new Map<number, { split: number; engineIds: U64Map }>();
    const held: Array<[number, SourceState]> = [];
    this.sources.forEach((state, source) => {
      if (state && state.engineIds.size > 0) held.push([source, state]);
    });
    for (const [source, state] of held) {
      const engineIds = yield* state.engineIds.cloneSteps(budget);
      if (this.changes !== start) return null;
      maps.set(source, { split: state.split, engineIds });
      yield;
    }
    const rec = yield* copySteps(this.rec, this.nextSlot * REC, budget);
    if (this.changes !== start) return null;
    const gen = this.gen ? yield* copySteps(this.gen, this.nextSlot, budget) : null;
    if (this.changes !== start) return null;
    return new IndexCapture(this.blockSize, rec, REC, gen, maps);
  }

  /**
   * Replaces everything `source` holds with a snapshot's blocks (IndexCapture.exportSource's arrays, or the same
   * decoded from the wire). Engine ids and hashes are read as u32 halves: no bigint per block. Entries that cannot be
   * restored (an engine id listed twice, a parent position out of range) are counted, never thrown on.
   */
  restoreSource(source: number, blocks: SourceBlocks): IndexApplyResult {
    const state = this.sources[source];
    const n = blocks.engineIds.length;
    if (!state) return this.reject('unknown_source', n);
    this.changes++;
    const bs = this.blockSize;
    if (!Number.isInteger(blocks.blockSize) || blocks.blockSize <= 0 || blocks.blockSize % bs !== 0) {
      return this.reject('block_size_mismatch', n);
    }
    const split = blocks.blockSize / bs;
    if (blocks.seqHashes.length !== n * split) return this.reject('token_count_mismatch', n);
    if (blocks.parents && blocks.parents.length !== n) return this.reject('invalid_snapshot', n);
    this.clearSource(source);
    if (n === 0) return { applied: 0, rejected: 0 };
    // Sized for all of them at once: any insertion order is then as cheap as any other.
    state.engineIds = new U64Map(n, this.capped);
    state.split = split;
    const ids = new Int32Array(blocks.engineIds.buffer, blocks.engineIds.byteOffset, 2 * n);
    const view = new Int32Array(blocks.seqHashes.buffer, blocks.seqHashes.byteOffset, 2 * n * split);
    const firstSlot = new Int32Array(n).fill(NONE);
    const lastSlot = new Int32Array(n).fill(NONE);
    let applied = 0;
    let duplicates = 0;
    for (let j = 0; j < n; j++) {
      const lo = ids[2 * j];
      const hi = ids[2 * j + 1];
      if (state.engineIds.find(lo, hi) >= 0) {
        duplicates++;
        continue;
      }
      const slot = this.holdChain(source, state, view, j * split, split, NONE);
      // holdChain linked the engine block's own router blocks; its first block's parent is linked below.
      firstSlot[j] = this.chainFirst;
      lastSlot[j] = slot;
      this.setEngineId(state, lo, hi, slot);
      applied++;
    }
    let invalid = 0;
    const parents = blocks.parents;
    if (parents) {
      // A block created here without its parent gets it now (a parent is a fact of content: any holder's is right).
      for (let j = 0; j < n; j++) {
        const p = parents[j];
        if (p < 0 || firstSlot[j] === NONE) continue;
        if (p >= n || p === j || !Number.isInteger(p)) {
          invalid++;
          continue;
        }
        const ps = lastSlot[p];
        const at = firstSlot[j] * REC + PARENT;
        if (ps === NONE || ps === firstSlot[j] || this.rec[at] !== 0) continue;
        this.rec[at] = ps + 1;
        if (this.capped) this.childCount![ps]++;
      }
    }
    if (this.capped) this.enforceCap();
    this.appliedByKind.stored += applied;
    if (duplicates > 0) this.count('duplicate_block', duplicates);
    if (invalid > 0) this.count('invalid_snapshot', invalid);
    const rejected = duplicates;
    if (rejected > 0) return { applied, rejected, reason: 'duplicate_block' };
    return invalid > 0 ? { applied, rejected: 0, reason: 'invalid_snapshot' } : { applied, rejected: 0 };
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
    /** Blocks whose holders outgrew their cell (more than four sources). */
    overflowBlocks: number;
    /** Distinct holder sets the blocks carry (interned: prefix chains share them). */
    holderSets: number;
    pruned: number;
    applied: { stored: number; removed: number; cleared: number };
    rejected: Record<string, number>;
  } {
    let pairs = 0;
    let sources = 0;
    let bytes = this.seq.byteLength + this.rec.byteLength + this.sets.byteLength;
    if (this.capped) bytes += this.lruPrev!.byteLength * 4;
    for (const s of this.sources) {
      if (!s) continue;
      sources++;
      pairs += s.cachedBlocks;
      bytes += s.engineIds.byteLength;
    }
    const rejected: Record<string, number> = {};
    for (const [k, v] of this.rejects) rejected[k] = v;
    return {
      blocks: this.liveBlocks,
      pairs,
      sources,
      bytes,
      overflowBlocks: this.sets.overflowBlocks,
      holderSets: this.sets.size,
      pruned: this.prunedBlocks,
      applied: { ...this.appliedByKind },
      rejected,
    };
  }

  /**
   * Events that rebuild an identical index from empty (same blocks per source, same engine-id mappings), carrying
   * the router's hashes so no tokens are needed. The older snapshot form (one bigint per engine id); `capture()`
   * and `restoreSource()` are the typed-array path.
   */
  dump(): Array<{ source: number; event: StoredEvent }> {
    const capture = this.capture();
    const out: Array<{ source: number; event: StoredEvent }> = [];
    for (const source of capture.sources()) {
      const blocks = capture.exportSource(source);
      if (!blocks || blocks.engineIds.length === 0) continue;
      out.push({
        source,
        event: {
          kind: 'stored',
          parent: null,
          engineIds: Array.from(blocks.engineIds),
          tokens: null,
          blockSize: blocks.blockSize,
          seqHashes: blocks.seqHashes,
        },
      });
    }
    return out;
  }

  /**
   * True when `source` holds block `i` of `seqHashes`: one table probe. The cache-group finders of hybrid models ask
   * this block by block (./groups.ts); the prefix walk above does not use it.
   */
  holdsBlock(source: number, seqHashes: BigUint64Array, i: number): boolean {
    if (this.liveBlocks === 0) return false;
    idBuf[0] = seqHashes[i];
    const slot = this.findSlot(idHalves[0], idHalves[1]);
    return slot !== NONE && this.sets.has(this.rec[slot * REC + SET], source);
  }

  /**
   * Leading blocks of a chain (`n` seq hashes as u32 halves) that `source` holds: a binary search of table probes,
   * exact when the source's blocks are prefix-closed along the chain (an engine evicts a chain's tail before its
   * prefix), else some prefix ending where a held block is followed by a missing one. The overlay's withdrawal reads
   * it (router.ts, applyEvents); routing does not.
   */
  heldPrefix(source: number, view: Uint32Array, n: number): number {
    if (this.liveBlocks === 0 || !this.sources[source]) return 0;
    let lo = 0;
    let hi = n;
    while (lo < hi) {
      const mid = (lo + hi + 1) >>> 1;
      const k = 2 * (mid - 1);
      const slot = this.findSlot(view[k], view[k + 1]);
      if (slot !== NONE && this.sets.has(this.rec[slot * REC + SET], source)) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  /** Router hashes a source holds (for tests and debugging; not a hot path). */
  blocksOf(source: number): Set<bigint> {
    const out = new Set<bigint>();
    if (!this.sources[source]) return out;
    const cells = this.seq.cells;
    for (let at = 0; at < cells.length; at += CELL) {
      const slot = cells[at + 2] - 1;
      if (slot >= 0 && this.sets.has(this.rec[slot * REC + SET], source)) out.add(joinU64(cells[at], cells[at + 1]));
    }
    return out;
  }
}
