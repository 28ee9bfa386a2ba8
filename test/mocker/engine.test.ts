import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import {
  BlockPool,
  DEFAULT_FIRST_PRINCIPLES,
  DEFAULT_POLYNOMIAL,
  MockEngine,
  EngineInputError,
  expectedOutputTokens,
  stepDurationMs,
  type EngineConfig,
  type EngineEvent,
  type RequestOutput,
} from '../../src/mocker/engine/index.ts';
import { computeSeqHashes, hashBlocksInto, hashSeed } from '../../src/core/hashing.ts';
import { KvIndex } from '../../src/core/index/kv-index.ts';
import { splitU64 } from '../../src/core/index/u64-map.ts';

// ------------------------------------------------------------------------------------------------ cache vs brute force

/** Brute-force model of the pool's semantics, at the level of hashes (physical ids are irrelevant to routing). */
class BrutePool {
  blocks: { hash: bigint | null; ref: number; freedAt: number }[];
  clock = 0;
  evicted: bigint[] = [];
  constructor(n: number) {
    this.blocks = Array.from({ length: n }, () => ({ hash: null, ref: 0, freedAt: -1 }));
  }
  find(h: bigint): number {
    return this.blocks.findIndex((b) => b.hash === h);
  }
  match(hashes: bigint[], max: number): number[] {
    const out: number[] = [];
    for (let i = 0; i < Math.min(max, hashes.length); i++) {
      const b = this.find(hashes[i]);
      if (b < 0) break;
      out.push(b);
    }
    return out;
  }
  free(): number {
    return this.blocks.filter((b) => b.ref === 0).length;
  }
  allocate(): number {
    // Empty free blocks first; otherwise the cached free block freed longest ago.
    let pick = this.blocks.findIndex((b) => b.ref === 0 && b.hash === null);
    if (pick < 0) {
      let best = Infinity;
      this.blocks.forEach((b, i) => {
        if (b.ref === 0 && b.freedAt < best) {
          best = b.freedAt;
          pick = i;
        }
      });
    }
    if (pick < 0) return -1;
    const b = this.blocks[pick];
    if (b.hash !== null) this.evicted.push(b.hash);
    b.hash = null;
    b.ref = 1;
    return pick;
  }
  release(list: number[]): void {
    for (let i = list.length - 1; i >= 0; i--) {
      const b = this.blocks[list[i]];
      b.ref--;
      if (b.ref === 0) b.freedAt = this.clock++;
    }
  }
  cachedSet(): Set<bigint> {
    return new Set(this.blocks.filter((b) => b.hash !== null).map((b) => b.hash!));
  }
}

/** Runs one "request" on either pool: hit, allocate the rest, register (sharing duplicates). Returns hit length or -1. */
function admit(
  p: {
    match(h: bigint[], m: number): number[];
    free(): number;
    refOf(b: number): number;
    touch(b: number): void;
    allocate(): number;
    lookup(h: bigint): number;
    register(b: number, h: bigint): void;
    release(l: number[]): void;
  },
  hashes: bigint[],
): { hit: number; held: number[] } | null {
  const hit = p.match(hashes, hashes.length - 1);
  const fresh = hashes.length - hit.length;
  const evictable = hit.filter((b) => p.refOf(b) === 0).length;
  if (fresh > p.free() - evictable) return null;
  const held: number[] = [];
  for (const b of hit) {
    p.touch(b);
    held.push(b);
  }
  for (let k = 0; k < fresh; k++) held.push(p.allocate());
  for (let j = hit.length; j < hashes.length; j++) {
    const ex = p.lookup(hashes[j]);
    if (ex >= 0 && ex !== held[j]) {
      p.touch(ex);
      p.release([held[j]]);
      held[j] = ex;
    } else p.register(held[j], hashes[j]);
  }
  return { hit: hit.length, held };
}

function realAdapter(pool: BlockPool) {
  return {
    match: (h: bigint[], m: number) => pool.matchPrefix(BigUint64Array.from(h), m),
    free: () => pool.freeBlocks,
    refOf: (b: number) => pool.refCount(b),
    touch: (b: number) => pool.touch(b),
    allocate: () => pool.allocate(),
    lookup: (h: bigint) => pool.lookup(h),
    register: (b: number, h: bigint) => {
      const [lo, hi] = splitU64(h);
      pool.register(b, lo, hi, h, null, 0);
    },
    release: (l: number[]) => pool.release(l),
  };
}

