/**
 * The NATS fault-injection soak (`npm run chaos -- --nats [--rounds 20]`): 3 mock engines (in this process, so their
 * true caches can be read), a `kvroute relay` process each (the built package, with replay endpoints), 2 router
 * replicas (child processes running NatsReplica + KvRouter, so they can be SIGKILLed and still be asked for their exact
 * index) and a private nats-server with JetStream. Prompts go to the engines directly, steadily, so only KV events can
 * tell the replicas. Each round injects one fault, in turn:
 *
 *   nats-restart      nats-server SIGKILLed and restarted on the same store (it may lose unflushed messages)
 *   relay-kill        a relay SIGKILLed under traffic, restarted
 *   replica-kill      a replica SIGKILLed, restarted (snapshot + stream)
 *   burst             every engine drops 30% of its event batches on the wire under a burst of requests
 *   relay-stop        a relay SIGSTOPped past the replicas' worker heartbeat TTL (3 s), then SIGCONT
 *   snapshot-corrupt  the stored snapshot corrupted (or truncated, alternately), then a replica restarted onto it
 *   engine-restart    an engine restarted (empty cache, event ids from 0)
 *   partition         (root only: `ip netns`) a third replica runs in a network namespace of its own, joined to this
 *                     host by a veth pair; its link is taken down for 4 s (no route to NATS), then up again. The
 *                     namespace and the veth pair are made at the start and removed at the end.
 *
 * After each fault the traffic stops (the quiet period) and every replica's index is compared with every engine's
 * actual block set, exactly, until equal (healed: time measured from the start of the quiet period) or 20 s (not
 * healed). Requests lost are engine requests that failed or got no answer in 10 s. Prints one line per round and a
 * summary; exit code 1 when a round did not heal or a request was lost.
 */
