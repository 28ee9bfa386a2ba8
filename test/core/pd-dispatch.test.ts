/**
 * Disaggregated prefill/decode in the core dispatcher: the path each request takes, the two legs' pools and policies,
 * the ledger on the prefill pool, and every leg failure (prefill retried elsewhere or decode alone, decode failure =
 * a new pair, cancel = both legs), all on an injected clock.
 */
import { describe, expect, it } from 'vitest';
import { type DispatchAttempt, type DispatchEffect, Dispatcher } from '../../src/core/dispatch/dispatcher.ts';
import { KvRouter } from '../../src/core/router.ts';
import { storedEvent, toks } from '../fixtures/routing.ts';

const BS = 4;

function fleet(opts: { prefill?: number; decode?: number; minUncached?: number; retries?: number; engine?: 'vllm' | 'sglang' } = {}) {
  const router = new KvRouter({ blockSize: BS, seed: 3 });
  const d = new Dispatcher(router, {
    queueLimit: 8,
    queueTimeoutMs: 1000,
    retries: opts.retries ?? 2,
    breaker: { threshold: 3, cooldownMs: 1000 },
    pd: { minUncachedTokens: opts.minUncached ?? 0 },
  });
  for (let i = 0; i < (opts.prefill ?? 2); i++) d.addWorker({ id: `p${i}`, mode: 'events', role: 'prefill', engine: opts.engine }, 0);
  for (let i = 0; i < (opts.decode ?? 2); i++) d.addWorker({ id: `d${i}`, mode: 'events', role: 'decode', engine: opts.engine }, 0);
  return { router, d };
}

const attempt = (e: DispatchEffect[]): DispatchAttempt => {
  const a = e.filter((x): x is DispatchAttempt => x.kind === 'dispatch');
  expect(a).toHaveLength(1);
  return a[0];
};