function bruteAdapter(bp: BrutePool) {
  return {
    match: (h: bigint[], m: number) => bp.match(h, m),
    free: () => bp.free(),
    refOf: (b: number) => bp.blocks[b].ref,
    touch: (b: number) => void bp.blocks[b].ref++,
    allocate: () => bp.allocate(),
    lookup: (h: bigint) => bp.find(h),
    register: (b: number, h: bigint) => {
      bp.blocks[b].hash = h;
    },
    release: (l: number[]) => bp.release(l),
  };
}

/** Hash paths through a small tree: block j of path p is named by the path's first j+1 choices, so prefixes share. */
const pathArb = fc.array(fc.integer({ min: 0, max: 2 }), { minLength: 1, maxLength: 6 }).map((choices) => {
  const hashes: bigint[] = [];
  let h = 1n;
  for (const c of choices) {
    h = h * 4n + BigInt(c + 1);
    hashes.push(h);
  }
  return hashes;
});

const opArb = fc.oneof(
  fc.record({ kind: fc.constant('admit' as const), path: pathArb }),
  fc.record({ kind: fc.constant('finish' as const), which: fc.nat() }),
);

describe('BlockPool', () => {
  it('matches a brute-force model of LRU prefix caching on random workloads', () => {
    fc.assert(
      fc.property(fc.integer({ min: 2, max: 12 }), fc.array(opArb, { maxLength: 60 }), (n, ops) => {
        const evictedReal: bigint[] = [];
        const pool = new BlockPool(n, (p, b) => evictedReal.push(p.seqHashOf(b)));
        const bp = new BrutePool(n);
        const ra = realAdapter(pool);
        const ba = bruteAdapter(bp);
        const activeR: number[][] = [];
        const activeB: number[][] = [];
        for (const op of ops) {
          if (op.kind === 'admit') {
            const r = admit(ra, op.path);
            const b = admit(ba, op.path);
            expect(r === null).toBe(b === null);
            if (r && b) {
              expect(r.hit).toBe(b.hit);
              activeR.push(r.held);
              activeB.push(b.held);
            }
          } else if (activeR.length > 0) {
            const i = op.which % activeR.length;
            pool.release(activeR.splice(i, 1)[0]);
            bp.release(activeB.splice(i, 1)[0]);
          }
          expect(evictedReal).toEqual(bp.evicted);
          expect(new Set(pool.cachedBlockList().map((b) => pool.seqHashOf(b)))).toEqual(bp.cachedSet());
          expect(pool.freeBlocks).toBe(bp.free());
        }
      }),
      { numRuns: 300 },
    );
  });

  it('evicts only when a block is needed, least recently freed first, and never a block in use', () => {
    const evicted: bigint[] = [];
    const pool = new BlockPool(3, (p, b) => evicted.push(p.seqHashOf(b)));
    const reg = (b: number, h: bigint) => {
      const [lo, hi] = splitU64(h);
      pool.register(b, lo, hi, h, null, 0);
    };
    const a = pool.allocate();
    const b = pool.allocate();
    reg(a, 1n);
    reg(b, 2n);
    pool.release([a, b]); // b freed first, then a
    expect(pool.cachedBlocks).toBe(2);
    expect(evicted).toEqual([]);
    const c = pool.allocate(); // the never-used block
    expect(evicted).toEqual([]);
    pool.allocate();
    expect(evicted).toEqual([2n]);
    pool.allocate();
    expect(evicted).toEqual([2n, 1n]);
    expect(pool.allocate()).toBe(-1);
    expect(c).toBeGreaterThanOrEqual(0);
  });
});

// ------------------------------------------------------------------------------------------------ engine

function runToCompletion(engine: MockEngine, opts: { check?: boolean; onStep?: (events: EngineEvent[]) => void } = {}) {
  const outputs = new Map<string, RequestOutput[]>();
  let t = 0;
  let steps = 0;
  while (engine.hasWork()) {
    const r = engine.step(t);
    expect(r.scheduledRequests).toBeGreaterThan(0);
    expect(r.scheduledTokens).toBeLessThanOrEqual(engine.config.maxNumBatchedTokens);
    expect(engine.numRunning).toBeLessThanOrEqual(engine.config.maxNumSeqs);
    if (opts.check) engine.checkInvariants();
    opts.onStep?.(r.events);
    for (const o of r.outputs) {
      const l = outputs.get(o.requestId) ?? [];
      l.push(o);
      outputs.set(o.requestId, l);
    }
    t += r.durationMs;
    if (++steps > 100_000) throw new Error('engine did not drain');
  }
  return { outputs, t, steps };
}

