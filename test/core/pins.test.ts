/** Pins of stored responses: the pure table (bounded, TTL'd) and the dispatcher's pin filter stage. */
import { describe, expect, it } from 'vitest';
import { type DispatchAttempt, type DispatchEffect, Dispatcher, type DispatchRefusal } from '../../src/core/dispatch/dispatcher.ts';
import { PIN_ENTRY_BYTES, PinTable } from '../../src/core/dispatch/pins.ts';
import { SESSION_ENTRY_BYTES, SessionTable } from '../../src/core/dispatch/sessions.ts';
import { KvRouter } from '../../src/core/router.ts';
import { toks } from '../fixtures/routing.ts';

describe('PinTable', () => {
  it('answers a live pin, forgets it after its TTL, and re-pinning refreshes it', () => {
    const t = new PinTable({ limit: 10, ttlMs: 100 });
    t.pin('r1', 'A', 0);
    expect(t.lookup('r1', 99)).toBe('A');
    expect(t.lookup('r1', 100)).toBeUndefined();
    expect(t.expired).toBe(1);
    t.pin('r2', 'A', 0);
    t.pin('r2', 'B', 50);
    expect(t.lookup('r2', 140)).toBe('B');
  });

  it('is bounded: the oldest pin goes first, and expired pins are dropped on insert', () => {
    const t = new PinTable({ limit: 3, ttlMs: 1000 });
    for (let i = 0; i < 5; i++) t.pin(`r${i}`, 'A', i);
    expect(t.size).toBe(3);
    expect(t.evicted).toBe(2);
    expect(t.lookup('r0', 10)).toBeUndefined();
    expect(t.lookup('r4', 10)).toBe('A');
    t.pin('late', 'B', 2000); // every earlier pin has expired by now
    expect(t.size).toBe(1);
  });

  it('drops the pins of a worker that left; limit 0 pins nothing', () => {
    const t = new PinTable({ limit: 10, ttlMs: 1000 });
    t.pin('a', 'A', 0);
    t.pin('b', 'B', 0);
    expect(t.dropWorker('A')).toBe(1);
    expect(t.lookup('a', 1)).toBeUndefined();
    expect(t.lookup('b', 1)).toBe('B');
    const off = new PinTable({ limit: 0, ttlMs: 1000 });
    off.pin('a', 'A', 0);
    expect(off.lookup('a', 1)).toBeUndefined();
  });
});

