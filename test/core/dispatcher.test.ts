import { describe, expect, it } from 'vitest';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { type DispatchAttempt, type DispatchEffect, Dispatcher, type DispatchRefusal } from '../../src/core/dispatch/dispatcher.ts';
import { KvRouter } from '../../src/core/router.ts';
import { storedEvent, toks } from '../fixtures/routing.ts';

const BS = 4;

function setup(opts: Partial<ConstructorParameters<typeof Dispatcher>[1]> = {}, busyPrefill?: number) {
  const router = new KvRouter({ blockSize: BS, seed: 1, busy: busyPrefill === undefined ? {} : { activePrefillTokens: busyPrefill } });
  const d = new Dispatcher(router, {
    queueLimit: 8,
    queueTimeoutMs: 1000,
    retries: 2,
    breaker: { threshold: 3, cooldownMs: 1500 },
    ...opts,
  });
  return { router, d };
}

const dispatches = (e: DispatchEffect[]) => e.filter((x): x is DispatchAttempt => x.kind === 'dispatch');
const rejects = (e: DispatchEffect[]) => e.filter((x): x is DispatchRefusal => x.kind === 'reject');
const only = <T extends DispatchEffect>(e: DispatchEffect[], kind: T['kind']): T => {
  expect(e.map((x) => x.kind)).toEqual([kind]);
  return e[0] as T;
};

describe('Dispatcher: eligibility at the moment of routing, with precise refusals', () => {
  it('names why nothing can serve: no workers, unknown model, unhealthy, breaker open', () => {
    const { d } = setup();
    expect(only<DispatchRefusal>(d.submit({ requestId: 'a', model: 'm', tokens: toks(8) }, 0), 'reject').code).toBe('no_workers');
    d.addWorker({ id: 'w0', mode: 'events', models: ['m'] }, 0);
    expect(only<DispatchRefusal>(d.submit({ requestId: 'b', model: 'other', tokens: toks(8) }, 0), 'reject').code).toBe('model_not_found');
    d.setHealthy('w0', false, 0);
    expect(only<DispatchRefusal>(d.submit({ requestId: 'c', model: 'm', tokens: toks(8) }, 0), 'reject').code).toBe('no_healthy_workers');
    d.setHealthy('w0', true, 0);
    for (let i = 0; i < 3; i++) {
      const a = only<DispatchAttempt>(d.submit({ requestId: `f${i}`, model: 'm', tokens: toks(8, 100 * i) }, 1), 'dispatch');
      d.failed(a.requestId, 'boom', 1);
    }
    expect(d.breakerState('w0', 2)).toBe('open');
    expect(only<DispatchRefusal>(d.submit({ requestId: 'd', model: 'm', tokens: toks(8) }, 2), 'reject').code).toBe('no_healthy_workers');
    expect(d.precheck('m', 2)?.code).toBe('no_healthy_workers');
    expect(d.precheck('m', 2000)).toBeNull(); // past the cooldown: half-open
  });

  it('a half-open breaker lets exactly one trial through a burst, then closes on its success', () => {
    const { d } = setup();
    d.addWorker({ id: 'A', mode: 'events', models: ['m'] }, 0);
    d.addWorker({ id: 'B', mode: 'events', models: ['m'] }, 0);
    // Open A's breaker: three failures in a row (each retried onto B, which answers).
    let failures = 0;
    for (let i = 0; failures < 3; i++) {
      const a = dispatches(d.submit({ requestId: `warm${i}`, model: 'm', tokens: toks(8, 1000 * i) }, 0))[0];
      if (a.workerId === 'A') {
        failures++;
        const next = dispatches(d.failed(a.requestId, 'A answered 500', 0));
        expect(next[0].workerId).toBe('B');
        d.finish(next[0].requestId, { outcome: 'ok' }, 0);
      } else d.finish(a.requestId, { outcome: 'ok' }, 0);
    }
    expect(d.breakerState('A', 10)).toBe('open');
    for (let burst = 0; burst < 3; burst++) {
      const now = 2000 + burst * 2000;
      const attempts = Array.from(
        { length: 24 },
        (_, i) => dispatches(d.submit({ requestId: `b${burst}-${i}`, model: 'm', tokens: toks(64, 10_000 * i) }, now))[0],
      );
      const toA = attempts.filter((a) => a.workerId === 'A');
      expect(toA).toHaveLength(1);
      expect(toA[0].trial).toBe(true);
      // The trial fails again: A opens for another cooldown; everyone else was on B.
      const retried = dispatches(d.failed(toA[0].requestId, 'still 500', now));
      expect(retried[0].workerId).toBe('B');
      for (const a of [...attempts.filter((x) => x.workerId === 'B'), retried[0]]) d.finish(a.requestId, { outcome: 'ok' }, now);
      expect(d.breakerState('A', now + 1)).toBe('open');
    }
    // A recovers: with B gone the next request is A's trial; its success closes the breaker.
    d.removeWorker('B', 9000);
    const trial = only<DispatchAttempt>(d.submit({ requestId: 'ok-trial', model: 'm', tokens: toks(8, 7) }, 9000), 'dispatch');
    expect([trial.workerId, trial.trial]).toEqual(['A', true]);
    d.finish(trial.requestId, { outcome: 'ok' }, 9000);
    expect(d.breakerState('A', 9001)).toBe('closed');
  });

  it('a trial whose client left gives the trial back (half-open, another request may try)', () => {
    const { d } = setup({ breaker: { threshold: 1, cooldownMs: 100 } });
    d.addWorker({ id: 'A', mode: 'events', models: ['m'] }, 0);
    const a = dispatches(d.submit({ requestId: 'x', model: 'm', tokens: toks(8) }, 0))[0];
    expect(rejects(d.failed(a.requestId, 'boom', 0))[0].code).toBe('no_healthy_workers');
    const t = dispatches(d.submit({ requestId: 'y', model: 'm', tokens: toks(8) }, 200))[0];
    expect(t.trial).toBe(true);
    expect(rejects(d.submit({ requestId: 'z', model: 'm', tokens: toks(8) }, 200))[0].code).toBe('no_healthy_workers');
    d.cancel('y', 201);
    expect(dispatches(d.submit({ requestId: 'z2', model: 'm', tokens: toks(8) }, 202))[0].trial).toBe(true);
  });
});

