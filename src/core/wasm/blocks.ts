/**
 * Block hashing (docs/protocols.md §1) in one WebAssembly call per prompt.
 *
 * The napi path costs two native calls per block (~300 ns, nearly all call overhead); here the tokens are copied
 * once into wasm memory and every local and chained hash is computed inside the module (xxh3_blocks.c) with native
 * i64 arithmetic. XXH3 inputs over 240 bytes are not implemented there, so blocks of more than 60 tokens must keep
 * using the napi path (see WASM_MAX_BLOCK_TOKENS).
 *
 * Instantiated synchronously at import (embedded as base64 so no file I/O is needed). Two builds of the same C are
 * embedded: one using wasm SIMD128 (for the byte swap of XXH3's 9-16-byte path, which the chain step takes on every
 * block, and the miss-ratio curve's sampling pass, eight blocks at a time) and a scalar one, taken where the engine does
 * not validate SIMD (V8 on an x64 without SSE4.1).
 */
import { endianness } from 'node:os';
import { XXH3_BLOCKS_SIMD_WASM_BASE64, XXH3_BLOCKS_WASM_BASE64 } from './xxh3-blocks.wasm.ts';

/** Max bytes per block the WASM path handles (240): block sizes up to 60 tokens. */
export const WASM_MAX_BLOCK_TOKENS = 60;

// tsconfig's lib (ES2022, no DOM) lacks the WebAssembly JS API types, so the few parts used are declared here.
interface WasmMemory {
  readonly buffer: ArrayBuffer;
  grow(pages: number): number;
}
interface WasmApi {
  validate(bytes: Uint8Array): boolean;
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object, imports: object) => { exports: unknown };
}
const WA = (globalThis as unknown as { WebAssembly: WasmApi }).WebAssembly;

/** The module's exports (both builds have the same). */
export interface Xxh3Exports {
  memory: WasmMemory;
  __heap_base: { value: number };
  xxh3_64(ptr: number, len: number, seed: bigint): bigint;
  hash_blocks(
    tokens: number,
    nblocks: number,
    bs: number,
    seed: bigint,
    hasParent: number,
    parent: bigint,
    outSeq: number,
    outLocal: number,
  ): number;
  mrc_scan(seq: number, from: number, n: number, t: number, out: number): number;
}

const PAGE = 65536;
// WebAssembly memory is little-endian; typed-array views use the host's order, so big-endian hosts go through a DataView.
const LITTLE_ENDIAN_HOST = endianness() === 'LE';

/** A fresh instance of one build (`simd`: the SIMD128 one); the hasher below uses one instance of the preferred build. */
export function instantiateXxh3(simd: boolean): Xxh3Exports {
  const bytes = Buffer.from(simd ? XXH3_BLOCKS_SIMD_WASM_BASE64 : XXH3_BLOCKS_WASM_BASE64, 'base64');
  return new WA.Instance(new WA.Module(bytes), {}).exports as Xxh3Exports;
}

/** Whether this engine runs the SIMD128 build (it validates it): the hasher's build. */
export const WASM_SIMD = WA.validate(Buffer.from(XXH3_BLOCKS_SIMD_WASM_BASE64, 'base64'));

const wasm = instantiateXxh3(WASM_SIMD);
const memory = wasm.memory;
// Everything below __heap_base belongs to the module (its constants and stack); our scratch starts above it.
const BASE = (Number(wasm.__heap_base.value) + 7) & ~7;

let u32 = new Uint32Array(memory.buffer);
let u64 = new BigUint64Array(memory.buffer);
let view = new DataView(memory.buffer);

/** Grows memory to at least `bytes` and re-creates the views (growth detaches the old buffer). */
function ensureMemory(bytes: number): void {
  if (memory.buffer.byteLength < bytes) memory.grow(Math.ceil((bytes - memory.buffer.byteLength) / PAGE));
  if (u32.buffer !== memory.buffer) {
    u32 = new Uint32Array(memory.buffer);
    u64 = new BigUint64Array(memory.buffer);
    view = new DataView(memory.buffer);
  }
}

function checkBlockSize(blockSize: number): void {
  if (!Number.isInteger(blockSize) || blockSize < 1 || blockSize > WASM_MAX_BLOCK_TOKENS) {
    throw new RangeError(`hashBlocksWasm: block size must be an integer in 1..${WASM_MAX_BLOCK_TOKENS}, got ${blockSize}`);
  }
}

function copyOut(src: number, blocks: number, out: BigUint64Array, outOffset: number): void {
  if (LITTLE_ENDIAN_HOST) {
    out.set(u64.subarray(src / 8, src / 8 + blocks), outOffset);
  } else {
    for (let b = 0; b < blocks; b++) out[outOffset + b] = view.getBigUint64(src + b * 8, true);
  }
}

/** One run of full blocks to hash (`hashBlocksInto`, `hashBlocksWasm`, `hashBlocksNapi`). */
export interface BlockRun {
  readonly tokens: ArrayLike<number>;
  /** First token of the run (default 0). */
  readonly from?: number;
  /** Tokens in the run (default: to the end of `tokens`); only its full blocks are hashed. */
  readonly count?: number;
  readonly blockSize: number;
  readonly seed: bigint;
  /** The seq hash the run chains from; null or absent: the run starts a sequence. */
  readonly parentSeq?: bigint | null;
  /** Seq hashes are written here from `outOffset` (default 0). */
  readonly outSeq: BigUint64Array;
  readonly outOffset?: number;
  /** Local (unchained) hashes, when wanted, at the same offsets. */
  readonly outLocal?: BigUint64Array;
}

