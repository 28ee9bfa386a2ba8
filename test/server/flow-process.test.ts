/**
 * Flow control and session affinity as a user runs them: `kvroute serve` processes in front of real HTTP engines.
 * Assertions are about order and counts (who was served before whom, what was refused and how), never wall-clock.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { NatsServer } from '../nats/nats-server.ts';
import { FakeEngine } from './fake-engine.ts';
import { json, randomTokens, sleep } from './helpers.ts';

const CLI = fileURLToPath(new URL('../../bin/kvroute.mjs', import.meta.url));

interface Serve {
  url: string;
  proc: ChildProcess;
  stop(): Promise<void>;
}

const running: Serve[] = [];
const engines: FakeEngine[] = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((s) => s.stop()));
  await Promise.all(engines.splice(0).map((e) => e.stop()));
});

async function engine(opts: ConstructorParameters<typeof FakeEngine>[0] = {}): Promise<FakeEngine> {
  const e = await new FakeEngine(opts).start();
  engines.push(e);
  return e;
}

async function serve(args: string[], env: Record<string, string> = {}): Promise<Serve> {
  const proc = spawn(process.execPath, [CLI, 'serve', '--port', '0', '--health-interval-ms', '0', ...args], {
    env: { ...process.env, KVROUTE_LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  proc.stderr.on('data', (d: Buffer) => {
    out += d.toString();
  });
  const url = await new Promise<string>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`kvroute serve did not start: ${out}`)), 30_000);
    proc.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /listening on (http:\/\/[\d.:]+)/.exec(out);
      if (m) {
        clearTimeout(t);
        resolve(m[1]);
      }
    });
    proc.once('exit', (code) => reject(new Error(`kvroute serve exited ${code}: ${out}`)));
  });
  const s: Serve = {
    url,
    proc,
    stop: async () => {
      if (proc.exitCode !== null) return;
      proc.kill('SIGTERM');
      await new Promise((r) => proc.once('exit', r));
    },
  };
  running.push(s);
  return s;
}

function completion(s: Serve, seed: number, headers: Record<string, string> = {}, extra: Record<string, unknown> = {}) {
  return fetch(`${s.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'fake-model', prompt: randomTokens(64, seed), max_tokens: 2, ...extra }),
  });
}

/** Sends requests and records the order in which their answers complete. */
function tracker() {
  const done: string[] = [];
  return {
    done,
    send: (label: string, p: Promise<Response>) =>
      p.then(async (r) => {
        const body = await r.text();
        done.push(label);
        return { status: r.status, body, headers: r.headers };
      }),
  };
}

// Every request holds its worker for its prefill (50 ms before the first chunk): one at a time per worker.
const SERIAL = ['--busy-prefill-tokens', '0', '--queue-limit', '500', '--queue-timeout-ms', '60000'];