describe('Dispatcher: the pin filter', () => {
  const dispatches = (e: DispatchEffect[]) => e.filter((x): x is DispatchAttempt => x.kind === 'dispatch');
  function setup() {
    const router = new KvRouter({ blockSize: 4, seed: 1 });
    const d = new Dispatcher(router, { queueLimit: 8, queueTimeoutMs: 1000, retries: 1, breaker: { threshold: 3, cooldownMs: 1000 } });
    d.addWorker({ id: 'A', mode: 'events', models: ['m'] }, 0);
    d.addWorker({ id: 'B', mode: 'events', models: ['m'] }, 0);
    return d;
  }

  it('a finished answer pins its key to the worker that served it; a request naming the key goes there', () => {
    const d = setup();
    const first = dispatches(d.submit({ requestId: 'r1', model: 'm', tokens: toks(16) }, 0))[0];
    expect(first.pinned).toBe(false);
    d.finish('r1', { outcome: 'ok', pinKey: 'resp_1' }, 1);
    // Load the pinned worker so an unpinned request would go to the other one.
    for (let i = 0; i < 4; i++) dispatches(d.submit({ requestId: `load${i}`, model: 'm', tokens: toks(64, 500 * i), pinKey: 'resp_1' }, 2));
    const next = dispatches(d.submit({ requestId: 'r2', model: 'm', tokens: toks(16, 9000), pinKey: 'resp_1' }, 3))[0];
    expect(next.workerId).toBe(first.workerId);
    expect(next.pinned).toBe(true);
    const free = dispatches(d.submit({ requestId: 'r3', model: 'm', tokens: toks(16, 9100) }, 3))[0];
    expect(free.workerId).not.toBe(first.workerId);
  });

  it('only an ok answer pins; a pinned worker that is unhealthy refuses, one that left voids the pin', () => {
    const d = setup();
    const a = dispatches(d.submit({ requestId: 'x', model: 'm', tokens: toks(8) }, 0))[0];
    d.finish('x', { outcome: 'error', pinKey: 'resp_err' }, 1);
    expect(d.pins.lookup('resp_err', 1)).toBeUndefined();
    const b = dispatches(d.submit({ requestId: 'y', model: 'm', tokens: toks(8, 50) }, 2))[0];
    d.finish('y', { outcome: 'ok', pinKey: 'resp_ok' }, 3);
    d.setHealthy(b.workerId, false, 4);
    const refused = d.submit({ requestId: 'z', model: 'm', tokens: toks(8, 70), pinKey: 'resp_ok' }, 5);
    expect((refused[0] as DispatchRefusal).code).toBe('no_healthy_workers');
    d.removeWorker(b.workerId, 6);
    const anywhere = dispatches(d.submit({ requestId: 'w', model: 'm', tokens: toks(8, 90), pinKey: 'resp_ok' }, 7))[0];
    expect(anywhere.pinned).toBe(false);
    expect(anywhere.workerId).not.toBe(b.workerId);
    expect(a).toBeDefined();
  });

  it('passthroughTarget picks a worker serving the model with the fewest in flight, or names the refusal', () => {
    const d = setup();
    const busy = dispatches(d.submit({ requestId: 'busy', model: 'm', tokens: toks(8) }, 0))[0];
    const t = d.passthroughTarget('m', 1);
    expect('workerId' in t && t.workerId).not.toBe(busy.workerId);
    expect(d.passthroughTarget('other', 1)).toMatchObject({ code: 'model_not_found' });
    expect('workerId' in d.passthroughTarget(null, 1)).toBe(true);
  });
});

describe('byte budgets of the pin and session tables', () => {
  it('pins: a flood of distinct long keys never exceeds maxBytes; the oldest go first; an oversized key is not pinned', () => {
    const maxBytes = 64 * 1024;
    const t = new PinTable({ limit: 1_000_000, ttlMs: 1e9, maxBytes });
    for (let i = 0; i < 5_000; i++) {
      t.pin(`resp_${i}_${'k'.repeat(i % 500)}`, 'A', i);
      expect(t.bytes).toBeLessThanOrEqual(maxBytes);
    }
    expect(t.evicted).toBeGreaterThan(4_000);
    const last = `resp_4999_${'k'.repeat(4999 % 500)}`;
    expect(t.lookup(last, 5_000)).toBe('A');
    expect(t.lookup('resp_0_', 5_000)).toBeUndefined();
    // The estimate: overhead + 16 + 2 per character, summed over what is kept; emptied, it is 0 again.
    const one = new PinTable({ limit: 10, ttlMs: 1e9, maxBytes });
    one.pin('abc', 'A', 0);
    expect(one.bytes).toBe(PIN_ENTRY_BYTES + 16 + 6);
    one.dropWorker('A');
    expect(one.bytes).toBe(0);
    one.pin('x'.repeat(40_000), 'A', 0); // 80 KB of key > the whole budget
    expect(one.size).toBe(0);
  });

  it('sessions: a flood of distinct ids never exceeds maxBytes; least recently used go first; expiry frees bytes', () => {
    const maxBytes = 32 * 1024;
    const t = new SessionTable(1_000, 1_000_000, maxBytes);
    t.set('keep', 'w0', 0);
    for (let i = 0; i < 5_000; i++) {
      t.set(`session-${i}-${'s'.repeat(i % 300)}`, 'w1', 0);
      if (i % 10 === 0) t.set('keep', 'w0', 0); // served often (each request records its session): stays
      expect(t.bytes).toBeLessThanOrEqual(maxBytes);
    }
    expect(t.evicted).toBeGreaterThan(4_000);
    expect(t.get('keep', 0)).toBe('w0');
    t.sweep(2_000);
    expect(t.size).toBe(0);
    expect(t.bytes).toBe(0);
    t.set('ab', 'w0', 0);
    expect(t.bytes).toBe(SESSION_ENTRY_BYTES + 16 + 4);
  });
});
