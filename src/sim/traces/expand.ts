/**
 * Expansion of a trace's 512-token prefix ids into pseudo-token ids, so the router's own hashing (docs/protocols.md §1)
 * sees exactly the trace's sharing structure at any block size that divides 512.
 *
 * The tokens of a block are a pure function of its id (a counter-mode hash keyed by the id), so the same id always
 * expands to the same 512 tokens, and different ids differ in every 16-token sub-block with overwhelming probability.
 * Because an id names its whole prefix, the router hashes of a full 512-block depend only on its id: the hasher below
 * memoises them per id, which turns hashing the conversation trace into mostly cache lookups.
 */
import { BASE_SEED, computeSeqHashes, fullBlocks, hashBlocksInto } from '../../core/hashing.ts';
import { mix32 } from '../../core/rng.ts';
import { TRACE_BLOCK_TOKENS, type TraceRequest } from './format.ts';

/** Pseudo-token ids stay inside a realistic vocabulary range (and clear of low special ids). */
const TOKEN_BASE = 1000;
/** 2^17 ids above the base (a mask, not a modulo: this runs for every prompt token of a replay). */
const TOKEN_MASK = 0x1ffff;

/** Nonzero xorshift state per id. mix32 is a bijection, so distinct ids get distinct streams. */
function blockSeed(id: number): number {
  return mix32(id ^ 0x5bd1e995) || 0x2545f491;
}

/**
 * Writes the first `count` pseudo-tokens of block `id` into `out` at `offset`: a xorshift32 stream seeded by a
 * well-mixed function of the id (one multiply-free step per token: this runs for every prompt token of a replay).
 */
export function writeBlockTokens(id: number, out: Uint32Array | number[], offset: number, count: number): void {
  let x = blockSeed(id);
  for (let j = 0; j < count; j++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[offset + j] = TOKEN_BASE + (x & TOKEN_MASK);
  }
}

/** The prompt of a trace request as token ids: each id expanded to 512 tokens, the last block cut to input_length. */
export function expandTokens(req: TraceRequest, out?: Uint32Array): Uint32Array {
  const n = req.inputLength;
  const tokens = out && out.length >= n ? out.subarray(0, n) : new Uint32Array(n);
  const ids = req.hashIds;
  for (let b = 0; b < ids.length; b++) {
    const from = b * TRACE_BLOCK_TOKENS;
    writeBlockTokens(ids[b], tokens, from, Math.min(TRACE_BLOCK_TOKENS, n - from));
  }
  return tokens;
}

interface MemoEntry {
  /** Router seq hash of the block before this id (0n for none): a guard against traces that reuse an id elsewhere. */
  readonly parent: bigint;
  readonly hasParent: boolean;
  readonly seq: BigUint64Array;
}

/**
 * Router sequence hashes of trace requests without materialising whole prompts. Equal to
 * `computeSeqHashes(expandTokens(req), blockSize, seed)` (tested), at a fraction of the cost on traces with reuse.
 */
export class TraceHasher {
  private readonly memo = new Map<number, MemoEntry>();
  private memoHashes = 0;
  private readonly perBlock: number;
  private readonly scratch = new Uint32Array(TRACE_BLOCK_TOKENS);
  hits = 0;
  misses = 0;

  constructor(
    readonly blockSize: number,
    readonly seed: bigint = BASE_SEED,
    /** Memo bound in hashes (8 bytes each plus overhead); the memo is dropped and rebuilt past it. */
    readonly maxMemoHashes = 4_000_000,
  ) {
    if (!Number.isInteger(blockSize) || blockSize <= 0) throw new RangeError(`block size must be a positive integer, got ${blockSize}`);
    this.perBlock = TRACE_BLOCK_TOKENS % blockSize === 0 ? TRACE_BLOCK_TOKENS / blockSize : 0;
  }

  seqHashes(req: TraceRequest): BigUint64Array {
    const bs = this.blockSize;
    // Block sizes that do not divide 512 straddle trace blocks: hash the expanded prompt directly.
    if (this.perBlock === 0) return computeSeqHashes(expandTokens(req), bs, this.seed);
    const out = new BigUint64Array(fullBlocks(req.inputLength, bs));
    const ids = req.hashIds;
    const per = this.perBlock;
    let filled = 0;
    for (let b = 0; b < ids.length; b++) {
      const tokensInBlock = Math.min(TRACE_BLOCK_TOKENS, req.inputLength - b * TRACE_BLOCK_TOKENS);
      const hasParent = filled > 0;
      const parent = hasParent ? out[filled - 1] : 0n;
      if (tokensInBlock === TRACE_BLOCK_TOKENS) {
        const hit = this.memo.get(ids[b]);
        if (hit && hit.hasParent === hasParent && hit.parent === parent) {
          out.set(hit.seq, filled);
          filled += per;
          this.hits++;
          continue;
        }
        this.misses++;
      }
      writeBlockTokens(ids[b], this.scratch, 0, tokensInBlock);
      const n = hashBlocksInto({
        tokens: this.scratch,
        from: 0,
        count: tokensInBlock,
        blockSize: bs,
        seed: this.seed,
        parentSeq: hasParent ? parent : null,
        outSeq: out,
        outOffset: filled,
      });
      if (tokensInBlock === TRACE_BLOCK_TOKENS) this.remember(ids[b], hasParent, parent, out.slice(filled, filled + n));
      filled += n;
    }
    return out;
  }

