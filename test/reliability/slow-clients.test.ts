/**
 * Slow clients: headers or body trickled in (slowloris). What the server sets today, and the proposed
 * httpServerTimeouts() in front of the server's real request handler: slow requests get 408 and their sockets are
 * freed, while a long streamed RESPONSE is not cut (node's requestTimeout covers receiving the request only).
 */
import { createServer, type RequestListener, type Server } from 'node:http';
import { connect, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { httpServerTimeouts } from '../../src/server/security/index.ts';
import { startFleet, type Fleet } from './harness.ts';

let fleet: Fleet;
let hardened: Server;
let port: number;

beforeAll(async () => {
  // slowdown: a 24-token stream lasts ~3 s of wall time, longer than the 1.5 s request timeout below.
  fleet = await startFleet(1, { mocker: { speedup: 1, defaultMaxTokens: 24, faults: { slowdown: 6 } } });
  const [handler] = fleet.server.server.listeners('request') as RequestListener[];
  hardened = createServer({ ...httpServerTimeouts({ headersTimeoutMs: 1_000, requestTimeoutMs: 1_500 }) }, handler);
  await new Promise<void>((r) => hardened.listen(0, '127.0.0.1', () => r()));
  port = (hardened.address() as AddressInfo).port;
});
afterAll(async () => {
  hardened?.closeAllConnections();
  await new Promise((r) => hardened?.close(r));
  await fleet?.close();
});

/** Opens a socket, writes `first`, then trickles `drip` bytes every 200 ms; resolves with what came back and when. */
function slowClient(p: number, first: string, drip: string | null): Promise<{ reply: string; ms: number; socket: Socket }> {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const c = connect(p, '127.0.0.1', () => c.write(first));
    let reply = '';
    const timer = drip ? setInterval(() => c.writable && c.write(drip), 200) : null;
    c.on('data', (d) => (reply += d.toString()));
    const done = () => {
      if (timer) clearInterval(timer);
      resolve({ reply, ms: Date.now() - t0, socket: c });
    };
    c.on('close', done);
    c.on('error', () => undefined);
    setTimeout(() => c.destroy(), 8_000); // the test's own bound
  });
}

describe('slow clients', () => {
  it('today: headersTimeout 60 s, requestTimeout 0 (a body trickled forever is never cut)', () => {
    // Recorded so a change is noticed; the proposal is below and in the report.
    expect(fleet.server.server.headersTimeout).toBe(60_000);
    expect(fleet.server.server.requestTimeout).toBe(0);
  });

  it('proposed: trickled headers get 408 after ~1 s', async () => {
    const r = await slowClient(port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\n', 'X-a: b\r\n');
    expect(r.reply).toMatch(/^HTTP\/1\.1 408/);
    expect(r.ms).toBeGreaterThanOrEqual(900);
    expect(r.ms).toBeLessThan(3_000);
  });

  it('proposed: a trickled body gets 408 after ~1.5 s', async () => {
    const r = await slowClient(port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"model":"m",', ' ');
    expect(r.reply).toMatch(/^HTTP\/1\.1 408/);
    expect(r.ms).toBeGreaterThanOrEqual(1_400);
    expect(r.ms).toBeLessThan(4_000);
  });

  it('proposed: 300 slowloris sockets are all dropped, and a long stream meanwhile completes in full', async () => {
    const loris = Array.from({ length: 300 }, () => slowClient(port, 'GET /health HTTP/1.1\r\nHost: x\r\n', 'X: y\r\n'));
    const t0 = Date.now();
    const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'a long answer please', stream: true, max_tokens: 80 }),
    });
    const text = await r.text();
    const streamMs = Date.now() - t0;
    expect(r.status).toBe(200);
    expect(streamMs).toBeGreaterThan(1_500); // longer than requestTimeout, yet not cut
    expect(text).toContain('data: [DONE]');
    expect(text.match(/^data: \{/gm)?.length).toBeGreaterThanOrEqual(24);
    const results = await Promise.all(loris);
    expect(results.every((x) => /^HTTP\/1\.1 408/.test(x.reply))).toBe(true);
    expect(Math.max(...results.map((x) => x.ms))).toBeLessThan(4_000);
    expect(fleet.server.router.state().inFlight).toBe(0);
  });
});