describe('Dispatcher: queue', () => {
  it('queues when every source is busy, and routes in FIFO order when load frees up', () => {
    const { d } = setup({}, 0);
    d.addWorker({ id: 'w0', mode: 'events', models: ['m'] }, 0);
    const first = only<DispatchAttempt>(d.submit({ requestId: 'a', model: 'm', tokens: toks(16) }, 0), 'dispatch');
    expect(d.submit({ requestId: 'b', model: 'm', tokens: toks(16, 100) }, 1)).toEqual([]);
    expect(d.submit({ requestId: 'c', model: 'm', tokens: toks(16, 200) }, 2)).toEqual([]);
    expect(d.queueLength).toBe(2);
    const next = d.firstToken(first.requestId, 10); // a's prefill done: the worker is no longer busy
    expect(dispatches(next).map((x) => x.requestId)).toEqual(['b']);
    expect(dispatches(next)[0].queuedMs).toBe(9);
    expect(d.queueLength).toBe(1);
  });

  it('a queued request is never sent to a worker that left while it waited', () => {
    const { d } = setup({}, 0);
    d.addWorker({ id: 'gone', mode: 'events', models: ['m'] }, 0);
    const a = only<DispatchAttempt>(d.submit({ requestId: 'a', model: 'm', tokens: toks(16) }, 0), 'dispatch');
    expect(a.workerId).toBe('gone');
    expect(d.submit({ requestId: 'b', model: 'm', tokens: toks(16, 100) }, 1)).toEqual([]);
    d.addWorker({ id: 'busy2', mode: 'events', models: ['other'] }, 2); // serves another model: no help for b
    expect(d.queueLength).toBe(1);
    // The only worker for "m" leaves: b is refused with the real reason, not "all workers stayed busy".
    const out = d.removeWorker('gone', 3) ?? [];
    expect(rejects(out).map((r) => [r.requestId, r.code])).toEqual([['b', 'model_not_found']]);
    // A worker ejected while requests wait: they are refused for that reason at once.
    d.addWorker({ id: 'w1', mode: 'events', models: ['m'] }, 4);
    const held = only<DispatchAttempt>(d.submit({ requestId: 'c', model: 'm', tokens: toks(16, 300) }, 5), 'dispatch');
    expect(held.workerId).toBe('w1');
    expect(d.submit({ requestId: 'e', model: 'm', tokens: toks(16, 400) }, 6)).toEqual([]);
    expect(rejects(d.setHealthy('w1', false, 7)).map((r) => [r.requestId, r.code])).toEqual([['e', 'no_healthy_workers']]);
    // Re-evaluated, not remembered: a request queued behind busy w1 goes to the worker that joins meanwhile.
    d.setHealthy('w1', true, 8);
    expect(d.submit({ requestId: 'f', model: 'm', tokens: toks(16, 500) }, 9)).toEqual([]);
    const moved = dispatches(d.addWorker({ id: 'w2', mode: 'events', models: ['m'] }, 10));
    expect(moved.map((x) => [x.requestId, x.workerId])).toEqual([['f', 'w2']]);
  });

  it('queue_full beyond the limit, queue_timeout at the deadline (tick), and a client leaving the queue', () => {
    const { d } = setup({ queueLimit: 1, queueTimeoutMs: 100 }, 0);
    d.addWorker({ id: 'w0', mode: 'events', models: ['m'] }, 0);
    only<DispatchAttempt>(d.submit({ requestId: 'a', model: 'm', tokens: toks(16) }, 0), 'dispatch');
    expect(d.submit({ requestId: 'b', model: 'm', tokens: toks(16, 100) }, 0)).toEqual([]);
    expect(only<DispatchRefusal>(d.submit({ requestId: 'c', model: 'm', tokens: toks(16, 200) }, 0), 'reject').code).toBe('queue_full');
    expect(d.nextWakeAt(1)).toBe(0); // the first sweep is due; then the queue deadline
    d.tick(1);
    expect(d.nextWakeAt(2)).toBe(100);
    const t = rejects(d.tick(100));
    expect(t.map((r) => [r.requestId, r.code, r.queuedMs])).toEqual([['b', 'queue_timeout', 100]]);
    expect(d.submit({ requestId: 'd', model: 'm', tokens: toks(16, 300) }, 101)).toEqual([]);
    expect(d.cancel('d', 102)).toEqual([]);
    expect(d.queueLength).toBe(0);
    expect(d.pending).toBe(1);
  });

  it('close() refuses everything queued', () => {
    const { d } = setup({}, 0);
    d.addWorker({ id: 'w0', mode: 'events', models: ['m'] }, 0);
    d.submit({ requestId: 'a', model: 'm', tokens: toks(16) }, 0);
    d.submit({ requestId: 'b', model: 'm', tokens: toks(16, 9) }, 0);
    expect(rejects(d.close(5)).map((r) => [r.requestId, r.code])).toEqual([['b', 'closed']]);
    expect(rejects(d.submit({ requestId: 'c', model: 'm', tokens: toks(16) }, 6))[0].code).toBe('closed');
  });
});

