import { describe, expect, it } from 'vitest';
import { TtlIndex } from '../../src/core/approx.ts';

/** Deterministic uniform 64-bit hashes (splitmix64). */
function hashes(seed: number) {
  let x = BigInt(seed) * 0x9e3779b97f4a7c15n;
  return (n: number): BigUint64Array => {
    const out = new BigUint64Array(n);
    for (let i = 0; i < n; i++) {
      x = (x + 0x9e3779b97f4a7c15n) & 0xffffffffffffffffn;
      let z = x;
      z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & 0xffffffffffffffffn;
      z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & 0xffffffffffffffffn;
      out[i] = z ^ (z >> 31n);
    }
    return out;
  };
}

/** `base` followed by `extra` new blocks. */
function extend(base: BigUint64Array, extra: BigUint64Array): BigUint64Array {
  const out = new BigUint64Array(base.length + extra.length);
  out.set(base);
  out.set(extra, base.length);
  return out;
}

/** Which blocks of a chain the source holds, one lookup per block (not the binary search). */
function presence(idx: TtlIndex, source: number, chain: BigUint64Array, now: number): boolean[] {
  return Array.from(chain, (_, i) => idx.prefix(source, chain.subarray(i, i + 1), now) === 1);
}

/** Prefix-closed: no block present after an absent one. */
function prefixClosed(p: boolean[]): boolean {
  const first = p.indexOf(false);
  return first < 0 || !p.slice(first).includes(true);
}

/**
 * The budget drops the least recently recorded blocks fleet-wide: some time T splits what is held (last recorded after
 * T) from what is not. Checks that split against the blocks' last record times, and the index's own counts.
 */
function expectOldestDropped(idx: TtlIndex, recorded: readonly { source: number; chain: BigUint64Array; at: number }[], now: number) {
  const last = new Map<string, { source: number; hash: bigint; at: number }>();
  for (const r of recorded) for (const h of r.chain) last.set(`${r.source}:${h}`, { source: r.source, hash: h, at: r.at });
  let newestDropped = -Infinity;
  let oldestHeld = Infinity;
  let held = 0;
  for (const b of last.values()) {
    if (idx.prefix(b.source, new BigUint64Array([b.hash]), now) === 1) {
      oldestHeld = Math.min(oldestHeld, b.at);
      held++;
    } else newestDropped = Math.max(newestDropped, b.at);
  }
  expect(newestDropped).toBeLessThan(oldestHeld);
  expect(held).toBeGreaterThan(0);
  expect(held).toBeLessThan(last.size);
  expect(idx.audit()).toBeUndefined();
  return held;
}

/** Sessions of growing chains on a few sources: each turn re-records its session's chain plus new blocks. */
function workload(idx: TtlIndex, turns: number, sources: number, seed = 1) {
  const gen = hashes(seed);
  const systems = Array.from({ length: 4 }, () => gen(8));
  const sessions: { source: number; chain: BigUint64Array }[] = [];
  const recorded: { source: number; chain: BigUint64Array; at: number }[] = [];
  for (let t = 0; t < turns; t++) {
    const k = (t * 7) % 40;
    if (!sessions[k] || t % 50 === 0) sessions[k] = { source: (t * 13) % sources, chain: systems[t % systems.length] };
    const s = sessions[k];
    s.chain = extend(s.chain, gen(2 + (t % 5)));
    idx.record(s.source, s.chain, t);
    recorded.push({ source: s.source, chain: s.chain, at: t });
  }
  return recorded;
}

