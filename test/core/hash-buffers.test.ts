import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { Dispatcher } from '../../src/core/dispatch/dispatcher.ts';
import { HashBuffers } from '../../src/core/hash-buffers.ts';
import { computeSeqHashes, hashSeed } from '../../src/core/hashing.ts';
import { KvRouter } from '../../src/core/router.ts';
import type { RouteDecision } from '../../src/core/types.ts';
import { routed, toks } from '../fixtures/routing.ts';

// Ownership of route()'s recycled hash buffers (src/core/hash-buffers.ts): a buffer goes back to the free list only
// when the caller has released it and the active load (in flight, then the overlay's ring) no longer holds it.

const BS = 4;

function fleet(opts: Partial<ConstructorParameters<typeof KvRouter>[0]> = {}) {
  const r = new KvRouter({ blockSize: BS, seed: 1, ...opts });
  for (let i = 0; i < 3; i++) r.addSource({ workerId: `w${i}`, dpRank: 0 });
  return r;
}

const route = (r: KvRouter, id: string, tokens: number[], now: number): RouteDecision => routed(r.route({ requestId: id, tokens }, now));
const expected = (tokens: number[]) => computeSeqHashes(tokens, BS, hashSeed());

describe('HashBuffers: holds', () => {
  it('a buffer is free again only after the caller and every other holder let go, once each', () => {
    const b = new HashBuffers();
    const h = b.take(100);
    expect(h.length).toBe(100);
    b.retain(h);
    b.releaseCaller(h);
    b.releaseCaller(h); // a second release of the same hold does nothing
    expect(b.isHeld(h)).toBe(true);
    expect(b.take(100).buffer).not.toBe(h.buffer);
    b.drop(h);
    expect(b.isHeld(h)).toBe(false);
    const again = b.take(120); // same capacity class (128 blocks)
    expect(again.buffer).toBe(h.buffer);
    expect(again).not.toBe(h); // a new view object every time
  });

  it('ignores arrays it did not make, and keeps no more free bytes than its bound', () => {
    const b = new HashBuffers(2 * 64 * 8);
    const foreign = new BigUint64Array(8);
    b.retain(foreign);
    b.drop(foreign);
    b.releaseCaller(foreign);
    expect(b.isHeld(foreign)).toBe(false);
    const hs = [b.take(10), b.take(10), b.take(10)];
    for (const h of hs) b.releaseCaller(h);
    const buffers = new Set(hs.map((h) => h.buffer));
    const next = [b.take(10), b.take(10), b.take(10)];
    expect(next.filter((h) => buffers.has(h.buffer)).length).toBe(2);
  });
});