describe('Dispatcher: retries and accounting', () => {
  it('retries on the next best worker without the failed one, bounded, and the ledger counts the request once', () => {
    const { router, d } = setup({ retries: 1 });
    for (const id of ['w0', 'w1', 'w2']) d.addWorker({ id, mode: 'events', models: ['m'] }, 0);
    const tokens = toks(32);
    router.applyEvents('w1', [storedEvent(tokens, 8, 1n, BS)]);
    const a = only<DispatchAttempt>(d.submit({ requestId: 'r', model: 'm', tokens }, 0), 'dispatch');
    expect(a.workerId).toBe('w1'); // it holds the prefix
    const b = only<DispatchAttempt>(d.failed('r', 'w1 answered 503', 1), 'dispatch');
    expect(b.workerId).not.toBe('w1');
    expect(b.attempt).toBe(1);
    expect(b.previousError).toBe('w1 answered 503');
    const end = only<DispatchRefusal>(d.failed('r', `${b.workerId} refused`, 2), 'reject');
    expect(end.code).toBe('upstream_failed');
    expect(end.attempts).toBe(2);
    expect(router.ledger.view().requests).toBe(0); // nothing was served
    const c = only<DispatchAttempt>(d.submit({ requestId: 's', model: 'm', tokens }, 3), 'dispatch');
    const c2 = only<DispatchAttempt>(d.failed('s', 'x', 3), 'dispatch');
    const fin = d.finish(c2.requestId, { outcome: 'ok', cachedTokens: 0 }, 4);
    expect(fin.map((e) => e.kind)).toEqual(['finished']);
    expect(c.attempt).toBe(0);
    expect(router.ledger.view().requests).toBe(1);
    expect(d.pending).toBe(0);
  });

  it('every eligible source already failed: upstream_failed with the last error', () => {
    const { d } = setup({ retries: 5 });
    d.addWorker({ id: 'w0', mode: 'events', models: ['m'] }, 0);
    d.addWorker({ id: 'w1', mode: 'events', models: ['m'] }, 0);
    const a = only<DispatchAttempt>(d.submit({ requestId: 'r', model: 'm', tokens: toks(8) }, 0), 'dispatch');
    const b = only<DispatchAttempt>(d.failed('r', 'first', 0), 'dispatch');
    expect(b.workerId).not.toBe(a.workerId);
    const end = only<DispatchRefusal>(d.failed('r', 'second', 0), 'reject');
    expect(end.code).toBe('upstream_failed');
    expect(end.message).toContain('second');
  });

  it('a stream that breaks counts against the breaker; an engine 4xx does not', () => {
    const { d } = setup({ breaker: { threshold: 2, cooldownMs: 1000 } });
    d.addWorker({ id: 'w0', mode: 'events', models: ['m'] }, 0);
    for (let i = 0; i < 3; i++) {
      const a = only<DispatchAttempt>(d.submit({ requestId: `q${i}`, model: 'm', tokens: toks(8) }, 0), 'dispatch');
      d.finish(a.requestId, { outcome: 'error' }, 0);
    }
    expect(d.breakerState('w0', 0)).toBe('closed');
    for (let i = 0; i < 2; i++) {
      const a = only<DispatchAttempt>(d.submit({ requestId: `s${i}`, model: 'm', tokens: toks(8) }, 0), 'dispatch');
      d.finish(a.requestId, { outcome: 'error', workerFault: true }, 0);
    }
    expect(d.breakerState('w0', 0)).toBe('open');
  });

  it('capacity learned from the engine never overrides a configured blocks=', () => {
    const { router, d } = setup();
    d.addWorker({ id: 'fixed', mode: 'events', capacityBlocks: 100 }, 0);
    d.addWorker({ id: 'learned', mode: 'events', dpRanks: 2 }, 0);
    expect(d.learnCapacity('fixed', 999)).toBe(false);
    expect(d.learnCapacity('learned', 500)).toBe(true);
    const cap = Object.fromEntries(router.state().sources.map((s) => [s.source, s.capacityBlocks]));
    expect(cap).toEqual({ fixed: 100, learned: 500, 'learned#1': 500 });
  });

  it('a duplicate request id is refused, not routed twice', () => {
    const { d } = setup();
    d.addWorker({ id: 'w0', mode: 'events' }, 0);
    only<DispatchAttempt>(d.submit({ requestId: 'r', model: 'm', tokens: toks(8) }, 0), 'dispatch');
    expect(only<DispatchRefusal>(d.submit({ requestId: 'r', model: 'm', tokens: toks(8) }, 0), 'reject').code).toBe('duplicate_request');
  });
});

