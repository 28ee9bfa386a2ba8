/**
 * The half-open burst, end to end: worker A answers every request with 500, B is healthy. After A's breaker cools down,
 * 24 concurrent chat requests with long prompts arrive while the tokenizer thread makes each wait before routing. The
 * trial is reserved at routing time, so exactly one of them reaches A, in every burst (the old shell let 7-9 through).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../../src/server/app.ts';
import { QWEN3_DIR } from '../reliability/harness.ts';
import { FakeEngine } from './fake-engine.ts';
import { post, serve, sleep } from './helpers.ts';

let a: FakeEngine;
let b: FakeEngine;
let s: RunningServer;

beforeAll(async () => {
  [a, b] = await Promise.all([new FakeEngine().start(), new FakeEngine().start()]);
  a.fail = 'status500';
  s = await serve({
    workers: [
      { url: a.url, id: 'A' },
      { url: b.url, id: 'B' },
    ],
    breakerThreshold: 3,
    breakerCooldownMs: 2000,
    retries: 2,
    tokenizerDir: QWEN3_DIR,
    tokenizerThreads: 1,
  });
});

afterAll(async () => {
  await s?.close(200);
  await Promise.all([a?.stop(), b?.stop()]);
});

const chat = (i: number, burst: number) => ({
  model: 'fake-model',
  max_tokens: 4,
  messages: [{ role: 'user', content: `burst ${burst} request ${i}: ${'a long prompt about prefix caches '.repeat(200)}` }],
});

describe('half-open breaker under a burst', () => {
  it('sends exactly one trial to the failing worker per burst, and every request still gets an answer', async () => {
    // Open A's breaker: its failures are retried on B, so clients never see them.
    for (let i = 0; s.workers.get('A')!.breaker !== 'open'; i++) {
      expect(i).toBeLessThan(50);
      expect((await post(`${s.url}/v1/chat/completions`, chat(i, -1))).status).toBe(200);
    }
    // The cooldown (2 s) is far longer than a burst takes to route, so after the trial fails A stays open for the rest
    // of its burst even on a loaded machine; the count is then exactly the number of trials.
    for (let burst = 0; burst < 2; burst++) {
      await sleep(2100); // past the cooldown: A is half-open
      const before = a.requests;
      const answers = await Promise.all(Array.from({ length: 24 }, (_, i) => post(`${s.url}/v1/chat/completions`, chat(i, burst))));
      expect(answers.map((r) => r.status)).toEqual(Array(24).fill(200));
      expect(a.requests - before).toBe(1);
      expect(answers.filter((r) => r.headers.get('x-kvroute-worker') === 'A')).toHaveLength(0);
      expect(s.workers.get('A')!.breaker).toBe('open');
    }
    expect(s.router.state().inFlight).toBe(0);
  });
});
