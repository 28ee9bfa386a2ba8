/**
 * Index snapshots through a real object store (a test-owned nats-server): a snapshot written by one replica is
 * loaded by the next, which replays only what came after it and ends with the same index; one written while events
 * keep arriving covers exactly the sequence it states. A stored snapshot that is corrupt, truncated or of another
 * format version is refused with a counted error (stats and the Prometheus counter), and the replica replays the
 * stream from its start instead, to the same index (run before the second write, which purges the stream's start).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jetstream, type JetStreamClient } from '@nats-io/jetstream';
import type { ObjectStore } from '@nats-io/obj';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { Registry } from 'prom-client';
import { KvRouter } from '../../src/core/router.ts';
import type { LogSink } from '../../src/log.ts';
import { registerReplicaMetrics } from '../../src/transport/nats/metrics.ts';
import { encodeEventMessage, eventSubject, SNAPSHOT_NAME } from '../../src/transport/nats/protocol.ts';
import { NatsReplica } from '../../src/transport/nats/replica.ts';
import { ensureEventPlane } from '../../src/transport/nats/setup.ts';
import { blocksOf } from './fleet.ts';
import { NatsServer, until } from './nats-server.ts';

const BS = 4;
const WORKERS = ['w0', 'w1'];
const nats = new NatsServer();
let nc: NatsConnection;
let js: JetStreamClient;
let store: ObjectStore;
const open: NatsReplica[] = [];
let published = 0;
let nextId = 1n;

/** Publishes `n` event messages per worker: chains of 3 engine blocks (8 tokens each = 2 router blocks). */
async function publish(n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    for (const w of WORKERS) {
      const base = Number(nextId) * 8;
      const ids = [nextId++, nextId++, nextId++];
      const events = ids.map((id, k) => ({
        kind: 'stored' as const,
        parent: k === 0 ? null : ids[k - 1],
        engineIds: [id],
        tokens: Array.from({ length: 8 }, (_, t) => base + k * 8 + t),
        blockSize: 8,
      }));
      await js.publish(eventSubject(w, 0), encodeEventMessage([{ kind: 'batch', seq: BigInt(i), fp: 0, events }]));
      published++;
    }
  }
}

interface Logged {
  level: string;
  msg: string;
  obj: object;
}

async function replica(id: string): Promise<{ router: KvRouter; replica: NatsReplica; logs: Logged[] }> {
  const router = new KvRouter({ blockSize: BS, overlay: false });
  const logs: Logged[] = [];
  const log: LogSink = {
    info: (obj, msg) => logs.push({ level: 'info', msg, obj }),
    warn: (obj, msg) => logs.push({ level: 'warn', msg, obj }),
    error: (obj, msg) => logs.push({ level: 'error', msg, obj }),
  };
  const r = new NatsReplica({ servers: nats.url, replicaId: id, log, snapshotIntervalMs: 0 });
  await r.start(router);
  open.push(r);
  return { router, replica: r, logs };
}

function sameIndex(a: KvRouter, b: KvRouter): void {
  for (const w of WORKERS) {
    const held = blocksOf(a, w);
    expect(held.size).toBeGreaterThan(0);
    expect(blocksOf(b, w)).toEqual(held);
  }
}

beforeAll(async () => {
  await nats.start();
  nc = await connect({ servers: nats.url });
  const plane = await ensureEventPlane(nc);
  store = plane.snapshots;
  js = jetstream(nc);
});

afterAll(async () => {
  for (const r of open) await r.close();
  await nc.close();
  await nats.dispose();
});

