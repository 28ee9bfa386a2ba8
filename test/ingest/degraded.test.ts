/**
 * A source whose KV events were lost and could not be replayed, tried as a user would: `kvroute serve` and a mock
 * engine (`kvroute mocker`, a replay buffer of one batch) as processes from the built package. Batches dropped on the
 * wire (the mocker's drop fault) make gaps its replay no longer covers, so the router resets the source: it must then
 * say so (GET /debug/state: degraded, since when, why; /metrics: router_kv_event_source_degraded{worker,reason}), and
 * `kvroute hitrate` must warn that the worker's figures are not to be trusted. An engine restart (its cache starts
 * empty) heals it.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort, until } from '../nats/nats-server.ts';

const procs: ChildProcess[] = [];
const run = promisify(execFile);

function cli(args: string[]): ChildProcess {
  const p = spawn(process.execPath, ['bin/kvroute.mjs', ...args], { stdio: 'ignore' });
  procs.push(p);
  return p;
}

afterAll(async () => {
  await Promise.all(
    procs.map(
      (p) =>
        new Promise<void>((resolve) => {
          if (p.exitCode !== null || p.signalCode !== null) return resolve();
          p.once('exit', () => resolve());
          p.kill('SIGKILL');
        }),
    ),
  );
});

interface SourceState {
  source: string;
  degraded: { since: number; reason: string; losses: number } | null;
}

describe('a source whose events were lost and not replayed', () => {
  it('is degraded in /debug/state and /metrics, hitrate warns, and an engine restart heals it', async () => {
    const [http, zmq, replay, port] = [await freePort(), await freePort(), await freePort(), await freePort()];
    const engine = `http://127.0.0.1:${http}`;
    cli([
      'mocker',
      '--port',
      String(http),
      '--host',
      '127.0.0.1',
      '--zmq-endpoint',
      `tcp://127.0.0.1:${zmq}`,
      '--replay-endpoint',
      `tcp://127.0.0.1:${replay}`,
      '--buffer-steps',
      '1',
      '--speedup',
      '1000',
    ]);
    const router = `http://127.0.0.1:${port}`;
    cli([
      'serve',
      '--port',
      String(port),
      '--worker',
      `${engine},events=tcp://127.0.0.1:${zmq},replay=tcp://127.0.0.1:${replay},id=eng`,
      '--health-interval-ms',
      '0',
      '--no-remote-tokenize',
    ]);
    const ok = async (url: string) => (await fetch(url).catch(() => null))?.status === 200;
    await until(() => ok(`${engine}/health`), 30_000, 'engine up');
    await until(() => ok(`${router}/health`), 30_000, 'router up');
    const sources = async () =>
      ((await (await fetch(`${router}/debug/state`)).json()) as { router: { sources: SourceState[] } }).router.sources;
    const complete = (seed: number) =>
      fetch(`${router}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: 'mock-model',
          prompt: Array.from({ length: 100 }, (_, i) => 1 + ((seed * 31 + i * 7) % 9000)),
          max_tokens: 2,
        }),
      }).then((r) => r.arrayBuffer());

    // Whole to begin with.
    await complete(1);
    expect((await sources())[0].degraded).toBeNull();

    // Half the batches dropped on the wire, the replay buffer holds one: gaps the replay cannot fill.
    const t0 = Date.now();
    await fetch(`${engine}/fault`, { method: 'POST', body: JSON.stringify({ dropEventFraction: 0.5 }) });
    let seed = 10;
    await until(
      async () => {
        await complete(seed++);
        return (await sources())[0].degraded !== null;
      },
      30_000,
      'the source degraded',
    );
    await fetch(`${engine}/fault`, { method: 'POST', body: JSON.stringify({ dropEventFraction: 0 }) });
    const d = (await sources())[0].degraded!;
    expect(d.losses).toBeGreaterThanOrEqual(1);
    expect(d.since).toBeGreaterThanOrEqual(t0);
    expect(d.reason).toMatch(/replay|gap/);
    const metrics = await (await fetch(`${router}/metrics`)).text();
    expect(metrics).toMatch(new RegExp(`router_kv_event_source_degraded\\{worker="eng",reason="${d.reason}"\\} 1`));

    const hit = await run(process.execPath, ['bin/kvroute.mjs', 'hitrate', '--router', router, '--window', '0.5s'], { timeout: 30_000 });
    expect(hit.stdout).toMatch(/WARNING: worker eng: KV events were lost and not replayed/);

    // The engine restarts (its cache starts empty, its seqs from 0): the router's view is whole again.
    await fetch(`${engine}/fault`, { method: 'POST', body: JSON.stringify({ restart: true }) });
    await until(
      async () => {
        await complete(seed++);
        return (await sources())[0].degraded === null;
      },
      30_000,
      'healed by the engine restart',
    );
    const after = await (await fetch(`${router}/metrics`)).text();
    expect(after).not.toMatch(/router_kv_event_source_degraded\{/);
  }, 120_000);
});
