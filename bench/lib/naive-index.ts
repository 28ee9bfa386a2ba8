/**
 * The naive baseline of the index benchmark: what one writes first with JS collections. `Map<seqHash, Set<source>>`
 * plus, per source, `Map<engineId, seqHash>`; same apply/findMatches contract as KvIndex (tokens hashed with the same
 * hashing code, contiguous-from-block-0 overlap per source), minus the rarely exercised parts (block splitting, caps).
 */
import { hashBlocksInto, hashSeed } from '../../src/core/hashing.ts';
import type { ApplyResult, KvEvent } from '../../src/core/types.ts';

export class NaiveIndex {
  private readonly blocks = new Map<bigint, Set<number>>();
  private readonly engine: (Map<bigint, bigint> | undefined)[] = [];
  private readonly cached: number[] = [];
  private scratch = new BigUint64Array(256);
  private scores = new Int32Array(64);

  constructor(readonly blockSize: number) {}

  addSource(source: number): void {
    this.engine[source] ??= new Map();
    this.cached[source] ??= 0;
    if (this.scores.length <= source) this.scores = new Int32Array(source + 1);
  }

  cachedBlocks(source: number): number {
    return this.cached[source] ?? 0;
  }

  apply(source: number, ev: KvEvent): ApplyResult {
    const engine = this.engine[source];
    if (!engine) return { applied: 0, rejected: 1, reason: 'unknown_source' };
    if (ev.kind === 'removed') {
      let applied = 0;
      for (const id of ev.engineIds) {
        const seq = engine.get(id);
        if (seq === undefined) continue;
        engine.delete(id);
        const holders = this.blocks.get(seq);
        if (holders?.delete(source)) {
          this.cached[source]--;
          if (holders.size === 0) this.blocks.delete(seq);
        }
        applied++;
      }
      const rejected = ev.engineIds.length - applied;
      return rejected > 0 ? { applied, rejected, reason: 'unknown_block' } : { applied, rejected };
    }
    if (ev.kind === 'cleared') {
      for (const seq of engine.values()) {
        const holders = this.blocks.get(seq);
        if (holders?.delete(source) && holders.size === 0) this.blocks.delete(seq);
      }
      engine.clear();
      this.cached[source] = 0;
      return { applied: 1, rejected: 0 };
    }
    const n = ev.engineIds.length;
    let parentSeq: bigint | null = null;
    if (ev.parent !== null) {
      parentSeq = engine.get(ev.parent) ?? null;
      if (parentSeq === null && !ev.seqHashes) return { applied: 0, rejected: n, reason: 'unknown_parent' };
    }
    let seqs: BigUint64Array;
    if (ev.seqHashes) {
      seqs = ev.seqHashes;
    } else {
      if (!ev.tokens || ev.tokens.length !== n * this.blockSize || ev.blockSize !== this.blockSize) {
        return { applied: 0, rejected: n, reason: 'token_count_mismatch' };
      }
      if (this.scratch.length < n) this.scratch = new BigUint64Array(n * 2);
      seqs = this.scratch;
      hashBlocksInto({
        tokens: ev.tokens,
        from: 0,
        count: n * this.blockSize,
        blockSize: this.blockSize,
        seed: hashSeed(ev.loraName, ev.cacheSalt),
        parentSeq,
        outSeq: seqs,
        outOffset: 0,
      });
    }
    for (let i = 0; i < n; i++) {
      const seq = seqs[i];
      let holders = this.blocks.get(seq);
      if (!holders) {
        holders = new Set();
        this.blocks.set(seq, holders);
      }
      if (!holders.has(source)) {
        holders.add(source);
        this.cached[source]++;
      }
      engine.set(ev.engineIds[i], seq);
    }
    return { applied: n, rejected: 0 };
  }

  findMatches(seqHashes: BigUint64Array): Int32Array {
    const scores = this.scores;
    scores.fill(0);
    let alive: number[] | null = null;
    let i = 0;
    for (; i < seqHashes.length; i++) {
      const holders = this.blocks.get(seqHashes[i]);
      if (!holders) break;
      if (alive === null) {
        alive = [...holders];
        continue;
      }
      const next: number[] = [];
      for (const s of alive) {
        if (holders.has(s)) next.push(s);
        else scores[s] = i;
      }
      alive = next;
      if (alive.length === 0) return scores;
    }
    if (alive) for (const s of alive) scores[s] = i;
    return scores;
  }

  stats(): { blocks: number; pairs: number } {
    let pairs = 0;
    for (const c of this.cached) pairs += c ?? 0;
    return { blocks: this.blocks.size, pairs };
  }
}
