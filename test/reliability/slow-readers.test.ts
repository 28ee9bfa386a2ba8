/**
 * A client that stops reading a stream (its socket paused, connection kept open). The engine finishes, the router's
 * write buffer and the kernel's fill, and the router waits for 'drain'.
 */
import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServeConfig } from '../../src/config/serve.ts';
import { sleep, startFleet, type Fleet } from './harness.ts';

let fleet: Fleet;

/** A fleet of one engine whose router drops a client that has not drained for `stallMs`. */
function fleetWithStall(stallMs: number): void {
  beforeAll(async () => {
    fleet = await startFleet(1, {
      // ~5 MB of SSE in ~2 s: more than loopback socket buffers hold.
      mocker: { speedup: 200, engine: { maxModelLen: 40_000 } },
      serve: { clientStallTimeoutMs: stallMs } as Partial<ServeConfig>,
    });
  });
  afterAll(async () => {
    await fleet?.close();
    fleet = undefined as unknown as Fleet;
  });
}

/** Starts a 35,000-token stream and stops reading after the first bytes. */
function stalledClient(): Promise<Socket> {
  const u = new URL(fleet.server.url);
  const body = JSON.stringify({ model: 'm', prompt: 'go', max_tokens: 35_000, stream: true });
  return new Promise((resolve) => {
    const c = connect(Number(u.port), u.hostname, () =>
      c.write(
        `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
      ),
    );
    c.on('error', () => undefined);
    c.once('data', () => {
      c.pause();
      resolve(c);
    });
  });
}

async function engineDone(): Promise<void> {
  const end = Date.now() + 10_000;
  while (fleet.engines[0].engine.numRunning > 0 && Date.now() < end) await sleep(50);
}

describe('slow readers, no stall timeout in reach', () => {
  // The stall timeout is far away here, so only the client's close can free the request (with 1 s, a loaded machine
  // took longer than that between the stall and the check, and the timeout freed it first).
  fleetWithStall(600_000);
  it('the request is freed (active load back to zero) when the stalled client closes its connection', async () => {
    const c = await stalledClient();
    await engineDone();
    await sleep(500);
    expect(fleet.server.router.state().inFlight).toBe(1); // still pinned while the connection is open
    c.destroy();
    const end = Date.now() + 15_000; // a generous deadline for the close to propagate on a loaded machine, not a timing goal
    while (fleet.server.router.state().inFlight > 0 && Date.now() < end) await sleep(20);
    expect(fleet.server.router.state().inFlight).toBe(0);
    expect(fleet.server.workers.get('w0')!.breaker).toBe('closed'); // a slow client is not the worker's fault
  });
});

describe('slow readers, a 1 s stall timeout', () => {
  fleetWithStall(1_000);
  // A client that keeps its connection open without reading must not pin its request in the worker's active load:
  // past clientStallTimeoutMs the response is destroyed, which takes the client-disconnect path (cancelled).
  it('a client that stops reading is dropped within the stall timeout', async () => {
    const c = await stalledClient();
    try {
      await engineDone();
      const end = Date.now() + 15_000;
      while (fleet.server.router.state().inFlight > 0 && Date.now() < end) await sleep(50);
      expect(fleet.server.router.state().inFlight).toBe(0);
    } finally {
      c.destroy();
      await sleep(200);
    }
  });
});
