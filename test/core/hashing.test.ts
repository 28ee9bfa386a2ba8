import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { computeBlockHashes, computeSeqHashes, hashSeed, SeqHasher, fullBlocks, islBlocks } from '../../src/core/hashing.ts';

const range = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => a + i);
const dec = (xs: BigUint64Array) => Array.from(xs, (x) => x.toString());

describe('hashing contract (docs/protocols.md §1 test vectors)', () => {
  it('tokens 0..35, bs 16, default seed: two full blocks, partial tail ignored', () => {
    expect(hashSeed()).toBe(1337n);
    const h = computeBlockHashes(range(0, 36), 16);
    expect(dec(h.local)).toEqual(['15310707395893867146', '15292316782987903195']);
    expect(dec(h.seq)).toEqual(['15310707395893867146', '13769157705258532664']);
  });

  it('lora_name sql-adapter mixes into the seed', () => {
    const seed = hashSeed('sql-adapter');
    expect(seed).toBe(9867606577583457700n);
    const h = computeBlockHashes(range(0, 36), 16, seed);
    expect(dec(h.local)).toEqual(['14536852851305923245', '7140174819136409355']);
    expect(dec(h.seq)).toEqual(['14536852851305923245', '8425625934314863947']);
  });

  it('cache_salt tenant-a mixes into the seed', () => {
    const seed = hashSeed(null, 'tenant-a');
    expect(seed).toBe(1948188790972764086n);
    const h = computeBlockHashes(range(0, 36), 16, seed);
    expect(dec(h.local)).toEqual(['2130915519417463704', '14342547135021016991']);
    expect(dec(h.seq)).toEqual(['2130915519417463704', '13676355973429745432']);
  });

  it('tokens 1000..1063, bs 32', () => {
    const h = computeBlockHashes(range(1000, 1064), 32);
    expect(dec(h.local)).toEqual(['9188553531300959059', '16310179652519145868']);
    expect(dec(h.seq)).toEqual(['9188553531300959059', '14908719570377643093']);
  });

  it('Qwen3 chat tokens, bs 4', () => {
    const h = computeBlockHashes([151644, 872, 198, 4340], 4);
    expect(dec(h.local)).toEqual(['10749291513524092935']);
    expect(dec(h.seq)).toEqual(['10749291513524092935']);
  });

  it('empty strings count as absent', () => {
    expect(hashSeed('', '')).toBe(1337n);
  });

  it('block accounting keeps full and isl blocks apart', () => {
    expect(fullBlocks(36, 16)).toBe(2);
    expect(islBlocks(36, 16)).toBe(3);
    expect(islBlocks(32, 16)).toBe(2);
    expect(computeSeqHashes(range(0, 15), 16).length).toBe(0);
  });
});

const tokenArb = fc.array(fc.integer({ min: 0, max: 0xffffffff }), { minLength: 0, maxLength: 200 });
const bsArb = fc.constantFrom(1, 2, 4, 16, 32);

describe('hashing properties', () => {
  it('hashes of a prefix are a prefix of the hashes', () => {
    fc.assert(
      fc.property(tokenArb, bsArb, fc.nat(), (tokens, bs, cut) => {
        const k = tokens.length === 0 ? 0 : cut % (tokens.length + 1);
        const whole = computeSeqHashes(tokens, bs);
        const prefix = computeSeqHashes(tokens.slice(0, k), bs);
        expect(dec(prefix)).toEqual(dec(whole.subarray(0, prefix.length)));
      }),
    );
  });

  it('a change in block i changes every seq[j >= i] and none before', () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 0xffffffff }), { minLength: 32, maxLength: 160 }), fc.nat(), (tokens, pick) => {
        const bs = 16;
        const n = Math.floor(tokens.length / bs);
        const pos = pick % (n * bs);
        const changed = tokens.slice();
        changed[pos] = (changed[pos] + 1) >>> 0;
        const a = computeSeqHashes(tokens, bs);
        const b = computeSeqHashes(changed, bs);
        const block = Math.floor(pos / bs);
        for (let j = 0; j < n; j++) {
          if (j < block) expect(b[j]).toBe(a[j]);
          else expect(b[j]).not.toBe(a[j]);
        }
      }),
    );
  });

  it('different salts or adapters never share seq[0]', () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 0xffffffff }), { minLength: 16, maxLength: 48 }),
        fc.string({ minLength: 1 }),
        fc.string({ minLength: 1 }),
        fc.boolean(),
        (tokens, x, y, useSalt) => {
          fc.pre(x !== y);
          const seedOf = (s: string) => (useSalt ? hashSeed(null, s) : hashSeed(s));
          const a = computeSeqHashes(tokens, 16, seedOf(x));
          const b = computeSeqHashes(tokens, 16, seedOf(y));
          const plain = computeSeqHashes(tokens, 16);
          expect(a[0]).not.toBe(b[0]);
          expect(a[0]).not.toBe(plain[0]);
        },
      ),
    );
  });

  it('incremental extension equals hashing the whole sequence at once', () => {
    fc.assert(
      fc.property(fc.array(tokenArb, { maxLength: 6 }), bsArb, (chunks, bs) => {
        const hasher = new SeqHasher(bs);
        const all: number[] = [];
        let hashedBlocks = 0;
        for (const chunk of chunks) {
          const before = Math.floor(all.length / bs);
          all.push(...chunk);
          const added = hasher.extend(chunk);
          // Only the blocks completed by this chunk are hashed.
          expect(added).toBe(Math.floor(all.length / bs) - before);
          hashedBlocks += added;
        }
        expect(hasher.blockCount).toBe(hashedBlocks);
        expect(hasher.tokenCount).toBe(all.length);
        expect(dec(hasher.seqHashes())).toEqual(dec(computeSeqHashes(all, bs)));
      }),
    );
  });
});
