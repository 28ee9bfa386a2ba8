/*
 * XXH3-64 (seeded, inputs of 0..240 bytes) and kvroute's block-hash chain (docs/protocols.md §1), for wasm32.
 *
 * Written from the public XXH3 algorithm description; no libc, no __int128 (that would need compiler-rt's
 * __multi3), no memcpy (clang 14's wasm32 has no bulk-memory by default). WebAssembly memory is little-endian
 * and allows unaligned loads, so reads are plain loads through an aligned(1) typedef.
 *
 * Rebuild: scripts/build-wasm.sh (regenerates xxh3-blocks.wasm.ts, which is committed because CI has no clang). It builds
 * two modules from this file, with and without wasm SIMD128 (used only for the byte swap); blocks.ts loads the SIMD one
 * where the engine validates it.
 */

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef u32 u32_unaligned __attribute__((aligned(1)));
typedef u64 u64_unaligned __attribute__((aligned(1)));

#define EXPORT(name) __attribute__((export_name(name)))
/* Everything below is inlined into the exported loops, so a block size known there folds the length branches. */
#define INLINE static inline __attribute__((always_inline))

static const u64 PRIME64_1 = 0x9E3779B185EBCA87ULL;
static const u64 PRIME64_2 = 0xC2B2AE3D27D4EB4FULL;
static const u64 PRIME64_3 = 0x165667B19E3779F9ULL;
static const u64 PRIME_MX1 = 0x165667919E3779F9ULL;
static const u64 PRIME_MX2 = 0x9FB21C651E98DF25ULL;

/* The default 192-byte kSecret (checked against @node-rs/xxhash by the tests). */
static const u8 kSecret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

INLINE u64 rd64(const u8 *p) { return *(const u64_unaligned *)p; }
INLINE u32 rd32(const u8 *p) { return *(const u32_unaligned *)p; }
INLINE u64 rotl64(u64 x, int r) { return (x << r) | (x >> (64 - r)); }

INLINE u32 swap32(u32 x) {
  return ((x << 24) & 0xff000000u) | ((x << 8) & 0x00ff0000u) | ((x >> 8) & 0x0000ff00u) | (x >> 24);
}

#ifdef __wasm_simd128__
/* With SIMD128 (scripts/build-wasm.sh builds both modules) the byte swap is one shuffle (pshufb on x64) instead of
 * some twenty shifts and masks: ~9% off the 64-byte block's time. */
#include <wasm_simd128.h>
INLINE u64 swap64(u64 x) {
  v128_t v = wasm_i64x2_splat(x);
  return wasm_i64x2_extract_lane(wasm_i8x16_shuffle(v, v, 7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8), 0);
}
#else
INLINE u64 swap64(u64 x) { return ((u64)swap32((u32)x) << 32) | swap32((u32)(x >> 32)); }
#endif

/*
 * Low 64 bits xor high 64 bits of the 128-bit product. wasm has no 64x64->128 multiply, so the high half comes from
 * four 32x32->64 products (Hacker's Delight's mulhu: neither partial sum can overflow) and the low half is one
 * ordinary 64-bit multiply.
 */
INLINE u64 mul128_fold64(u64 a, u64 b) {
  u64 alo = a & 0xffffffffULL, ahi = a >> 32;
  u64 blo = b & 0xffffffffULL, bhi = b >> 32;
  u64 t = ((alo * blo) >> 32) + ahi * blo;         /* <= 2^64 - 2^32 */
  u64 w = (t & 0xffffffffULL) + alo * bhi;         /* < 2^64 */
  u64 upper = ahi * bhi + (t >> 32) + (w >> 32);
  return (a * b) ^ upper;
}

INLINE u64 xxh64_avalanche(u64 h) {
  h ^= h >> 33;
  h *= PRIME64_2;
  h ^= h >> 29;
  h *= PRIME64_3;
  h ^= h >> 32;
  return h;
}

INLINE u64 xxh3_avalanche(u64 h) {
  h ^= h >> 37;
  h *= PRIME_MX1;
  h ^= h >> 32;
  return h;
}

INLINE u64 rrmxmx(u64 h, u64 len) {
  h ^= rotl64(h, 49) ^ rotl64(h, 24);
  h *= PRIME_MX2;
  h ^= (h >> 35) + len;
  h *= PRIME_MX2;
  h ^= h >> 28;
  return h;
}

