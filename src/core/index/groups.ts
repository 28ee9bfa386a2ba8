/**
 * Hybrid models' cache groups (docs/engines.md "Hybrid attention (cache groups)"). Pure.
 *
 * A hybrid model (gpt-oss: sliding-window layers beside full attention; Qwen3-Next, Jamba: Mamba-style state beside
 * attention) keeps one KV-cache group per kind of layer, and vLLM announces each group's blocks apart (`group_idx`,
 * `kv_cache_spec_kind`, `kv_cache_spec_sliding_window`), with the same engine block ids in every group. The main
 * `KvIndex` holds each source's first full-attention group, exactly as for a model with one group (so nothing changes
 * for those); this class holds every other group in a `KvIndex` of its own, and answers what prefix the engine's
 * hybrid allocator would really reuse:
 *
 *   the longest L (blocks, at most cap) such that every full-attention group holds blocks [0, L), every
 *   sliding-window group holds the last ceil((window - 1) / block) blocks before L (all of [0, L) when L is
 *   shorter), and every Mamba group holds block L - 1 (its state was saved at L) or L = 0.
 *
 * computed as vLLM's `HybridKVCacheCoordinator.find_longest_cache_hit` does: a fixed point where each group's finder
 * (`SlidingWindowManager` / `MambaManager.find_longest_cache_hit`: the largest acceptable length at most the current
 * one, scanning right to left) may only lower the candidate, until no group lowers it.
 */
import { hashBlocksInto, hashSeed } from '../hashing.ts';
import { hashBlocksWithKeys } from '../multimodal.ts';
import type { ApplyResult, CacheGroupKind, CacheGroupSpec, KvEvent, StoredEvent } from '../types.ts';
import { KvIndex } from './kv-index.ts';

interface GroupEntry {
  readonly group: number;
  spec: CacheGroupSpec;
  readonly index: KvIndex;
}

interface SourceGroups {
  /** The group the main index holds for this source; null while no full-attention group is known. */
  primary: number | null;
  readonly groups: Map<number, GroupEntry>;
  /** Groups in the order the engine's coordinator checks them: full attention first, then by group index. */
  ordered: GroupEntry[];
}

const FULL: CacheGroupKind = 'full_attention';

/** Sliding-window blocks a hit needs before its cut: vLLM's cdiv(sliding_window - 1, block_size). */
export function slidingWindowBlocks(windowTokens: number, blockSize: number): number {
  return Math.ceil((windowTokens - 1) / blockSize);
}

/**
 * The router's sequence hashes of a Stored event's blocks, chained from `parentSeq` (multimodal keys included);
 * null when the token count does not fit the block count.
 */
export function hashStoredEvent(ev: StoredEvent, routerBlockSize: number, parentSeq: bigint | null): BigUint64Array | null {
  const n = ev.engineIds.length;
  if (!ev.tokens || ev.tokens.length !== n * ev.blockSize || ev.blockSize % routerBlockSize !== 0) return null;
  const blocks = (n * ev.blockSize) / routerBlockSize;
  const out = new BigUint64Array(blocks);
  const seed = hashSeed(ev.loraName, ev.cacheSalt);
  if (ev.mmKeys?.some((k) => k !== null)) {
    // Multimodal keys are per engine block: they map onto router blocks only when the two are the same size.
    if (ev.blockSize !== routerBlockSize || ev.mmKeys.length !== n) return null;
    hashBlocksWithKeys({
      tokens: ev.tokens,
      from: 0,
      blocks,
      blockSize: routerBlockSize,
      seed,
      parentSeq,
      keys: ev.mmKeys,
      outSeq: out,
      outOffset: 0,
    });
  } else {
    hashBlocksInto({
      tokens: ev.tokens,
      from: 0,
      count: blocks * routerBlockSize,
      blockSize: routerBlockSize,
      seed,
      parentSeq,
      outSeq: out,
      outOffset: 0,
    });
  }
  return out;
}

export class CacheGroups {
  private readonly indexes = new Map<number, KvIndex>();
  private readonly sources: (SourceGroups | undefined)[] = [];
  private readonly rejects = new Map<string, number>();
  /** True once any source's events named a cache group (until then every event takes the main index's path). */
  private seen = false;

