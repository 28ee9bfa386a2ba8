/**
 * Real ZMQ high-water-mark overflow (issue 30): an engine process publishing on a real PUB socket at a send high-water
 * mark of 8 messages, and a subscriber (the ingestion shell, receive high-water mark 8) whose thread is held up while a
 * burst of 30,000 batches goes out: what does not fit is dropped by libzmq on the publisher's side, silently. The
 * drops must show up as sequence gaps counted for the source by name, be healed by replay from the engine's ROUTER,
 * and leave the index equal to the engine's cache, with no reset.
 */
import { type ChildProcess, fork } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { KvIndex } from '../../src/core/index/kv-index.ts';
import type { KvEvent } from '../../src/core/types.ts';
import { quietLog } from '../../src/log.ts';
import { EventIngest } from '../../src/transport/event-ingest.ts';

const CHILD = fileURLToPath(new URL('./hwm-publisher.ts', import.meta.url));
const BURST = 30_000;

type Msg = { kind: string; [k: string]: unknown };

function next(child: ChildProcess, kind: string, ms = 60_000): Promise<Msg> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no '${kind}' from the publisher in ${ms} ms`)), ms);
    const on = (m: Msg) => {
      if (m.kind !== kind) return;
      clearTimeout(timer);
      child.off('message', on);
      resolve(m);
    };
    child.on('message', on);
  });
}

async function until(cond: () => boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe('ZMQ high-water mark overflow, real sockets', () => {
  it('publisher drops under a slow subscriber are counted as gaps for the source and healed by replay', { timeout: 120_000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvroute-hwm-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const done = join(dir, 'done');
    const child = fork(CHILD, ['8'], { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    cleanups.push(() => {
      if (child.exitCode === null) child.kill('SIGKILL');
    });
    const ready = await next(child, 'ready');

    const index = new KvIndex({ blockSize: 32 });
    index.addSource(0);
    const resets: string[] = [];
    let hold = false;
    let heldMs = 0;
    const ingest = new EventIngest({
      routerBlockSize: 32,
      sink: (_key, events: KvEvent[]) => {
        if (hold) {
          // The slow subscriber: its thread does nothing else until the whole burst has been sent.
          hold = false;
          const t0 = Date.now();
          while (!existsSync(done) && Date.now() - t0 < 60_000) {}
          heldMs = Date.now() - t0;
        }
        for (const e of events) index.apply(0, e);
      },
      onReset: (_key, reason) => {
        resets.push(reason);
        index.apply(0, { kind: 'cleared' });
      },
      log: quietLog,
      replayTimeoutMs: 5_000,
      receiveHighWaterMark: 8,
    });
    cleanups.push(() => ingest.close());
    await ingest.addWorker({ workerId: 'w0', endpoint: String(ready.pub), replayEndpoint: String(ready.replay), topic: 'kv-events' });
    await until(() => ingest.health()[0].connected, 10_000, 'the subscription');

    // Warm up until batches flow (a SUB misses what is sent before its subscription reaches the PUB).
    while (ingest.health()[0].lastSeq === null) {
      child.send({ kind: 'one' });
      await next(child, 'one-done');
      await new Promise((r) => setTimeout(r, 50));
    }
    const before = ingest.health()[0];

    hold = true;
    child.send({ kind: 'burst', n: BURST, done });
    const burst = await next(child, 'burst-done');
    await until(() => ingest.health()[0].lastSeq === burst.last, 90_000, `seq ${burst.last} in order`);
    expect(heldMs).toBeGreaterThan(0);

    const h = ingest.health()[0];
    expect(h.sourceKey).toBe('w0');
    // Batches went missing on the wire (the publisher sent every one): gaps counted for w0, filled by replay.
    expect(h.gaps - before.gaps).toBeGreaterThanOrEqual(1);
    expect(h.replays - before.replays).toBeGreaterThanOrEqual(1);
    expect(h.replayedBatches - before.replayedBatches).toBeGreaterThan(100);
    expect(h.replayFailures).toBe(0);
    expect(resets).toEqual([]);

    child.send({ kind: 'truth' });
    const truth = await next(child, 'truth');
    expect(truth.last).toBe(burst.last);
    expect(index.blocksOf(0)).toEqual(new Set((truth.hashes as string[]).map(BigInt)));
  });
});
