import { describe, expect, it } from 'vitest';
import { TokenBudgets } from '../../src/core/dispatch/budget.ts';
import {
  type DispatchAttempt,
  type DispatchEffect,
  Dispatcher,
  type DispatchRefusal,
  type DispatchOptions,
} from '../../src/core/dispatch/dispatcher.ts';
import { FlowQueue } from '../../src/core/dispatch/flow.ts';
import { KvRouter } from '../../src/core/router.ts';
import { toks } from '../fixtures/routing.ts';

const BS = 4;
const dispatches = (e: DispatchEffect[]) => e.filter((x): x is DispatchAttempt => x.kind === 'dispatch');
const rejects = (e: DispatchEffect[]) => e.filter((x): x is DispatchRefusal => x.kind === 'reject');

function queueOrder(q: FlowQueue): string[] {
  return q.inOrder().map((i) => i.requestId);
}

function item(q: FlowQueue, id: string, tenant: string, priority = 0, cost = 100, deadline?: number) {
  return { requestId: id, tenant, priority, cost, enqueuedAt: 0, expiresAt: 1e9, seq: q.nextSeq(), ...(deadline ? { deadline } : {}) };
}

describe('FlowQueue', () => {
  it('fair queuing: a tenant that arrives behind a flood is served next, not after it', () => {
    const q = new FlowQueue();
    for (let i = 0; i < 10; i++) q.push(item(q, `a${i}`, 'A'));
    q.push(item(q, 'b0', 'B'));
    q.push(item(q, 'b1', 'B'));
    expect(queueOrder(q).slice(0, 4)).toEqual(['a0', 'b0', 'a1', 'b1']);
    const fifo = new FlowQueue({ order: 'fifo' });
    for (let i = 0; i < 10; i++) fifo.push(item(fifo, `a${i}`, 'A'));
    fifo.push(item(fifo, 'b0', 'B'));
    expect(queueOrder(fifo).indexOf('b0')).toBe(10);
  });

  it('weights: a tenant of weight 2 gets two requests for every one of weight 1', () => {
    const q = new FlowQueue({ weights: { gold: 2 } });
    for (let i = 0; i < 6; i++) q.push(item(q, `g${i}`, 'gold'));
    for (let i = 0; i < 6; i++) q.push(item(q, `s${i}`, 'silver'));
    const first6 = queueOrder(q).slice(0, 6);
    expect(first6.filter((x) => x.startsWith('g'))).toHaveLength(4);
  });

  it('cost is prompt tokens: many small requests of one tenant share with one large request of another', () => {
    const q = new FlowQueue();
    q.push(item(q, 'big0', 'A', 0, 8000));
    q.push(item(q, 'big1', 'A', 0, 8000));
    for (let i = 0; i < 8; i++) q.push(item(q, `small${i}`, 'B', 0, 1000));
    const order = queueOrder(q);
    expect(order.indexOf('big1')).toBeGreaterThan(order.indexOf('small6'));
  });

  it('bands by priority are served strictly in order; EDF orders a tenant by deadline', () => {
    const q = new FlowQueue({
      bands: [
        { name: 'interactive', maxPriority: 0, order: 'edf' },
        { name: 'batch', maxPriority: 100 },
      ],
    });
    q.push(item(q, 'batch-old', 'A', 50));
    q.push(item(q, 'late', 'B', 0, 100, 900));
    q.push(item(q, 'soon', 'B', 0, 100, 500));
    expect(queueOrder(q)[2]).toBe('batch-old');
    // EDF only reorders a tenant's requests whose fair tags tie; give B two tied items by pushing a retry.
    const e = new FlowQueue({ bands: [{ name: 'i', maxPriority: 0, order: 'edf' }] });
    e.push(item(e, 'late', 'B', 0, 100, 900), true);
    e.push(item(e, 'soon', 'B', 0, 100, 500), true);
    expect(queueOrder(e)).toEqual(['soon', 'late']);
    expect(q.bandOf(1000)).toBe(2); // past every band: the catch-all
    expect(q.bands.map((b) => b.name)).toEqual(['interactive', 'batch', 'rest']);
  });

  it('refuses a band defined twice', () => {
    expect(
      () =>
        new FlowQueue({
          bands: [
            { name: 'x', maxPriority: 0 },
            { name: 'x', maxPriority: 1 },
          ],
        }),
    ).toThrow(/twice/);
  });
});