  constructor(private readonly blockSize: number) {}

  /** True once any source announced a group the main index does not hold (a cheap test for the event path). */
  get active(): boolean {
    return this.seen;
  }

  /** True when `source` has groups besides the main index's: its hits follow the hybrid rule. */
  isHybrid(source: number): boolean {
    const st = this.sources[source];
    return st !== undefined && st.groups.size > 0;
  }

  /** The groups of a source, as announced (for state and tests). */
  groupsOf(source: number): { primary: number | null; groups: Array<{ group: number } & CacheGroupSpec> } {
    const st = this.sources[source];
    if (!st) return { primary: 0, groups: [] };
    return { primary: st.primary, groups: st.ordered.map((e) => ({ group: e.group, ...e.spec })) };
  }

  /**
   * True when the event belongs in the main index (the source's first full-attention group; group 0 of an engine
   * that does not say). Decides, on the way, which group that is.
   */
  isPrimary(source: number, ev: KvEvent, main: KvIndex): boolean {
    if (ev.kind === 'cleared') return true;
    const g = ev.groupIdx ?? 0;
    const kind = ev.kind === 'stored' ? ev.groupKind : undefined;
    let st = this.sources[source];
    if (!st) {
      if (g === 0 && (kind === undefined || kind === FULL)) return true;
      // Group 0 is already the main index's when it holds blocks of this source (an engine that named no kinds).
      st = { primary: g !== 0 && main.cachedBlocks(source) > 0 ? 0 : null, groups: new Map(), ordered: [] };
      this.sources[source] = st;
      this.seen = true;
    }
    if (ev.kind === 'stored') {
      if (st.primary === g && kind !== undefined && kind !== FULL)
        st.primary = null; // it said otherwise after all
      else if (st.primary === null && !st.groups.has(g) && (kind === FULL || (kind === undefined && g === 0))) st.primary = g;
    }
    return g === st.primary;
  }

  /** Applies an event of a group the main index does not hold (see isPrimary). `main` resolves parents. */
  apply(source: number, ev: KvEvent, main: KvIndex): ApplyResult {
    if (ev.kind === 'cleared') {
      this.clearSource(source);
      return { applied: 1, rejected: 0 };
    }
    const st = this.sources[source];
    const g = ev.groupIdx ?? 0;
    if (ev.kind === 'removed') {
      const e = st?.groups.get(g);
      if (!e) return this.reject('unknown_block', ev.engineIds.length);
      return e.index.apply(source, ev);
    }
    if (!st) return this.reject('unknown_source', ev.engineIds.length);
    // A group that does not say its kind (a relay of an older protocol, an engine that names none) is not indexed:
    // the source then keeps the one-group reading rather than a wrong hybrid one.
    const kind = ev.groupKind;
    if (kind === undefined || kind === 'unknown') return this.reject('unknown_group_kind', ev.engineIds.length);
    let e = st.groups.get(g);
    const spec: CacheGroupSpec = kind === 'sliding_window' ? { kind, slidingWindow: ev.slidingWindow ?? 0 } : { kind };
    if (!e) {
      let index = this.indexes.get(g);
      if (!index) {
        index = new KvIndex({ blockSize: this.blockSize });
        this.indexes.set(g, index);
      }
      if (!index.hasSource(source)) index.addSource(source);
      e = { group: g, spec, index };
      st.groups.set(g, e);
      st.ordered = coordinatorOrder(st.groups);
    } else if (e.spec.kind !== spec.kind || e.spec.slidingWindow !== spec.slidingWindow) {
      e.spec = spec;
      st.ordered = coordinatorOrder(st.groups);
    }
    if (ev.seqHashes) return e.index.apply(source, ev);
    let parentSeq: bigint | null = null;
    if (ev.parent !== null) {
      // The engine id is the block's hash in every group: any index that saw the parent knows its router hash (a
      // Mamba group announces a saved state whose parent block it never stored).
      parentSeq = e.index.seqHashOfEngineId(source, ev.parent) ?? main.seqHashOfEngineId(source, ev.parent);
      if (parentSeq === null) {
        for (const other of st.ordered) {
          if (other === e) continue;
          parentSeq = other.index.seqHashOfEngineId(source, ev.parent);
          if (parentSeq !== null) break;
        }
      }
      if (parentSeq === null) return this.reject('unknown_parent', ev.engineIds.length);
    }
    const seqHashes = hashStoredEvent(ev, this.blockSize, parentSeq);
    if (!seqHashes) return this.reject('token_count_mismatch', ev.engineIds.length);
    return e.index.apply(source, { ...ev, seqHashes });
  }