describe('TtlIndex: the byte budget', () => {
  it('never grows past its budget, keeps the newest chains whole and every chain prefix-closed', () => {
    const idx = new TtlIndex({ ttlMs: 1e9, maxBytes: 64 * 1024 });
    expect(idx.maxEntries).toBeGreaterThan(1000);
    const gen = hashes(7);
    let worst = 0;
    const recorded: { source: number; chain: BigUint64Array; at: number }[] = [];
    for (let t = 0; t < 2000; t++) {
      const parent = recorded.length > 0 && t % 3 !== 0 ? recorded[(t * 31) % recorded.length] : undefined;
      const source = parent?.source ?? t % 3;
      const chain = parent ? extend(parent.chain.subarray(0, Math.min(parent.chain.length, 12)), gen(4)) : gen(6);
      idx.record(source, chain, t);
      recorded.push({ source, chain, at: t });
      worst = Math.max(worst, idx.bytes);
      expect(idx.size).toBeLessThanOrEqual(idx.maxEntries);
      if (t % 97 === 0) expect(idx.audit()).toBeUndefined();
    }
    expect(worst).toBeLessThanOrEqual(64 * 1024);
    // Far more blocks were recorded than fit: the oldest went, the newest stayed.
    expect(recorded.reduce((n, r) => n + r.chain.length, 0)).toBeGreaterThan(3 * idx.maxEntries);
    expectOldestDropped(idx, recorded, 2000);
    for (const r of recorded.slice(-20)) expect(idx.prefix(r.source, r.chain, 2000)).toBe(r.chain.length);
    for (const r of recorded.filter((_, i) => i % 7 === 0)) expect(prefixClosed(presence(idx, r.source, r.chain, 2000))).toBe(true);
  });

  it("counts each source's blocks exactly (what blocks() reports equals the blocks it holds)", () => {
    const idx = new TtlIndex({ ttlMs: 1e9, maxBytes: 32 * 1024 });
    const recorded = workload(idx, 1500, 4);
    for (let s = 0; s < 4; s++) {
      const held = new Set<bigint>();
      for (const r of recorded)
        if (r.source === s) for (const h of r.chain) if (idx.prefix(s, new BigUint64Array([h]), 1500) === 1) held.add(h);
      expect(idx.blocks(s)).toBe(held.size);
    }
    expect(idx.blocks(0) + idx.blocks(1) + idx.blocks(2) + idx.blocks(3)).toBeLessThanOrEqual(idx.size);
  });

  it("a record() at a full table reads a bounded number of cells, whatever the table's size", () => {
    for (const maxBytes of [64 * 1024, 1024 * 1024]) {
      const idx = new TtlIndex({ ttlMs: 1e9, maxBytes });
      const gen = hashes(21);
      const last = Array.from({ length: 8 }, () => gen(64));
      // 64-block chains, 32 shared with the source's previous one: three table turnovers.
      for (let t = 0; t < (3 * idx.maxEntries) / 32; t++) {
        const s = t % 8;
        last[s] = extend(last[s].subarray(0, 32), gen(32));
        idx.record(s, last[s], t);
      }
      expect(idx.size).toBeGreaterThan(0.85 * idx.maxEntries);
      // The old eviction read every cell (twice) per eviction: ~10^5 cells at 1 MiB.
      expect(idx.scanned.worstRecord).toBeLessThan(40 * 64);
      expect(idx.audit()).toBeUndefined();
    }
  });

  it('a chain longer than the whole table keeps its leading blocks', () => {
    const idx = new TtlIndex({ ttlMs: 1e9, maxBytes: 4096 });
    const chain = hashes(3)(idx.maxEntries + 50);
    idx.record(0, chain, 0);
    expect(idx.size).toBe(idx.maxEntries);
    expect(idx.prefix(0, chain, 1)).toBe(idx.maxEntries);
    expect(idx.bytes).toBeLessThanOrEqual(4096);
  });

  it('unbounded without a budget', () => {
    const idx = new TtlIndex({ ttlMs: 1e9 });
    expect(idx.maxEntries).toBe(Infinity);
    idx.record(0, hashes(5)(50_000), 0);
    expect(idx.size).toBe(50_000);
  });
});