describe('snapshots in the object store', () => {
  let first: { router: KvRouter; replica: NatsReplica };
  let written = 0;

  it('round trip: the next replica loads the snapshot, replays only what came after it, same index', async () => {
    await publish(40);
    first = await replica('snap-a');
    const w = await first.replica.writeSnapshot();
    written = w.streamSeq;
    expect(w.streamSeq).toBe(published);
    expect(w.bytes).toBeGreaterThan(0);
    const info = await store.info(SNAPSHOT_NAME);
    expect(info?.size).toBe(w.bytes);
    await publish(5);

    const next = await replica('snap-b');
    const s = next.replica.stats();
    expect(s.snapshotSeq).toBe(written);
    expect(s.snapshotBlocks).toBe(40 * 2 * 3); // messages x workers x engine blocks each
    expect(s.messages).toBe(published - written);
    expect(s.snapshotErrors).toBe(0);
    await until(() => first.replica.stats().appliedSeq === published);
    sameIndex(first.router, next.router);
    // Engine ids survived: a removal by engine id applies the same way on both.
    const removed = encodeEventMessage([{ kind: 'batch', seq: 99n, fp: 0, events: [{ kind: 'removed', engineIds: [1n] }] }]);
    await js.publish(eventSubject('w0', 0), removed);
    published++;
    await until(() => first.replica.stats().appliedSeq === published && next.replica.stats().appliedSeq === published);
    expect(next.replica.stats().blocksRejected).toBe(0);
    sameIndex(first.router, next.router);
  });

  const bad: Array<[string, (b: Uint8Array) => Uint8Array, string, RegExp]> = [
    ['corrupt (one byte flipped)', (b) => flip(b, Math.floor(b.byteLength / 2)), 'corrupt', /checksum mismatch/],
    ['truncated (first half)', (b) => new Uint8Array(b.subarray(0, Math.floor(b.byteLength / 2))), 'truncated', /truncated/],
    ['of another format version', (b) => versioned(b, 3), 'version', /snapshot format 3, this replica reads format 2/],
  ];
  for (const [what, spoil, code, message] of bad) {
    it(`a snapshot ${what} is refused, counted, and the stream replayed from its start instead`, async () => {
      const good = (await store.getBlob(SNAPSHOT_NAME))!;
      const info = (await store.info(SNAPSHOT_NAME))!;
      await store.putBlob({ name: SNAPSHOT_NAME, description: info.description }, spoil(good));
      try {
        const r = await replica(`snap-${code}`);
        const registry = new Registry();
        registerReplicaMetrics(r.replica, registry);
        const s = r.replica.stats();
        expect(s.snapshotErrors).toBe(1);
        expect(s.lastSnapshotError).toBe(code);
        expect(s.snapshotBlocks).toBe(0);
        expect(s.snapshotSeq).toBe(0);
        expect(s.messages).toBe(published); // every message, from the first
        const refusal = r.logs.find((l) => l.level === 'error' && l.msg.startsWith('index snapshot refused'));
        expect(refusal?.msg).toMatch(message);
        expect(await registry.getSingleMetricAsString('router_nats_snapshot_errors_total')).toMatch(/ 1$/m);
        await until(() => first.replica.stats().appliedSeq === published);
        sameIndex(first.router, r.router);
      } finally {
        await store.putBlob({ name: SNAPSHOT_NAME, description: info.description }, good);
      }
    });
  }

  it('a snapshot written while events keep arriving covers exactly the sequence it states', async () => {
    const flowing = publish(60);
    await new Promise((r) => setTimeout(r, 20));
    const w = await first.replica.writeSnapshot();
    await flowing;
    expect(w.streamSeq).toBeGreaterThan(written);
    written = w.streamSeq;
    const late = await replica('snap-c');
    expect(late.replica.stats().snapshotSeq).toBe(w.streamSeq);
    expect(late.replica.stats().messages).toBe(published - w.streamSeq);
    await until(() => first.replica.stats().appliedSeq === published);
    sameIndex(first.router, late.router);
  });
});

function flip(b: Uint8Array, at: number): Uint8Array {
  const out = new Uint8Array(b); // a copy (the client may hand out a Buffer, whose slice() is a view)
  out[at] ^= 0x5a;
  return out;
}

function versioned(b: Uint8Array, version: number): Uint8Array {
  const out = new Uint8Array(b);
  new DataView(out.buffer).setUint16(4, version, true);
  return out;
}