INLINE u64 mix16(const u8 *in, const u8 *sec, u64 seed) {
  u64 lo = rd64(in), hi = rd64(in + 8);
  return mul128_fold64(lo ^ (rd64(sec) + seed), hi ^ (rd64(sec + 8) - seed));
}

INLINE u64 len_0to16(const u8 *in, u32 len, u64 seed) {
  if (len > 8) {
    u64 flip1 = (rd64(kSecret + 24) ^ rd64(kSecret + 32)) + seed;
    u64 flip2 = (rd64(kSecret + 40) ^ rd64(kSecret + 48)) - seed;
    u64 lo = rd64(in) ^ flip1;
    u64 hi = rd64(in + len - 8) ^ flip2;
    u64 acc = (u64)len + swap64(lo) + hi + mul128_fold64(lo, hi);
    return xxh3_avalanche(acc);
  }
  if (len >= 4) {
    u64 s = seed ^ ((u64)swap32((u32)seed) << 32);
    u64 in1 = rd32(in), in2 = rd32(in + len - 4);
    u64 flip = (rd64(kSecret + 8) ^ rd64(kSecret + 16)) - s;
    u64 keyed = (in2 + (in1 << 32)) ^ flip;
    return rrmxmx(keyed, len);
  }
  if (len > 0) {
    u32 c1 = in[0], c2 = in[len >> 1], c3 = in[len - 1];
    u32 combined = (c1 << 16) | (c2 << 24) | c3 | (len << 8);
    u64 flip = (u64)(rd32(kSecret) ^ rd32(kSecret + 4)) + seed;
    return xxh64_avalanche((u64)combined ^ flip);
  }
  return xxh64_avalanche(seed ^ (rd64(kSecret + 56) ^ rd64(kSecret + 64)));
}

INLINE u64 len_17to128(const u8 *in, u32 len, u64 seed) {
  u64 acc = (u64)len * PRIME64_1;
  if (len > 32) {
    if (len > 64) {
      if (len > 96) {
        acc += mix16(in + 48, kSecret + 96, seed);
        acc += mix16(in + len - 64, kSecret + 112, seed);
      }
      acc += mix16(in + 32, kSecret + 64, seed);
      acc += mix16(in + len - 48, kSecret + 80, seed);
    }
    acc += mix16(in + 16, kSecret + 32, seed);
    acc += mix16(in + len - 32, kSecret + 48, seed);
  }
  acc += mix16(in, kSecret, seed);
  acc += mix16(in + len - 16, kSecret + 16, seed);
  return xxh3_avalanche(acc);
}

/* 129..240 bytes: 8 rounds on the secret's start, avalanche, then the rest at secret offset 3, and the last 16
 * bytes at offset 136 - 17. */
INLINE u64 len_129to240(const u8 *in, u32 len, u64 seed) {
  u64 acc = (u64)len * PRIME64_1;
  u32 rounds = len / 16;
  for (u32 i = 0; i < 8; i++) acc += mix16(in + 16 * i, kSecret + 16 * i, seed);
  acc = xxh3_avalanche(acc);
  for (u32 i = 8; i < rounds; i++) acc += mix16(in + 16 * i, kSecret + 16 * (i - 8) + 3, seed);
  acc += mix16(in + len - 16, kSecret + 136 - 17, seed);
  return xxh3_avalanche(acc);
}

INLINE u64 xxh3_64_small(const u8 *in, u32 len, u64 seed) {
  if (len <= 16) return len_0to16(in, len, seed);
  if (len <= 128) return len_17to128(in, len, seed);
  return len_129to240(in, len, seed);
}

/* seq[i] = xxh3_64(le64(prev) || le64(local), 1337): the 9..16-byte path with both halves known. */
INLINE u64 chain(u64 prev, u64 local) {
  const u64 seed = 1337;
  u64 lo = prev ^ ((rd64(kSecret + 24) ^ rd64(kSecret + 32)) + seed);
  u64 hi = local ^ ((rd64(kSecret + 40) ^ rd64(kSecret + 48)) - seed);
  return xxh3_avalanche(16 + swap64(lo) + hi + mul128_fold64(lo, hi));
}