describe('TokenBudgets', () => {
  it('admits while the balance is positive, then says when to come back; refills at budget per minute', () => {
    const b = new TokenBudgets({ acme: 6000, '*': 0 });
    expect(b.admit('other', 1e9, 0).ok).toBe(true); // unlimited
    expect(b.admit('acme', 5000, 0).ok).toBe(true);
    expect(b.admit('acme', 5000, 0).ok).toBe(true); // balance 1000 > 0: admitted, now -4000
    const r = b.admit('acme', 10, 0);
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.retryAfterMs).toBe(Math.ceil((4001 * 60_000) / 6000));
    expect(b.admit('acme', 10, 41_000).ok).toBe(true); // refilled 4100 tokens
    b.charge('acme', 3000, 41_000);
    expect(b.balance('acme', 41_000)).toBeCloseTo(100 - 10 - 3000, 5);
  });
});

function fleet(options: Partial<DispatchOptions> = {}, busyPrefill?: number, workers = ['w0', 'w1']) {
  const router = new KvRouter({ blockSize: BS, seed: 3, busy: busyPrefill === undefined ? {} : { activePrefillTokens: busyPrefill } });
  const d = new Dispatcher(router, {
    queueLimit: 100,
    queueTimeoutMs: 10_000,
    retries: 1,
    breaker: { threshold: 3, cooldownMs: 1000 },
    ...options,
  });
  for (const id of workers) d.addWorker({ id, mode: 'events', models: ['m'] }, 0);
  return { router, d };
}

