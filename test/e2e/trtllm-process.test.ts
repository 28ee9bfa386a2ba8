/**
 * The built package as a user runs it, for TensorRT-LLM: two mock engines speaking TensorRT-LLM's formats (JSON KV
 * events drained by POST /kv_cache_events, the disaggregated_params handoff) and `kvroute serve` in front of them with
 * `engine=trtllm` workers. A P/D request goes through; its prefix is then found in the index fed by the polled events;
 * the prefill engine dies and the request falls back to the decode worker alone.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { freePort, ShellProcess } from '../fixtures/processes.ts';

const procs: ShellProcess[] = [];
afterEach(async () => {
  await Promise.all(procs.splice(0).map((p) => p.stop()));
});

function run(command: string): ShellProcess {
  const p = new ShellProcess(command, { cwd: process.cwd() });
  procs.push(p);
  return p;
}

async function mocker(role: 'prefill' | 'decode', seed: number): Promise<{ proc: ShellProcess; url: string }> {
  const port = await freePort();
  const proc = run(
    `node bin/kvroute.mjs mocker --port ${port} --model m --speedup 50 --seed ${seed} --role ${role} --pd-protocol trtllm --event-format trtllm`,
  );
  await proc.waitFor(/"numGpuBlocks"/);
  return { proc, url: `http://127.0.0.1:${port}` };
}

const prompt = Array.from({ length: 401 }, (_, i) => (i * 7919) % 30000);

async function complete(url: string) {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', prompt, max_tokens: 4 }),
  });
  const body = (await r.json()) as { usage?: { completion_tokens: number; prompt_tokens_details?: { cached_tokens: number } } };
  return { status: r.status, headers: r.headers, body };
}

describe('kvroute serve with TensorRT-LLM workers (processes)', () => {
  it('P/D through the disaggregated_params handoff, events polled into the index, prefill death handled', async () => {
    const p = await mocker('prefill', 1);
    const d = await mocker('decode', 2);
    const serve = run(
      `node bin/kvroute.mjs serve --port 0 --disagg-min-uncached-tokens 0 --disagg-machine-id 77 ` +
        `--worker ${p.url},id=p0,role=prefill,engine=trtllm,model=m --worker ${d.url},id=d0,role=decode,engine=trtllm,model=m`,
    );
    const url = (await serve.waitFor(/kvroute listening on (http:\/\/[\d.:]+)/))[1];

    const first = await complete(url);
    expect(first.status).toBe(200);
    expect(first.body.usage?.completion_tokens).toBe(4);
    expect(first.headers.get('x-kvroute-prefill-worker')).toBe('p0');
    expect(first.headers.get('x-kvroute-worker')).toBe('d0');

    // The prefill engine's Stored events reach the router through its /kv_cache_events: the same prompt now overlaps.
    let events: { sourceKey: string; blocksStored: number; endpoint: string; trtllm?: { createdEvents: number; polls: number } }[] = [];
    for (let i = 0; i < 100; i++) {
      events = ((await (await fetch(`${url}/debug/state`)).json()) as { events: typeof events }).events;
      if (events.find((e) => e.sourceKey === 'p0')?.blocksStored) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(events.find((e) => e.sourceKey === 'p0')).toMatchObject({ endpoint: `${p.url}/kv_cache_events` });
    expect(events.find((e) => e.sourceKey === 'p0')?.trtllm?.createdEvents).toBe(1);
    const second = await complete(url);
    expect(Number(second.headers.get('x-kvroute-overlap-blocks'))).toBe(25); // 401 tokens: 25 full blocks
    expect(second.body.usage?.prompt_tokens_details?.cached_tokens).toBe(25 * 16);

    await p.proc.stop();
    const alone = await complete(url);
    expect(alone.status).toBe(200);
    expect(alone.body.usage?.completion_tokens).toBe(4);
    expect(alone.headers.get('x-kvroute-prefill-worker')).toBeNull();
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics).toMatch(/router_pd_requests_total\{path="disaggregated"\} 2/);
  }, 90_000);
});
