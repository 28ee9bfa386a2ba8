/**
 * The router's own block hash (docs/protocols.md §1; the base case of NVIDIA Dynamo's router hash).
 *
 *   seed     = 1337 (+ xxh3(lora_name, 0)) (+ xxh3(cache_salt, 1))         wrapping at 2^64
 *   local[i] = xxh3_64(LE u32 bytes of tokens[i*bs .. (i+1)*bs), seed)     full blocks only
 *   seq[0]   = local[0];  seq[i] = xxh3_64(LE u64 seq[i-1] ‖ LE u64 local[i], 1337)
 *
 * seq[i] names the whole prefix up to block i, so two requests share block i of cache iff their seq[i] agree.
 */
import { xxh3 } from '@node-rs/xxhash';
import { endianness } from 'node:os';
import type { MmBlockKey } from './types.ts';
import { type BlockRun, hashBlocksWasm, WASM_MAX_BLOCK_TOKENS } from './wasm/blocks.ts';

export type { BlockRun } from './wasm/blocks.ts';

export const BASE_SEED = 1337n;
const U64 = (1n << 64n) - 1n;
const LITTLE_ENDIAN_HOST = endianness() === 'LE';

/** Hash seed for a request or event: adapters and tenants (cache_salt) never share blocks. Empty strings are absent. */
export function hashSeed(loraName?: string | null, cacheSalt?: string | null): bigint {
  let seed = BASE_SEED;
  if (loraName) seed = (seed + xxh3.xxh64(Buffer.from(loraName, 'utf8'), 0n)) & U64;
  if (cacheSalt) seed = (seed + xxh3.xxh64(Buffer.from(cacheSalt, 'utf8'), 1n)) & U64;
  return seed;
}

/** Number of full blocks in a prompt: the most that can ever match. */
export function fullBlocks(tokens: number, blockSize: number): number {
  return Math.floor(tokens / blockSize);
}

/** ceil(tokens / blockSize): the denominator of the per-request hit rate (a trailing partial block counts). */
export function islBlocks(tokens: number, blockSize: number): number {
  return Math.ceil(tokens / blockSize);
}

/**
 * Reusable scratch space for hashing. One per hasher keeps the hot path free of per-block allocation: tokens are
 * written once into a Uint32Array and hashed through byte views of it.
 */
class Scratch {
  u32: Uint32Array;
  u8: Uint8Array;
  readonly pair = new BigUint64Array(2);
  readonly pairBytes = new Uint8Array(this.pair.buffer);

  constructor(capacityTokens: number) {
    this.u32 = new Uint32Array(Math.max(16, capacityTokens));
    this.u8 = new Uint8Array(this.u32.buffer);
  }

  ensure(tokens: number): void {
    if (this.u32.length >= tokens) return;
    let cap = this.u32.length;
    while (cap < tokens) cap *= 2;
    this.u32 = new Uint32Array(cap);
    this.u8 = new Uint8Array(this.u32.buffer);
  }

  /** Copies tokens (as unsigned 32-bit) into the scratch buffer, little-endian whatever the host. */
  load(tokens: ArrayLike<number>, from: number, count: number): void {
    this.ensure(count);
    const u32 = this.u32;
    if (LITTLE_ENDIAN_HOST) {
      for (let i = 0; i < count; i++) u32[i] = tokens[from + i];
    } else {
      const view = new DataView(u32.buffer);
      for (let i = 0; i < count; i++) view.setUint32(i * 4, tokens[from + i] >>> 0, true);
    }
  }
}

const shared = new Scratch(4096);

/** seq[i] from seq[i-1] and local[i]. */
function chain(prevSeq: bigint, local: bigint, scratch: Scratch): bigint {
  scratch.pair[0] = prevSeq;
  scratch.pair[1] = local;
  if (!LITTLE_ENDIAN_HOST) {
    const view = new DataView(scratch.pair.buffer);
    view.setBigUint64(0, prevSeq, true);
    view.setBigUint64(8, local, true);
  }
  return xxh3.xxh64(scratch.pairBytes, BASE_SEED);
}

export interface BlockHashes {
  readonly local: BigUint64Array;
  readonly seq: BigUint64Array;
}

/**
 * Hashes the full blocks of `tokens[from .. from+count)`, chaining from `parentSeq` (null or absent: the blocks start a
 * sequence). Writes into `outSeq` (and `outLocal`) at `outOffset`. Returns the number of blocks hashed.
 *
 * Blocks of up to 60 tokens (240 bytes, every common engine block size) are hashed in one WebAssembly call for the
 * whole run of blocks; larger blocks take the napi path, two native calls per block.
 */