describe('P/D decisions', () => {
  it('a long prompt gets a prefill leg on the prefill pool that holds its prefix, and a decode leg on the decode pool', () => {
    const { router, d } = fleet();
    const prompt = toks(64);
    router.applyEvents('p1', [storedEvent(prompt, 12, 100n, BS)]);
    const a = attempt(d.submit({ requestId: 'r1', model: 'm', tokens: prompt }, 0));
    expect(a.path).toBe('disaggregated');
    expect(a.workerId).toMatch(/^d/);
    expect(a.prefill?.workerId).toBe('p1');
    expect(a.prefill?.decision.overlapBlocks).toBe(12);
    // The ledger counts the prefill leg (one request, its overlap on the prefill worker), not the decode leg.
    expect(router.ledger.total.requests).toBe(1);
    expect(router.ledger.total.overlapBlocks).toBe(12);
    expect(router.ledger.bySource.get('p1')?.requests).toBe(1);
    expect(router.ledger.bySource.get(a.decision.sourceKey)).toBeUndefined();
  });

  it('the prefill leg counts as prefill load until it answers, its blocks until the decode side has them', () => {
    const { router, d } = fleet({ prefill: 1, decode: 1 });
    const a = attempt(d.submit({ requestId: 'r1', model: 'm', tokens: toks(40) }, 0));
    const p0 = () => router.state().sources.find((s) => s.source === 'p0')!;
    expect(p0().activePrefillTokens).toBe(40);
    d.prefillDone('r1', { cachedTokens: 8 }, 5);
    expect(p0().activePrefillTokens).toBe(0);
    expect(p0().activeBlocks).toBe(10);
    const effects = d.firstToken('r1', 9);
    expect(p0().activeBlocks).toBe(0);
    // Delivered reuse is the prefill's figure, on the prefill worker.
    const f = effects.find((e) => e.kind === 'finished');
    expect(f?.kind === 'finished' && f.request.sourceKey).toBe('p0');
    expect(router.ledger.total.deliveredCachedTokens).toBe(8);
    d.finish('r1', { outcome: 'ok', cachedTokens: 36 }, 20);
    // The decode engine's cached_tokens (transferred KV) never reaches the ledger.
    expect(router.ledger.total.deliveredCachedTokens).toBe(8);
    expect(router.ledger.total.deliveredRequests).toBe(1);
    expect(d.pdStats.paths.disaggregated).toBe(1);
    expect(d.pdStats.transferredTokens).toBe(40);
    expect(a.engine).toBe('vllm');
  });

  it('conditional disaggregation: a prompt mostly cached on its decode worker, or with several sequences, is served there alone', () => {
    const { router, d } = fleet({ prefill: 1, decode: 1, minUncached: 8 });
    const prompt = toks(40);
    router.applyEvents('d0', [storedEvent(prompt, 8, 500n, BS)]);
    const a = attempt(d.submit({ requestId: 'short', model: 'm', tokens: prompt }, 0));
    expect([a.path, a.prefill]).toEqual(['decode_rule', undefined]);
    // Served alone, the decode worker's own cache hit is the one that counts.
    expect(router.ledger.bySource.get('d0')?.overlapBlocks).toBe(8);
    const b = attempt(d.submit({ requestId: 'n2', model: 'm', tokens: toks(40, 1000), sequences: 2 }, 0));
    expect(b.path).toBe('decode_rule');
    const c = attempt(d.submit({ requestId: 'long', model: 'm', tokens: toks(40, 2000) }, 0));
    expect(c.path).toBe('disaggregated');
    expect(d.pdStats.decodeOnly).toEqual({ short: 1, sequences: 1 });
    // A prompt of unknown length (no tokenizer) cannot be judged short: it is disaggregated.
    expect(attempt(d.submit({ requestId: 'unknown', model: 'm', tokens: [] }, 0)).path).toBe('disaggregated');
  });

  it('a fleet without prefill workers is aggregated; prefill workers never take aggregated requests', () => {
    const router = new KvRouter({ blockSize: BS, seed: 1 });
    const d = new Dispatcher(router, { queueLimit: 1, queueTimeoutMs: 10, retries: 0, breaker: { threshold: 1, cooldownMs: 1 } });
    d.addWorker({ id: 'b0', mode: 'events' }, 0);
    const a = attempt(d.submit({ requestId: 'a', model: 'm', tokens: toks(40) }, 0));
    expect([a.path, a.workerId, a.prefill]).toEqual(['aggregated', 'b0', undefined]);
    d.addWorker({ id: 'p0', mode: 'events', role: 'prefill' }, 0);
    d.removeWorker('b0', 0);
    const r = d.submit({ requestId: 'b', model: 'm', tokens: toks(40) }, 0);
    expect(r[0].kind === 'reject' && r[0].code).toBe('no_workers_for_role');
  });

  it('the prefill pool must speak the decode worker’s protocol', () => {
    const router = new KvRouter({ blockSize: BS, seed: 1 });
    const d = new Dispatcher(router, { queueLimit: 1, queueTimeoutMs: 10, retries: 0, breaker: { threshold: 1, cooldownMs: 1 } });
    d.addWorker({ id: 'p0', mode: 'events', role: 'prefill', engine: 'sglang' }, 0);
    d.addWorker({ id: 'd0', mode: 'events', role: 'decode', engine: 'vllm' }, 0);
    const a = attempt(d.submit({ requestId: 'a', model: 'm', tokens: toks(40) }, 0));
    expect(a.path).toBe('decode_fallback');
    expect(d.pdStats.decodeOnly).toEqual({ no_workers_for_role: 1 });
  });

  it('DP ranks are sources on both roles', () => {
    const router = new KvRouter({ blockSize: BS, seed: 1 });
    const d = new Dispatcher(router, { queueLimit: 1, queueTimeoutMs: 10, retries: 0, breaker: { threshold: 1, cooldownMs: 1 } });
    d.addWorker({ id: 'p0', mode: 'events', role: 'prefill', dpRanks: 2 }, 0);
    d.addWorker({ id: 'd0', mode: 'events', role: 'decode', dpRanks: 2 }, 0);
    const prompt = toks(40);
    router.applyEvents('p0#1', [storedEvent(prompt, 9, 1n, BS)]);
    const a = attempt(d.submit({ requestId: 'a', model: 'm', tokens: prompt }, 0));
    expect(a.prefill?.decision.sourceKey).toBe('p0#1');
    const b = attempt(d.submit({ requestId: 'b', model: 'm', tokens: toks(40, 100) }, 0));
    // The decode leg balances: the second request goes to the other rank.
    expect(new Set([a.decision.sourceKey, b.decision.sourceKey])).toEqual(new Set(['d0', 'd0#1']));
  });
});