/**
 * Same contract as `hashBlocksInto` (src/core/hashing.ts): hashes the full blocks of `tokens[from .. from+count)`
 * with `seed`, chaining from `parentSeq` (null: the blocks start a sequence); writes seq hashes to
 * `outSeq[outOffset..]` and local hashes to `outLocal[outOffset..]` when given. Returns floor(count / blockSize).
 * Tokens are taken as unsigned 32-bit (ToUint32, as a Uint32Array store does). Throws RangeError for a block size
 * outside 1..WASM_MAX_BLOCK_TOKENS or an output array too short.
 */
export function hashBlocksWasm(run: BlockRun): number {
  const { tokens, blockSize, seed, outSeq, outLocal } = run;
  const from = run.from ?? 0;
  const count = run.count ?? tokens.length - from;
  const parentSeq = run.parentSeq ?? null;
  const outOffset = run.outOffset ?? 0;
  checkBlockSize(blockSize);
  const blocks = Math.floor(count / blockSize);
  if (blocks <= 0) return 0;
  if (outOffset + blocks > outSeq.length || (outLocal !== undefined && outOffset + blocks > outLocal.length)) {
    throw new RangeError(`hashBlocksWasm: output arrays too short for ${blocks} blocks at offset ${outOffset}`);
  }
  const n = blocks * blockSize;
  // A plain-array prompt whose full blocks start at 0 is copied whole, its trailing partial block included (it lands
  // in scratch the module never reads): TypedArray#set takes a whole array in one bulk copy, where a slice would
  // first build a second array of the prompt's length.
  const copied =
    LITTLE_ENDIAN_HOST && from === 0 && Array.isArray(tokens) && tokens.length >= n && tokens.length < n + blockSize ? tokens.length : n;
  const tokPtr = BASE;
  const seqPtr = tokPtr + ((copied * 4 + 7) & ~7);
  const localPtr = seqPtr + blocks * 8;
  ensureMemory(localPtr + (outLocal ? blocks * 8 : 0));

  if (!LITTLE_ENDIAN_HOST) {
    for (let i = 0; i < n; i++) view.setUint32(tokPtr + i * 4, tokens[from + i] >>> 0, true);
  } else if (tokens instanceof Uint32Array && from + n <= tokens.length) {
    u32.set(tokens.subarray(from, from + n), tokPtr / 4);
  } else if (Array.isArray(tokens) && from + n <= tokens.length) {
    // TypedArray#set from a plain array is a native bulk copy (same ToUint32 conversion), ~4x faster than a JS loop.
    u32.set(copied === tokens.length ? tokens : tokens.slice(from, from + n), tokPtr / 4);
  } else {
    const at = tokPtr / 4;
    for (let i = 0; i < n; i++) u32[at + i] = tokens[from + i];
  }

  wasm.hash_blocks(
    tokPtr,
    blocks,
    blockSize,
    seed,
    parentSeq === null ? 0 : 1,
    parentSeq === null ? 0n : parentSeq,
    seqPtr,
    outLocal ? localPtr : 0,
  );
  copyOut(seqPtr, blocks, outSeq, outOffset);
  if (outLocal) copyOut(localPtr, blocks, outLocal, outOffset);
  return blocks;
}

/** XXH3-64 of `bytes` (at most 240) with `seed`, computed by the module: exposed to test every length path. */
export function xxh3Wasm(bytes: Uint8Array, seed: bigint): bigint {
  if (bytes.length > 240) throw new RangeError(`xxh3Wasm: at most 240 bytes, got ${bytes.length}`);
  ensureMemory(BASE + 240);
  new Uint8Array(memory.buffer, BASE, bytes.length).set(bytes);
  return BigInt.asUintN(64, wasm.xxh3_64(BASE, bytes.length, seed));
}

/**
 * The miss-ratio curve's sampling pass (src/core/mrc.ts, collectCandidates) over blocks [from, n) of a chain: `seq` is
 * the u32 view of its seq hashes (low word at 2i, at least 2n long); writes to `out` (at least n - from long) the
 * indices whose hash has its low 24 bits below `t` (an integer, at most 2^24), in order, and returns how many. One copy
 * of the hashes into the module's memory and one call: about 2 instructions a block where the JS loop takes ~16 (V8
 * checks every typed-array read). Returns -1 on a big-endian host (the caller scans in JS).
 */
export function mrcScanWasm(seq: Uint32Array, from: number, n: number, t: number, out: Int32Array): number {
  if (!LITTLE_ENDIAN_HOST) return -1;
  const seqPtr = BASE;
  const outPtr = seqPtr + ((seq.length * 4 + 7) & ~7);
  ensureMemory(outPtr + (n - from) * 4);
  u32.set(seq, seqPtr / 4);
  const count = wasm.mrc_scan(seqPtr, from, n, t, outPtr);
  const at = outPtr / 4;
  for (let k = 0; k < count; k++) out[k] = u32[at + k];
  return count;
}