describe('TtlIndex: capacities, expiry, removal', () => {
  it("a source never holds more than its engine's learned capacity (beyond the chain just recorded)", () => {
    const caps: (number | undefined)[] = [20, undefined];
    const idx = new TtlIndex({ ttlMs: 1e9, capacityOf: (s) => caps[s] });
    const gen = hashes(17);
    const chains: BigUint64Array[] = [];
    for (let t = 0; t < 100; t++) {
      chains.push(gen(5));
      idx.record(0, chains[t], t);
      idx.record(1, chains[t], t);
      expect(idx.blocks(0)).toBeLessThanOrEqual(20);
    }
    expect(chains.map((c) => idx.prefix(0, c, 100))).toEqual([...Array(96).fill(0), 5, 5, 5, 5]);
    expect(idx.blocks(1)).toBe(500);
    expect(idx.audit()).toBeUndefined();
    // Shared prefixes: the newest chain stays whole and every chain prefix-closed.
    caps[2] = 30;
    const recorded = workload(idx, 400, 3).filter((r) => r.source === 2);
    const last = recorded[recorded.length - 1];
    expect(idx.prefix(2, last.chain, 400)).toBe(last.chain.length);
    expect(idx.blocks(2)).toBeLessThanOrEqual(Math.max(30, last.chain.length));
    for (const r of recorded) expect(prefixClosed(presence(idx, 2, r.chain, 400))).toBe(true);
    // The configured per-source capacity applies when lower.
    const both = new TtlIndex({ ttlMs: 1e9, capacityPerSource: 10, capacityOf: () => 1000 });
    const gen9 = hashes(9);
    for (let t = 0; t < 20; t++) both.record(0, gen9(4), t);
    expect(both.blocks(0)).toBeLessThanOrEqual(10);
  });

  it('expired groups are dropped and their entries deleted by sweep', () => {
    const idx = new TtlIndex({ ttlMs: 100 });
    const gen = hashes(11);
    const a = gen(30);
    idx.record(0, a, 0);
    const b = gen(30);
    idx.record(1, b, 60);
    expect(idx.prefix(0, a, 99)).toBe(30);
    expect(idx.prefix(0, a, 100)).toBe(0);
    idx.sweep(120);
    expect(idx.size).toBe(30);
    expect(idx.blocks(0)).toBe(0);
    expect(idx.prefix(1, b, 120)).toBe(30);
    // Recording again within the TTL extends every block of the chain, ancestors included.
    idx.record(1, b.subarray(0, 10), 150);
    expect(idx.prefix(1, b, 200)).toBe(10);
  });

  it('a removed source forgets its chains; its index reused by a new source starts empty', () => {
    const idx = new TtlIndex({ ttlMs: 1e9, maxBytes: 64 * 1024 });
    const gen = hashes(13);
    const a = gen(40);
    idx.record(2, a, 0);
    idx.record(1, a, 0);
    idx.removeSource(2);
    expect(idx.blocks(2)).toBe(0);
    expect(idx.prefix(2, a, 1)).toBe(0);
    expect(idx.prefix(1, a, 1)).toBe(40);
    idx.record(2, a.subarray(0, 5), 2);
    expect(idx.prefix(2, a, 3)).toBe(5);
    expect(idx.blocks(2)).toBe(5);
    idx.sweep(4);
    expect(idx.size).toBe(45);
  });

  it('sequence numbers are renumbered before they overflow, without losing live chains', () => {
    const idx = new TtlIndex({ ttlMs: 1e9, maxBytes: 32 * 1024 }, 300);
    const recorded = workload(idx, 2000, 3, 5);
    expectOldestDropped(idx, recorded, 2000);
    const r = recorded.at(-1)!;
    expect(idx.prefix(r.source, r.chain, 2000)).toBe(r.chain.length);
    for (const r of recorded.filter((_, i) => i % 11 === 0)) expect(prefixClosed(presence(idx, r.source, r.chain, 2000))).toBe(true);
    expect(idx.size).toBeLessThanOrEqual(idx.maxEntries);
  });
});