export function hashBlocksInto(run: BlockRun): number {
  return run.blockSize <= WASM_MAX_BLOCK_TOKENS ? hashBlocksWasm(run) : hashBlocksNapi(run);
}

/** The reference path through @node-rs/xxhash, one call per hash: any block size. */
export function hashBlocksNapi(run: BlockRun): number {
  const { tokens, blockSize, seed, outSeq, outLocal } = run;
  const from = run.from ?? 0;
  const count = run.count ?? tokens.length - from;
  const outOffset = run.outOffset ?? 0;
  const blocks = Math.floor(count / blockSize);
  if (blocks === 0) return 0;
  const scratch = shared;
  scratch.load(tokens, from, blocks * blockSize);
  const blockBytes = blockSize * 4;
  let prev = run.parentSeq ?? null;
  for (let b = 0; b < blocks; b++) {
    const local = xxh3.xxh64(scratch.u8.subarray(b * blockBytes, (b + 1) * blockBytes), seed);
    const seq = prev === null ? local : chain(prev, local, scratch);
    outSeq[outOffset + b] = seq;
    if (outLocal) outLocal[outOffset + b] = local;
    prev = seq;
  }
  return blocks;
}

// ---------------------------------------------------------------- multimodal keys (multimodal.ts)

const encoder = new TextEncoder();
let scratch = new Uint8Array(1024);

function localWithKeys(tokens: ArrayLike<number>, from: number, blockSize: number, keys: readonly MmBlockKey[], seed: bigint): bigint {
  const ids = keys.map((k) => encoder.encode(k[0]));
  let len = 4 * blockSize;
  for (const id of ids) len += 8 + id.length;
  if (scratch.length < len) scratch = new Uint8Array(2 * len);
  const view = new DataView(scratch.buffer);
  let at = 0;
  for (let i = 0; i < blockSize; i++, at += 4) view.setUint32(at, tokens[from + i] >>> 0, true);
  for (let j = 0; j < keys.length; j++) {
    view.setUint32(at, ids[j].length, true);
    scratch.set(ids[j], at + 4);
    at += 4 + ids[j].length;
    view.setInt32(at, keys[j][1] | 0, true);
    at += 4;
  }
  return xxh3.xxh64(scratch.subarray(0, at), seed);
}

/** A run of `blocks` full blocks with per-block multimodal keys (`keys[b]` for block b, null for a text-only block). */
export interface KeyedBlockRun extends Omit<BlockRun, 'count' | 'outLocal'> {
  readonly blocks: number;
  readonly keys: readonly (readonly MmBlockKey[] | null)[];
}

/**
 * Sequence hashes of `blocks` full blocks of tokens[from ..), chained from `parentSeq`, with per-block multimodal
 * keys (`keys[b]` for block b, null for a text-only block). Writes into out[outOffset ..). Text-only runs take the
 * ordinary (WebAssembly) path.
 */
export function hashBlocksWithKeys(run: KeyedBlockRun): void {
  const { tokens, blocks, blockSize, seed, keys, outSeq: out } = run;
  const from = run.from ?? 0;
  const outOffset = run.outOffset ?? 0;
  let prev = run.parentSeq ?? null;
  let b = 0;
  while (b < blocks) {
    if (!keys[b]) {
      let e = b + 1;
      while (e < blocks && !keys[e]) e++;
      hashBlocksInto({
        tokens,
        from: from + b * blockSize,
        count: (e - b) * blockSize,
        blockSize,
        seed,
        parentSeq: prev,
        outSeq: out,
        outOffset: outOffset + b,
      });
      prev = out[outOffset + e - 1];
      b = e;
      continue;
    }
    const local = localWithKeys(tokens, from + b * blockSize, blockSize, keys[b] as readonly MmBlockKey[], seed);
    const seq = prev === null ? local : chain(prev, local, shared);
    out[outOffset + b] = seq;
    prev = seq;
    b++;
  }
}

/** Local and sequence hashes of every full block of `tokens` (the contract of docs/protocols.md §1). */
export function computeBlockHashes(tokens: ArrayLike<number>, blockSize: number, seed: bigint = BASE_SEED): BlockHashes {
  const n = fullBlocks(tokens.length, blockSize);
  const local = new BigUint64Array(n);
  const seq = new BigUint64Array(n);
  hashBlocksInto({ tokens, from: 0, count: tokens.length, blockSize, seed, parentSeq: null, outSeq: seq, outOffset: 0, outLocal: local });
  return { local, seq };
}

