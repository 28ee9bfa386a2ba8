/**
 * The hit-rate truth is the same behind a gateway as in front of the fleet: the same traffic through `kvroute serve`
 * and through `kvroute epp` (both processes from the built package, each in front of its own identical mock fleet)
 * leaves the same ledger figures (delivered cached tokens, requests whose delivered reuse is known, predicted), and
 * the client sees the same answer shape: no usage chunk it did not ask for, and under P/D the prefill's cached tokens.
 * The picker gets there as serve does, by asking the engine for usage in streams (stream_options.include_usage) and
 * rewriting the answer (FULL_DUPLEX_STREAMED lets it mutate both bodies: envoyproxy/data-plane-api @84e84367
 * processing_mode.proto).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { afterAll, describe, expect, it } from 'vitest';
import { type MockerHandle, type MockerOptions, startMocker } from '../../src/mocker/server.ts';
import { randomTokens } from '../server/helpers.ts';
import { EnvoySide } from './envoy-side.ts';
import { CLI, type EppProcess, eventually, metric, metricsText, startEpp } from './picker.ts';

const mocks: MockerHandle[] = [];
const procs: EppProcess[] = [];
const serves: ChildProcess[] = [];
const clients: EnvoySide[] = [];

afterAll(async () => {
  for (const c of clients) c.close();
  for (const s of serves) s.kill('SIGTERM');
  await Promise.all(procs.map((p) => p.stop()));
  await Promise.all(mocks.map((m) => m.close()));
});

async function mock(seed: number, extra: Partial<MockerOptions> = {}): Promise<MockerHandle> {
  const m = await startMocker({ model: 'm', speedup: 50, seed, ...extra } as MockerOptions);
  mocks.push(m);
  return m;
}

/** `kvroute serve` as a process; resolves with its URL. */
async function startServe(args: string[]): Promise<string> {
  const proc = spawn(process.execPath, [CLI, 'serve', '--port', '0', '--health-interval-ms', '200', ...args], {
    env: { ...process.env, KVROUTE_LOG_LEVEL: 'info' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  serves.push(proc);
  let out = '';
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`kvroute serve did not start: ${out}`)), 30_000);
    proc.stderr!.on('data', (d: Buffer) => {
      out += d.toString();
    });
    proc.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /kvroute listening on (http:\/\/[\d.:]+)/.exec(out);
      if (m) {
        clearTimeout(t);
        resolve(m[1]);
      }
    });
    proc.once('exit', (code) => reject(new Error(`kvroute serve exited ${code}: ${out}`)));
  });
}

const LEDGER = [
  'router_kv_engine_cached_tokens_total',
  'router_kv_engine_prompt_tokens_total',
  'router_kv_delivered_hit_rate_count',
  'router_kv_predicted_cached_tokens_total',
  'router_kv_hit_rate_count',
] as const;

const ledger = (text: string) => Object.fromEntries(LEDGER.map((n) => [n, metric(text, n)]));

/** A chat-completions stream's usage chunks, as the client received them. */
const usageChunks = (sse: string) =>
  sse
    .split('\n\n')
    .filter((e) => e.startsWith('data: {') && e.includes('"usage"'))
    .map((e) => JSON.parse(e.slice(6)) as { usage?: { prompt_tokens_details?: { cached_tokens?: number } } })
    .filter((c) => c.usage);

interface Traffic {
  readonly body: string;
  readonly stream: boolean;
}

function traffic(): Traffic[] {
  const shared = randomTokens(160, 41);
  const out: Traffic[] = [];
  for (let i = 0; i < 6; i++) {
    const prompt = [...shared, ...randomTokens(24, 500 + i)];
    const stream = i % 3 !== 2;
    const extra: Record<string, unknown> = stream ? { stream: true, ...(i === 3 ? { stream_options: { include_usage: true } } : {}) } : {};
    out.push({ body: JSON.stringify({ model: 'm', prompt, max_tokens: 3, ...extra }), stream });
  }
  return out;
}