describe('KvRouter: route() reuses hash memory only when nobody holds it', () => {
  it('in flight and in the overlay ring the hashes stay intact; after both and the caller let go they are reused', () => {
    const r = fleet({ overlayGraceMs: 100 });
    const a = toks(40, 1);
    const da = route(r, 'a', a, 0);
    r.releaseHashes(da.seqHashes); // the caller is done; the active load still holds them
    const db = route(r, 'b', toks(40, 500), 1);
    expect(db.seqHashes.buffer).not.toBe(da.seqHashes.buffer);
    r.releaseHashes(db.seqHashes);
    r.finish('a', { cachedTokens: 0 }, 2); // into the overlay's ring (grace 100 ms)
    const dc = route(r, 'c', toks(40, 900), 3);
    expect(dc.seqHashes.buffer).not.toBe(da.seqHashes.buffer);
    expect(da.seqHashes).toEqual(expected(a));
    r.sweep(200); // the ring entry expires
    const dd = route(r, 'd', toks(40, 1300), 201);
    expect(dd.seqHashes.buffer).toBe(da.seqHashes.buffer);
    expect(dd.seqHashes).toEqual(expected(toks(40, 1300)));
  });

  it('without releaseHashes a buffer is never reused, however long ago its request finished', () => {
    const r = fleet({ overlay: false });
    const da = route(r, 'a', toks(40, 1), 0);
    r.finish('a', { cachedTokens: 0 }, 1);
    r.sweep(10_000);
    for (let i = 0; i < 5; i++) {
      const d = route(r, `n${i}`, toks(40, 100 * (i + 2)), 2 + i);
      expect(d.seqHashes.buffer).not.toBe(da.seqHashes.buffer);
    }
    expect(da.seqHashes).toEqual(expected(toks(40, 1)));
  });

  it('a released buffer routed again by its caller (a retry, a P/D leg) is held by each active entry', () => {
    const r = fleet({ overlay: false });
    const a = toks(40, 1);
    const da = route(r, 'a', a, 0);
    const leg = routed(r.route({ requestId: 'a/leg', seqHashes: da.seqHashes, promptTokens: a.length }, 0));
    r.finish('a', { cachedTokens: 0 }, 1);
    r.releaseHashes(da.seqHashes);
    const other = route(r, 'x', toks(40, 700), 2);
    expect(other.seqHashes.buffer).not.toBe(da.seqHashes.buffer); // the leg still holds it
    expect(leg.seqHashes).toEqual(expected(a));
    r.finish('a/leg', { cachedTokens: 0 }, 3);
    expect(route(r, 'y', toks(40, 1100), 4).seqHashes.buffer).toBe(da.seqHashes.buffer);
  });

  it('routes exactly as a router that never reuses, and every decision carries its own prompt hashes', () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.integer({ min: 0, max: 5 }), fc.integer({ min: 1, max: 60 }), fc.boolean()), { minLength: 10, maxLength: 60 }),
        (steps) => {
          const reusing = fleet({ overlayGraceMs: 5 });
          const plain = fleet({ overlayGraceMs: 5 });
          const live: { id: string; d: RouteDecision; tokens: number[] }[] = [];
          steps.forEach(([family, len, finish], i) => {
            const tokens = toks(len, family * 1000);
            tokens.push(i); // a fresh last token
            const a = route(reusing, `r${i}`, tokens, i);
            const b = route(plain, `r${i}`, tokens, i);
            expect(a.sourceKey).toBe(b.sourceKey);
            expect(a.candidates).toEqual(b.candidates);
            expect(a.seqHashes).toEqual(expected(tokens));
            live.push({ id: `r${i}`, d: a, tokens });
            if (finish && live.length > 2) {
              const done = live.shift()!;
              expect(done.d.seqHashes).toEqual(expected(done.tokens)); // intact until the caller lets go
              reusing.finish(done.id, { cachedTokens: 0 }, i);
              plain.finish(done.id, { cachedTokens: 0 }, i);
              reusing.releaseHashes(done.d.seqHashes);
              reusing.sweep(i);
              plain.sweep(i);
            }
          });
          for (const l of live) expect(l.d.seqHashes).toEqual(expected(l.tokens));
        },
      ),
      { numRuns: 60 },
    );
  });

  it('the dispatcher gives its hold back when the request finishes, not before', () => {
    const router = new KvRouter({ blockSize: BS, seed: 1, overlay: false });
    const d = new Dispatcher(router, { queueLimit: 8, queueTimeoutMs: 1000, retries: 2, breaker: { threshold: 3, cooldownMs: 1500 } });
    d.addWorker({ id: 'w0', mode: 'events', models: ['m'] }, 0);
    d.addWorker({ id: 'w1', mode: 'events', models: ['m'] }, 0);
    const first = d.submit({ requestId: 'a', model: 'm', tokens: toks(40, 1) }, 0).find((e) => e.kind === 'dispatch');
    if (first?.kind !== 'dispatch') throw new Error('not dispatched');
    const hashes = first.decision.seqHashes;
    // A failed attempt is retried with the same hashes: they must not be reused in between.
    const retry = d.failed('a', 'boom', 1).find((e) => e.kind === 'dispatch');
    if (retry?.kind !== 'dispatch') throw new Error('not retried');
    expect(retry.decision.seqHashes.buffer).toBe(hashes.buffer);
    const other = d.submit({ requestId: 'b', model: 'm', tokens: toks(40, 500) }, 2).find((e) => e.kind === 'dispatch');
    if (other?.kind !== 'dispatch') throw new Error('not dispatched');
    expect(other.decision.seqHashes.buffer).not.toBe(hashes.buffer);
    expect(hashes).toEqual(expected(toks(40, 1)));
    d.finish('a', { outcome: 'ok' }, 3);
    const next = d.submit({ requestId: 'c', model: 'm', tokens: toks(40, 900) }, 4).find((e) => e.kind === 'dispatch');
    if (next?.kind !== 'dispatch') throw new Error('not dispatched');
    expect(next.decision.seqHashes.buffer).toBe(hashes.buffer);
  });

  it('a request refused or cancelled while queued gives its hold back too (queue timeout, queue full, client left)', () => {
    const router = new KvRouter({ blockSize: BS, seed: 1, overlay: false, busy: { activePrefillTokens: 0 } });
    const released: BigUint64Array[] = [];
    const release = router.releaseHashes.bind(router);
    router.releaseHashes = (h) => {
      released.push(h);
      release(h);
    };
    const d = new Dispatcher(router, { queueLimit: 2, queueTimeoutMs: 100, retries: 2, breaker: { threshold: 3, cooldownMs: 1500 } });
    d.addWorker({ id: 'w0', mode: 'events', models: ['m'] }, 0);
    expect(d.submit({ requestId: 'a', model: 'm', tokens: toks(40, 1) }, 0).map((e) => e.kind)).toEqual(['dispatch']);
    // w0 is busy: b and c wait, d finds the queue full.
    expect(d.submit({ requestId: 'b', model: 'm', tokens: toks(40, 100) }, 0)).toEqual([]);
    expect(d.submit({ requestId: 'c', model: 'm', tokens: toks(40, 200) }, 0)).toEqual([]);
    expect(d.submit({ requestId: 'd', model: 'm', tokens: toks(40, 300) }, 0).map((e) => e.kind)).toEqual(['reject']);
    expect(released.map((h) => [...h])).toEqual([[...expected(toks(40, 300))]]);
    d.cancel('c', 1);
    expect(released.slice(1).map((h) => [...h])).toEqual([[...expected(toks(40, 200))]]);
    d.tick(1); // the first sweep
    expect(d.tick(100).map((e) => (e.kind === 'reject' ? e.code : e.kind))).toEqual(['queue_timeout']);
    expect(released.slice(2).map((h) => [...h])).toEqual([[...expected(toks(40, 100))]]);
  });
});
