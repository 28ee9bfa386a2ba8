/**
 * `kvroute relay` as a process: bad input is a clear error with exit code 2; a running relay feeds a replica, and
 * SIGTERM stops it cleanly (exit 0) keeping the registry entry.
 */
import { spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NatsServer, until } from './nats-server.ts';
import { complete, converged, PromptGen, startEngine, startReplica, type Engine } from './fleet.ts';

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

function run(args: string[]): { done: Promise<{ code: number | null; stderr: string }>; kill: (sig: NodeJS.Signals) => void } {
  const p = spawn(process.execPath, ['bin/kvroute.mjs', 'relay', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  p.stderr.on('data', (d) => (stderr += d));
  return { done: new Promise((resolve) => p.on('exit', (code) => resolve({ code, stderr }))), kill: (s) => p.kill(s) };
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
    expect(r.stderr).toMatch(/--events must look like tcp:\/\/host:port/);
  });

  it('feeds a replica and stops cleanly on SIGTERM', async () => {
    const { router, replica } = await startReplica(nats, 'cli-rep');
    try {
      const relay = run([
        '--nats', nats.url, '--worker', 'cli0', '--events', engine.mocker.zmqEndpoint!, '--replay', engine.mocker.replayEndpoint!,
        '--url', engine.mocker.url, '--model', 'mock-model', '--heartbeat-ms', '200', '--log-level', 'warn',
      ]);
      await until(() => replica.workerEntries().some((w) => w.workerId === 'cli0'), 10_000, 'relay registered');
      expect(replica.workerEntries()[0].url).toBe(engine.mocker.url);
      const gen = new PromptGen(3);
      for (let i = 0; i < 20; i++) await complete(engine.mocker.url, gen.next());
      await until(() => engine.mocker.engine.cachedSeqHashes().size > 0 && converged([{ router }], [engine]), 10_000, 'replica convergence');
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
});
