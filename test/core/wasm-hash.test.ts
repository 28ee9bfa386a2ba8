import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { xxh3 } from '@node-rs/xxhash';
import { hashBlocksNapi, hashSeed } from '../../src/core/hashing.ts';
import { hashBlocksWasm, instantiateXxh3, WASM_MAX_BLOCK_TOKENS, WASM_SIMD, xxh3Wasm } from '../../src/core/wasm/blocks.ts';

const range = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => a + i);
const dec = (xs: BigUint64Array) => Array.from(xs, (x) => x.toString());

/** Runs the WASM hasher over a whole token list from a fresh chain, returning local and seq hashes. */
function wasmHashes(tokens: ArrayLike<number>, bs: number, seed: bigint) {
  const n = Math.floor(tokens.length / bs);
  const seq = new BigUint64Array(n);
  const local = new BigUint64Array(n);
  expect(
    hashBlocksWasm({
      tokens,
      from: 0,
      count: tokens.length,
      blockSize: bs,
      seed,
      parentSeq: null,
      outSeq: seq,
      outOffset: 0,
      outLocal: local,
    }),
  ).toBe(n);
  return { local: dec(local), seq: dec(seq) };
}

describe('WASM block hasher: docs/protocols.md §1 test vectors', () => {
  it('tokens 0..35, bs 16, seed 1337', () => {
    expect(wasmHashes(range(0, 36), 16, 1337n)).toEqual({
      local: ['15310707395893867146', '15292316782987903195'],
      seq: ['15310707395893867146', '13769157705258532664'],
    });
  });

  it('lora_name sql-adapter', () => {
    expect(hashSeed('sql-adapter')).toBe(9867606577583457700n);
    expect(wasmHashes(range(0, 36), 16, 9867606577583457700n)).toEqual({
      local: ['14536852851305923245', '7140174819136409355'],
      seq: ['14536852851305923245', '8425625934314863947'],
    });
  });

  it('cache_salt tenant-a', () => {
    expect(hashSeed(null, 'tenant-a')).toBe(1948188790972764086n);
    expect(wasmHashes(range(0, 36), 16, 1948188790972764086n)).toEqual({
      local: ['2130915519417463704', '14342547135021016991'],
      seq: ['2130915519417463704', '13676355973429745432'],
    });
  });

  it('tokens 1000..1063, bs 32', () => {
    expect(wasmHashes(range(1000, 1064), 32, 1337n)).toEqual({
      local: ['9188553531300959059', '16310179652519145868'],
      seq: ['9188553531300959059', '14908719570377643093'],
    });
  });

  it('Qwen3 chat tokens, bs 4 (also from a Uint32Array)', () => {
    const expected = { local: ['10749291513524092935'], seq: ['10749291513524092935'] };
    expect(wasmHashes([151644, 872, 198, 4340], 4, 1337n)).toEqual(expected);
    expect(wasmHashes(Uint32Array.of(151644, 872, 198, 4340), 4, 1337n)).toEqual(expected);
  });
});

describe('WASM xxh3_64 matches @node-rs/xxhash on every length path (0..240 bytes)', () => {
  it('every length, fixed and random seeds', () => {
    const seeds = [0n, 1n, 1337n, 9867606577583457700n, (1n << 64n) - 1n, 1n << 63n];
    for (let len = 0; len <= 240; len++) {
      const bytes = Uint8Array.from({ length: len }, (_, i) => (i * 131 + len * 7 + 3) & 255);
      for (const seed of seeds) expect(xxh3Wasm(bytes, seed)).toBe(xxh3.xxh64(bytes, seed));
    }
  });

  it('random bytes and seeds', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 240, size: 'max' }), fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }), (bytes, seed) => {
        expect(xxh3Wasm(bytes, seed)).toBe(xxh3.xxh64(bytes, seed));
      }),
      { numRuns: 3000 },
    );
  });

  it('refuses inputs over 240 bytes (the napi path handles them)', () => {
    expect(() => xxh3Wasm(new Uint8Array(241), 0n)).toThrow(RangeError);
  });
});

