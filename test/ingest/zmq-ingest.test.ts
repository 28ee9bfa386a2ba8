/**
 * Real ZMQ: a Publisher and a ROUTER replay endpoint in the test (as a vLLM engine binds them), the ingestion shell
 * subscribing and replaying with a DEALER, a real KvIndex as the sink.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { Publisher, Router } from 'zeromq';
import { KvIndex } from '../../src/core/index/kv-index.ts';
import type { KvEvent } from '../../src/core/types.ts';
import { REPLAY_END_SEQ } from '../../src/engines/common.ts';
import { EventIngest } from '../../src/transport/event-ingest.ts';
import { quietLog } from '../../src/log.ts';
import { requestReplay } from '../../src/transport/replay.ts';
import { FakeEngine } from './fake-engine.ts';

async function until(cond: () => boolean, ms = 4000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** The engine side: PUB for live events, ROUTER answering replay requests from the engine's history. */
class EngineSockets {
  pub!: Publisher;
  router: Router | null = null;
  pubEndpoint = '';
  replayEndpoint = '';
  replayRequests = 0;

  constructor(readonly engine: FakeEngine) {}

  async start(pubEndpoint = 'tcp://127.0.0.1:*', replay = true): Promise<void> {
    this.pub = new Publisher({ linger: 0 });
    for (let i = 0; ; i++) {
      try {
        await this.pub.bind(pubEndpoint);
        break;
      } catch (err) {
        if (i > 50) throw err; // the old socket may hold the port for a moment after close
        await new Promise((r) => setTimeout(r, 20));
      }
    }
    this.pubEndpoint = this.pub.lastEndpoint!;
    if (replay && !this.router) {
      this.router = new Router({ linger: 0 });
      await this.router.bind('tcp://127.0.0.1:*');
      this.replayEndpoint = this.router.lastEndpoint!;
      void this.serveReplay(this.router);
    }
  }

  private async serveReplay(router: Router): Promise<void> {
    try {
      for await (const [identity, , start] of router) {
        this.replayRequests++;
        for (const frames of this.engine.replayFrom(start)) await router.send([identity, ...frames]);
      }
    } catch {
      // closed
    }
  }

  async publish(n: number, drop: (i: number) => boolean = () => false): Promise<void> {
    for (let i = 0; i < n; i++) {
      const frames = this.engine.publish();
      if (!drop(i)) await this.pub.send(frames);
    }
  }

  close(): void {
    this.pub.close();
    this.router?.close();
  }
}

function setup(engine: FakeEngine) {
  const index = new KvIndex({ blockSize: engine.o.blockSize });
  index.addSource(0);
  const resets: string[] = [];
  const ingest = new EventIngest({
    routerBlockSize: engine.o.blockSize,
    sink: (_key, events: KvEvent[]) => {
      for (const e of events) index.apply(0, e);
    },
    onReset: (_key, reason) => {
      resets.push(reason);
      index.apply(0, { kind: 'cleared' });
    },
    log: quietLog,
    replayTimeoutMs: 300,
    reconnectIntervalMs: 20,
    reconnectMaxIntervalMs: 100,
  });
  return { index, ingest, resets };
}

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
});

