/**
 * Overload against the real server: a burst of concurrent connections far beyond what the workers and the queue
 * hold. Past the limits the answer must be 503 (or 429 with a rate limit) with Retry-After, every request must be
 * answered, memory bounded, nothing left in flight. The 10,000-connection version is `npm run chaos -- --overload`.
 */
import { Agent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { heapUsedMB, notOpenAiError, percentile, sleep, startFleet, type Fleet } from './harness.ts';

const CONNECTIONS = 2_000;
const QUEUE_LIMIT = 100;

let fleet: Fleet;

beforeAll(async () => {
  fleet = await startFleet(2, {
    mocker: { speedup: 1, defaultMaxTokens: 4 },
    serve: { busyPrefillTokens: 100, queueLimit: QUEUE_LIMIT, queueTimeoutMs: 5_000 },
  });
});
afterAll(async () => {
  await fleet?.close();
});

/** A completion with 64 prompt tokens (token ids: no tokenizer needed, the router sees the prefill load). */
function body(i: number): string {
  const ids = Array.from({ length: 64 }, (_, k) => ((i * 7919 + k * 104729) % 150_000) + 1);
  return JSON.stringify({ model: 'm', prompt: ids, max_tokens: 4, stream: i % 2 === 0 });
}

describe('overload', () => {
  it(`${CONNECTIONS} concurrent connections, queue limit ${QUEUE_LIMIT}: admitted ones succeed, the rest get 503 + Retry-After`, async () => {
    const heap0 = heapUsedMB();
    const agent = new Agent({ connections: CONNECTIONS, pipelining: 1, connect: { timeout: 20_000 } });
    const admitted: number[] = [];
    const statuses = new Map<number, number>();
    const bad: string[] = [];
    let peakRss = 0;
    const rssTimer = setInterval(() => (peakRss = Math.max(peakRss, process.memoryUsage().rss)), 50);
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: CONNECTIONS }, async (_, i) => {
        const t = performance.now();
        try {
          const r = await request(`${fleet.server.url}/v1/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: body(i),
            dispatcher: agent,
          });
          const text = await r.body.text();
          statuses.set(r.statusCode, (statuses.get(r.statusCode) ?? 0) + 1);
          if (r.statusCode === 200) {
            admitted.push(performance.now() - t);
            if (i % 2 === 0 && !text.includes('[DONE]')) bad.push(`stream ${i} without [DONE]`);
          } else if (r.statusCode === 503) {
            const ra = Number(r.headers['retry-after']);
            if (!(ra >= 1)) bad.push(`503 without Retry-After: ${JSON.stringify(r.headers)}`);
            const ct = r.headers['content-type'];
            const why = notOpenAiError(503, Array.isArray(ct) ? ct[0] : (ct ?? null), text);
            if (why) bad.push(`503 body: ${why}`);
          } else bad.push(`status ${r.statusCode}: ${text.slice(0, 200)}`);
        } catch (err) {
          bad.push(`request ${i} failed: ${(err as Error).message}`);
        }
      }),
    );
    const wallS = (performance.now() - t0) / 1000;
    clearInterval(rssTimer);
    await agent.close();
    const ok = statuses.get(200) ?? 0;
    const refused = statuses.get(503) ?? 0;
    console.log(
      `overload: ${CONNECTIONS} connections in ${wallS.toFixed(1)} s: ${ok} admitted (p50 ${percentile(admitted, 50).toFixed(0)} ms, ` +
        `p99 ${percentile(admitted, 99).toFixed(0)} ms), ${refused} x 503; peak RSS ${(peakRss / 2 ** 20).toFixed(0)} MB`,
    );
    expect(bad).toEqual([]);
    expect(ok + refused).toBe(CONNECTIONS);
    expect(ok).toBeGreaterThanOrEqual(QUEUE_LIMIT); // the queue was used, not just refused
    expect(refused).toBeGreaterThan(0); // the limit was reached
    await sleep(100);
    expect(fleet.server.inFlight()).toBe(0);
    expect(fleet.server.dispatcher.queueLength).toBe(0);
    const st = fleet.server.router.state();
    expect(st.inFlight).toBe(0);
    for (const s of st.sources) expect([s.activeRequests, s.activePrefillTokens]).toEqual([0, 0]);
    const heap1 = heapUsedMB();
    console.log(`overload: heap ${heap0.toFixed(1)} MB -> ${heap1.toFixed(1)} MB after the burst`);
    expect(heap1 - heap0).toBeLessThan(40);
  });

  it('per-key rate limit (--api-key, --rate-limit 5,10): 429 + Retry-After past the burst, other keys unaffected', async () => {
    const a = 'sk-tenant-a-000000000000';
    const b = 'sk-tenant-b-000000000000';
    const limited = await startFleet(1, { serve: { apiKeys: [a, b], rateLimit: '5,10' } });
    try {
      const call = async (key: string | null) => {
        const r = await fetch(`${limited.server.url}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
          body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 1 }),
        });
        return { status: r.status, retryAfter: r.headers.get('retry-after'), text: await r.text(), ct: r.headers.get('content-type') };
      };
      const t0 = performance.now();
      const burst = await Promise.all(Array.from({ length: 30 }, () => call(a)));
      const seconds = (performance.now() - t0) / 1000;
      const ok = burst.filter((r) => r.status === 200).length;
      const refused = burst.filter((r) => r.status === 429);
      expect(ok).toBeGreaterThanOrEqual(10);
      // The burst, plus what refills (5/s) while the 30 arrive: on a quiet machine they take well under a second; on a
      // loaded one (load average 20+) they took over a second and 16 were admitted, which the bucket allows.
      expect(ok).toBeLessThanOrEqual(10 + Math.ceil(5 * seconds) + 1);
      expect(refused.length).toBe(30 - ok);
      for (const r of refused) {
        expect(Number(r.retryAfter)).toBeGreaterThanOrEqual(1);
        expect(notOpenAiError(r.status, r.ct, r.text)).toBeNull();
        expect(JSON.parse(r.text).error.code).toBe('rate_limit_exceeded');
      }
      expect((await call(b)).status).toBe(200);
      // Unauthenticated requests are refused before the limiter: they cannot drain a tenant's bucket.
      const none = await call(null);
      expect(none.status).toBe(401);
      expect(notOpenAiError(none.status, none.ct, none.text)).toBeNull();
      expect((await call('sk-wrong-key-00000000000')).status).toBe(401);
      // /health stays open for probes.
      expect((await fetch(`${limited.server.url}/health`)).status).toBe(200);
    } finally {
      await limited.close();
    }
  });
});
