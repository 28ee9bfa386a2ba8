/**
 * Scale-out on a real nats-server: 4 mock engines with relays, 3 router replicas routing the traffic in turn. After
 * the traffic every replica's index equals every engine's true cache, and all replicas answer random probes
 * identically. Then a 4th replica starts from a snapshot written under the lease and catches up to the same view.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect } from '@nats-io/transport-node';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import type { KvRouter } from '../../src/core/router.ts';
import { LOAD_SUBJECT, STREAM } from '../../src/transport/nats/protocol.ts';
import type { NatsReplica } from '../../src/transport/nats/replica.ts';
import { NatsServer, until } from './nats-server.ts';
import { converged, describeDiff, matchesByKey, PromptGen, startEngine, startRelay, startReplica, traffic, type Engine } from './fleet.ts';

const nats = new NatsServer();
const engines: Engine[] = [];
const replicas: Array<{ router: KvRouter; replica: NatsReplica }> = [];

beforeAll(async () => {
  await nats.start();
  for (let i = 0; i < 4; i++) engines.push(await startEngine(`eng${i}`));
  for (let i = 0; i < 3; i++) replicas.push(await startReplica(nats, `rep${i}`));
  for (const e of engines) await startRelay(nats, e);
});

afterAll(async () => {
  for (const r of replicas) await r.replica.close();
  for (const e of engines) {
    await e.relay?.close();
    await e.mocker.close();
  }
  await nats.dispose();
});

describe('replicas on JetStream', () => {
  it('discover the workers from the registry', async () => {
    await until(() => replicas.every((r) => r.replica.workerEntries().length === 4), 5000, 'registry');
    for (const r of replicas) {
      const ids = r.replica
        .workerEntries()
        .map((w) => w.workerId)
        .sort();
      expect(ids).toEqual(['eng0', 'eng1', 'eng2', 'eng3']);
      expect(r.replica.workerEntries().every((w) => w.url?.startsWith('http://') && w.blockSize === 16)).toBe(true);
      expect(r.router.sourceKeys().sort()).toEqual(['eng0', 'eng1', 'eng2', 'eng3']);
    }
  });

  it('converge on the engines’ true caches and answer probes identically', async () => {
    const gen = new PromptGen(42);
    await traffic(replicas, engines, gen, 160, 4);
    await until(() => converged(replicas, engines), 10_000, 'convergence').catch((err) => {
      throw new Error(`${err.message}\n${describeDiff(replicas, engines)}`);
    });
    // The engines' caches are small enough that traffic evicted blocks: removals travelled too.
    const removed = engines.reduce((n, e) => n + e.relay!.stats()[0].blocks, 0);
    expect(removed).toBeGreaterThan(engines.reduce((n, e) => n + e.mocker.engine.cachedSeqHashes().size, 0));
    let nonEmpty = 0;
    for (let i = 0; i < 300; i++) {
      const probe = i % 3 === 0 ? gen.tokens(16 * (1 + gen.int(6))) : gen.next();
      const h = replicas[0].router.hashRequest(probe);
      const m0 = matchesByKey(replicas[0].router, h);
      if (Object.keys(m0).length > 0) nonEmpty++;
      for (const r of replicas.slice(1)) expect(matchesByKey(r.router, h)).toEqual(m0);
    }
    expect(nonEmpty).toBeGreaterThan(100);
    for (const r of replicas) {
      const s = r.replica.stats();
      expect(s.badMessages).toBe(0);
      expect(s.streamGaps).toBe(0);
    }
  });

  it('a new replica loads the leased snapshot, replays the rest and sees the same index; covered messages are purged', async () => {
    // Two snapshots with traffic in between: the second purges what the first covered.
    expect(await replicas[0].replica.acquireLease()).toBe(true);
    expect(await replicas[1].replica.acquireLease()).toBe(false); // lease held by rep0
    const first = await replicas[0].replica.writeSnapshot();
    expect(first.streamSeq).toBeGreaterThan(0);
    await traffic(replicas, engines, new PromptGen(7), 40, 4);
    await until(() => converged(replicas, engines), 10_000, 'convergence');
    const second = await replicas[0].replica.writeSnapshot();
    expect(second.streamSeq).toBeGreaterThan(first.streamSeq);
    expect(second.purged).toBeGreaterThan(0);
    const nc = await connect({ servers: nats.url });
    const info = await (await jetstreamManager(nc)).streams.info(STREAM);
    await nc.close();
    expect(info.state.first_seq).toBe(first.streamSeq + 1);

    await traffic(replicas, engines, new PromptGen(8), 20, 4);
    const late = await startReplica(nats, 'rep-late');
    try {
      expect(late.replica.stats().snapshotSeq).toBe(second.streamSeq);
      expect(late.replica.stats().snapshotBlocks).toBeGreaterThan(0);
      await until(() => converged([...replicas, late], engines), 10_000, 'late replica convergence').catch((err) => {
        throw new Error(`${err.message}\n${describeDiff([...replicas, late], engines)}`);
      });
      expect(late.replica.stats().streamGaps).toBe(0);
    } finally {
      await late.replica.close();
    }
  });

  it('count garbage on the stream and the lifecycle subject instead of failing', async () => {
    const nc = await connect({ servers: nats.url });
    try {
      const js = jetstream(nc);
      await js.publish('kvroute.events.junk.0', new Uint8Array([0xc1, 0xff, 0x00]));
      await js.publish('kvroute.events.nodp', new Uint8Array([0x90]));
      nc.publish(LOAD_SUBJECT, new Uint8Array([0xde, 0xad]));
      await nc.flush();
      await until(() => replicas.every((r) => r.replica.stats().badMessages === 2), 5000, 'bad messages counted');
      // Still consuming: new traffic converges.
      await traffic(replicas, engines, new PromptGen(9), 12, 4);
      await until(() => converged(replicas, engines), 10_000, 'convergence after garbage');
      for (const r of replicas) expect(r.router.hasSource('junk')).toBe(false);
    } finally {
      await nc.close();
    }
  });
});