describe('ZMQ ingestion', () => {
  it('subscribes, recovers dropped batches by DEALER replay, and resets on an engine restart', async () => {
    const engine = new FakeEngine({ blockSize: 4, capacity: 80, format: 'map', hashType: 'u64', seed: 11, salts: true });
    const sockets = new EngineSockets(engine);
    await sockets.start();
    cleanups.push(() => sockets.close());
    const { index, ingest, resets } = setup(engine);
    cleanups.push(() => ingest.close());
    const [key] = await ingest.addWorker({
      workerId: 'w0',
      endpoint: sockets.pubEndpoint,
      replayEndpoint: sockets.replayEndpoint,
      topic: 'kv-events',
    });
    await until(() => ingest.health()[0].connected);

    // Batches published before the subscription settles, plus drops on the wire: all recovered by replay.
    await sockets.publish(300, (i) => i % 41 === 3);
    await until(() => ingest.health()[0].lastSeq === String(engine.seq - 1n));
    let h = ingest.health()[0];
    expect(h.sourceKey).toBe(key);
    expect(h.replays).toBeGreaterThanOrEqual(1);
    expect(sockets.replayRequests).toBe(h.replays);
    expect(h.gaps).toBeGreaterThanOrEqual(1);
    expect(resets).toEqual([]);
    expect(index.blocksOf(0)).toEqual(engine.truth());

    // Restart: a new publisher process on the same port, seq from 0, empty cache. The SUB reconnects by itself.
    const port = sockets.pubEndpoint;
    sockets.pub.close();
    engine.restart();
    await sockets.start(port);
    await until(() => ingest.health()[0].connected);
    await new Promise((r) => setTimeout(r, 100));
    await sockets.publish(50);
    await until(() => ingest.health()[0].lastSeq === String(engine.seq - 1n));
    expect(resets[0]).toBe('restart');
    h = ingest.health()[0];
    expect(h.resetsByReason.restart).toBe(1);
    expect(index.blocksOf(0)).toEqual(engine.truth());
  });

  it('replay unavailable (nobody answers) -> the source is reset and ingestion continues', async () => {
    const engine = new FakeEngine({ blockSize: 4, capacity: 40, format: 'array', hashType: 'i64', seed: 5 });
    const sockets = new EngineSockets(engine);
    await sockets.start('tcp://127.0.0.1:*', false);
    cleanups.push(() => sockets.close());
    const { index, ingest, resets } = setup(engine);
    cleanups.push(() => ingest.close());
    // A replay endpoint with no ROUTER behind it: the DEALER's request times out.
    await ingest.addWorker({ workerId: 'w1', endpoint: sockets.pubEndpoint, replayEndpoint: 'tcp://127.0.0.1:9', dpRanks: 1 });
    await until(() => ingest.health()[0].connected);
    await new Promise((r) => setTimeout(r, 50));
    await sockets.publish(5);
    await until(() => ingest.health()[0].batches + ingest.health()[0].heldBatches >= 1);
    await sockets.publish(30, (i) => i === 10);
    await until(() => ingest.health()[0].lastSeq === String(engine.seq - 1n));
    const h = ingest.health()[0];
    expect(h.replayFailures).toBeGreaterThanOrEqual(1);
    expect(resets).toContain('replay_unavailable');
    // Cold, never wrong: after the reset the index holds a subset of the engine's blocks.
    for (const b of index.blocksOf(0)) expect(engine.truth().has(b)).toBe(true);
  });

  it('bind mode: the engine connects to the router; dp rank r uses port + r', async () => {
    const engine = new FakeEngine({ blockSize: 4, capacity: 40, format: 'map', hashType: 'bytes', seed: 3 });
    const { index, ingest } = setup(engine);
    cleanups.push(() => ingest.close());
    const [key] = await ingest.addWorker({ workerId: 'w2', endpoint: 'tcp://127.0.0.1:*', mode: 'bind' });
    const endpoint = ingest.endpointOf(key)!;
    expect(endpoint).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    const pub = new Publisher({ linger: 0 });
    cleanups.push(() => pub.close());
    pub.connect(endpoint);
    await until(() => ingest.health()[0].connected);
    await new Promise((r) => setTimeout(r, 50));
    for (let i = 0; i < 40; i++) await pub.send(engine.publish());
    await until(() => ingest.health()[0].lastSeq === '39');
    expect(index.blocksOf(0)).toEqual(engine.truth());
    const { rankEndpoint } = await import('../../src/transport/zmq-source.ts');
    expect(rankEndpoint('tcp://10.0.0.1:5557', 3)).toBe('tcp://10.0.0.1:5560');
  });

  it('logs a source that serves traffic without events as blind, once, and its recovery', async () => {
    let now = 5_000_000;
    const errors: string[] = [];
    const infos: string[] = [];
    const blindIngest = new EventIngest({
      routerBlockSize: 4,
      sink: () => {},
      onReset: () => {},
      now: () => now,
      blindCheckMs: 0,
      log: { info: (_o, m) => infos.push(m), warn() {}, error: (_o, m) => errors.push(m) },
    });
    cleanups.push(() => blindIngest.close());
    const [key] = await blindIngest.addWorker({ workerId: 'quiet', endpoint: 'tcp://127.0.0.1:*', mode: 'bind' });
    for (let i = 0; i < 4; i++) blindIngest.noteRequestRouted(key);
    expect(blindIngest.checkBlind()).toEqual([]);
    now += 30_000;
    expect(blindIngest.checkBlind()).toEqual([key]);
    expect(blindIngest.checkBlind()).toEqual([key]);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatch(/source quiet is blind: 4 requests routed to it and no KV event for 30 s/);
    expect(blindIngest.health()[0]).toMatchObject({ blind: true, requestsSinceLastEvent: 4, mode: 'bind' });
    // Events resume: an engine connects and publishes.
    const pub = new Publisher({ linger: 0 });
    cleanups.push(() => pub.close());
    pub.connect(blindIngest.endpointOf(key)!);
    await until(() => blindIngest.health()[0].connected);
    await new Promise((r) => setTimeout(r, 50));
    const engine = new FakeEngine({ blockSize: 4, capacity: 10, format: 'array', hashType: 'u64', seed: 1 });
    await pub.send(engine.publish());
    await until(() => blindIngest.health()[0].batches === 1);
    expect(blindIngest.checkBlind()).toEqual([]);
    expect(infos.some((m) => /no longer blind/.test(m))).toBe(true);
  });

  it('counts bad frames arriving on the socket and keeps receiving', async () => {
    const engine = new FakeEngine({ blockSize: 4, capacity: 20, format: 'array', hashType: 'u64', seed: 8 });
    const { index, ingest } = setup(engine);
    cleanups.push(() => ingest.close());
    const [key] = await ingest.addWorker({ workerId: 'noisy', endpoint: 'tcp://127.0.0.1:*', mode: 'bind' });
    const pub = new Publisher({ linger: 0 });
    cleanups.push(() => pub.close());
    pub.connect(ingest.endpointOf(key)!);
    await until(() => ingest.health()[0].connected);
    await new Promise((r) => setTimeout(r, 50));
    await pub.send(engine.publish()); // seq 0
    await pub.send([Buffer.from('kv-events'), Buffer.alloc(8)]); // 2 frames
    await pub.send([Buffer.from('kv-events'), Buffer.alloc(5), Buffer.from([0x90])]); // 5-byte seq
    const garbage = Buffer.alloc(8);
    garbage.writeBigUInt64BE(1n);
    engine.seq++; // seq 1 is taken by the garbage payload
    await pub.send([Buffer.from('kv-events'), garbage, Buffer.from([0xc1, 0x00])]);
    await pub.send(engine.publish()); // seq 2
    await until(() => ingest.health()[0].lastSeq === '2');
    const h = ingest.health()[0];
    expect(h.badFrames).toBe(3);
    expect(h.decodeErrors).toBe(1);
    expect(h.resetsByReason).toEqual({ undecodable_batch: 1 });
    // Cold after the undecodable batch, never wrong.
    for (const b of index.blocksOf(0)) expect(engine.truth().has(b)).toBe(true);
  });

  it('requestReplay skips malformed reply frames (counted) and stops at the end marker', async () => {
    const router = new Router({ linger: 0 });
    cleanups.push(() => router.close());
    await router.bind('tcp://127.0.0.1:*');
    void (async () => {
      for await (const [id, , start] of router) {
        const seq = (n: bigint) => {
          const b = Buffer.alloc(8);
          b.writeBigUInt64BE(n);
          return b;
        };
        const from = start.readBigUInt64BE(0);
        await router.send([id, Buffer.alloc(0), seq(from), Buffer.from([0x90])]);
        await router.send([id, Buffer.alloc(0), Buffer.alloc(3), Buffer.from([0x90])]); // bad seq length
        await router.send([id, Buffer.alloc(0), seq(from + 1n), Buffer.from([0x91]), Buffer.alloc(1)]); // 4 frames
        await router.send([id, Buffer.alloc(0), seq(from + 2n), Buffer.from([0x92])]);
        await router.send([id, Buffer.alloc(0), seq(REPLAY_END_SEQ), Buffer.alloc(0)]);
      }
    })();
    const got: bigint[] = [];
    const r = await requestReplay(router.lastEndpoint!, 40n, (s) => got.push(s), { timeoutMs: 1000 });
    expect(r).toEqual({ ok: true, batches: 2, badFrames: 2 });
    expect(got).toEqual([40n, 42n]);
  });

  it('requestReplay reports an unanswered endpoint as unavailable within the timeout', async () => {
    // It answers (the test's own timeout guards a hang) and says the timeout is why; it waited for the timeout first.
    // The lower bound is half the timeout, not the timeout: the receive timer starts from libuv's loop time, cached when
    // the loop turn began, so on a loaded machine it fires early by however long that turn has run (182 of 200 ms once,
    // at load average 28); an answer that did not wait at all would still fail.
    const t0 = performance.now();
    const r = await requestReplay('tcp://127.0.0.1:9', 0n, () => {}, { timeoutMs: 200 });
    expect(r.ok).toBe(false);
    expect(r.reason).toMatch(/replay unavailable: timeout/);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(100);
  });
});
