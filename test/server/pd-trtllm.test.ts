/**
 * TensorRT-LLM disaggregated serving through kvroute serve and kvroute epp, against mock engines as strict as
 * trtllm-serve: their request models are NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py
 * @0076e9390e1ed11515f149eec356f5a03f4a00d8 with extra="forbid" (src/engines/trtllm/protocol.ts, src/engines/trtllm/mock.ts),
 * and the flow is tensorrt_llm/serve/openai_disagg_service.py @00bb903d965f (`_get_ctx_request`, `_need_gen`,
 * `_get_gen_request`). What each case pins:
 *
 * - the official OpenAI SDK's chat request (max_completion_tokens) is one spelling on the context leg, not two;
 * - the generation leg carries the context answer's usage as disaggregated_params.ctx_usage, and its ids exact;
 * - a server without disagg_request_id / ctx_usage (an older DisaggregatedParams) refuses them once per worker: the
 *   leg is resent without and the worker remembered; `disagg-id=off|on` and `ctx-usage=off` are obeyed;
 * - a context answer whose first token ended the request is the answer: no generation leg (streamed or not);
 * - kvroute epp in front of a TensorRT-LLM pair sends TensorRT-LLM's handoff (not vLLM's kv_transfer_params).
 */
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { parseWorkerSpec } from '../../src/config/worker-spec.ts';
import type { TrtllmDisaggRelease } from '../../src/engines/trtllm/protocol.ts';
import { startMocker, type MockerHandle } from '../../src/mocker/server.ts';
import type { RunningServer } from '../../src/server/app.ts';
import { EnvoySide } from '../epp/envoy-side.ts';
import { type EppProcess, startEpp } from '../epp/picker.ts';
import { randomTokens, serve } from './helpers.ts';

const started: { close(): Promise<void> }[] = [];
afterEach(async () => {
  await Promise.all(started.splice(0).map((s) => s.close()));
});

async function pair(release: TrtllmDisaggRelease = 'current', seed = 40) {
  const m = (role: 'prefill' | 'decode', s: number) =>
    startMocker({ model: 'm', speedup: 50, seed: s, eventFormat: 'trtllm', pd: { role, protocol: 'trtllm', trtllmDisaggParams: release } });
  const prefill = await m('prefill', seed);
  const decode = await m('decode', seed + 1);
  started.push(prefill, decode);
  return { prefill, decode };
}

/** Workers as --worker specs (the grammar's disagg-id= and ctx-usage= options included). */
async function router(p: { prefill: MockerHandle; decode: MockerHandle }, extra: { prefill?: string; decode?: string } = {}) {
  const s: RunningServer = await serve({
    workers: [
      parseWorkerSpec(`${p.prefill.url},id=p0,role=prefill,engine=trtllm,model=m${extra.prefill ?? ''}`),
      parseWorkerSpec(`${p.decode.url},id=d0,role=decode,engine=trtllm,model=m${extra.decode ?? ''}`),
    ],
    disaggMinUncachedTokens: 0,
  });
  started.push({ close: () => s.close(200) });
  return s;
}

const sdk = (s: RunningServer) => new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });
const messages = (n: number) => [{ role: 'user' as const, content: `question ${n}: ${'tell me about the sea '.repeat(12)}` }];