/** Sequence hashes only: what routing needs. `out`, when given, receives them (its length must be the full blocks'). */
export function computeSeqHashes(
  tokens: ArrayLike<number>,
  blockSize: number,
  seed: bigint = BASE_SEED,
  out?: BigUint64Array,
): BigUint64Array {
  const seq = outFor(out, fullBlocks(tokens.length, blockSize));
  hashBlocksInto({ tokens, from: 0, count: tokens.length, blockSize, seed, parentSeq: null, outSeq: seq, outOffset: 0 });
  return seq;
}

/** `out` when given (checked to hold exactly `blocks` hashes), else a new array. */
export function outFor(out: BigUint64Array | undefined, blocks: number): BigUint64Array {
  if (!out) return new BigUint64Array(blocks);
  if (out.length !== blocks) throw new RangeError(`output for ${blocks} block hashes has ${out.length} slots`);
  return out;
}

/**
 * Incremental hasher for a growing sequence (decode growth, the next turn of a chat): `extend` hashes only blocks
 * completed by the new tokens. The partial tail is kept until it fills.
 */
export class SeqHasher {
  private seqBuf: BigUint64Array;
  private blocks = 0;
  private readonly tail: number[] = [];
  private tokens = 0;

  constructor(
    readonly blockSize: number,
    readonly seed: bigint = BASE_SEED,
    /** Multimodal keys of blocks [fromBlock, fromBlock + blocks) (multimodal.ts: mmBlockKeys); text-only without. */
    private readonly keysOf?: (fromBlock: number, blocks: number) => readonly (readonly MmBlockKey[] | null)[] | null,
  ) {
    this.seqBuf = new BigUint64Array(16);
  }

  private hashRun(tokens: ArrayLike<number>, from: number, blocks: number): void {
    const keys = this.keysOf?.(this.blocks, blocks) ?? null;
    if (keys)
      hashBlocksWithKeys({
        tokens,
        from,
        blocks,
        blockSize: this.blockSize,
        seed: this.seed,
        parentSeq: this.last(),
        keys,
        outSeq: this.seqBuf,
        outOffset: this.blocks,
      });
    else
      hashBlocksInto({
        tokens,
        from,
        count: blocks * this.blockSize,
        blockSize: this.blockSize,
        seed: this.seed,
        parentSeq: this.last(),
        outSeq: this.seqBuf,
        outOffset: this.blocks,
      });
  }

  /** Tokens seen so far (hashed blocks plus the partial tail). */
  get tokenCount(): number {
    return this.tokens;
  }

  get blockCount(): number {
    return this.blocks;
  }

  /** Appends tokens; returns how many new full blocks were hashed. */
  extend(newTokens: ArrayLike<number>): number {
    const bs = this.blockSize;
    this.tokens += newTokens.length;
    let offset = 0;
    const before = this.blocks;
    // Complete the pending partial block first.
    if (this.tail.length > 0) {
      const need = bs - this.tail.length;
      const take = Math.min(need, newTokens.length);
      for (let i = 0; i < take; i++) this.tail.push(newTokens[i]);
      offset = take;
      if (this.tail.length === bs) {
        this.reserve(this.blocks + 1);
        this.hashRun(this.tail, 0, 1);
        this.blocks++;
        this.tail.length = 0;
      }
    }
    const remaining = newTokens.length - offset;
    const full = Math.floor(remaining / bs);
    if (full > 0) {
      this.reserve(this.blocks + full);
      this.hashRun(newTokens, offset, full);
      this.blocks += full;
      offset += full * bs;
    }
    for (let i = offset; i < newTokens.length; i++) this.tail.push(newTokens[i]);
    return this.blocks - before;
  }

  /** The sequence hashes so far (a view; copy it to keep it past the next extend). */
  seqHashes(): BigUint64Array {
    return this.seqBuf.subarray(0, this.blocks);
  }

  private last(): bigint | null {
    return this.blocks === 0 ? null : this.seqBuf[this.blocks - 1];
  }

  private reserve(blocks: number): void {
    if (blocks <= this.seqBuf.length) return;
    let cap = this.seqBuf.length;
    while (cap < blocks) cap *= 2;
    const next = new BigUint64Array(cap);
    next.set(this.seqBuf.subarray(0, this.blocks));
    this.seqBuf = next;
  }
}