/** Runs the traffic through both routers, one request at a time, each after the last one's KV events arrived. */
async function runBoth(serveUrl: string, picker: EppProcess, envoy: EnvoySide, blocksAfter: (i: number) => number) {
  const viaServe: string[] = [];
  const viaEpp: string[] = [];
  for (const [i, t] of traffic().entries()) {
    const r = await fetch(`${serveUrl}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: t.body });
    expect(r.status).toBe(200);
    viaServe.push(await r.text());
    const e = await envoy.roundTrip({ body: t.body });
    if (!('picked' in e)) throw new Error(`immediate: ${JSON.stringify(e.immediate)}`);
    expect(e.response.status).toBe(200);
    viaEpp.push(e.response.echoed);
    const want = blocksAfter(i);
    await eventually(async () => metric(await (await fetch(`${serveUrl}/metrics`)).text(), 'router_kv_index_blocks') >= want);
    await eventually(async () => metric(await metricsText(picker), 'router_kv_index_blocks') >= want);
  }
  await eventually(async () => metric(await metricsText(picker), 'router_requests_in_flight') === 0);
  return { viaServe, viaEpp };
}

describe('the same traffic through kvroute serve and kvroute epp', () => {
  it('aggregated: the same ledger, and the client gets no usage chunk it did not ask for', async () => {
    const [a, b] = [await mock(9), await mock(9)];
    const serveUrl = await startServe(['-w', `${a.url},events=${a.zmqEndpoint},id=w0,model=m`]);
    const picker = await startEpp(['-w', `${b.url},events=${b.zmqEndpoint},id=w0,model=m`]);
    procs.push(picker);
    const envoy = new EnvoySide(picker.address);
    clients.push(envoy);
    await eventually(async () => (await envoy.check('readiness')).status === 1);
    const { viaServe, viaEpp } = await runBoth(serveUrl, picker, envoy, () => 10);
    for (const [i, t] of traffic().entries()) {
      if (!t.stream) continue;
      // Usage only where the client asked for it (request 3), through either router.
      expect(usageChunks(viaEpp[i]).length, `request ${i}`).toBe(usageChunks(viaServe[i]).length);
      expect(usageChunks(viaEpp[i]).length, `request ${i}`).toBe(i === 3 ? 1 : 0);
      expect(viaEpp[i]).toContain('data: [DONE]');
    }
    const s = ledger(await (await fetch(`${serveUrl}/metrics`)).text());
    const e = ledger(await metricsText(picker));
    expect(e).toEqual(s);
    // Every request's delivered reuse is known (the picker asked for the usage the clients did not).
    expect(e.router_kv_delivered_hit_rate_count).toBe(6);
    expect(e.router_kv_engine_cached_tokens_total).toBeGreaterThan(0);
  }, 120_000);

  it('disaggregated (vLLM): the same ledger, and the client sees the prefill pool’s cached tokens', async () => {
    const fleet = async (seed: number) => {
      const p = await mock(seed, { pd: { role: 'prefill', protocol: 'vllm' } } as Partial<MockerOptions>);
      const d = await mock(seed + 1, { pd: { role: 'decode', protocol: 'vllm' } } as Partial<MockerOptions>);
      return [
        '-w',
        `${p.url},events=${p.zmqEndpoint},id=p0,model=m,role=prefill,engine=vllm`,
        '-w',
        `${d.url},events=${d.zmqEndpoint},id=d0,model=m,role=decode,engine=vllm`,
        '--disagg-min-uncached-tokens',
        '0',
      ];
    };
    const serveUrl = await startServe(await fleet(21));
    const picker = await startEpp(await fleet(21));
    procs.push(picker);
    const envoy = new EnvoySide(picker.address);
    clients.push(envoy);
    await eventually(async () => (await envoy.check('readiness')).status === 1);
    const { viaServe, viaEpp } = await runBoth(serveUrl, picker, envoy, () => 10);
    for (const [i, t] of traffic().entries()) {
      const cached = (text: string) =>
        t.stream
          ? usageChunks(text).map((c) => c.usage?.prompt_tokens_details?.cached_tokens)
          : [
              (JSON.parse(text) as { usage: { prompt_tokens_details?: { cached_tokens?: number } } }).usage.prompt_tokens_details
                ?.cached_tokens,
            ];
      expect(cached(viaEpp[i]), `request ${i}`).toEqual(cached(viaServe[i]));
    }
    // The shared prefix was prefilled once: later requests report the prefill worker's hit.
    const last = JSON.parse(viaEpp[5]) as { usage: { prompt_tokens_details: { cached_tokens: number } } };
    expect(last.usage.prompt_tokens_details.cached_tokens).toBeGreaterThanOrEqual(144);
    expect(ledger(await metricsText(picker))).toEqual(ledger(await (await fetch(`${serveUrl}/metrics`)).text()));
  }, 120_000);
});