const u64Arb = fc.bigInt({ min: 0n, max: (1n << 64n) - 1n });
// Seeds as the router makes them: the base seed, LoRA and salt seeds from random names, and arbitrary u64s.
const seedArb = fc.oneof(
  fc.constant(1337n),
  fc.string({ minLength: 1, maxLength: 12 }).map((s) => hashSeed(s)),
  fc.string({ minLength: 1, maxLength: 12 }).map((s) => hashSeed(null, s)),
  fc.tuple(fc.string({ minLength: 1 }), fc.string({ minLength: 1 })).map(([a, b]) => hashSeed(a, b)),
  u64Arb,
);

describe('WASM block hasher is bit-identical to the napi path (hashBlocksNapi, the reference)', () => {
  it('random tokens, every block size 1..60, random seeds, with and without parent, offsets', () => {
    fc.assert(
      fc.property(
        // Lengths are drawn explicitly (fast-check's default size would give mostly sub-block arrays for big bs).
        fc
          .record({
            bs: fc.integer({ min: 1, max: WASM_MAX_BLOCK_TOKENS }),
            blocks: fc.integer({ min: 0, max: 8 }),
            extra: fc.integer({ min: 0, max: 2 * WASM_MAX_BLOCK_TOKENS }),
          })
          .chain(({ bs, blocks, extra }) =>
            fc.tuple(
              fc.constant(bs),
              fc.array(fc.integer({ min: 0, max: 0xffffffff }), {
                minLength: blocks * bs + extra,
                maxLength: blocks * bs + extra,
              }),
            ),
          ),
        fc.nat(),
        seedArb,
        fc.option(u64Arb, { nil: null }),
        fc.nat({ max: 3 }),
        fc.boolean(),
        ([bs, tokens], fromPick, seed, parent, outOffset, typed) => {
          // Mostly from 0 (whole prompt), sometimes from an arbitrary offset.
          const from = tokens.length === 0 || fromPick % 3 !== 0 ? 0 : fromPick % (tokens.length + 1);
          const count = tokens.length - from;
          const blocks = Math.floor(count / bs);
          const src = typed ? Uint32Array.from(tokens) : tokens;
          const napiSeq = new BigUint64Array(outOffset + blocks);
          const napiLocal = new BigUint64Array(outOffset + blocks);
          const wasmSeq = new BigUint64Array(outOffset + blocks);
          const wasmLocal = new BigUint64Array(outOffset + blocks);
          const nb = hashBlocksNapi({
            tokens: src,
            from,
            count,
            blockSize: bs,
            seed,
            parentSeq: parent,
            outSeq: napiSeq,
            outOffset,
            outLocal: napiLocal,
          });
          const wb = hashBlocksWasm({
            tokens: src,
            from,
            count,
            blockSize: bs,
            seed,
            parentSeq: parent,
            outSeq: wasmSeq,
            outOffset,
            outLocal: wasmLocal,
          });
          expect(wb).toBe(nb);
          expect(wb).toBe(blocks);
          expect(dec(wasmSeq)).toEqual(dec(napiSeq));
          expect(dec(wasmLocal)).toEqual(dec(napiLocal));
        },
      ),
      { numRuns: 3000 },
    );
  });

  it('covers each block size 1..60 on a multi-block prompt with a parent (seq only)', () => {
    const tokens = Uint32Array.from({ length: 60 * 9 + 7 }, (_, i) => (i * 2654435761) >>> 0);
    for (let bs = 1; bs <= WASM_MAX_BLOCK_TOKENS; bs++) {
      for (const parent of [null, 0n, 12345678901234567890n]) {
        const blocks = Math.floor(tokens.length / bs);
        const napi = new BigUint64Array(blocks);
        const wasm = new BigUint64Array(blocks);
        hashBlocksNapi({
          tokens,
          from: 0,
          count: tokens.length,
          blockSize: bs,
          seed: 1337n,
          parentSeq: parent,
          outSeq: napi,
          outOffset: 0,
        });
        expect(
          hashBlocksWasm({
            tokens,
            from: 0,
            count: tokens.length,
            blockSize: bs,
            seed: 1337n,
            parentSeq: parent,
            outSeq: wasm,
            outOffset: 0,
          }),
        ).toBe(blocks);
        expect(dec(wasm)).toEqual(dec(napi));
      }
    }
  });

  it('chaining across calls equals one call (parent = last seq of the previous call)', () => {
    const tokens = range(0, 16 * 50);
    const whole = new BigUint64Array(50);
    hashBlocksWasm({ tokens, from: 0, count: tokens.length, blockSize: 16, seed: 1337n, parentSeq: null, outSeq: whole, outOffset: 0 });
    const parts = new BigUint64Array(50);
    hashBlocksWasm({ tokens, from: 0, count: 16 * 20, blockSize: 16, seed: 1337n, parentSeq: null, outSeq: parts, outOffset: 0 });
    hashBlocksWasm({
      tokens,
      from: 16 * 20,
      count: 16 * 30,
      blockSize: 16,
      seed: 1337n,
      parentSeq: parts[19],
      outSeq: parts,
      outOffset: 20,
    });
    expect(dec(parts)).toEqual(dec(whole));
  });

  it('a 32k-token prompt (memory growth) matches napi', () => {
    const tokens = Uint32Array.from({ length: 32768 + 5 }, (_, i) => (i * 7919 + 13) % 151_000);
    const blocks = Math.floor(tokens.length / 16);
    const napi = new BigUint64Array(blocks);
    const wasm = new BigUint64Array(blocks);
    const wasmLocal = new BigUint64Array(blocks);
    hashBlocksNapi({ tokens, from: 0, count: tokens.length, blockSize: 16, seed: 1337n, parentSeq: null, outSeq: napi, outOffset: 0 });
    expect(
      hashBlocksWasm({
        tokens,
        from: 0,
        count: tokens.length,
        blockSize: 16,
        seed: 1337n,
        parentSeq: null,
        outSeq: wasm,
        outOffset: 0,
        outLocal: wasmLocal,
      }),
    ).toBe(2048);
    expect(dec(wasm)).toEqual(dec(napi));
    // A smaller call after growth still sees fresh views.
    const small = new BigUint64Array(2);
    hashBlocksWasm({ tokens: range(0, 36), from: 0, count: 36, blockSize: 16, seed: 1337n, parentSeq: null, outSeq: small, outOffset: 0 });
    expect(dec(small)).toEqual(['15310707395893867146', '13769157705258532664']);
  });

  it('a plain-array prompt with a trailing partial block, larger than any before (copied whole), matches napi', () => {
    // 4,500 blocks of 16 plus 15 tokens: the largest input in this file, so memory must grow to hold the copied tail.
    const tokens = Array.from({ length: 4500 * 16 + 15 }, (_, i) => (i * 104_729 + 7) % 151_000);
    const napi = new BigUint64Array(4500);
    const napiLocal = new BigUint64Array(4500);
    const wasm = new BigUint64Array(4500);
    const wasmLocal = new BigUint64Array(4500);
    hashBlocksNapi({
      tokens,
      from: 0,
      count: tokens.length,
      blockSize: 16,
      seed: 7n,
      parentSeq: 99n,
      outSeq: napi,
      outOffset: 0,
      outLocal: napiLocal,
    });
    expect(
      hashBlocksWasm({
        tokens,
        from: 0,
        count: tokens.length,
        blockSize: 16,
        seed: 7n,
        parentSeq: 99n,
        outSeq: wasm,
        outOffset: 0,
        outLocal: wasmLocal,
      }),
    ).toBe(4500);
    expect(dec(wasm)).toEqual(dec(napi));
    expect(dec(wasmLocal)).toEqual(dec(napiLocal));
  });
});

