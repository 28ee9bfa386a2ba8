/**
 * The live miss-ratio curve as a user runs it: `kvroute serve` (dist/, an embedded fleet of real mock engines over
 * ZMQ) fed token prompts, its GET /debug/mrc and router_kv_mrc_* gauges compared with an exact LRU prefix cache fed
 * the same hash chains in the test, and `kvroute hitrate --what-if` (text and --json) as a process.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { computeSeqHashes, islBlocks } from '../../src/core/hashing.ts';
import type { MrcReport } from '../../src/core/mrc.ts';
import { parsePrometheusText, sumOf } from '../../src/metrics/scrape.ts';
import { LruPrefixCache } from '../../src/sim/lru-prefix.ts';

const CLI = fileURLToPath(new URL('../../bin/kvroute.mjs', import.meta.url));
const BS = 16;
/** As docs/cache-sizing.md shows them; run through bash with `kvroute` the package's bin and the router's URL. */
const DOC_SERVE = 'kvroute serve --mrc-sample-rate 1 --mrc-max-samples 16384';
const DOC_WHAT_IF = 'kvroute hitrate --router http://localhost:8000 --what-if --host-blocks 65536';
const asRun = (doc: string) =>
  doc.replace(/^kvroute /, `${JSON.stringify(process.execPath)} ${JSON.stringify(CLI)} `).replace('http://localhost:8000', url);

let child: ChildProcess;
let url: string;
let out = '';

/** Conversations: 36 sessions over 6 system prompts of 1,024 tokens; each turn adds 800 tokens to its previous prompt. */
function prompts(): number[][] {
  const list: number[][] = [];
  const sessions = Array.from({ length: 36 }, (_, s) =>
    Array.from({ length: 1024 }, (_, i) => 1000 + (((s % 6) * 7919 + i * 31) % 50_000)),
  );
  for (let turn = 0; turn < 4; turn++) {
    for (let s = 0; s < sessions.length; s++) {
      for (let i = 0; i < 800; i++) sessions[s].push(2000 + ((s * 104_729 + turn * 613 + i * 17) % 60_000));
      list.push([...sessions[s]]);
    }
  }
  return list;
}

async function report(query = ''): Promise<MrcReport> {
  const res = await fetch(`${url}/debug/mrc${query}`);
  expect(res.status).toBe(200);
  return (await res.json()) as MrcReport;
}

beforeAll(async () => {
  // The documented command; the port, fleet size and probes come from the environment (the flags are the docs').
  child = spawn(process.execPath, [CLI, ...DOC_SERVE.split(' ').slice(1)], {
    env: { ...process.env, KVROUTE_LOG_LEVEL: 'info', KVROUTE_PORT: '0', KVROUTE_MOCK_WORKERS: '2', KVROUTE_HEALTH_INTERVAL_MS: '0' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  url = await new Promise<string>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`no listening line: ${out}`)), 60_000);
    const onData = (d: Buffer) => {
      out += d.toString();
      const m = /kvroute listening on (http:\/\/[\d.:]+)/.exec(out);
      if (m) {
        clearTimeout(t);
        resolve(m[1]);
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    child.once('exit', (code) => reject(new Error(`serve exited ${code}: ${out}`)));
  });
}, 90_000);

afterAll(async () => {
  if (child && child.exitCode === null) {
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    await exited;
  }
});