describe('flow control (kvroute serve processes)', () => {
  it('a flooding tenant is queued behind its own share: another tenant is served next, unlike FIFO', async () => {
    const e = await engine({ firstChunkDelayMs: 50 });
    for (const order of ['fair', 'fifo'] as const) {
      const s = await serve(['-w', e.url, ...SERIAL, '--queue-order', order]);
      const t = tracker();
      const flood = Array.from({ length: 24 }, (_, i) => t.send(`A${i}`, completion(s, i, { 'x-kvroute-tenant': 'flood' })));
      await sleep(300); // the flood is queued
      const quiet = Array.from({ length: 3 }, (_, i) => t.send(`B${i}`, completion(s, 1000 + i, { 'x-kvroute-tenant': 'quiet' })));
      const answers = await Promise.all([...flood, ...quiet]);
      expect(answers.every((a) => a.status === 200)).toBe(true);
      const floodBefore = (label: string) => t.done.slice(0, t.done.indexOf(label)).filter((x) => x.startsWith('A')).length;
      const lastQuiet = Math.max(...['B0', 'B1', 'B2'].map(floodBefore));
      if (order === 'fair') expect(lastQuiet).toBeLessThanOrEqual(12);
      else expect(lastQuiet).toBeGreaterThanOrEqual(22);
      await s.stop();
      running.splice(running.indexOf(s), 1);
    }
  });

  it('high priority overtakes queued low priority; a sheddable band gets 429 at once and nothing is lost', async () => {
    const e = await engine({ firstChunkDelayMs: 50 });
    const s = await serve([
      '-w',
      e.url,
      ...SERIAL,
      '--band',
      'interactive,max-priority=0',
      '--band',
      'batch,max-priority=50',
      '--band',
      'scavenger,max-priority=1000,sheddable',
    ]);
    const t = tracker();
    const low = Array.from({ length: 24 }, (_, i) => t.send(`low${i}`, completion(s, i, {}, { priority: 10 })));
    await sleep(300);
    const seenBefore = e.requests;
    const shed = await Promise.all(Array.from({ length: 8 }, (_, i) => completion(s, 500 + i, { 'x-kvroute-priority': '500' })));
    for (const r of shed) {
      expect(r.status).toBe(429);
      expect(Number(r.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      expect((await json(r)).error.code).toBe('shed');
    }
    const doneAtArrival = t.done.length;
    const high = t.send('high', completion(s, 900, {}, { priority: -5 }));
    await Promise.all([...low, high]);
    // Between its arrival and its answer only what was already on the engine finishes (one in prefill, a stream or
    // two decoding): the queued low-priority requests all wait behind it.
    const overtakenBy = t.done.indexOf('high') - doneAtArrival;
    expect(overtakenBy).toBeLessThanOrEqual(3);
    expect(t.done.length - t.done.indexOf('high') - 1).toBeGreaterThanOrEqual(5); // most lows were still queued
    // The engine saw the low and high requests, never the shed ones.
    expect(e.requests).toBe(25);
    expect(seenBefore).toBeLessThan(25);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/router_flow_requests_total\{band="scavenger",tenant="default",outcome="shed"\} 8/);
    expect(metrics).toMatch(/router_flow_requests_total\{band="interactive",tenant="default",outcome="dispatched"\} 1/);
  });

  it('tenants from API key names; a tenant over its token budget is refused with Retry-After, the other is not', async () => {
    const e = await engine();
    const s = await serve([
      '-w',
      e.url,
      '--api-key',
      'heavy=sk-heavy-0123456789abcdef',
      '--api-key',
      'light=sk-light-0123456789abcdef',
      '--tenant-token-budgets',
      'heavy=100',
    ]);
    const as = (key: string, seed: number, spoof?: string) =>
      completion(s, seed, { authorization: `Bearer ${key}`, ...(spoof ? { 'x-kvroute-tenant': spoof } : {}) });
    expect((await as('sk-heavy-0123456789abcdef', 1)).status).toBe(200);
    expect((await as('sk-heavy-0123456789abcdef', 2)).status).toBe(200); // 64 + 64 > 100: now overdrawn
    const over = await as('sk-heavy-0123456789abcdef', 3);
    expect(over.status).toBe(429);
    expect((await json(over)).error.code).toBe('token_budget_exceeded');
    expect(Number(over.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    // The header cannot move a request to another tenant's budget when keys name the tenant.
    expect((await as('sk-light-0123456789abcdef', 4, 'heavy')).status).toBe(200);
    const metrics = await (await fetch(`${s.url}/metrics`, { headers: { authorization: 'Bearer sk-light-0123456789abcdef' } })).text();
    expect(metrics).toMatch(/router_flow_dispatched_tokens_total\{tenant="light"\} 64/);
    expect(metrics).toMatch(/tenant="heavy",outcome="budget"\} 1/);
  });

  it('rejects malformed identity headers with 400 naming the header', async () => {
    const e = await engine();
    const s = await serve(['-w', e.url]);
    for (const [h, v] of [
      ['x-kvroute-priority', 'high'],
      ['x-kvroute-slo-ttft-ms', '-5'],
      ['x-kvroute-tenant', 'has space'],
    ]) {
      const r = await completion(s, 1, { [h]: v });
      expect(r.status).toBe(400);
      expect((await json(r)).error.param).toBe(h);
    }
    expect(e.requests).toBe(0);
  });
});

describe('session affinity (kvroute serve processes)', () => {
  it("a session's requests stay on one worker through distinct prompts and move only when it is ejected", async () => {
    const es = [await engine(), await engine(), await engine()];
    const s = await serve([...es.flatMap((e, i) => ['-w', `${e.url},id=w${i}`]), '--health-interval-ms', '200', '--eject-after', '1']);
    const workers: string[] = [];
    for (let i = 0; i < 6; i++) {
      const r = await completion(s, 5000 + i * 17, { 'x-session-id': 'agent-42' });
      expect(r.status).toBe(200);
      workers.push(r.headers.get('x-kvroute-worker')!);
      await r.text();
    }
    expect(new Set(workers).size).toBe(1);
    const home = es[Number(workers[0].slice(1))];
    home.fail = 'health503';
    await sleep(800); // ejected by the probes
    const moved = await completion(s, 7777, { 'x-session-id': 'agent-42' });
    expect(moved.status).toBe(200);
    expect(moved.headers.get('x-kvroute-worker')).not.toBe(workers[0]);
    await moved.text();
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/router_session_requests_total\{outcome="kept",reason=""\} 5/);
    expect(metrics).toMatch(/router_session_requests_total\{outcome="moved",reason="unavailable"\} 1/);
  });

  describe('two replicas over NATS', () => {
    const nats = new NatsServer();
    beforeAll(() => nats.start());
    afterAll(() => nats.dispose());

    it('agree on every session worker: the second replica keeps the sessions the first pinned', async () => {
      const es = [await engine(), await engine(), await engine(), await engine()];
      const workers = es.flatMap((e, i) => ['-w', `${e.url},id=w${i}`]);
      const natsUrl = `nats://127.0.0.1:${nats.port}`;
      const [a, b] = await Promise.all([
        serve([...workers, '--nats', natsUrl, '--replica-id', 'rep-a', '--snapshot-interval-ms', '0']),
        serve([...workers, '--nats', natsUrl, '--replica-id', 'rep-b', '--snapshot-interval-ms', '0']),
      ]);
      const pinned = new Map<string, string>();
      for (let i = 0; i < 8; i++) {
        const r = await completion(a, 100 + i, { 'x-session-id': `s-${i}` });
        pinned.set(`s-${i}`, r.headers.get('x-kvroute-worker')!);
        await r.text();
      }
      await sleep(300); // the pins reach the other replica
      for (let i = 0; i < 8; i++) {
        const r = await completion(b, 9000 + i, { 'x-session-id': `s-${i}` });
        expect(r.headers.get('x-kvroute-worker')).toBe(pinned.get(`s-${i}`));
        await r.text();
      }
      const metrics = await (await fetch(`${b.url}/metrics`)).text();
      expect(metrics).toMatch(/router_session_requests_total\{outcome="kept",reason=""\} 8/);
    });
  });
});