  /** Forgets every group block of a source (engine reset, AllBlocksCleared); its group layout is kept. */
  clearSource(source: number): void {
    const st = this.sources[source];
    if (!st) return;
    for (const e of st.groups.values()) e.index.apply(source, { kind: 'cleared' });
  }

  /** Forgets a source entirely. */
  removeSource(source: number): void {
    const st = this.sources[source];
    if (!st) return;
    for (const e of st.groups.values()) e.index.removeSource(source);
    this.sources[source] = undefined;
  }

  /**
   * The prefix (in blocks) the engine's hybrid allocator would reuse for a request: `mainBlocks` is what the main
   * index's walk found for this source, `cap` the most the engine can reuse (floor((prompt tokens - 1) / block)).
   */
  hit(source: number, seqHashes: BigUint64Array, mainBlocks: number, cap: number): number {
    const st = this.sources[source];
    let length = Math.min(cap, seqHashes.length);
    if (!st) return Math.min(length, mainBlocks);
    if (st.primary !== null) length = Math.min(length, mainBlocks);
    for (;;) {
      let cur = length;
      for (const e of st.ordered) {
        cur = groupHit(e, source, seqHashes, cur, this.blockSize);
        if (cur === 0) return 0;
      }
      if (cur >= length) return length;
      length = cur;
    }
  }

  /** Blocks per group index (all sources), and what was rejected, by reason. */
  stats(): { blocks: Record<string, number>; rejected: Record<string, number> } {
    const blocks: Record<string, number> = {};
    for (const [g, index] of this.indexes) blocks[String(g)] = index.stats().pairs;
    const rejected: Record<string, number> = {};
    for (const index of this.indexes.values())
      for (const [k, v] of Object.entries(index.stats().rejected)) rejected[k] = (rejected[k] ?? 0) + v;
    for (const [k, v] of this.rejects) rejected[k] = (rejected[k] ?? 0) + v;
    return { blocks, rejected };
  }

  private reject(reason: string, blocks: number): ApplyResult {
    this.rejects.set(reason, (this.rejects.get(reason) ?? 0) + blocks);
    const shared = reason === 'unknown_group_kind' ? 'empty_event' : reason;
    return { applied: 0, rejected: blocks, reason: shared as ApplyResult['reason'] };
  }
}

/** The order vLLM's coordinator checks groups in: full attention first, then by group index. */
function coordinatorOrder(groups: Map<number, GroupEntry>): GroupEntry[] {
  return [...groups.values()].sort((a, b) => Number(a.spec.kind !== FULL) - Number(b.spec.kind !== FULL) || a.group - b.group);
}

/** One group's finder: the largest length at most `max` this group accepts (vLLM's per-manager semantics). */
function groupHit(e: GroupEntry, source: number, seq: BigUint64Array, max: number, blockSize: number): number {
  const idx = e.index;
  switch (e.spec.kind) {
    case 'sliding_window': {
      const need = slidingWindowBlocks(e.spec.slidingWindow ?? 0, blockSize);
      let run = 0;
      for (let i = max - 1; i >= 0; i--) {
        if (!idx.holdsBlock(source, seq, i)) {
          run = 0;
          continue;
        }
        run++;
        if (run >= need) return i + run;
      }
      // No full window anywhere: the leading run is a hit all the same (the window before it is all of it).
      return run;
    }
    case 'mamba': {
      for (let i = max - 1; i >= 0; i--) if (idx.holdsBlock(source, seq, i)) return i + 1;
      return 0;
    }
    default: {
      let i = 0;
      while (i < max && idx.holdsBlock(source, seq, i)) i++;
      return i;
    }
  }
}