describe('WASM block hasher: empty, partial and bad input', () => {
  it('0 tokens and a partial block hash nothing and write nothing', () => {
    const out = BigUint64Array.of(7n, 7n);
    expect(hashBlocksWasm({ tokens: [], from: 0, count: 0, blockSize: 16, seed: 1337n, parentSeq: null, outSeq: out, outOffset: 0 })).toBe(
      0,
    );
    expect(
      hashBlocksWasm({ tokens: range(0, 15), from: 0, count: 15, blockSize: 16, seed: 1337n, parentSeq: 5n, outSeq: out, outOffset: 0 }),
    ).toBe(0);
    expect(
      hashBlocksWasm({ tokens: range(0, 40), from: 30, count: 10, blockSize: 16, seed: 1337n, parentSeq: null, outSeq: out, outOffset: 0 }),
    ).toBe(0);
    expect(dec(out)).toEqual(['7', '7']);
  });

  it('a trailing partial block is ignored: 47 tokens at bs 16 hash exactly the first 32', () => {
    const a = new BigUint64Array(2);
    const b = new BigUint64Array(2);
    expect(
      hashBlocksWasm({ tokens: range(0, 47), from: 0, count: 47, blockSize: 16, seed: 1337n, parentSeq: null, outSeq: a, outOffset: 0 }),
    ).toBe(2);
    expect(
      hashBlocksWasm({ tokens: range(0, 32), from: 0, count: 32, blockSize: 16, seed: 1337n, parentSeq: null, outSeq: b, outOffset: 0 }),
    ).toBe(2);
    expect(dec(a)).toEqual(dec(b));
  });

  it('rejects block sizes it cannot hash and outputs too short, with a RangeError', () => {
    const out = new BigUint64Array(4);
    for (const bs of [0, -1, 1.5, 61, 64, Number.NaN]) {
      expect(() =>
        hashBlocksWasm({
          tokens: range(0, 128),
          from: 0,
          count: 128,
          blockSize: bs,
          seed: 1337n,
          parentSeq: null,
          outSeq: out,
          outOffset: 0,
        }),
      ).toThrow(RangeError);
    }
    expect(() =>
      hashBlocksWasm({ tokens: range(0, 80), from: 0, count: 80, blockSize: 16, seed: 1337n, parentSeq: null, outSeq: out, outOffset: 0 }),
    ).toThrow(RangeError);
    expect(() =>
      hashBlocksWasm({ tokens: range(0, 64), from: 0, count: 64, blockSize: 16, seed: 1337n, parentSeq: null, outSeq: out, outOffset: 1 }),
    ).toThrow(RangeError);
    expect(() =>
      hashBlocksWasm({
        tokens: range(0, 64),
        from: 0,
        count: 64,
        blockSize: 16,
        seed: 1337n,
        parentSeq: null,
        outSeq: out,
        outOffset: 0,
        outLocal: new BigUint64Array(3),
      }),
    ).toThrow(RangeError);
  });
});

