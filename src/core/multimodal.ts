/**
 * Multimodal block identity (docs/engines.md "Multimodal block keys"). Pure.
 *
 * vLLM gives a block whose tokens overlap a multimodal item (an image, an audio clip: its placeholder tokens) extra
 * keys: one (identifier, offset) pair per overlapping item, offset = item start - block start. Two prompts with the
 * same placeholder tokens and different images then never share a block, and the same image at the same place does.
 * The router hashes these keys into its own block hash:
 *
 *   local[i] = xxh3_64(LE u32 tokens of block i ‖ for each key: LE u32 byte length ‖ utf8 identifier ‖ LE i32 offset, seed)
 *
 * for a block with keys (a text-only block keeps the plain hash of docs/protocols.md §1), chained as usual, so every
 * block after the first image block differs too, as in the engine's chain (hashing.ts: hashBlocksWithKeys).
 */
export { hashBlocksWithKeys };
import { computeSeqHashes, hashBlocksInto, hashBlocksWithKeys, hashSeed, outFor } from './hashing.ts';
import type { MmBlockKey, MmItem } from './types.ts';

/**
 * The keys of blocks [fromBlock, fromBlock + blocks) of a prompt, by vLLM's rule (`_gen_mm_extra_hash_keys`): an
 * item overlaps block [s, e) when e > offset and s < offset + length. Items must be sorted by offset (as the engine's
 * processor produces them); null for a block no item overlaps. Returns null when no block has a key.
 */
export function mmBlockKeys(
  items: readonly MmItem[],
  fromBlock: number,
  blocks: number,
  blockSize: number,
): (MmBlockKey[] | null)[] | null {
  if (items.length === 0 || blocks <= 0) return null;
  let out: (MmBlockKey[] | null)[] | null = null;
  let k = 0;
  for (let b = 0; b < blocks; b++) {
    const start = (fromBlock + b) * blockSize;
    const end = start + blockSize;
    // Items that ended before this block are done for every later block too.
    while (k < items.length && items[k].offset + items[k].length <= start) k++;
    let keys: MmBlockKey[] | null = null;
    for (let j = k; j < items.length && items[j].offset < end; j++) {
      const it = items[j];
      if (it.offset + it.length <= start) continue;
      keys ??= [];
      keys.push([it.identifier, it.offset - start]);
    }
    if (keys) {
      out ??= new Array<MmBlockKey[] | null>(blocks).fill(null);
      out[b] = keys;
    }
  }
  return out;
}

/** Checks items against a prompt length: sorted, non-overlapping, inside the prompt, non-empty identifiers. */
export function mmItemsError(items: readonly MmItem[], promptTokens: number): string | null {
  let end = 0;
  for (const it of items) {
    if (typeof it.identifier !== 'string' || it.identifier.length === 0) return 'multimodal item without an identifier';
    if (!Number.isInteger(it.offset) || !Number.isInteger(it.length) || it.offset < 0 || it.length < 1) {
      return `multimodal item ${it.identifier}: offset and length must be integers >= 0 and >= 1`;
    }
    if (it.offset < end) return `multimodal item ${it.identifier} overlaps the item before it`;
    end = it.offset + it.length;
    if (end > promptTokens) return `multimodal item ${it.identifier} ends past the prompt (${end} > ${promptTokens})`;
  }
  return null;
}

/** A prompt's sequence hashes (full blocks) with its multimodal items in the block identities. */
export function computeSeqHashesMm(
  tokens: ArrayLike<number>,
  blockSize: number,
  seed: bigint,
  items: readonly MmItem[],
  into?: BigUint64Array,
): BigUint64Array {
  const n = Math.floor(tokens.length / blockSize);
  const out = outFor(into, n);
  const keys = mmBlockKeys(items, 0, n, blockSize);
  if (!keys) hashBlocksInto({ tokens, from: 0, count: n * blockSize, blockSize, seed, parentSeq: null, outSeq: out, outOffset: 0 });
  else hashBlocksWithKeys({ tokens, from: 0, blocks: n, blockSize, seed, parentSeq: null, keys, outSeq: out, outOffset: 0 });
  return out;
}

/**
 * A request's sequence hashes (full blocks) as the router computes them: its adapter and salt in the seed, its
 * multimodal items in the block identities. The one definition for KvRouter.route and for the HTTP shells of
 * `serve --processes`, which hash ahead of the primary (src/server/cluster/shell.ts). `out`, when given, receives
 * them (exactly floor(tokens / blockSize) long; the router's recycled buffers, hash-buffers.ts).
 */
export function requestSeqHashes(
  tokens: ArrayLike<number>,
  blockSize: number,
  loraName?: string | null,
  cacheSalt?: string | null,
  mmItems?: readonly MmItem[],
  out?: BigUint64Array,
): BigUint64Array {
  const seed = hashSeed(loraName, cacheSalt);
  if (mmItems && mmItems.length > 0) return computeSeqHashesMm(tokens, blockSize, seed, mmItems, out);
  return computeSeqHashes(tokens, blockSize, seed, out);
}