describe('Dispatcher.servedElsewhere: a gateway proxy served the attempt on a fallback', () => {
  it('counts the request where it ran: the pick is taken back (its breaker told), the served worker carries it', () => {
    const { router, d } = setup();
    for (const id of ['w0', 'w1', 'w2']) d.addWorker({ id, mode: 'events', models: ['m'] }, 0);
    const tokens = toks(32);
    router.applyEvents('w1', [storedEvent(tokens, 8, 1n, BS)]);
    const a = only<DispatchAttempt>(d.submit({ requestId: 'r', model: 'm', tokens }, 0), 'dispatch');
    expect(a.workerId).toBe('w1');
    const moved = only<DispatchAttempt>(d.servedElsewhere('r', 'w2', 'proxy fell back', 1), 'dispatch');
    expect(moved.workerId).toBe('w2');
    expect(moved.decision.overlapBlocks).toBe(0); // w2 holds none of it: the ledger counts what really happened
    expect(d.worker('w1')?.inFlight).toBe(0);
    expect(d.worker('w2')?.inFlight).toBe(1);
    expect(router.ledger.bySource.get('w1')?.requests ?? 0).toBe(0);
    expect(router.ledger.bySource.get('w2')?.requests).toBe(1);
    d.finish('r', { outcome: 'ok', cachedTokens: 0 }, 2);
    expect(router.ledger.view().requests).toBe(1);
    expect(d.pending).toBe(0);
  });

  it('the same worker, an unknown request or a worker not in the fleet: nothing moves, nothing leaks', () => {
    const { d } = setup();
    d.addWorker({ id: 'w0', mode: 'events', models: ['m'] }, 0);
    d.addWorker({ id: 'w1', mode: 'events', models: ['m'] }, 0);
    const a = only<DispatchAttempt>(d.submit({ requestId: 'r', model: 'm', tokens: toks(8) }, 0), 'dispatch');
    expect(d.servedElsewhere('r', a.workerId, 'same', 1)).toEqual([]);
    expect(d.servedElsewhere('nope', 'w0', 'unknown', 1)).toEqual([]);
    const gone = only<DispatchRefusal>(d.servedElsewhere('r', 'ghost', 'not a worker', 1), 'reject');
    expect(gone.code).toBe('upstream_failed');
    expect(d.pending).toBe(0);
    expect(d.worker(a.workerId)?.inFlight).toBe(0);
  });
});

describe('Dispatcher: a request in flight holds its hashes, not its prompt', () => {
  it('lets the token ids go once routed; a retry routes on the same hashes and prompt length', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const { d } = setup();
    d.addWorker({ id: 'A', mode: 'approx', models: ['m'] }, 0);
    d.addWorker({ id: 'B', mode: 'approx', models: ['m'] }, 0);
    let ref: WeakRef<number[]> | undefined;
    const first = (() => {
      const tokens = Array.from({ length: 66 }, (_, i) => i + 1);
      ref = new WeakRef(tokens);
      return dispatches(d.submit({ requestId: 'r', model: 'm', tokens }, 0))[0];
    })();
    // A WeakRef keeps its target until the job that made it has ended.
    await new Promise((r) => setTimeout(r, 0));
    gc();
    expect(ref?.deref()).toBeUndefined();
    const next = dispatches(d.failed('r', 'boom', 1))[0];
    expect(next.workerId).not.toBe(first.workerId);
    expect(next.decision.seqHashes).toEqual(first.decision.seqHashes);
    expect(next.decision.promptTokens).toBe(66);
    expect(next.decision.islBlocks).toBe(first.decision.islBlocks);
  });
});