/* XXH3-64 of in[0..len) with seed; len must be <= 240 (returns 0 otherwise: the caller falls back to napi). */
EXPORT("xxh3_64")
u64 xxh3_64(const u8 *in, u32 len, u64 seed) {
  if (len > 240) return 0;
  return xxh3_64_small(in, len, seed);
}

/*
 * The block loop for `bytes` bytes a block. Inlined with a constant `bytes` (below), XXH3's length branches fold away
 * and the seed's keys (secret +- seed) are computed once, outside the loop.
 */
INLINE void hash_run(const u8 *p, u32 nblocks, u32 bytes, u64 seed, u32 has_parent, u64 parent, u64 *out_seq,
                     u64 *out_local) {
  u32 b = 0;
  u64 prev = parent;
  if (!has_parent) {
    prev = xxh3_64_small(p, bytes, seed);
    out_seq[0] = prev;
    if (out_local) out_local[0] = prev;
    b = 1;
    p += bytes;
  }
  for (; b < nblocks; b++, p += bytes) {
    u64 local = xxh3_64_small(p, bytes, seed);
    prev = chain(prev, local);
    out_seq[b] = prev;
    if (out_local) out_local[b] = local;
  }
}

/*
 * Hashes `nblocks` full blocks of `bs` u32 tokens at `tokens` (little-endian), writing seq hashes to out_seq and,
 * when out_local is not 0, the local hashes to out_local. The chain starts from `parent` when has_parent != 0.
 * Returns the number of blocks hashed (0 when bs is 0 or bs * 4 > 240). Block sizes 16 (vLLM's default) and 32 have
 * loops of their own; the others share one that branches on the length per block.
 */
EXPORT("hash_blocks")
u32 hash_blocks(const u32 *tokens, u32 nblocks, u32 bs, u64 seed, u32 has_parent, u64 parent, u64 *out_seq,
                u64 *out_local) {
  if (bs == 0 || bs > 60) return 0;
  if (nblocks == 0) return 0;
  const u8 *p = (const u8 *)tokens;
  if (bs == 16)
    hash_run(p, nblocks, 64, seed, has_parent, parent, out_seq, out_local);
  else if (bs == 32)
    hash_run(p, nblocks, 128, seed, has_parent, parent, out_seq, out_local);
  else
    hash_run(p, nblocks, bs * 4, seed, has_parent, parent, out_seq, out_local);
  return nblocks;
}

/*
 * The miss-ratio curve's sampling pass over the tail of a chain (src/core/mrc.ts, collectCandidates): writes to `out`
 * the indices i in [from, n) whose seq hash (the u64 at seq + 8 i) has its low 24 bits below `t` (t <= 2^24), in
 * order, and returns how many. In the SIMD128 build eight blocks at a time (the scalar build checks one at a time):
 * (v - t) is negative iff v < t (both below 2^24 + 1), so the sign bits of eight differences say whether any of the
 * eight passes (rare: about t / 2^24 of the blocks); those eight are then checked one by one.
 */
EXPORT("mrc_scan")
u32 mrc_scan(const u64 *seq, u32 from, u32 n, u32 t, u32 *out) {
  const u32 mask = 0xffffffu;
  u32 c = 0;
  u32 i = from;
#ifdef __wasm_simd128__
  const v128_t vmask = wasm_i32x4_splat((int)mask);
  const v128_t vt = wasm_i32x4_splat((int)t);
  for (; i + 8 <= n; i += 8) {
    const v128_t *p = (const v128_t *)(seq + i); /* lanes: lo, hi, lo, hi (little-endian u64s) */
    v128_t lo0 = wasm_i32x4_shuffle(wasm_v128_load(p), wasm_v128_load(p + 1), 0, 2, 4, 6);
    v128_t lo1 = wasm_i32x4_shuffle(wasm_v128_load(p + 2), wasm_v128_load(p + 3), 0, 2, 4, 6);
    v128_t d = wasm_v128_or(wasm_i32x4_sub(wasm_v128_and(lo0, vmask), vt), wasm_i32x4_sub(wasm_v128_and(lo1, vmask), vt));
    if (wasm_i32x4_bitmask(d)) {
      for (u32 j = 0; j < 8; j++)
        if (((u32)seq[i + j] & mask) < t) out[c++] = i + j;
    }
  }
#endif
  for (; i < n; i++)
    if (((u32)seq[i] & mask) < t) out[c++] = i;
  return c;
}