describe('live miss-ratio curve (kvroute serve as a process)', () => {
  it('matches an exact LRU prefix cache fed the same chains, in /debug/mrc, the gauges and hitrate --what-if', async () => {
    const all = prompts();
    const exactStream: { seq: BigUint64Array; isl: number }[] = [];
    for (const p of all) {
      const res = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'mock-model', prompt: p, max_tokens: 2 }),
      });
      expect(res.status, await res.clone().text()).toBe(200);
      await res.text();
      exactStream.push({ seq: computeSeqHashes(p, BS), isl: islBlocks(p.length, BS) });
    }
    // The engines' capacity is learned from their /metrics (cache_config_info): wait for it.
    let r = await report();
    for (let i = 0; i < 100 && r.fleetBlocks === null; i++) {
      await new Promise((res) => setTimeout(res, 100));
      r = await report();
    }
    expect(r.requests).toBe(all.length);
    expect(r.sampleRate).toBe(1);
    const fleet = r.fleetBlocks!;
    expect(fleet).toBeGreaterThan(0);
    const distinct = new Set<bigint>();
    for (const s of exactStream) for (const h of s.seq) distinct.add(h);
    // The traffic is larger than the smaller capacities, so the curve is not flat there.
    expect(distinct.size).toBeGreaterThan(fleet / 8);
    for (const point of r.fleet) {
      const cache = new LruPrefixCache(point.blocks!);
      for (const s of exactStream) cache.access(s.seq, s.isl);
      expect(Math.abs(point.hit! - cache.hitRatio), `factor ${point.factor}: exact ${cache.hitRatio}`).toBeLessThan(0.01);
    }
    const small = r.fleet.find((p) => p.factor === 0.125)!.hit!;
    const big = r.fleet.find((p) => p.factor === 16)!.hit!;
    expect(big - small).toBeGreaterThan(0.05);
    expect(Object.keys(r.models)).toEqual(['mock-model']);
    expect(Object.keys(r.engines)).toHaveLength(2);

    // Gauges: the same figures, labelled by model and factor.
    const text = await (await fetch(`${url}/metrics`)).text();
    const samples = parsePrometheusText(text).samples;
    for (const point of r.fleet) {
      expect(sumOf(samples, 'router_kv_mrc_hit_ratio', { model: '_all', capacity_factor: String(point.factor) })).toBeCloseTo(
        point.hit!,
        9,
      );
    }
    expect(text).toMatch(/# HELP router_kv_mrc_hit_ratio .*SHARDS.*rate 1/);
    expect(sumOf(samples, 'router_kv_mrc_fleet_blocks', {})).toBe(fleet);
    // Scale out: +1, +2, +4, +8 engines of today's mean size (two engines now).
    expect(r.scaleOut.map((p) => p.engines)).toEqual([3, 4, 6, 10]);
    for (const p of r.scaleOut) {
      // More blocks in all: at least today's hit (the fleet curve is monotone), at most the shared cache's asymptote.
      expect(p.hit!).toBeGreaterThanOrEqual(r.scaleUp.find((q) => q.factor === 1)!.hit! - 1e-9);
      expect(p.hit!).toBeLessThanOrEqual(r.fleet.find((q) => q.factor === 16)!.hit! + 1e-9);
      expect(sumOf(samples, 'router_kv_mrc_scale_out_hit_ratio', { engines_added: String(p.enginesAdded) })).toBeCloseTo(p.hit!, 9);
    }
    expect(r.locality).toBeGreaterThan(0);

    // Host tier: each engine's own blocks plus N; bad N is a 400.
    const withHost = await report(`?host_blocks=${fleet}`);
    expect(withHost.hostTier?.hostBlocksPerEngine).toBe(fleet);
    expect(withHost.hostTier!.hit!).toBeGreaterThanOrEqual(withHost.scaleUp.find((p) => p.factor === 1)!.hit!);
    const bad = await fetch(`${url}/debug/mrc?host_blocks=-3`);
    expect(bad.status).toBe(400);
    expect(await bad.text()).toContain('host_blocks must be an integer >= 0');

    // The CLI, as a process.
    const plain = spawnSync('bash', ['-c', asRun(DOC_WHAT_IF)], { encoding: 'utf8' });
    expect(plain.status, plain.stderr).toBe(0);
    const two = r.fleet.find((p) => p.factor === 2)!.hit!;
    const one = r.fleet.find((p) => p.factor === 1)!.hit!;
    expect(plain.stdout).toContain(`2x KV capacity: block-weighted hit ${one.toFixed(2)} -> ${two.toFixed(2)}`);
    // docs/cache-sizing.md shows the fleet-wide lines of this very report (they do not depend on which engine got what).
    const doc = readFileSync(fileURLToPath(new URL('../../docs/cache-sizing.md', import.meta.url)), 'utf8');
    const sample = /```\n(what more KV cache would buy[\s\S]*?)```/.exec(doc);
    expect(sample, 'the sample report in docs/cache-sizing.md').not.toBeNull();
    for (const line of sample![1].split('\n').filter((l) => /^fleet:|KV capacity:/.test(l))) {
      expect(plain.stdout.split('\n'), plain.stdout).toContain(line);
    }
    expect(plain.stdout).toMatch(/\+host tier of 65,536 blocks per engine: block-weighted hit \d\.\d\d -> \d\.\d\d/);
    expect(plain.stdout).toMatch(/\+2 engines \(4 in all\): block-weighted hit \d\.\d\d -> \d\.\d\d/);
    const asJson = spawnSync('bash', ['-c', `${asRun(DOC_WHAT_IF)} --json`], { encoding: 'utf8' });
    expect(asJson.status, asJson.stderr).toBe(0);
    const parsed = JSON.parse(asJson.stdout) as MrcReport;
    expect(parsed.fleet).toEqual(r.fleet);
    expect(parsed.hostTier?.hostBlocksPerEngine).toBe(65_536);
  }, 120_000);

  it('refuses bad settings and misuse with clear errors', () => {
    const rate = spawnSync(process.execPath, [CLI, 'serve', '--mrc-sample-rate', '2'], { encoding: 'utf8' });
    expect(rate.status).not.toBe(0);
    expect(rate.stderr).toMatch(/--mrc-sample-rate/);
    const samples = spawnSync(process.execPath, [CLI, 'serve', '--mrc-max-samples', '3'], { encoding: 'utf8', env: { ...process.env } });
    expect(samples.status).not.toBe(0);
    expect(samples.stderr).toMatch(/--mrc-max-samples/);
    const noRouter = spawnSync(process.execPath, [CLI, 'hitrate', '--what-if'], { encoding: 'utf8' });
    expect(noRouter.status).toBe(2);
    expect(noRouter.stderr).toContain('--what-if reads a live router');
    const host = spawnSync(process.execPath, [CLI, 'hitrate', '--router', url, '--what-if', '--host-blocks', 'lots'], { encoding: 'utf8' });
    expect(host.status).not.toBe(0);
    expect(host.stderr).toContain('--host-blocks must be an integer >= 0');
  }, 60_000);

  it('refuses a negative decay half-life', () => {
    const halfLife = spawnSync(process.execPath, [CLI, 'serve', '--mrc-half-life', '-5'], { encoding: 'utf8' });
    expect(halfLife.status).not.toBe(0);
    expect(halfLife.stderr).toMatch(/--mrc-half-life/);
  }, 60_000);
});