describe('Dispatcher flow control', () => {
  it('a high-priority request overtakes queued low-priority ones; a sheddable band is refused at once when saturated', () => {
    const { d } = fleet(
      {
        flow: {
          bands: [
            { name: 'hi', maxPriority: 0 },
            { name: 'lo', maxPriority: 10 },
            { name: 'scavenger', maxPriority: 100, sheddable: true },
          ],
        },
      },
      0,
      ['w0'],
    );
    const first = dispatches(d.submit({ requestId: 'running', model: 'm', tokens: toks(16), priority: 5 }, 0))[0];
    for (let i = 0; i < 3; i++)
      expect(d.submit({ requestId: `lo${i}`, model: 'm', tokens: toks(16, 100 * i), priority: 5 }, 1)).toEqual([]);
    expect(d.submit({ requestId: 'hi', model: 'm', tokens: toks(16, 900), priority: 0 }, 2)).toEqual([]);
    const shed = rejects(d.submit({ requestId: 'scav', model: 'm', tokens: toks(16, 800), priority: 50 }, 3));
    expect(shed.map((r) => [r.code, r.band])).toEqual([['shed', 'scavenger']]);
    expect(shed[0].retryAfterMs).toBeGreaterThan(0);
    const next = dispatches(d.firstToken(first.requestId, 10));
    expect(next.map((a) => [a.requestId, a.band])).toEqual([['hi', 'hi']]);
    // Idle fleet: the sheddable band is served like any other.
    const { d: idle } = fleet({ flow: { bands: [{ name: 'scavenger', maxPriority: 100, sheddable: true }] } });
    expect(dispatches(idle.submit({ requestId: 's', model: 'm', tokens: toks(16), priority: 50 }, 0))).toHaveLength(1);
  });

  it('a flooding tenant does not delay another tenant behind its whole backlog', () => {
    const { d } = fleet({}, 0, ['w0']);
    const first = dispatches(d.submit({ requestId: 'x', model: 'm', tokens: toks(16), tenant: 'flood' }, 0))[0];
    for (let i = 0; i < 20; i++) d.submit({ requestId: `f${i}`, model: 'm', tokens: toks(16, 100 + i), tenant: 'flood' }, 1);
    d.submit({ requestId: 'quiet', model: 'm', tokens: toks(16, 999), tenant: 'quiet' }, 2);
    let active = first.requestId;
    const served: string[] = [];
    for (let step = 0; step < 3; step++) {
      const a = dispatches(d.firstToken(active, 10 + step)); // its prefill is done: the worker takes the next one
      d.finish(active, { outcome: 'ok' }, 10 + step);
      expect(a).toHaveLength(1);
      served.push(a[0].requestId);
      active = a[0].requestId;
    }
    expect(served.slice(0, 2)).toContain('quiet');
    expect(d.census().find((c) => c.tenant === 'flood')?.waiting).toBeGreaterThan(15);
  });

  it('per-band TTL: a band with a short TTL times out first', () => {
    const { d } = fleet(
      {
        flow: {
          bands: [
            { name: 'fast', maxPriority: 0, ttlMs: 100 },
            { name: 'slow', maxPriority: 10 },
          ],
        },
      },
      0,
      ['w0'],
    );
    dispatches(d.submit({ requestId: 'busy', model: 'm', tokens: toks(16) }, 0));
    d.submit({ requestId: 'a', model: 'm', tokens: toks(16, 5), priority: 0 }, 0);
    d.submit({ requestId: 'b', model: 'm', tokens: toks(16, 9), priority: 10 }, 0);
    expect(d.nextWakeAt(1)).toBeLessThanOrEqual(100);
    d.tick(1);
    const out = rejects(d.tick(100));
    expect(out.map((r) => [r.requestId, r.code, r.band])).toEqual([['a', 'queue_timeout', 'fast']]);
  });

  it('token budgets refuse an over-budget tenant with Retry-After and leave others alone', () => {
    const { d } = fleet({ tokenBudgets: { heavy: 40 } });
    expect(dispatches(d.submit({ requestId: 'h1', model: 'm', tokens: toks(64), tenant: 'heavy' }, 0))).toHaveLength(1);
    const r = rejects(d.submit({ requestId: 'h2', model: 'm', tokens: toks(16), tenant: 'heavy' }, 1));
    expect(r[0].code).toBe('token_budget_exceeded');
    expect(r[0].retryAfterMs).toBeGreaterThan(0);
    expect(dispatches(d.submit({ requestId: 'l1', model: 'm', tokens: toks(64), tenant: 'light' }, 1))).toHaveLength(1);
  });

  it('TTFT deadlines: once the prefill rate is known, a request that cannot make it is refused early', () => {
    const { d } = fleet({ prefillTokensPerSecond: 1000 }, undefined, ['w0']); // 1 token per ms
    // 64 prompt tokens at 1 token/ms: about 64 ms on an idle worker.
    expect(dispatches(d.submit({ requestId: 'ok', model: 'm', tokens: toks(64), sloTtftMs: 200 }, 0))).toHaveLength(1);
    // Now 64 tokens are queued ahead: a second 64-token request needs ~128 ms; 100 ms cannot be met.
    const r = rejects(d.submit({ requestId: 'late', model: 'm', tokens: toks(64, 500), sloTtftMs: 100 }, 0));
    expect(r.map((x) => x.code)).toEqual(['deadline_unmeetable']);
    expect(d.pending).toBe(1); // taken back: not in flight
    // Learned rates replace the prior: first tokens arriving fast make the same request feasible.
    const { d: learn } = fleet({}, undefined, ['w0']);
    for (let i = 0; i < 4; i++) {
      const a = dispatches(learn.submit({ requestId: `s${i}`, model: 'm', tokens: toks(64, 1000 * i) }, i * 100))[0];
      learn.firstToken(a.requestId, i * 100 + 8); // 64 tokens in 8 ms
      learn.finish(a.requestId, { outcome: 'ok' }, i * 100 + 9);
    }
    expect(dispatches(learn.submit({ requestId: 'fast', model: 'm', tokens: toks(64, 77), sloTtftMs: 20 }, 1000))).toHaveLength(1);
    expect(rejects(learn.submit({ requestId: 'tight', model: 'm', tokens: toks(64, 78), sloTtftMs: 2 }, 1000))[0].code).toBe(
      'deadline_unmeetable',
    );
  });
});

