/**
 * The stream going back: nats-server killed before its file store flushed keeps fewer messages than it acknowledged,
 * and gives their sequences to new messages after a restart (seen in `npm run bench:nats`: the replica waited for
 * blocks whose messages were gone). Made deterministic here on a real nats-server: the stream is cut back to its
 * first K messages (deleted, recreated, the K messages published again with their message ids), as the restarted
 * server would hold it. The replica must notice (the message at its last applied sequence is gone), consume again
 * from the last sequence it still agrees on, and the relays must notice their acknowledged messages are gone and
 * publish the lost engine batches again from the engines' replay buffers: afterwards every index equals the
 * engines' true caches, with the loss counted on both sides.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect, headers } from '@nats-io/transport-node';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import type { KvRouter } from '../../src/core/router.ts';
import { STREAM } from '../../src/transport/nats/protocol.ts';
import type { NatsReplica } from '../../src/transport/nats/replica.ts';
import { NatsServer, until } from './nats-server.ts';
import { converged, describeDiff, PromptGen, startEngine, startRelay, startReplica, traffic, type Engine } from './fleet.ts';

const nats = new NatsServer();
const engines: Engine[] = [];
const replicas: Array<{ router: KvRouter; replica: NatsReplica }> = [];

beforeAll(async () => {
  await nats.start();
  for (let i = 0; i < 2; i++) engines.push(await startEngine(`eng${i}`, 256));
  replicas.push(await startReplica(nats, 'rep0'));
  const relayLog = process.env.KVROUTE_TEST_LOG
    ? {
        info: (o: object, m: string) =>
          console.log(
            'relay',
            m,
            JSON.stringify(o, (_k, v) => (typeof v === 'bigint' ? String(v) : v)),
          ),
        warn: (o: object, m: string) =>
          console.log(
            'relay',
            m,
            JSON.stringify(o, (_k, v) => (typeof v === 'bigint' ? String(v) : v)),
          ),
        error: (o: object, m: string) =>
          console.log(
            'relay',
            m,
            JSON.stringify(o, (_k, v) => (typeof v === 'bigint' ? String(v) : v)),
          ),
      }
    : undefined;
  for (const e of engines) await startRelay(nats, e, relayLog ? { log: relayLog } : {});
});

afterAll(async () => {
  for (const r of replicas) await r.replica.close();
  for (const e of engines) {
    await e.relay?.close();
    await e.mocker.close();
  }
  await nats.dispose();
});

/** Cuts the stream back to its first `keep` messages, as a server that lost the rest would hold it. */
async function cutStreamBack(keep: number): Promise<number> {
  const nc = await connect({ servers: nats.url });
  try {
    const jsm = await jetstreamManager(nc);
    const info = await jsm.streams.info(STREAM);
    const kept: { subject: string; data: Uint8Array; id: string }[] = [];
    for (let seq = info.state.first_seq; seq <= keep; seq++) {
      const m = await jsm.streams.getMessage(STREAM, { seq });
      if (m) kept.push({ subject: m.subject, data: m.data, id: m.header?.get('Nats-Msg-Id') ?? '' });
    }
    await jsm.streams.delete(STREAM);
    await jsm.streams.add(info.config);
    const js = jetstream(nc);
    for (const k of kept) {
      const h = headers();
      await js.publish(k.subject, k.data, { msgID: k.id, headers: h });
    }
    return info.state.last_seq;
  } finally {
    await nc.close();
  }
}

describe('the event stream goes back (acknowledged messages lost)', () => {
  it('replica and relays notice, count it, and the index equals the engines’ caches again', async () => {
    const gen = new PromptGen(7);
    await traffic(replicas, engines, gen, 40, 2);
    await until(() => converged(replicas, engines), 10_000, 'convergence before the cut').catch((err) => {
      throw new Error(`${err.message}\n${describeDiff(replicas, engines)}`);
    });
    const before = replicas[0].replica.stats().appliedSeq;
    expect(before).toBeGreaterThan(12);
    const last = await cutStreamBack(before - 6);
    expect(last).toBe(before);

    // New traffic: the relays' next publishes find their subjects behind them; the replica's consumer died with the
    // stream and checks before it starts again.
    await traffic(replicas, engines, gen, 20, 2);
    await until(() => converged(replicas, engines), 15_000, 'convergence after the cut').catch((err) => {
      throw new Error(`${err.message}\n${describeDiff(replicas, engines)}`);
    });
    expect(replicas[0].replica.stats().streamDiscontinuities).toBeGreaterThanOrEqual(1);
    const relayLosses = engines.reduce((n, e) => n + e.relay!.stats()[0].discontinuities, 0);
    expect(relayLosses).toBeGreaterThanOrEqual(1);
  }, 60_000);
});