describe('WASM block hasher: token coercion matches the napi path', () => {
  it('out-of-range and non-integer token values are taken mod 2^32 exactly as napi does', () => {
    const odd = [-1, 2 ** 32, 2 ** 32 + 5, 1.9, -0.5, Number.NaN, 0xffffffff, 7];
    const napi = new BigUint64Array(2);
    const wasm = new BigUint64Array(2);
    hashBlocksNapi({ tokens: odd, from: 0, count: 8, blockSize: 4, seed: 1337n, parentSeq: null, outSeq: napi, outOffset: 0 });
    hashBlocksWasm({ tokens: odd, from: 0, count: 8, blockSize: 4, seed: 1337n, parentSeq: null, outSeq: wasm, outOffset: 0 });
    expect(dec(wasm)).toEqual(dec(napi));
    // -1 is 0xffffffff: same hash as the explicit value.
    const a = new BigUint64Array(1);
    const b = new BigUint64Array(1);
    hashBlocksWasm({ tokens: [-1], from: 0, count: 1, blockSize: 1, seed: 1337n, parentSeq: null, outSeq: a, outOffset: 0 });
    hashBlocksWasm({
      tokens: Uint32Array.of(0xffffffff),
      from: 0,
      count: 1,
      blockSize: 1,
      seed: 1337n,
      parentSeq: null,
      outSeq: b,
      outOffset: 0,
    });
    expect(a[0]).toBe(b[0]);
  });

  it('a count reaching past the end reads missing tokens as 0, as napi does', () => {
    const napi = new BigUint64Array(2);
    const wasm = new BigUint64Array(2);
    hashBlocksNapi({ tokens: [1, 2, 3], from: 1, count: 8, blockSize: 4, seed: 1337n, parentSeq: null, outSeq: napi, outOffset: 0 });
    hashBlocksWasm({ tokens: [1, 2, 3], from: 1, count: 8, blockSize: 4, seed: 1337n, parentSeq: null, outSeq: wasm, outOffset: 0 });
    expect(dec(wasm)).toEqual(dec(napi));
    hashBlocksWasm({
      tokens: Uint32Array.of(1, 2, 3),
      from: 1,
      count: 8,
      blockSize: 4,
      seed: 1337n,
      parentSeq: null,
      outSeq: wasm,
      outOffset: 0,
    });
    expect(dec(wasm)).toEqual(dec(napi));
  });
});

