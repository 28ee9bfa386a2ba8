/**
 * `kvroute serve --nats` as a process, the way it is deployed: a real nats-server, two mock engines each fed to
 * JetStream by a `kvroute relay` process, and a router replica process that discovers the workers from the registry,
 * answers /health 503 until it is ready, then routes a repeated prompt back to the engine that cached it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pino from 'pino';
import { startMocker } from '../../src/mocker/server.ts';
import { startServer } from '../../src/server/app.ts';
import { DEFAULTS } from '../../src/config/serve.ts';
import { freePort, NatsServer, until } from './nats-server.ts';

const nats = new NatsServer();
const procs: ChildProcess[] = [];
let mockers: Awaited<ReturnType<typeof startMocker>>[] = [];

function spawnCli(args: string[]): ChildProcess {
  const p = spawn(process.execPath, ['bin/kvroute.mjs', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  procs.push(p);
  return p;
}

/** `kvroute serve --nats` as a replica on a free port, its stderr kept for the failure message. */
async function spawnReplica(id: string, extra: string[] = []) {
  const port = await freePort();
  const p = spawnCli([
    'serve',
    '--nats',
    nats.url,
    ...extra,
    '--port',
    String(port),
    '--replica-id',
    id,
    '--log-level',
    'warn',
    '--health-interval-ms',
    '0',
    '--no-remote-tokenize',
  ]);
  let stderr = '';
  p.stderr!.on('data', (d) => (stderr += d));
  return { p, url: `http://127.0.0.1:${port}`, stderr: () => stderr };
}

/** A 2-token completion of `prompt` through a replica: the worker and overlap it was routed with, and the body. */
async function complete(url: string, prompt: number[]) {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock-model', prompt, max_tokens: 2 }),
  });
  expect(r.status).toBe(200);
  const body = (await r.json()) as { usage: { prompt_tokens_details?: { cached_tokens?: number } } };
  return { worker: r.headers.get('x-kvroute-worker'), overlap: Number(r.headers.get('x-kvroute-overlap-blocks')), body };
}

async function health(url: string): Promise<number> {
  try {
    return (await fetch(`${url}/health`)).status;
  } catch {
    return 0;
  }
}

beforeAll(async () => {
  await nats.start();
  mockers = await Promise.all(
    [0, 1].map(() => startMocker({ speedup: 1000, defaultMaxTokens: 2, engine: { blockSize: 16, numGpuBlocks: 512 }, seed: 3 })),
  );
}, 60_000);

afterAll(async () => {
  for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  await Promise.all(mockers.map((m) => m.close()));
  await nats.dispose();
});

describe('kvroute serve --nats', () => {
  it('discovers relayed workers, becomes ready, and routes by their KV events', async () => {
    mockers.forEach((m, i) => {
      spawnCli([
        'relay',
        '--nats',
        nats.url,
        '--worker',
        `eng${i}`,
        '--events',
        m.zmqEndpoint!,
        '--replay',
        m.replayEndpoint!,
        '--url',
        m.url,
        '--model',
        'mock-model',
        '--log-level',
        'warn',
      ]);
    });
    const { p: router, url, stderr } = await spawnReplica('r1');

    await until(
      async () => (await health(url)) === 200,
      40_000,
      () => `router ready (stderr: ${stderr()})`,
    );
    await until(
      async () => {
        const state = (await (await fetch(`${url}/debug/state`)).json()) as { router: { sources: unknown[] } };
        return state.router.sources.length === 2;
      },
      20_000,
      'both relayed workers discovered',
    );

    const prompt = Array.from({ length: 640 }, (_, i) => (i * 7919) % 50_000);
    const ask = () => complete(url, prompt);
    const first = await ask();
    expect(first.overlap).toBe(0);
    // Wait until the engine's Stored events have crossed relay -> JetStream -> replica.
    await until(
      async () => {
        const state = (await (await fetch(`${url}/debug/state`)).json()) as { router: { index: { blocks: number } } };
        return state.router.index.blocks >= 40;
      },
      20_000,
      'events indexed through NATS',
    );
    const second = await ask();
    expect(second.worker).toBe(first.worker);
    // 640 tokens = 40 full blocks, all cached on that engine; the engine serves 39 of them (never the last token).
    expect(second.overlap).toBe(40);
    expect(second.body.usage.prompt_tokens_details?.cached_tokens).toBe(39 * 16);

    router.kill('SIGTERM');
    const code = await new Promise<number | null>((resolve) => router.on('exit', resolve));
    expect(code).toBe(0);
  }, 120_000);

  it('runs as several --processes replicas: the primaries share the index and the load, the shells route', async () => {
    // The relays of the test above still feed JetStream (they stop in afterAll); a prompt of its own here.
    const replicas = await Promise.all(['pa', 'pb'].map((id) => spawnReplica(id, ['--processes', '2'])));
    for (const r of replicas) {
      await until(
        async () => (await health(r.url)) === 200,
        60_000,
        () => `replica ready (stderr: ${r.stderr()})`,
      );
      await until(
        async () =>
          ((await (await fetch(`${r.url}/debug/state`)).json()) as { router: { sources: unknown[] } }).router.sources.length === 2,
        20_000,
        'both relayed workers discovered',
      );
    }
    const [a, b] = replicas;
    const prompt = Array.from({ length: 640 }, (_, i) => (i * 104_729 + 17) % 50_000);
    const ask = (url: string) => complete(url, prompt);
    const counter = async (url: string, name: string) => {
      const text = await (await fetch(`${url}/metrics`)).text();
      const line = text.split('\n').find((l) => l.startsWith(`${name} `));
      return line ? Number(line.split(' ')[1]) : 0;
    };
    const first = await ask(a.url);
    expect(first.overlap).toBe(0);
    // The engine's Stored events reach replica b's primary through JetStream; b's shells route by them.
    await until(
      async () => (await ask(b.url)).overlap === 40,
      20_000,
      "replica b's shells see the blocks replica a's request left on the engine",
    );
    expect((await ask(b.url)).worker).toBe(first.worker);
    // Lifecycle shared: what a's shells routed, a's primary announced and b's primary folded into its active load.
    const published = await counter(a.url, 'router_nats_lifecycle_published_total');
    expect(published).toBeGreaterThanOrEqual(1);
    await until(async () => (await counter(b.url, 'router_nats_remote_requests_total')) >= 1, 10_000, "b counts a's requests");
    for (const r of replicas) r.p.kill('SIGTERM');
    const codes = await Promise.all(replicas.map((r) => new Promise<number | null>((resolve) => r.p.on('exit', resolve))));
    expect(codes).toEqual([0, 0]);
  }, 150_000);

  it('answers /health 503 "starting" until the replica is ready', async () => {
    let ready = false;
    const server = await startServer(
      { ...DEFAULTS, port: 0, workers: [], healthIntervalMs: 0, engineMetricsIntervalMs: 0, logLevel: 'silent' },
      { logger: pino({ level: 'silent' }), readiness: () => ready },
    );
    try {
      const before = await fetch(`${server.url}/health`);
      expect(before.status).toBe(503);
      expect(((await before.json()) as { status: string }).status).toBe('starting');
      ready = true;
      // Ready, but no worker yet: unavailable rather than starting.
      const after = await fetch(`${server.url}/health`);
      expect(((await after.json()) as { status: string }).status).toBe('unavailable');
    } finally {
      await server.close(100);
    }
  });
});
