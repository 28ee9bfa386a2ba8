/**
 * A child process for test/ingest/zmq-hwm.test.ts: an engine's event sockets as vLLM binds them (PUB for live batches,
 * ROUTER for replay), the PUB at a small send high-water mark (argv[2]). On 'burst' it publishes N batches as fast as it can
 * (a PUB drops what does not fit, silently, as libzmq does), then creates the `done` file; on 'truth' it answers with
 * its cache's router hashes and its last seq.
 */
import { writeFileSync } from 'node:fs';
import { Publisher, Router } from 'zeromq';
import { FakeEngine } from './fake-engine.ts';

const sndhwm = Number(process.argv[2] ?? '8');
const engine = new FakeEngine({ blockSize: 32, capacity: 4_000, format: 'map', hashType: 'u64', seed: 77, buffer: 1_000_000 });
const pub = new Publisher({ linger: 0, sendHighWaterMark: sndhwm });
await pub.bind('tcp://127.0.0.1:*');
// Mandatory: a reply that does not fit the pipe waits instead of being dropped. vLLM's replay ROUTER has default
// options and drops (see docs/operations.md, "Replay of a long gap"); here the replay must be whole, the drops under
// test are the PUB's.
const router = new Router({ linger: 0, mandatory: true });
await router.bind('tcp://127.0.0.1:*');

void (async () => {
  for await (const [identity, , start] of router) for (const frames of engine.replayFrom(start)) await router.send([identity, ...frames]);
})();

process.on('message', async (m: { kind: string; n?: number; done?: string }) => {
  if (m.kind === 'burst') {
    for (let i = 0; i < m.n!; i++) await pub.send(engine.publish());
    writeFileSync(m.done!, String(engine.seq));
    process.send!({ kind: 'burst-done', last: String(engine.seq - 1n) });
  } else if (m.kind === 'one') {
    await pub.send(engine.publish());
    process.send!({ kind: 'one-done' });
  } else if (m.kind === 'truth') {
    process.send!({ kind: 'truth', hashes: [...engine.truth()].map(String), last: String(engine.seq - 1n) });
  }
});
process.send!({ kind: 'ready', pub: pub.lastEndpoint, replay: router.lastEndpoint });