describe('both embedded builds (SIMD128 and scalar) agree with the napi reference', () => {
  it('this engine validates the SIMD128 build (the one the hasher uses)', () => {
    // Node 20 on x64 (SSE4.1) and arm64 runs wasm SIMD; if this fails the scalar fallback is what ships.
    expect(WASM_SIMD).toBe(true);
  });

  for (const simd of [true, false]) {
    it(`${simd ? 'SIMD128' : 'scalar'} build: xxh3_64 on every length, hash_blocks on block sizes 1..60 with and without a parent`, () => {
      const w = instantiateXxh3(simd);
      w.memory.grow(4);
      const base = (Number(w.__heap_base.value) + 7) & ~7;
      const mem = new Uint8Array(w.memory.buffer);
      const u64 = new BigUint64Array(w.memory.buffer);
      for (let len = 0; len <= 240; len++) {
        const bytes = Uint8Array.from({ length: len }, (_, i) => (i * 37 + len * 11 + 5) & 255);
        mem.set(bytes, base);
        for (const seed of [0n, 1337n, (1n << 64n) - 1n])
          expect(BigInt.asUintN(64, w.xxh3_64(base, len, seed))).toBe(xxh3.xxh64(bytes, seed));
      }
      const tokens = Uint32Array.from({ length: 60 * 9 + 7 }, (_, i) => (i * 2654435761 + 12345) >>> 0);
      new Uint32Array(w.memory.buffer, base, tokens.length).set(tokens);
      const seqPtr = base + tokens.length * 4 + 8 - ((tokens.length * 4) % 8);
      const localPtr = seqPtr + 8 * 600;
      for (let bs = 1; bs <= WASM_MAX_BLOCK_TOKENS; bs++) {
        for (const parent of [null, 98765432123456789n]) {
          const blocks = Math.floor(tokens.length / bs);
          const napiSeq = new BigUint64Array(blocks);
          const napiLocal = new BigUint64Array(blocks);
          hashBlocksNapi({ tokens, blockSize: bs, seed: 4242n, parentSeq: parent, outSeq: napiSeq, outLocal: napiLocal });
          expect(w.hash_blocks(base, blocks, bs, 4242n, parent === null ? 0 : 1, parent ?? 0n, seqPtr, localPtr)).toBe(blocks);
          expect(dec(u64.slice(seqPtr / 8, seqPtr / 8 + blocks))).toEqual(dec(napiSeq));
          expect(dec(u64.slice(localPtr / 8, localPtr / 8 + blocks))).toEqual(dec(napiLocal));
        }
      }
    });

    it(`${simd ? 'SIMD128' : 'scalar'} build: mrc_scan finds exactly the blocks whose low 24 bits are under the threshold`, () => {
      const w = instantiateXxh3(simd);
      w.memory.grow(4);
      const base = (Number(w.__heap_base.value) + 7) & ~7;
      const n = 1_003; // not a multiple of 8: the tail loop runs too
      const words = new Uint32Array(w.memory.buffer, base, 2 * n);
      for (let i = 0; i < 2 * n; i++) words[i] = (i * 2654435761 + 977) >>> 0;
      // Values at the threshold itself and one below it, on both sides of an eight-block group's edge.
      const t = 1 << 21;
      words[2 * 7] = (words[2 * 7] & 0xff000000) | t;
      words[2 * 8] = (words[2 * 8] & 0xff000000) | (t - 1);
      const outPtr = base + 8 * n;
      for (const from of [0, 5, 15, 1_000]) {
        const want: number[] = [];
        for (let i = from; i < n; i++) if ((words[2 * i] & 0xffffff) < t) want.push(i);
        const count = w.mrc_scan(base, from, n, t, outPtr);
        expect(Array.from(new Uint32Array(w.memory.buffer, outPtr, count))).toEqual(want);
      }
      expect(w.mrc_scan(base, 0, n, 0, outPtr)).toBe(0);
      expect(w.mrc_scan(base, 0, n, 1 << 24, outPtr)).toBe(n);
    });
  }
});