import { usage } from './usage.ts';
import { type ChildProcess, execFileSync, fork, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { connect } from '@nats-io/transport-node';
import { Objm } from '@nats-io/obj';
import { KvRouter } from '../src/core/router.ts';
import { quietLog } from '../src/log.ts';
import { startMocker, type MockerHandle } from '../src/mocker/server.ts';
import { SNAPSHOT_BUCKET, SNAPSHOT_NAME } from '../src/transport/nats/protocol.ts';
import { NatsReplica } from '../src/transport/nats/replica.ts';
import { NatsServer } from '../test/nats/nats-server.ts';

usage(import.meta.url);

const BS = 16;
const WORKER_TTL_MS = 3000;
const HEAL_TIMEOUT_MS = 20_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const ROOT = fileURLToPath(new URL('..', import.meta.url));

export const FAULTS = [
  'nats-restart',
  'relay-kill',
  'replica-kill',
  'burst',
  'relay-stop',
  'snapshot-corrupt',
  'engine-restart',
  'partition',
] as const;
export type Fault = (typeof FAULTS)[number];

/** A network namespace with a veth pair to this host: made, cut, healed and removed with `ip`. */
class NetNs {
  readonly ns = `kvr${process.pid}`;
  readonly hostIf = `kvh${process.pid}`.slice(0, 15);
  readonly nsIf = `kvn${process.pid}`.slice(0, 15);
  readonly hostIp = '10.231.7.1';
  readonly nsIp = '10.231.7.2';
  private made = false;

  private static ip(args: string[]): void {
    execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  }

  /** Makes the namespace and the veth pair; false (nothing left behind) when this user may not. */
  make(): boolean {
    try {
      NetNs.ip(['netns', 'add', this.ns]);
      this.made = true;
      NetNs.ip(['link', 'add', this.hostIf, 'type', 'veth', 'peer', 'name', this.nsIf]);
      NetNs.ip(['link', 'set', this.nsIf, 'netns', this.ns]);
      NetNs.ip(['addr', 'add', `${this.hostIp}/30`, 'dev', this.hostIf]);
      NetNs.ip(['link', 'set', this.hostIf, 'up']);
      NetNs.ip(['netns', 'exec', this.ns, 'ip', 'addr', 'add', `${this.nsIp}/30`, 'dev', this.nsIf]);
      NetNs.ip(['netns', 'exec', this.ns, 'ip', 'link', 'set', this.nsIf, 'up']);
      NetNs.ip(['netns', 'exec', this.ns, 'ip', 'link', 'set', 'lo', 'up']);
      return true;
    } catch {
      this.remove();
      return false;
    }
  }

  cut(down: boolean): void {
    NetNs.ip(['link', 'set', this.hostIf, down ? 'down' : 'up']);
  }

  remove(): void {
    if (!this.made) return;
    this.made = false;
    for (const args of [
      ['link', 'del', this.hostIf],
      ['netns', 'del', this.ns],
    ]) {
      try {
        NetNs.ip(args);
      } catch {
        // already gone
      }
    }
  }
}

// ------------------------------------------------------------------------------------------ child: one replica

interface Dump {
  type: 'dump';
  ready: boolean;
  sources: Record<string, string[]>;
  degraded: string[];
  stats: Record<string, unknown>;
}

async function replicaChild(url: string, id: string): Promise<void> {
  const router = new KvRouter({ blockSize: BS, overlay: false, seed: 1 });
  const replica = new NatsReplica({ servers: url, replicaId: id, snapshotIntervalMs: 3000, workerTtlMs: WORKER_TTL_MS, log: quietLog });
  process.on('message', (m: { type: string }) => {
    if (m.type !== 'dump') return;
    const snap = router.snapshot();
    const sources: Record<string, string[]> = {};
    for (const key of snap.keys) sources[key] = [...(snap.source(key)?.seqHashes ?? [])].map(String);
    const d: Dump = {
      type: 'dump',
      ready: replica.isReady(),
      sources,
      degraded: [...router.degradedSources()].map(([k, v]) => `${k}:${v.reason}`),
      stats: replica.stats() as unknown as Record<string, unknown>,
    };
    process.send!(d);
  });
  await replica.start(router);
  process.send!({ type: 'ready' });
}

// ------------------------------------------------------------------------------------------ main

interface Replica {
  id: string;
  proc: ChildProcess;
}

export interface NatsChaosReport {
  rounds: Array<{ round: number; fault: Fault; healedMs: number | null; detail: string }>;
  requests: number;
  lost: number;
  lines: string[];
}

function percentile(xs: number[], p: number): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

export async function runNatsChaos(rounds: number, log: (s: string) => void): Promise<NatsChaosReport> {
  const script = fileURLToPath(import.meta.url);
  const netns = new NetNs();
  const partitions = netns.make();
  if (!partitions) log('chaos-nats: partition rounds skipped: `ip netns add` is not permitted here (needs root / CAP_NET_ADMIN)');
  const faults = FAULTS.filter((f) => f !== 'partition' || partitions);
  const nats = new NatsServer({ host: partitions ? '0.0.0.0' : '127.0.0.1' });
  await nats.start();
  const engines: MockerHandle[] = [];
  for (let i = 0; i < 3; i++) {
    engines.push(await startMocker({ speedup: 1000, defaultMaxTokens: 2, engine: { blockSize: BS, numGpuBlocks: 256 }, seed: i + 1 }));
  }
  const ids = engines.map((_, i) => `eng${i}`);
  const children = new Set<ChildProcess>();
  const relays: ChildProcess[] = [];
  const startRelay = (i: number): ChildProcess => {
    const e = engines[i];
    const p = spawn(
      process.execPath,
      [
        'bin/kvroute.mjs',
        'relay',
        '--nats',
        nats.url,
        '--worker',
        ids[i],
        '--events',
        e.zmqEndpoint!,
        '--replay',
        e.replayEndpoint!,
        '--url',
        e.url,
        '--model',
        'mock-model',
        '--log-level',
        'error',
      ],
      { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] },
    );
    children.add(p);
    p.once('exit', () => children.delete(p));
    relays[i] = p;
    return p;
  };
  const replicas: Replica[] = [];
  const startReplica = async (id: string, inNs = false): Promise<Replica> => {
    const proc = inNs
      ? spawn(
          'ip',
          [
            'netns',
            'exec',
            netns.ns,
            process.execPath,
            '--import',
            'tsx',
            script,
            '--nats-replica-child',
            `nats://${netns.hostIp}:${nats.port}`,
            id,
          ],
          { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit', 'ipc'] },
        )
      : fork(script, ['--nats-replica-child', nats.url, id], {
          execArgv: ['--import', 'tsx'],
          stdio: ['ignore', 'ignore', 'inherit', 'ipc'],
        });
    children.add(proc);
    proc.once('exit', () => children.delete(proc));
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`replica ${id} not ready in 60 s`)), 60_000);
      proc.on('message', (m: { type: string }) => {
        if (m.type === 'ready') {
          clearTimeout(t);
          resolve();
        }
      });
    });
    return { id, proc };
  };
  const dump = (r: Replica): Promise<Dump | null> =>
    new Promise((resolve) => {
      if (r.proc.exitCode !== null || r.proc.signalCode !== null) return resolve(null);
      const t = setTimeout(() => resolve(null), 5000);
      const on = (m: Dump) => {
        if (m.type !== 'dump') return;
        clearTimeout(t);
        r.proc.off('message', on);
        resolve(m);
      };
      r.proc.on('message', on);
      r.proc.send({ type: 'dump' });
    });
  const kill = (p: ChildProcess, signal: NodeJS.Signals = 'SIGKILL') =>
    new Promise<void>((resolve) => {
      if (p.exitCode !== null || p.signalCode !== null) return resolve();
      p.once('exit', () => resolve());
      p.kill(signal);
    });

  // Traffic: each engine gets prompts from its own client loop; shared prefixes so blocks are reused and evicted.
  let requests = 0;
  let lost = 0;
  const lostWhy: string[] = [];
  let trafficOn = false;
  let seed = 1;
  const prompt = () => {
    const s = seed++;
    const sys = s % 5;
    return [
      ...Array.from({ length: 48 }, (_, i) => 100 + sys * 1000 + i),
      ...Array.from({ length: 20 + (s % 60) }, (_, i) => 1 + ((s * 7919 + i * 104_729) % 30_000)),
    ];
  };
  const send = async (e: MockerHandle) => {
    requests++;
    try {
      const r = await fetch(`${e.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'mock-model', prompt: prompt(), max_tokens: 2 }),
        signal: AbortSignal.timeout(10_000),
      });
      await r.arrayBuffer();
      if (r.status !== 200) throw new Error(`HTTP ${r.status}`);
    } catch (err) {
      lost++;
      if (lostWhy.length < 5) lostWhy.push(String(err));
    }
  };
  let clients: Promise<void>[] = [];
  const startTraffic = () => {
    trafficOn = true;
    clients = engines.map(async (e) => {
      while (trafficOn) {
        await send(e);
        await sleep(15);
      }
    });
  };
  const stopTraffic = async () => {
    trafficOn = false;
    await Promise.all(clients);
  };

  const lines: string[] = [];
  const out = (s: string) => {
    lines.push(s);
    log(s);
  };
  const report: NatsChaosReport = { rounds: [], requests: 0, lost: 0, lines };
  try {
    for (let i = 0; i < engines.length; i++) startRelay(i);
    replicas.push(await startReplica('rep0'), await startReplica('rep1'));
    if (partitions) replicas.push(await startReplica('rep-ns', true));

    /** Compares every replica with every engine; '' when all equal. */
    const compare = async (): Promise<string> => {
      const diffs: string[] = [];
      for (const r of replicas) {
        const d = await dump(r);
        if (!d) {
          diffs.push(`${r.id}: no answer`);
          continue;
        }
        if (!d.ready) diffs.push(`${r.id}: not ready`);
        engines.forEach((e, i) => {
          const truth = new Set([...e.engine.cachedSeqHashes()].map(String));
          const mine = new Set(d.sources[ids[i]] ?? []);
          let missing = 0;
          let extra = 0;
          for (const h of truth) if (!mine.has(h)) missing++;
          for (const h of mine) if (!truth.has(h)) extra++;
          if (missing + extra > 0)
            diffs.push(`${r.id} ${ids[i]}: engine ${truth.size}, index ${mine.size}, missing ${missing}, extra ${extra}`);
        });
        if (d.degraded.length > 0) diffs.push(`${r.id} degraded: ${d.degraded.join(', ')}`);
      }
      return diffs.join('; ');
    };
    const quiet = async (): Promise<{ healedMs: number | null; detail: string }> => {
      await stopTraffic();
      // One request per engine: a batch dropped last is only seen as a gap when the next one arrives.
      await Promise.all(engines.map((e) => send(e)));
      const t0 = Date.now();
      let diff = await compare();
      while (diff !== '' && Date.now() - t0 < HEAL_TIMEOUT_MS) {
        await sleep(200);
        diff = await compare();
      }
      return diff === '' ? { healedMs: Date.now() - t0, detail: 'equal' } : { healedMs: null, detail: diff };
    };

    startTraffic();
    await sleep(1500);
    const first = await quiet();
    out(
      `chaos-nats: warm-up ${first.healedMs === null ? `NOT equal: ${first.detail}` : `index equal to the engines after ${first.healedMs} ms`}`,
    );
    let snapshotFlip = 0;
    for (let round = 0; round < rounds; round++) {
      const fault = faults[round % faults.length];
      const target = round % engines.length;
      startTraffic();
      await sleep(800);
      switch (fault) {
        case 'nats-restart':
          await nats.stop();
          await sleep(800);
          await nats.start();
          break;
        case 'relay-kill':
          await kill(relays[target]);
          await sleep(600);
          startRelay(target);
          break;
        case 'replica-kill': {
          const r = replicas[round % 2]; // rep0 or rep1 (rep-ns is cut off by the partition rounds)
          await kill(r.proc);
          await sleep(300);
          replicas[replicas.indexOf(r)] = await startReplica(r.id);
          break;
        }
        case 'burst':
          for (const e of engines) e.faults.dropEventFraction = 0.3;
          await Promise.all(engines.flatMap((e) => Array.from({ length: 40 }, () => send(e))));
          for (const e of engines) e.faults.dropEventFraction = 0;
          break;
        case 'relay-stop':
          relays[target].kill('SIGSTOP');
          await sleep(WORKER_TTL_MS + 1500);
          relays[target].kill('SIGCONT');
          break;
        case 'snapshot-corrupt': {
          const nc = await connect({ servers: nats.url });
          try {
            const os = await new Objm(nc).open(SNAPSHOT_BUCKET);
            const data = await os.getBlob(SNAPSHOT_NAME);
            const info = await os.info(SNAPSHOT_NAME);
            if (data && info) {
              const bad = snapshotFlip++ % 2 === 0 ? data.slice() : data.slice(0, Math.floor(data.length / 2));
              if (bad.length === data.length) bad[Math.floor(bad.length / 2)] ^= 0xff;
              await os.putBlob({ name: SNAPSHOT_NAME, description: info.description }, bad);
            }
          } finally {
            await nc.close();
          }
          const r = replicas[round % 2]; // rep0 or rep1 (rep-ns is cut off by the partition rounds)
          await kill(r.proc);
          replicas[replicas.indexOf(r)] = await startReplica(r.id);
          break;
        }
        case 'engine-restart':
          await engines[target].restart();
          break;
        case 'partition':
          netns.cut(true);
          await sleep(4000);
          netns.cut(false);
          break;
      }
      await sleep(500);
      const q = await quiet();
      report.rounds.push({ round: round + 1, fault, healedMs: q.healedMs, detail: q.detail });
      out(
        `chaos-nats: round ${round + 1} ${fault}: ${q.healedMs === null ? `NOT healed in ${HEAL_TIMEOUT_MS} ms: ${q.detail}` : `healed in ${q.healedMs} ms`}`,
      );
    }
  } finally {
    trafficOn = false;
    await Promise.all(clients);
    for (const p of relays) p?.kill('SIGCONT');
    await Promise.all([...children].map((p) => kill(p)));
    await Promise.all(engines.map((e) => e.close()));
    await nats.dispose();
    netns.remove();
  }
  report.requests = requests;
  report.lost = lost;
  const healed = report.rounds.filter((r) => r.healedMs !== null).map((r) => r.healedMs!);
  const byFault = new Map<string, number>();
  for (const r of report.rounds) byFault.set(r.fault, (byFault.get(r.fault) ?? 0) + 1);
  out(
    `chaos-nats summary: ${report.rounds.length} faults injected (${[...byFault].map(([f, n]) => `${f} ${n}`).join(', ')}); ` +
      `recovered ${healed.length}/${report.rounds.length}; time to heal p50 ${percentile(healed, 50)} ms, max ${healed.length ? Math.max(...healed) : Number.NaN} ms; ` +
      `requests ${requests}, lost ${lost}${lostWhy.length ? ` (${lostWhy.join(' | ')})` : ''}`,
  );
  return report;
}

if (process.argv.includes('--nats-replica-child')) {
  const i = process.argv.indexOf('--nats-replica-child');
  replicaChild(process.argv[i + 1], process.argv[i + 2]).catch((err) => {
    console.error(err);
    process.exit(1);
  });
}