describe('session affinity', () => {
  it('keeps a session on one source through distinct prompts; moves only when that source is unavailable or overloaded', () => {
    const { d } = fleet();
    const first = dispatches(d.submit({ requestId: 's0', model: 'm', tokens: toks(16), sessionId: 'chat-1' }, 0))[0];
    expect(first.session?.outcome).toBe('new');
    d.finish('s0', { outcome: 'ok' }, 1);
    const home = first.decision.sourceKey;
    for (let i = 1; i <= 6; i++) {
      const a = dispatches(d.submit({ requestId: `s${i}`, model: 'm', tokens: toks(16, 1000 * i), sessionId: 'chat-1' }, i * 10))[0];
      expect([a.decision.sourceKey, a.session?.outcome]).toEqual([home, 'kept']);
      d.finish(a.requestId, { outcome: 'ok' }, i * 10 + 1);
    }
    // Overloaded: pile load on the home source (requests restricted to it), then the session moves and says why.
    for (let i = 0; i < 6; i++) {
      dispatches(d.submit({ requestId: `load${i}`, model: 'm', tokens: toks(400, 7000 + 500 * i), subset: new Set([home]) }, 100));
    }
    const moved = dispatches(d.submit({ requestId: 's7', model: 'm', tokens: toks(16, 99), sessionId: 'chat-1' }, 101))[0];
    expect(moved.decision.sourceKey).not.toBe(home);
    expect([moved.session?.outcome, moved.session?.reason]).toEqual(['moved', 'overloaded']);
    // Unavailable: a session whose source is ejected moves, and says so.
    const b = dispatches(
      d.submit({ requestId: 'u0', model: 'm', tokens: toks(16, 3), sessionId: 'chat-2', subset: new Set([home]) }, 102),
    )[0];
    expect(b.decision.sourceKey).toBe(home);
    d.setHealthy(home, false, 200);
    const after = dispatches(d.submit({ requestId: 'u1', model: 'm', tokens: toks(16, 5), sessionId: 'chat-2' }, 201))[0];
    expect(after.decision.sourceKey).not.toBe(home);
    expect([after.session?.outcome, after.session?.reason]).toEqual(['moved', 'unavailable']);
  });

  it('a session learned from a peer replica is honoured; entries expire after their TTL', () => {
    const { d } = fleet({ sessions: { ttlMs: 1000 } });
    d.rememberSession('peer-session', { sourceKey: 'w1', expiresAt: 500 });
    const a = dispatches(d.submit({ requestId: 'p', model: 'm', tokens: toks(16), sessionId: 'peer-session' }, 10))[0];
    expect([a.decision.sourceKey, a.session?.outcome]).toEqual(['w1', 'kept']);
    expect(d.sessions.get('peer-session', 1009)).toBe('w1');
    expect(d.sessions.get('peer-session', 1011)).toBeUndefined();
  });
});

describe('tables bounded by the tenants that matter (a tenant is whatever a header says)', () => {
  it('FlowQueue forgets finish tags behind the virtual clock, and a returning tenant starts there', () => {
    const q = new FlowQueue();
    // A busy tenant keeps the clock moving; 20,000 one-off tenants pass through the queue one request each.
    for (let i = 0; i < 20_000; i++) {
      const busy = item(q, `busy${i}`, 'busy');
      q.push(busy);
      const once = item(q, `t${i}`, `tenant-${i}`);
      q.push(once);
      for (const id of queueOrder(q)) {
        const it = q.remove(id);
        if (it) q.dispatched(it);
      }
    }
    expect(q.length).toBe(0);
    expect(q.finishTags).toBeLessThanOrEqual(1024 + 2);
    // Fairness is unchanged for a forgotten tenant: behind a flood of A it is still served next, as a new one would be.
    for (let i = 0; i < 10; i++) q.push(item(q, `a${i}`, 'A'));
    q.push(item(q, 'x0', 'tenant-7'));
    expect(queueOrder(q).slice(0, 2)).toEqual(['a0', 'x0']);
  });

  it('TokenBudgets forgets refilled buckets but keeps a tenant that is paying back', () => {
    const b = new TokenBudgets({ '*': 6000 });
    expect(b.admit('greedy', 6000, 0).ok).toBe(true);
    b.charge('greedy', 60_000, 0); // deep in debt: refused for ~10 minutes
    for (let i = 0; i < 5000; i++) expect(b.admit(`t${i}`, 100, i * 100).ok).toBe(true);
    expect(b.size).toBeLessThanOrEqual(1024 + 1);
    // 500 s later the greedy tenant is still paying back: its bucket was kept, so it is still refused.
    expect(b.admit('greedy', 1, 500_000).ok).toBe(false);
    // A forgotten tenant starts full, as it would have been by now.
    expect(b.balance('t3', 500_000)).toBe(6000);
  });
});
