/**
 * `kvroute relay` as a process: bad input is a clear error with exit code 2; a running relay feeds a replica, and
 * SIGTERM stops it cleanly (exit 0) keeping the registry entry; a DP-2 engine gets one subject per rank.
 */
import { spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort, NatsServer, until } from './nats-server.ts';
import { blocksOf, complete, converged, PromptGen, sameSet, startEngine, startReplica, type Engine } from './fleet.ts';

const nats = new NatsServer();
let engine: Engine;

beforeAll(async () => {
  await nats.start();
  engine = await startEngine('cli0');
});

afterAll(async () => {
  await engine.mocker.close();
  await nats.dispose();
});

function run(args: string[]): {
  done: Promise<{ code: number | null; stderr: string }>;
  started: Promise<void>;
  kill: (sig: NodeJS.Signals) => void;
} {
  const p = spawn(process.execPath, ['bin/kvroute.mjs', 'relay', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  let stdout = '';
  p.stderr.on('data', (d) => (stderr += d));
  const started = new Promise<void>((resolve) => {
    p.stdout.on('data', (d) => {
      stdout += d;
      if (stdout.includes('relay starting')) resolve();
    });
  });
  return { done: new Promise((resolve) => p.on('exit', (code) => resolve({ code, stderr }))), started, kill: (s) => p.kill(s) };
}

describe('kvroute relay', () => {
  it('rejects a worker id that cannot name a subject', async () => {
    const r = await run(['--nats', nats.url, '--worker', 'a.b', '--events', 'tcp://127.0.0.1:5557']).done;
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/worker id "a.b" must match/);
  });

  it('rejects a malformed endpoint', async () => {
    const r = await run(['--nats', nats.url, '--worker', 'x', '--events', 'localhost:5557']).done;
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/--events must be a tcp:\/\/host:port endpoint/);
  });

  it('feeds a replica and stops cleanly on SIGTERM', async () => {
    const { router, replica } = await startReplica(nats, 'cli-rep');
    try {
      const relay = run([
        '--nats',
        nats.url,
        '--worker',
        'cli0',
        '--events',
        engine.mocker.zmqEndpoint!,
        '--replay',
        engine.mocker.replayEndpoint!,
        '--url',
        engine.mocker.url,
        '--model',
        'mock-model',
        '--heartbeat-ms',
        '200',
        '--log-level',
        'warn',
      ]);
      await until(() => replica.workerEntries().some((w) => w.workerId === 'cli0'), 10_000, 'relay registered');
      expect(replica.workerEntries()[0].url).toBe(engine.mocker.url);
      const gen = new PromptGen(3);
      for (let i = 0; i < 20; i++) await complete(engine.mocker.url, gen.next());
      await until(
        () => engine.mocker.engine.cachedSeqHashes().size > 0 && converged([{ router }], [engine]),
        10_000,
        'replica convergence',
      );
      relay.kill('SIGTERM');
      const r = await relay.done;
      expect(r.code).toBe(0);
      // The entry stays: a restarted relay keeps the worker's blocks on the replicas.
      await new Promise((res) => setTimeout(res, 300));
      expect(replica.workerEntries().map((w) => w.workerId)).toContain('cli0');
    } finally {
      await replica.close();
    }
  });

  it('relays every data-parallel rank of an engine to its own subject', async () => {
    const { startMocker } = await import('../../src/mocker/server.ts');
    const { NatsRelay } = await import('../../src/transport/nats/relay.ts');
    const { quietLog } = await import('../../src/log.ts');
    const mocker = await startMocker({
      speedup: 1000,
      defaultMaxTokens: 2,
      dataParallelSize: 2,
      engine: { blockSize: 16, numGpuBlocks: 64 },
    });
    const { router, replica } = await startReplica(nats, 'dp-rep');
    const relay = new NatsRelay({
      servers: nats.url,
      workerId: 'dp2',
      events: mocker.zmqEndpoint!,
      replay: mocker.replayEndpoint,
      dpRanks: 2,
      url: mocker.url,
      log: quietLog,
    });
    try {
      await relay.start();
      const gen = new PromptGen(13);
      for (let i = 0; i < 16; i++) {
        const res = await fetch(`${mocker.url}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-data-parallel-rank': String(i % 2) },
          body: JSON.stringify({ model: 'mock-model', prompt: gen.next(), max_tokens: 2 }),
        });
        expect(res.status).toBe(200);
        await res.arrayBuffer();
      }
      await until(
        () => [0, 1].every((r) => sameSet(blocksOf(router, r === 0 ? 'dp2' : 'dp2#1'), mocker.engines[r].cachedSeqHashes())),
        10_000,
        'both ranks indexed',
      );
      expect(mocker.engines[1].cachedSeqHashes().size).toBeGreaterThan(0);
      expect(relay.stats().map((s) => s.subject)).toEqual(['kvroute.events.dp2.0', 'kvroute.events.dp2.1']);
      expect(replica.workerEntries().find((w) => w.workerId === 'dp2')!.dpRanks).toEqual([0, 1]);
    } finally {
      await relay.close();
      await replica.close();
      await mocker.close();
    }
  });

  it('waits for NATS when it is not up yet, then registers', async () => {
    const later = new NatsServer();
    later.port = await freePort();
    const relay = run(['--nats', later.url, '--worker', 'early', '--events', engine.mocker.zmqEndpoint!, '--log-level', 'warn']);
    try {
      await new Promise((r) => setTimeout(r, 1000));
      await later.start();
      const { replica } = await startReplica(later, 'late-nats-rep');
      try {
        await until(() => replica.workerEntries().some((w) => w.workerId === 'early'), 10_000, 'relay registered after NATS came up');
      } finally {
        await replica.close();
      }
    } finally {
      relay.kill('SIGTERM');
      const r = await relay.done;
      await later.dispose();
      expect(r.stderr).toBe('');
      expect(r.code).toBe(0);
    }
  });

  it('stops cleanly on SIGTERM while still waiting for NATS', async () => {
    const port = await freePort();
    const relay = run([
      '--nats',
      `nats://127.0.0.1:${port}`,
      '--worker',
      'never',
      '--events',
      engine.mocker.zmqEndpoint!,
      '--log-level',
      'info',
    ]);
    // Signal once it has said it is starting (its handlers are in place), not after a guessed delay: a loaded machine
    // can take longer than any fixed wait just to load the CLI.
    await relay.started;
    await new Promise((r) => setTimeout(r, 500)); // well inside the wait for NATS
    relay.kill('SIGTERM');
    expect((await relay.done).code).toBe(0);
  });

  it('splits engine batches bigger than a message across messages, losing nothing', async () => {
    const { NatsRelay } = await import('../../src/transport/nats/relay.ts');
    const { quietLog } = await import('../../src/log.ts');
    const small = await startEngine('small');
    const { router, replica } = await startReplica(nats, 'split-rep');
    // 512-byte messages: a prefill of a few blocks (80 bytes each) already needs several.
    const relay = new NatsRelay({
      servers: nats.url,
      workerId: 'small',
      events: small.mocker.zmqEndpoint!,
      replay: small.mocker.replayEndpoint,
      maxMessageBytes: 512,
      log: quietLog,
    });
    try {
      await relay.start();
      const gen = new PromptGen(17);
      for (let i = 0; i < 10; i++) await complete(small.mocker.url, gen.next());
      await until(
        () => small.mocker.engine.cachedSeqHashes().size > 0 && converged([{ router }], [small]),
        10_000,
        'split batches applied',
      );
      const engineBatches = relay.health()[0].batches;
      expect(relay.stats()[0].batches).toBeGreaterThan(engineBatches); // some batches became several items
      expect(relay.stats()[0].dropped).toBe(0);
    } finally {
      await relay.close();
      await replica.close();
      await small.mocker.close();
    }
  });
});
