/** `kvroute mocker --role prefill|decode --pd-protocol vllm|sglang|trtllm` as processes: the two sides of a pair hand KV over. */
import { type ChildProcess, spawn } from 'node:child_process';
import { afterAll, describe, expect, it } from 'vitest';

const children: ChildProcess[] = [];
afterAll(() => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
});

function start(args: string[]): Promise<Record<string, unknown>> {
  const child = spawn(
    process.execPath,
    ['bin/kvroute.mjs', 'mocker', '--port', '0', '--host', '127.0.0.1', '--zmq-endpoint', 'none', '--speedup', '50', ...args],
    {
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  children.push(child);
  let err = '';
  child.stderr!.on('data', (d) => (err += d));
  return new Promise((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (d) => {
      out += d;
      const k = out.indexOf('\n');
      if (k >= 0) resolve(JSON.parse(out.slice(0, k)) as Record<string, unknown>);
    });
    child.on('exit', (code) => reject(new Error(`exited ${code}: ${err}`)));
  });
}

const post = (url: string, body: unknown, headers: Record<string, string> = {}) =>
  fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });

describe('kvroute mocker P/D roles', () => {
  it('vllm: the prefill answers kv_transfer_params, the decode side pulls them once', async () => {
    const p = await start(['--role', 'prefill', '--pd-protocol', 'vllm']);
    const d = await start(['--role', 'decode', '--pd-protocol', 'vllm']);
    expect([p.role, p.pdProtocol, d.role]).toEqual(['prefill', 'vllm', 'decode']);
    const prompt = Array.from({ length: 100 }, (_, i) => i + 1);
    const pr = await post(
      `${p.url}/v1/completions`,
      {
        model: 'mock-model',
        prompt,
        max_tokens: 1,
        stream: false,
        kv_transfer_params: {
          do_remote_decode: true,
          do_remote_prefill: false,
          remote_engine_id: null,
          remote_block_ids: null,
          remote_host: null,
          remote_port: null,
        },
      },
      { 'x-request-id': 'pair-1' },
    );
    const pj = (await pr.json()) as { kv_transfer_params: Record<string, unknown> };
    // The fields of NixlConnector's request_finished (scheduler.py @053da34be7ea): no remote_num_tokens among them.
    expect(pj.kv_transfer_params).toMatchObject({ do_remote_prefill: true, remote_host: '127.0.0.1', tp_size: 1 });
    expect(pj.kv_transfer_params.remote_num_tokens).toBeUndefined();
    const body = { model: 'mock-model', prompt, max_tokens: 3, kv_transfer_params: pj.kv_transfer_params };
    const dr = await post(`${d.url}/v1/completions`, body, { 'x-request-id': 'pair-1' });
    const dj = (await dr.json()) as { usage: { completion_tokens: number; prompt_tokens_details: { cached_tokens: number } } };
    expect(dr.status).toBe(200);
    expect(dj.usage.completion_tokens).toBe(3);
    // The decode engine counts the KV it received as cached: all but the last prompt token.
    expect(dj.usage.prompt_tokens_details.cached_tokens).toBe(99);
    // Pulled once: a second decode with the same params finds no lease (kv_load_failure_policy fail: an error).
    const again = await post(`${d.url}/v1/completions`, body, { 'x-request-id': 'pair-1b' });
    expect(again.status).toBe(500);
  });

  it('trtllm: context_only answers disaggregated_params in its first choice; generation_only pulls them; events drain as JSON', async () => {
    const p = await start(['--role', 'prefill', '--pd-protocol', 'trtllm', '--event-format', 'trtllm']);
    const d = await start(['--role', 'decode', '--pd-protocol', 'trtllm']);
    const prompt = Array.from({ length: 100 }, (_, i) => i + 1);
    const ctx = await post(`${p.url}/v1/completions`, {
      model: 'mock-model',
      prompt,
      max_tokens: 1,
      stream: false,
      disaggregated_params: { request_type: 'context_only', disagg_request_id: 42 },
    });
    const text = await ctx.text();
    const cj = JSON.parse(text) as {
      choices: { disaggregated_params: Record<string, unknown>; finish_reason: string }[];
      prompt_token_ids: number[];
    };
    expect(cj.choices[0].disaggregated_params).toMatchObject({ request_type: 'context_only', disagg_request_id: 42 });
    expect(cj.choices[0].finish_reason).toBe('not_finished');
    expect(cj.prompt_token_ids).toEqual(prompt);
    // ctx_request_id is past 2^53, written as a bare integer: read it from the text, as a router must.
    const ctxId = /"ctx_request_id":(\d+)/.exec(text)![1];
    expect(BigInt(ctxId) > BigInt(Number.MAX_SAFE_INTEGER)).toBe(true);
    const raw = (id: string) =>
      `{"model":"mock-model","prompt":${JSON.stringify(prompt)},"max_tokens":3,"disaggregated_params":` +
      `{"request_type":"generation_only","ctx_request_id":${id},"encoded_opaque_state":${JSON.stringify(cj.choices[0].disaggregated_params.encoded_opaque_state)}}}`;
    const rawPost = (body: string) =>
      fetch(`${d.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    // A client that rounded the id (JSON.parse) names no context request: the KV transfer fails.
    expect((await rawPost(raw(String(Number(ctxId))))).status).toBe(500);
    const gen = await rawPost(raw(ctxId));
    const gj = (await gen.json()) as { usage: { completion_tokens: number; prompt_tokens_details: { cached_tokens: number } } };
    expect(gen.status).toBe(200);
    expect(gj.usage.prompt_tokens_details.cached_tokens).toBe(99);
    expect((await rawPost(raw(ctxId))).status).toBe(500); // pulled once: the lease is gone
    // As strict as trtllm-serve (extra="forbid"): a field DisaggregatedParams lacks is a 400 naming it.
    const extra = await post(`${p.url}/v1/completions`, {
      model: 'mock-model',
      prompt,
      disaggregated_params: { request_type: 'context_only', kv_transfer_params: {} },
    });
    expect(extra.status).toBe(400);
    expect(await extra.text()).toMatch(/extra_forbidden.*'disaggregated_params', 'kv_transfer_params'/);
    // TensorRT-LLM's event format: created first, then the prefill's stored blocks; a drain empties the buffer.
    const events = (await (await post(`${p.url}/kv_cache_events`, {})).json()) as { event_id: number; data: { type: string } }[];
    expect(events[0]).toMatchObject({ event_id: 0, data: { type: 'created' }, window_size: 4096 });
    expect(events.some((e) => e.data.type === 'stored')).toBe(true);
    expect(events.map((e) => e.event_id)).toEqual(events.map((_, i) => i));
    expect(await (await post(`${p.url}/kv_cache_events`, {})).json()).toEqual([]);
  });

  it('sglang: the prefill serves a bootstrap port, and refuses a bad --role with a one-line message', async () => {
    const p = await start(['--role', 'prefill', '--pd-protocol', 'sglang', '--bootstrap-port', '0']);
    expect(typeof p.bootstrapPort).toBe('number');
    await expect(start(['--role', 'prefiller'])).rejects.toThrow(/--role/);
  });
});
