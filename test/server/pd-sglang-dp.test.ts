/**
 * SGLang P/D with data parallelism: the decode rank kvroute chooses must be the rank the decode engine runs the request
 * on, whatever SGLang release serves it. The mock SGLang side reads the DP rank as a chosen release does
 * (src/engines/sglang/mock.ts): `header` (sgl-project/sglang#19832: x-data-parallel-rank, then routed_dp_rank),
 * `body` (#19268..#19832: routed_dp_rank and disagg_prefill_dp_rank, the header ignored; the fields lightseekorg/smg
 * model_gateway/src/routers/http/pd_router.rs @73da68ca sends), `legacy-body` (#6884..#19268: data_parallel_rank, which
 * the decode side also takes as the *prefill* rank to fetch from). kvroute sends the body fields and the header; never
 * data_parallel_rank.
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { SglangDpRouting } from '../../src/engines/sglang/mock.ts';
import { startMocker, type MockerHandle } from '../../src/mocker/server.ts';
import type { RunningServer } from '../../src/server/app.ts';
import { randomTokens, serve, sleep } from './helpers.ts';

const started: { close(): Promise<void> }[] = [];
afterEach(async () => {
  await Promise.all(started.splice(0).map((s) => s.close()));
});

async function fleet(routing: SglangDpRouting) {
  const m = (role: 'prefill' | 'decode', seed: number) =>
    startMocker({
      model: 'm',
      speedup: 50,
      seed,
      dataParallelSize: 2,
      pd: { role, protocol: 'sglang', bootstrapPort: 0, sglangDpRouting: routing },
    });
  const prefill = await m('prefill', 11);
  const decode = await m('decode', 12);
  started.push(prefill, decode);
  const spec = (h: MockerHandle, id: string, role: string) => ({
    url: h.url,
    id,
    events: h.zmqEndpoint!,
    dp: 2,
    role,
    engine: 'sglang',
    models: ['m'],
    ...(h.bootstrapPort !== null ? { bootstrap: h.bootstrapPort } : {}),
  });
  const s: RunningServer = await serve({
    workers: [spec(prefill, 'p0', 'prefill'), spec(decode, 'd0', 'decode')] as never,
    disaggMinUncachedTokens: 0,
  });
  started.push({ close: () => s.close(200) });
  return { prefill, decode, s };
}

/** Sends requests and returns, per request, the decode rank kvroute chose and the decode rank that ran it. */
async function runs(f: Awaited<ReturnType<typeof fleet>>, n: number) {
  const out: { chosen: number; ran: number[]; status: number }[] = [];
  for (let i = 0; i < n; i++) {
    const before = f.decode.engines.map((e) => e.cachedSeqHashes().size);
    const res = await fetch(`${f.s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: randomTokens(160, 300 + i), max_tokens: 2 }),
    });
    await res.arrayBuffer();
    await sleep(50);
    const worker = res.headers.get('x-kvroute-worker') ?? '';
    const chosen = worker.includes('#') ? Number(worker.split('#')[1]) : 0;
    const ran = f.decode.engines.flatMap((e, r) => (e.cachedSeqHashes().size > before[r] ? [r] : []));
    out.push({ chosen, ran, status: res.status });
  }
  return out;
}

describe('SGLang decode DP rank', () => {
  it('a release that reads routed_dp_rank but not the header (sglang#19268..#19832) runs each request on the chosen rank', async () => {
    const f = await fleet('body');
    const r = await runs(f, 6);
    for (const x of r) {
      expect(x.status).toBe(200);
      expect(x.ran).toEqual([x.chosen]);
    }
  }, 60_000);

  it('the newest releases (header first, sglang#19832) likewise', async () => {
    const f = await fleet('header');
    for (const x of await runs(f, 4)) {
      expect(x.status).toBe(200);
      expect(x.ran).toEqual([x.chosen]);
    }
  }, 60_000);

  it('a data_parallel_rank release (sglang#6884..#19268) still hands the KV over: its decode fetches from the room’s prefill rank', async () => {
    const f = await fleet('legacy-body');
    for (const x of await runs(f, 4)) {
      expect(x.status).toBe(200);
      expect(x.ran).toHaveLength(1);
    }
    expect(f.prefill.pd!.stats.bootstrapTimeouts).toBe(0);
  }, 60_000);
});