describe('TensorRT-LLM P/D through kvroute serve, against the strict mock', () => {
  it("the SDK's chat (max_completion_tokens) streams and answers whole; ctx_usage and the ids reach the generation leg", async () => {
    const p = await pair();
    const s = await router(p);
    const client = sdk(s);
    const whole = await client.chat.completions.create({ model: 'm', messages: messages(1), max_completion_tokens: 5 });
    expect(whole.choices[0].message.content?.length).toBeGreaterThan(0);
    let chunks = 0;
    for await (const c of await client.chat.completions.create({
      model: 'm',
      messages: messages(2),
      max_completion_tokens: 5,
      stream: true,
      stream_options: { include_usage: true },
    })) {
      if (c.choices[0]?.delta?.content) chunks++;
    }
    expect(chunks).toBeGreaterThan(0);
    expect(p.prefill.pd!.stats.refusedLegs).toBe(0);
    expect(p.decode.pd!.stats.refusedLegs).toBe(0);
    // Every context leg carried a disagg_request_id; every generation leg its context answer's usage.
    expect(p.prefill.pd!.stats.disaggRequestIds).toHaveLength(2);
    const gen = p.decode.pd!.stats.generationParams.map((t) => JSON.parse(t) as Record<string, unknown>);
    expect(gen).toHaveLength(2);
    for (const g of gen) {
      expect(g.request_type).toBe('generation_only');
      expect(g.ctx_usage).toMatchObject({ completion_tokens: 1, prompt_tokens: expect.any(Number) });
    }
    // The id the router minted travelled to the generation leg digit for digit.
    expect(p.decode.pd!.stats.generationParams[0]).toContain(`"disagg_request_id":${p.prefill.pd!.stats.disaggRequestIds[0]}`);
  }, 60_000);

  it('an older server without disagg_request_id and ctx_usage: refused once per worker, resent without, remembered', async () => {
    const p = await pair('basic', 50);
    const s = await router(p);
    const client = sdk(s);
    for (let i = 0; i < 3; i++) {
      const r = await client.chat.completions.create({ model: 'm', messages: messages(10 + i), max_completion_tokens: 3 });
      expect(r.choices[0].message.content?.length).toBeGreaterThan(0);
    }
    // One refusal each (the first request's legs), then the workers' learned fields hold.
    expect(p.prefill.pd!.stats.refusedLegs).toBe(1);
    expect(p.decode.pd!.stats.refusedLegs).toBe(1);
    expect(p.prefill.pd!.stats.disaggRequestIds).toEqual([]);
    for (const g of p.decode.pd!.stats.generationParams) expect(g).not.toContain('ctx_usage');
    const state = (await (await fetch(`${s.url}/debug/state`)).json()) as { workers: { id: string; refusedHandoffFields?: string[] }[] };
    const byId = new Map(state.workers.map((w) => [w.id, w.refusedHandoffFields]));
    expect(byId.get('p0')).toEqual(['disagg_request_id']);
    expect(byId.get('d0')).toEqual(['ctx_usage']);
  }, 60_000);

  it('disagg-id=off never sends the id; disagg-id=on sends it whatever the server says (its 400 is the answer)', async () => {
    const p = await pair('basic', 60);
    const off = await router(p, { prefill: ',disagg-id=off', decode: ',ctx-usage=off' });
    const r = await sdk(off).chat.completions.create({ model: 'm', messages: messages(20), max_completion_tokens: 3 });
    expect(r.choices[0].message.content?.length).toBeGreaterThan(0);
    expect(p.prefill.pd!.stats.refusedLegs + p.decode.pd!.stats.refusedLegs).toBe(0);
    const q = await pair('basic', 70);
    const on = await router(q, { prefill: ',disagg-id=on' });
    const res = await fetch(`${on.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', messages: messages(21), max_completion_tokens: 3 }),
    });
    expect(res.status).toBe(400);
    expect(await res.text()).toMatch(/extra_forbidden.*disagg_request_id/);
  }, 60_000);

  it('a context answer whose first token ended the request is the answer: no generation leg, streamed or not', async () => {
    const p = await pair('current', 80);
    await fetch(`${p.prefill.url}/fault`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"eosFirstToken":true}',
    });
    const s = await router(p);
    const client = sdk(s);
    const whole = await client.chat.completions.create({ model: 'm', messages: messages(30), max_completion_tokens: 8 });
    expect(whole.choices[0].finish_reason).toBe('stop');
    expect((whole.choices[0] as unknown as Record<string, unknown>).disaggregated_params).toBeUndefined();
    let content = '';
    let finish: string | null = null;
    for await (const c of await client.completions.create({ model: 'm', prompt: randomTokens(80, 3), max_tokens: 8, stream: true })) {
      content += c.choices[0]?.text ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    expect(finish).toBe('stop');
    expect(content.length).toBeGreaterThan(0);
    expect(p.decode.pd!.stats.generationParams).toEqual([]);
  }, 60_000);
});

describe('TensorRT-LLM P/D through kvroute epp', () => {
  const procs: EppProcess[] = [];
  afterEach(async () => {
    for (const proc of procs.splice(0)) await proc.stop();
  });

  it("runs TensorRT-LLM's context leg and sends the decode worker the generation body (disaggregated_params, not kv_transfer_params)", async () => {
    const p = await pair('current', 90);
    const picker = await startEpp([
      '-w',
      `${p.prefill.url},id=p0,model=m,role=prefill,engine=trtllm`,
      '-w',
      `${p.decode.url},id=d0,model=m,role=decode,engine=trtllm`,
      '--disagg-min-uncached-tokens',
      '0',
    ]);
    procs.push(picker);
    const envoy = new EnvoySide(picker.address);
    try {
      const prompt = randomTokens(200, 5);
      const r = await envoy.roundTrip({ body: Buffer.from(JSON.stringify({ model: 'm', prompt, max_tokens: 4, stream: true })) });
      if (!('picked' in r)) throw new Error(`immediate: ${JSON.stringify(r.immediate)}`);
      const sent = JSON.parse(r.picked.body.toString()) as Record<string, unknown>;
      expect(sent.kv_transfer_params).toBeUndefined();
      expect(sent.disaggregated_params).toMatchObject({ request_type: 'generation_only', ctx_usage: { completion_tokens: 1 } });
      expect(sent.prompt).toEqual(prompt);
      expect(r.response.status).toBe(200);
      expect(r.response.body).toContain('data: [DONE]');
      expect(p.prefill.pd!.stats.refusedLegs + p.decode.pd!.stats.refusedLegs).toBe(0);
      expect(p.decode.pd!.stats.generationParams).toHaveLength(1);
    } finally {
      envoy.close();
    }
  }, 60_000);
});
