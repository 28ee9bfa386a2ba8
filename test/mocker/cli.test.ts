import { afterAll, describe, expect, it } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createServer } from 'node:net';
import * as zmq from 'zeromq';
import { decodeVllmBatch } from '../../src/engines/vllm/events.ts';
import { decodeMsgpack, type Msg } from './independent-msgpack.ts';

const children: ChildProcess[] = [];
afterAll(() => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
});

function run(args: string[]): { child: ChildProcess; firstLine: Promise<string>; stderr: () => string } {
  const child = spawn(process.execPath, ['bin/kvroute.mjs', ...args], { cwd: process.cwd(), stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let err = '';
  child.stderr!.on('data', (d) => (err += d));
  const firstLine = new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (d) => {
      out += d;
      const k = out.indexOf('\n');
      if (k >= 0) resolve(out.slice(0, k));
    });
    child.on('exit', (code) => reject(new Error(`exited ${code}: ${err}`)));
  });
  firstLine.catch(() => {}); // a test that expects the process to fail never awaits it
  return { child, firstLine, stderr: () => err };
}

describe('kvroute mocker CLI', () => {
  it('starts, serves, publishes on the reported endpoints, and stops on SIGTERM', async () => {
    const { child, firstLine } = run([
      'mocker',
      '--port',
      '0',
      '--host',
      '127.0.0.1',
      '--model',
      'cli-model',
      '--zmq-endpoint',
      'tcp://127.0.0.1:*',
      '--replay-endpoint',
      'none',
      '--data-parallel-size',
      '2',
      '--block-size',
      '32',
      '--speedup',
      '100',
      '--timing',
      'first-principles',
    ]);
    const info = JSON.parse(await firstLine);
    expect(info.zmqEndpoints).toHaveLength(2);
    expect(info.replayEndpoints).toEqual([]);
    const r = await fetch(`${info.url}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ model: 'cli-model', prompt: Array.from({ length: 70 }, (_, i) => i), max_tokens: 2 }),
    });
    expect(r.status).toBe(200);
    const metrics = await (await fetch(`${info.url}/metrics`)).text();
    expect(metrics).toMatch(/vllm:cache_config_info\{[^}]*block_size="32"/);
    child.kill('SIGTERM');
    const [code] = await once(child, 'exit');
    expect(code).toBe(0);
  });

  it('--hybrid gpt-oss publishes each cache group apart, decoded by the router codec', async () => {
    const { child, firstLine } = run([
      'mocker',
      '--port',
      '0',
      '--host',
      '127.0.0.1',
      '--zmq-endpoint',
      'tcp://127.0.0.1:*',
      '--replay-endpoint',
      'none',
      '--hybrid',
      'gpt-oss',
      '--event-format',
      'array',
      '--speedup',
      '100',
    ]);
    const info = JSON.parse(await firstLine);
    const sub = new zmq.Subscriber({ linger: 0, receiveTimeout: 5000 });
    try {
      sub.connect(info.zmqEndpoints[0]);
      sub.subscribe();
      const first = sub.receive();
      await new Promise((r) => setTimeout(r, 300)); // ZMQ slow joiner
      const r = await fetch(`${info.url}/v1/completions`, {
        method: 'POST',
        body: JSON.stringify({ prompt: Array.from({ length: 70 }, (_, i) => i), max_tokens: 1 }),
      });
      expect(r.status).toBe(200);
      const [, , payload] = await first;
      const d = decodeVllmBatch(payload);
      const groups = d.events.map((e) => (e.kind === 'stored' ? [e.groupIdx, e.groupKind, e.slidingWindow] : null));
      expect(groups).toEqual([
        [1, 'full_attention', undefined],
        [0, 'sliding_window', 128],
      ]);
    } finally {
      sub.close();
    }
    child.kill('SIGTERM');
    const [code] = await once(child, 'exit');
    expect(code).toBe(0);
  });

  it('rejects a bad --hybrid layout with one line, exit 2', async () => {
    const { child, stderr } = run(['mocker', '--hybrid', 'mamba,sliding:64']);
    const [code] = await once(child, 'exit');
    expect(code).toBe(2);
    expect(stderr().trim().split('\n')).toHaveLength(1);
    expect(stderr()).toMatch(/--hybrid: a hybrid layout needs a full-attention group/);
  });

  it('rejects bad flags with a clear message', async () => {
    const { child } = run(['mocker', '--block-size', 'zero']);
    let err = '';
    child.stderr!.on('data', (d) => (err += d));
    const [code] = await once(child, 'exit');
    expect(code).not.toBe(0);
    expect(err).toMatch(/--block-size must be an integer/);
  });
});

/** True when nothing listens on `port` (all interfaces, as a mocker binding tcp://*:PORT would). */
function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.once('error', () => resolve(false));
    srv.listen(port, '0.0.0.0', () => srv.close(() => resolve(true)));
  });
}

/** A base port with `n` consecutive free ports above it. */
async function freeRun(n: number): Promise<number> {
  for (let attempt = 0; attempt < 100; attempt++) {
    const base = 20_000 + Math.floor(Math.random() * 30_000);
    let ok = true;
    for (let p = base; p < base + n && ok; p++) ok = await portFree(p);
    if (ok) return base;
  }
  throw new Error(`no run of ${n} free ports found`);
}

const portOf = (ep: string) => Number(/:(\d+)$/.exec(ep)![1]);

interface Started {
  url: string;
  zmqEndpoints: string[];
  replayEndpoints: string[];
}

/** Publishes one batch on `rank` (a completion pinned to it), returns it as received on PUB and as replayed from seq 0. */
async function publishAndReplay(m: Started, rank: number) {
  const sub = new zmq.Subscriber({ linger: 0 });
  const dealer = new zmq.Dealer({ linger: 0, receiveTimeout: 5000 });
  try {
    sub.connect(m.zmqEndpoints[rank]);
    sub.subscribe();
    const first = sub.receive();
    await new Promise((r) => setTimeout(r, 300)); // ZMQ slow joiner: let the subscription reach the publisher
    const r = await fetch(`${m.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-data-parallel-rank': String(rank) },
      body: JSON.stringify({ prompt: Array.from({ length: 40 }, (_, i) => 100 * rank + i), max_tokens: 1 }),
    });
    expect(r.status).toBe(200);
    const [, seq, payload] = await first;
    expect(seq.readBigUInt64BE(0)).toBe(0n);
    dealer.connect(m.replayEndpoints[rank]);
    await dealer.send([Buffer.alloc(0), Buffer.alloc(8)]);
    const replayed: Buffer[] = [];
    for (;;) {
      const [, s, p] = await dealer.receive();
      if (s.readBigUInt64BE(0) === 0xffffffffffffffffn) break;
      replayed.push(p);
    }
    const batch = decodeMsgpack(payload) as Msg[];
    return { payload, replayed, rankInBatch: batch[2] };
  } finally {
    sub.close();
    dealer.close();
  }
}

describe('kvroute mocker: default replay ports', () => {
  it('two mocker processes with different --zmq-endpoint and default replay ports, one of them DP 2, start, serve, publish and replay', async () => {
    const base = await freeRun(6);
    // A: DP 2 on base → events base, base+1; replay base+2, base+3. B: one rank on base+4 → events base+4, replay base+5.
    const common = ['--port', '0', '--host', '127.0.0.1', '--speedup', '100'];
    const a = run(['mocker', ...common, '--zmq-endpoint', `tcp://*:${base}`, '--data-parallel-size', '2']);
    const b = run(['mocker', ...common, '--zmq-endpoint', `tcp://*:${base + 4}`]);
    const [ia, ib] = (await Promise.all([a.firstLine, b.firstLine])).map((l) => JSON.parse(l) as Started);
    expect(ia.zmqEndpoints.map(portOf)).toEqual([base, base + 1]);
    expect(ia.replayEndpoints.map(portOf)).toEqual([base + 2, base + 3]);
    expect(ib.zmqEndpoints.map(portOf)).toEqual([base + 4]);
    expect(ib.replayEndpoints.map(portOf)).toEqual([base + 5]);
    for (const [m, rank] of [
      [ia, 0],
      [ia, 1],
      [ib, 0],
    ] as const) {
      const got = await publishAndReplay(m, rank);
      expect(got.rankInBatch).toBe(rank);
      expect(got.replayed).toHaveLength(1);
      expect(got.replayed[0].equals(got.payload)).toBe(true);
    }
    for (const c of [a.child, b.child]) c.kill('SIGTERM');
    const codes = await Promise.all([a.child, b.child].map(async (c) => (await once(c, 'exit'))[0]));
    expect(codes).toEqual([0, 0]);
  });

  it('refuses a replay endpoint that overlaps the event ports, with one line saying what to do', async () => {
    const base = await freeRun(3);
    const { child, stderr } = run([
      'mocker',
      '--port',
      '0',
      '--zmq-endpoint',
      `tcp://*:${base}`,
      '--data-parallel-size',
      '2',
      '--replay-endpoint',
      `tcp://*:${base + 1}`,
    ]);
    const [code] = await once(child, 'exit');
    expect(code).toBe(1);
    expect(stderr()).toMatch(new RegExp(`replay ports ${base + 1}-${base + 2} overlap event ports ${base}-${base + 1}`));
    expect(stderr().trim().split('\n')).toHaveLength(1);
  });

  it('documents the rule in --help', async () => {
    const { child } = run(['mocker', '--help']);
    let out = '';
    child.stdout!.on('data', (d) => (out += d));
    const [code] = await once(child, 'exit');
    expect(code).toBe(0);
    expect(out.replace(/\s+/g, ' ')).toContain('Default: the ports right after the event ports, event port + data-parallel size');
  });
});
