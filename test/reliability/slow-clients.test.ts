/**
 * Slow clients against the real server: headers or body trickled in (slowloris) get 408 and their sockets are
 * freed (--header-timeout-ms, --body-timeout-ms through httpServerTimeouts), while a long streamed RESPONSE is not
 * cut (node's requestTimeout covers receiving the request only).
 */
import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULTS } from '../../src/config/serve.ts';
import { startFleet, type Fleet } from './harness.ts';

let fleet: Fleet;
let port: number;

beforeAll(async () => {
  // slowdown: an 80-token stream lasts ~3 s of wall time, longer than the 1.5 s request timeout below.
  fleet = await startFleet(1, {
    mocker: { speedup: 1, defaultMaxTokens: 24, faults: { slowdown: 6 } },
    serve: { headerTimeoutMs: 1_000, bodyTimeoutMs: 1_500 },
  });
  port = fleet.server.port;
});
afterAll(async () => {
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
    setTimeout(() => c.destroy(), 12_000); // the test's own bound
  });
}

describe('slow clients', () => {
  it('defaults: 10 s for the head, 60 s for the whole request; configured values reach node:http', () => {
    expect([DEFAULTS.headerTimeoutMs, DEFAULTS.bodyTimeoutMs]).toEqual([10_000, 60_000]);
    expect(fleet.server.server.headersTimeout).toBe(1_000);
    expect(fleet.server.server.requestTimeout).toBe(1_500);
  });

  it('trickled headers get 408 after ~1 s', async () => {
    const r = await slowClient(port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\n', 'X-a: b\r\n');
    expect(r.reply).toMatch(/^HTTP\/1\.1 408/);
    expect(r.ms).toBeGreaterThanOrEqual(900);
    expect(r.ms).toBeLessThan(3_000);
  });

  it('a trickled body gets 408 after ~1.5 s', async () => {
    const r = await slowClient(
      port,
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"model":"m",',
      ' ',
    );
    expect(r.reply).toMatch(/^HTTP\/1\.1 408/);
    expect(r.ms).toBeGreaterThanOrEqual(1_400);
    expect(r.ms).toBeLessThan(4_000);
  });

  it('300 slowloris sockets are all dropped, and a long stream meanwhile completes in full', async () => {
    const loris = Array.from({ length: 300 }, () => slowClient(port, 'GET /health HTTP/1.1\r\nHost: x\r\n', 'X: y\r\n'));
    const t0 = Date.now();
    const r = await fetch(`${fleet.server.url}/v1/completions`, {
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
    const other = results.filter((x) => !/^HTTP\/1\.1 408/.test(x.reply)).map((x) => `${x.ms} ms: ${JSON.stringify(x.reply.slice(0, 40))}`);
    expect(other).toEqual([]);
    expect(Math.max(...results.map((x) => x.ms))).toBeLessThan(6_000); // nominal 1.25 s; shared cores
    expect(fleet.server.router.state().inFlight).toBe(0);
  });
});