  private remember(id: number, hasParent: boolean, parent: bigint, seq: BigUint64Array): void {
    if (this.memoHashes + seq.length > this.maxMemoHashes) {
      this.memo.clear();
      this.memoHashes = 0;
    }
    this.memo.set(id, { parent, hasParent, seq });
    this.memoHashes += seq.length;
  }
}

/** Same as {@link expandTokens} into a plain array (what the engine model takes). */
export function expandTokensArray(req: TraceRequest): number[] {
  const n = req.inputLength;
  const tokens: number[] = new Array(n);
  let k = 0;
  const ids = req.hashIds;
  for (let b = 0; b < ids.length; b++) {
    const count = Math.min(TRACE_BLOCK_TOKENS, n - b * TRACE_BLOCK_TOKENS);
    let x = blockSeed(ids[b]);
    for (let j = 0; j < count; j++) {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      tokens[k++] = TOKEN_BASE + (x & TOKEN_MASK);
    }
  }
  return tokens;
}

/**
 * A recorded request (`kvroute serve --record`) for the engine models: the router's recorded hash chain is what the
 * simulated router routes on, but a mock engine caches tokens. Each recorded block becomes `blockSize` pseudo-tokens
 * drawn from its 64-bit hash (even positions from its low half, odd from its high half), so two blocks get the same
 * tokens only if their hashes agree; since a recorded hash names its whole prefix, the engines see exactly the
 * recording's sharing structure at the recorded block size. The tail past the last full block is drawn from the
 * request's index (never shared; engines never cache a partial block).
 *
 * `RecordedPrompts` also keeps the way back: the router hash the engine's events will carry for each pseudo block ->
 * the recorded hash, so the events reach the simulated router in the recording's own hashes.
 */
export class RecordedPrompts {
  /** Engine-side (pseudo-token) router hash -> recorded hash. */
  private readonly back = new Map<bigint, bigint>();
  /** Recorded chains already mapped, by their last hash (it names the whole chain). */
  private readonly mapped = new Set<bigint>();

  constructor(readonly blockSize: number) {}

  /** The prompt of recorded request `index` as pseudo-token ids; its blocks' hashes are remembered for `recorded`. */
  tokens(req: TraceRequest, index: number): number[] {
    const bs = this.blockSize;
    const hashes = req.blockHashes!;
    const n = req.inputLength;
    const tokens: number[] = new Array(n);
    for (let b = 0; b < hashes.length; b++) {
      const h = hashes[b];
      let lo = blockSeed(Number(h & 0xffffffffn));
      let hi = blockSeed(Number(h >> 32n) ^ 0x68e31da4);
      const from = b * bs;
      for (let j = 0; j < bs; j += 2) {
        lo ^= lo << 13;
        lo ^= lo >>> 17;
        lo ^= lo << 5;
        tokens[from + j] = TOKEN_BASE + (lo & TOKEN_MASK);
        if (j + 1 < bs) {
          hi ^= hi << 13;
          hi ^= hi >>> 17;
          hi ^= hi << 5;
          tokens[from + j + 1] = TOKEN_BASE + (hi & TOKEN_MASK);
        }
      }
    }
    let x = blockSeed(index ^ 0x1b873593);
    for (let k = hashes.length * bs; k < n; k++) {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      tokens[k] = TOKEN_BASE + (x & TOKEN_MASK);
    }
    if (hashes.length > 0 && !this.mapped.has(hashes[hashes.length - 1])) {
      this.mapped.add(hashes[hashes.length - 1]);
      const pseudo = computeSeqHashes(Uint32Array.from(tokens.slice(0, hashes.length * bs)), bs, BASE_SEED);
      for (let b = 0; b < hashes.length; b++) this.back.set(pseudo[b], hashes[b]);
    }
    return tokens;
  }

  /** The recorded hash of an engine block (the engine's own for blocks no recording named: those filled by decode). */
  recorded(engineSeqHash: bigint): bigint {
    return this.back.get(engineSeqHash) ?? engineSeqHash;
  }
}