const tokens = (n: number, base = 0) => Array.from({ length: n }, (_, i) => base + i);

describe('MockEngine', () => {
  it('hits floor((n-1)/bs) blocks on a repeated prompt, never the last token', () => {
    for (const n of [15, 16, 17, 32, 33, 100]) {
      const e = new MockEngine({ blockSize: 16, numGpuBlocks: 64 });
      e.addRequest({ requestId: 'a', promptTokens: tokens(n), maxTokens: 2 }, 0);
      const first = runToCompletion(e);
      e.addRequest({ requestId: 'b', promptTokens: tokens(n), maxTokens: 2 }, first.t);
      const second = runToCompletion(e);
      expect(first.outputs.get('a')![0].cachedTokens).toBe(0);
      expect(second.outputs.get('b')![0].cachedTokens).toBe(Math.floor((n - 1) / 16) * 16);
      expect(e.counters.prefixCacheQueries).toBe(2 * n);
      expect(e.counters.prefixCacheHits).toBe(Math.floor((n - 1) / 16) * 16);
    }
  });

  it('chunks prefill to the token budget and decodes one token per request per step', () => {
    const e = new MockEngine({ blockSize: 16, numGpuBlocks: 64, maxNumBatchedTokens: 32 });
    e.addRequest({ requestId: 'a', promptTokens: tokens(100), maxTokens: 3 }, 0);
    const steps: number[] = [];
    let t = 0;
    const got: number[] = [];
    while (e.hasWork()) {
      const r = e.step(t);
      steps.push(r.scheduledTokens);
      for (const o of r.outputs) got.push(...o.newTokens);
      t += r.durationMs;
    }
    expect(steps).toEqual([32, 32, 32, 4, 1, 1]);
    expect(got).toEqual(expectedOutputTokens({ promptTokens: tokens(100) }, 3, 32000));
  });

  it('announces blocks filled by generated tokens, chained to the prompt blocks', () => {
    const e = new MockEngine({ blockSize: 4, numGpuBlocks: 64 });
    const prompt = tokens(6, 500);
    e.addRequest({ requestId: 'a', promptTokens: prompt, maxTokens: 8 }, 0);
    const stored: EngineEvent[] = [];
    runToCompletion(e, { onStep: (ev) => stored.push(...ev) });
    // 6 + 8 tokens, the last one never computed: 13 computed -> 3 full blocks, announced as they fill.
    const s = stored.filter((x) => x.kind === 'stored');
    expect(s.map((x) => x.engineIds.length)).toEqual([1, 1, 1]);
    const out = expectedOutputTokens({ promptTokens: prompt }, 8, 32000);
    const all = [...prompt, ...out];
    const seq = computeSeqHashes(all.slice(0, 12), 4);
    expect(s.flatMap((x) => (x.kind === 'stored' ? x.routerSeqHashes : []))).toEqual([...seq]);
    expect(s[1].kind === 'stored' && s[1].tokens).toEqual(all.slice(4, 8));
    expect(s[1].kind === 'stored' && s[1].parent).toBe(s[0].engineIds[0]);
    // Engine ids are not the router's hashes.
    expect(s[0].engineIds[0]).not.toBe(seq[0]);
  });

  it('gives LoRA and cache_salt requests their own block identity and extra keys', () => {
    const e = new MockEngine({ blockSize: 4, numGpuBlocks: 64 });
    const p = tokens(9);
    e.addRequest({ requestId: 'plain', promptTokens: p, maxTokens: 1 }, 0);
    e.addRequest({ requestId: 'lora', promptTokens: p, maxTokens: 1, loraName: 'sql' }, 0);
    e.addRequest({ requestId: 'salt', promptTokens: p, maxTokens: 1, cacheSalt: 'tenant-a' }, 0);
    const events: EngineEvent[] = [];
    const { outputs } = runToCompletion(e, { onStep: (ev) => events.push(...ev) });
    expect([...outputs.values()].map((o) => o[0].cachedTokens)).toEqual([0, 0, 0]);
    const s = events.filter((x) => x.kind === 'stored');
    expect(s).toHaveLength(3);
    const ids = new Set(s.map((x) => x.engineIds[0]));
    expect(ids.size).toBe(3);
    const lora = s.find((x) => x.kind === 'stored' && x.loraName === 'sql')!;
    const salt = s.find((x) => x.kind === 'stored' && x.cacheSalt === 'tenant-a')!;
    if (lora.kind !== 'stored' || salt.kind !== 'stored') throw new Error('unreachable');
    expect(lora.extraKeys).toEqual([['sql'], ['sql']]);
    expect(lora.loraId).toBe(1);
    expect(salt.extraKeys).toEqual([['tenant-a'], null]);
    expect(lora.routerSeqHashes).toEqual([...computeSeqHashes(p, 4, hashSeed('sql', null))]);
    expect(salt.routerSeqHashes).toEqual([...computeSeqHashes(p, 4, hashSeed(null, 'tenant-a'))]);
    // A second salted request hits only the salted blocks.
    e.addRequest({ requestId: 'salt2', promptTokens: p, maxTokens: 1, cacheSalt: 'tenant-a' }, 0);
    e.addRequest({ requestId: 'salt3', promptTokens: p, maxTokens: 1, cacheSalt: 'tenant-b' }, 0);
    const again = runToCompletion(e);
    expect(again.outputs.get('salt2')![0].cachedTokens).toBe(8);
    expect(again.outputs.get('salt3')![0].cachedTokens).toBe(0);
  });

  it('preempts by recompute when blocks run out, and still delivers every token', () => {
    const e = new MockEngine({ blockSize: 4, numGpuBlocks: 10, maxNumBatchedTokens: 64 });
    for (let i = 0; i < 4; i++) e.addRequest({ requestId: `r${i}`, promptTokens: tokens(8, i * 100), maxTokens: 20 }, 0);
    const { outputs } = runToCompletion(e, { check: true });
    expect(e.counters.preemptions).toBeGreaterThan(0);
    for (let i = 0; i < 4; i++) {
      const toks = outputs.get(`r${i}`)!.flatMap((o) => o.newTokens);
      expect(toks).toEqual(expectedOutputTokens({ promptTokens: tokens(8, i * 100) }, 20, 32000));
    }
    // Recomputes after preemption are not prefix-cache queries (vLLM counts them apart).
    expect(e.counters.prefixCacheQueries).toBe(32);
    expect(e.counters.generationTokens).toBe(80);
  });

  it('without prefix caching: no hits, no events, no prefix-cache stats', () => {
    const e = new MockEngine({ blockSize: 4, numGpuBlocks: 16, enablePrefixCaching: false });
    const events: EngineEvent[] = [];
    for (const id of ['a', 'b']) {
      e.addRequest({ requestId: id, promptTokens: tokens(12), maxTokens: 3 }, 0);
      const { outputs } = runToCompletion(e, { onStep: (ev) => events.push(...ev) });
      expect(outputs.get(id)![0].cachedTokens).toBe(0);
    }
    expect(events).toEqual([]);
    expect(e.cachedBlocks).toBe(0);
    expect(e.counters.prefixCacheQueries).toBe(0);
    expect(e.counters.promptTokens).toBe(24);
  });

  it('rejects input it could never serve', () => {
    const e = new MockEngine({ blockSize: 16, numGpuBlocks: 4, maxModelLen: 100 });
    expect(() => e.addRequest({ requestId: 'x', promptTokens: [], maxTokens: 1 }, 0)).toThrow(EngineInputError);
    expect(() => e.addRequest({ requestId: 'x', promptTokens: tokens(90), maxTokens: 20 }, 0)).toThrow(/maximum context length is 100/);
    expect(() => e.addRequest({ requestId: 'x', promptTokens: tokens(80), maxTokens: 1 }, 0)).toThrow(/needs 5 KV blocks/);
    expect(() => e.addRequest({ requestId: 'x', promptTokens: [1.5], maxTokens: 1 }, 0)).toThrow(EngineInputError);
    expect(() => e.addRequest({ requestId: 'x', promptTokens: [1], maxTokens: 0 }, 0)).toThrow(EngineInputError);
    e.addRequest({ requestId: 'x', promptTokens: [1], maxTokens: 1 }, 0);
    expect(() => e.addRequest({ requestId: 'x', promptTokens: [1], maxTokens: 1 }, 0)).toThrow(/already/);
    expect(e.abort('x')).toBe(true);
    expect(e.hasWork()).toBe(false);
  });

  it('reset is a silent restart: empty cache, zero counters, no events', () => {
    const e = new MockEngine({ blockSize: 4, numGpuBlocks: 16 });
    e.addRequest({ requestId: 'a', promptTokens: tokens(12), maxTokens: 2 }, 0);
    runToCompletion(e);
    expect(e.cachedBlocks).toBeGreaterThan(0);
    e.addRequest({ requestId: 'b', promptTokens: tokens(12), maxTokens: 2 }, 0);
    expect(e.reset()).toEqual(['b']);
    expect(e.cachedBlocks).toBe(0);
    expect(e.counters.prefixCacheQueries).toBe(0);
    expect(e.step(0).events).toEqual([]);
  });

  it('timing models reproduce the published reference points', () => {
    const w = { prefillTokens: 0, prefillAttnTokens2: 0, decodeRequests: 0, decodeContextTokens: 0, kvUsage: 0 };
    const poly = stepDurationMs(DEFAULT_POLYNOMIAL, { ...w, prefillTokens: 1000 });
    expect(poly).toBeCloseTo(4.21e-7 * 1e6 + 15.18 + 16.5, 6);
    expect(stepDurationMs(DEFAULT_POLYNOMIAL, { ...w, decodeRequests: 1, kvUsage: 0.5 })).toBeCloseTo(-25.74 / 4 + 27.005 + 5.74, 6);
    const cold8k = stepDurationMs(DEFAULT_FIRST_PRINCIPLES, { ...w, prefillTokens: 8192, prefillAttnTokens2: 8192 * 8192 });
    expect(cold8k).toBeGreaterThan(300);
    expect(cold8k).toBeLessThan(380);
    const warm = stepDurationMs(DEFAULT_FIRST_PRINCIPLES, { ...w, prefillTokens: 1000, prefillAttnTokens2: 1000 * (2 * 100_000 + 1000) });
    expect(warm).toBeGreaterThan(150);
    expect(warm).toBeLessThan(200);
    const decode = stepDurationMs(DEFAULT_FIRST_PRINCIPLES, { ...w, decodeRequests: 1, decodeContextTokens: 1000 });
    expect(decode).toBeGreaterThan(9);
    expect(decode).toBeLessThan(11);
  });

  it('random workloads: invariants hold, outputs are exact, events replayed into the router index equal the dump', () => {
    const reqArb = fc.record({
      prefix: fc.integer({ min: 0, max: 3 }),
      prefixLen: fc.integer({ min: 0, max: 40 }),
      suffixLen: fc.integer({ min: 1, max: 30 }),
      maxTokens: fc.integer({ min: 1, max: 12 }),
      arriveStep: fc.integer({ min: 0, max: 20 }),
      lora: fc.constantFrom(null, 'a'),
      // Some requests are aborted mid-way (the client went away).
      abortStep: fc.option(fc.integer({ min: 0, max: 40 }), { freq: 4 }),
    });
    const seen = { evictions: 0, preemptions: 0, hits: 0, aborts: 0 };
    fc.assert(
      fc.property(
        fc.record({
          blockSize: fc.constantFrom(2, 4, 8),
          numGpuBlocks: fc.integer({ min: 20, max: 80 }),
          maxNumSeqs: fc.integer({ min: 1, max: 8 }),
          maxNumBatchedTokens: fc.integer({ min: 8, max: 64 }),
        }),
        fc.array(reqArb, { minLength: 1, maxLength: 25 }),
        (cfg: Partial<EngineConfig>, reqs) => {
          const e = new MockEngine({ ...cfg, maxModelLen: 4096 });
          const bs = cfg.blockSize!;
          const prompts = reqs.map((r, i) => [...tokens(r.prefixLen, 1000 * (r.prefix + 1)), ...tokens(r.suffixLen, 100_000 + i * 100)]);
          const idx = new KvIndex({ blockSize: bs });
          idx.addSource(0);
          const engineToSeq = new Map<bigint, bigint>();
          const outputs = new Map<string, RequestOutput[]>();
          const aborted = new Set<string>();
          let t = 0;
          let step = 0;
          let pending = reqs.map((r, i) => ({ ...r, i }));
          while (pending.length > 0 || e.hasWork()) {
            for (const r of pending.filter((p) => p.arriveStep <= step)) {
              try {
                e.addRequest({ requestId: `r${r.i}`, promptTokens: prompts[r.i], maxTokens: r.maxTokens, loraName: r.lora }, t);
              } catch (err) {
                expect(err).toBeInstanceOf(EngineInputError);
                outputs.set(`r${r.i}`, []);
              }
            }
            pending = pending.filter((p) => p.arriveStep > step);
            reqs.forEach((r, i) => {
              if (r.abortStep === step && e.abort(`r${i}`)) aborted.add(`r${i}`);
            });
            const res = e.step(t);
            e.checkInvariants();
            expect(res.scheduledTokens).toBeLessThanOrEqual(cfg.maxNumBatchedTokens!);
            for (const ev of res.events) {
              const applied = idx.apply(0, ev);
              expect(applied.rejected).toBe(0);
              if (ev.kind === 'stored') {
                // The event's tokens chained from the parent's router hash reproduce the blocks' router hashes.
                const parentSeq = ev.parent === null ? null : engineToSeq.get(ev.parent)!;
                expect(parentSeq).not.toBe(undefined);
                const out = new BigUint64Array(ev.engineIds.length);
                hashBlocksInto({
                  tokens: ev.tokens,
                  from: 0,
                  count: ev.tokens.length,
                  blockSize: bs,
                  seed: hashSeed(ev.loraName, ev.cacheSalt),
                  parentSeq,
                  outSeq: out,
                  outOffset: 0,
                });
                expect([...out]).toEqual(ev.routerSeqHashes);
                ev.engineIds.forEach((id, k) => {
                  engineToSeq.set(id, out[k]);
                });
              } else {
                for (const id of ev.engineIds) engineToSeq.delete(id);
              }
            }
            const dump = e.dump();
            expect(new Set(engineToSeq.keys())).toEqual(new Set(dump.map((d) => d.engineId)));
            for (const d of dump) expect(engineToSeq.get(d.engineId)).toBe(d.seqHash);
            expect(idx.cachedBlocks(0)).toBe(dump.length);
            for (const o of res.outputs) {
              const l = outputs.get(o.requestId) ?? [];
              l.push(o);
              outputs.set(o.requestId, l);
            }
            t += res.durationMs;
            step++;
            if (step > 20_000) throw new Error('did not drain');
          }
          let sumCached = 0;
          let sumPrompt = 0;
          reqs.forEach((r, i) => {
            const o = outputs.get(`r${i}`) ?? [];
            if (aborted.has(`r${i}`)) {
              expect(o.some((x) => x.finished)).toBe(false);
              return;
            }
            if (o.length === 0) return; // rejected at admission (too many blocks)
            expect(o.flatMap((x) => x.newTokens)).toEqual(expectedOutputTokens({ promptTokens: prompts[i] }, r.maxTokens, 32000));
            expect(o[o.length - 1].finished).toBe(true);
            const cached = o[0].cachedTokens;
            expect(cached % bs).toBe(0);
            expect(cached).toBeLessThanOrEqual(Math.floor((prompts[i].length - 1) / bs) * bs);
            sumCached += cached;
            sumPrompt += prompts[i].length;
          });
          if (aborted.size === 0) {
            expect(e.counters.prefixCacheHits).toBe(sumCached);
            expect(e.counters.prefixCacheQueries).toBe(sumPrompt);
          }
          expect(e.counters.requestsAborted).toBe(aborted.size);
          expect(e.kvUsage).toBe(0);
          seen.evictions += e.counters.blocksEvicted;
          seen.preemptions += e.counters.preemptions;
          seen.hits += e.counters.prefixCacheHits;
          seen.aborts += aborted.size;
        },
      ),
      { numRuns: 120 },
    );
    // The workloads really exercise eviction, preemption and hits.
    expect(seen.evictions).toBeGreaterThan(0);
    expect(seen.preemptions).toBeGreaterThan(0);
    expect(seen.hits).toBeGreaterThan(0);
    expect(seen.aborts).toBeGreaterThan(0);
  });
});