describe('P/D leg failures', () => {
  it('prefill failure: a new prefill leg elsewhere, the ledger counts the request once, on the prefill that served', () => {
    const { router, d } = fleet();
    const a = attempt(d.submit({ requestId: 'r', model: 'm', tokens: toks(40) }, 0));
    const first = a.prefill!.workerId;
    const b = attempt(d.prefillFailed('r', 'connection refused', 1));
    expect(b.path).toBe('disaggregated');
    expect(b.workerId).toBe(a.workerId); // the decode worker keeps its leg
    expect(b.prefill?.workerId).not.toBe(first);
    expect(b.prefill?.attempt).toBe(1);
    expect(router.ledger.total.requests).toBe(1);
    expect(router.ledger.bySource.get(first)?.requests ?? 0).toBe(0);
    expect(d.pdStats.handoffFailures.prefill_failed).toBe(1);
    expect(d.pdStats.prefillRetries).toBe(1);
  });

  it('no prefill worker left: served on decode alone, then counted by that path', () => {
    const { router, d } = fleet({ prefill: 1 });
    const a = attempt(d.submit({ requestId: 'r', model: 'm', tokens: toks(40) }, 0));
    const b = attempt(d.prefillFailed('r', 'p0 answered 500', 1));
    expect([b.path, b.prefill, b.workerId]).toEqual(['decode_fallback', undefined, a.workerId]);
    // The decode leg became the served one: now it is in the ledger, the withdrawn prefill is not.
    expect(router.ledger.total.requests).toBe(1);
    expect(router.ledger.bySource.get(a.decision.sourceKey)?.requests).toBe(1);
    d.finish('r', { outcome: 'ok', cachedTokens: 0 }, 5);
    expect(d.pdStats.paths.decode_fallback).toBe(1);
    expect(d.pdStats.decodeOnly).toEqual({ prefill_retries_exhausted: 1 });
  });

  it('decode failure: both legs taken back and a new pair routed, away from the failed decode worker', () => {
    const { router, d } = fleet();
    const a = attempt(d.submit({ requestId: 'r', model: 'm', tokens: toks(40) }, 0));
    d.prefillDone('r', { cachedTokens: 0 }, 1);
    const b = attempt(d.failed('r', 'lease expired', 2));
    expect(b.path).toBe('disaggregated');
    expect(b.workerId).not.toBe(a.workerId);
    expect(b.prefill).toBeDefined();
    expect(b.prefill?.legId).not.toBe(a.prefill?.legId);
    expect(router.ledger.total.requests).toBe(1);
    expect(d.pdStats.handoffFailures.decode_failed).toBe(1);
    // The prefill worker did its part: not blamed.
    expect(d.worker(a.prefill!.workerId)?.breaker.toJSON().failures).toBe(0);
    expect(router.state().inFlight).toBe(2);
  });

  it('client disconnect cancels both legs and frees every load', () => {
    const { router, d } = fleet();
    attempt(d.submit({ requestId: 'r', model: 'm', tokens: toks(40) }, 0));
    expect(router.state().inFlight).toBe(2);
    d.cancel('r', 3);
    expect(router.state().inFlight).toBe(0);
    expect(d.pdStats.handoffFailures.cancelled).toBe(1);
    expect(d.workers().every((w) => w.inFlight === 0)).toBe(true);
  });

  it('missing kv_transfer_params are counted and the request goes on', () => {
    const { d } = fleet();
    attempt(d.submit({ requestId: 'r', model: 'm', tokens: toks(40) }, 0));
    d.prefillDone('r', { cachedTokens: 0, transferParams: false }, 1);
    d.firstToken('r', 2);
    d.finish('r', { outcome: 'ok' }, 3);
    expect(d.pdStats.handoffFailures.no_kv_transfer_params).toBe(1);
    expect(d.pdStats.paths.disaggregated).toBe(1);
  });
});
