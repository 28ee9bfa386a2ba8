/**
 * A relay message over the NATS server's max_payload: the client refuses it (recognised by its error class, not by
 * its message text), the relay drops it (counted) and publishes a reset of the source instead, so the replicas
 * treat the worker as cold rather than miss blocks silently; smaller messages go on flowing.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { blocksOf, complete, startEngine, startRelay, startReplica, type Engine } from './fleet.ts';
import { NatsServer, until } from './nats-server.ts';

const nats = new NatsServer({ maxPayload: 4096 });
const closers: Array<() => Promise<unknown>> = [];

beforeAll(async () => {
  await nats.start();
});

afterAll(async () => {
  for (const c of closers.reverse()) await c();
  await nats.dispose();
});

const prompt = (n: number, seed: number) => Array.from({ length: n }, (_, i) => ((seed * 7919 + i) % 30_000) + 1);

describe('relay: a message over max_payload', () => {
  it('is dropped, counted and replaced by a reset of the source; later messages still arrive', async () => {
    const engine: Engine = await startEngine('pl0', 1024);
    closers.push(() => engine.mocker.close());
    const relay = await startRelay(nats, engine);
    closers.push(() => relay.close());
    const { router, replica } = await startReplica(nats, 'pl-r');
    closers.push(() => replica.close());

    await complete(engine.mocker.url, prompt(64, 1));
    await until(() => blocksOf(router, 'pl0').size >= 4, 10_000, 'the small request’s blocks');
    const resets = replica.stats().resets;

    // 3,000 tokens of one prompt: its stored events carry ~12 KB of token ids, over the 4 KiB max_payload.
    await complete(engine.mocker.url, prompt(3000, 2));
    await until(() => relay.stats()[0].dropped > 0, 10_000, 'the oversized message dropped');
    await until(() => replica.stats().resets > resets, 10_000, 'the reset that replaces it');

    await complete(engine.mocker.url, prompt(64, 3));
    const truth = () => engine.mocker.engine.cachedSeqHashes();
    await until(() => [...blocksOf(router, 'pl0')].some((h) => truth().has(h)), 10_000, 'blocks after the reset');
    // Cold for what was dropped, never a block the engine does not hold.
    for (const h of blocksOf(router, 'pl0')) expect(truth().has(h)).toBe(true);
    expect(blocksOf(router, 'pl0').size).toBeLessThan(truth().size);
  });
});
