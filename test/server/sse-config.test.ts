import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { loadConfigFile, parseWorkerSpec } from '../../src/config/serve.ts';
import { SseRelay } from '../../src/apis/sse.ts';

const chunk = (i: number) => `data: {"id":"c","choices":[{"index":0,"delta":{"content":"t${i}"}}]}\n\n`;
const usage =
  'data: {"id":"c","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":64}}}\n\n';
const done = 'data: [DONE]\n\n';

function relayAll(relay: SseRelay, pieces: string[]): string {
  let out = '';
  for (const p of pieces) out += relay.push(Buffer.from(p)).toString();
  return out + relay.flush().toString();
}

describe('SseRelay', () => {
  it('strips the usage chunk it asked for and still reads cached tokens', () => {
    const r = new SseRelay(true);
    const out = relayAll(r, [chunk(0), chunk(1), usage, done]);
    expect(out).toBe(chunk(0) + chunk(1) + done);
    expect(r.usage).toEqual({ promptTokens: 100, completionTokens: 3, cachedTokens: 64 });
    expect(r.sawDone).toBe(true);
    expect(r.events).toBe(2);
  });

  it('keeps the usage chunk when the client asked for it', () => {
    const r = new SseRelay(false);
    expect(relayAll(r, [chunk(0), usage, done])).toBe(chunk(0) + usage + done);
    expect(r.usage?.cachedTokens).toBe(64);
  });

  it('property: any split of the byte stream forwards the same events', () => {
    const stream = chunk(0) + chunk(1) + chunk(2) + usage + done;
    const expected = chunk(0) + chunk(1) + chunk(2) + done;
    fc.assert(
      fc.property(fc.uniqueArray(fc.integer({ min: 1, max: stream.length - 1 }), { maxLength: 12 }), (cuts) => {
        const at = [0, ...cuts.sort((a, b) => a - b), stream.length];
        const pieces = at.slice(1).map((end, i) => stream.slice(at[i], end));
        const r = new SseRelay(true);
        expect(relayAll(r, pieces)).toBe(expected);
        expect(r.usage?.cachedTokens).toBe(64);
      }),
      { numRuns: 200 },
    );
  });

  it('handles CRLF framing and leaves usage:null chunks alone', () => {
    const r = new SseRelay(true);
    const withNull = 'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\r\n\r\n';
    const out = relayAll(r, [withNull, 'data: [DONE]\r\n\r\n']);
    expect(out).toContain('"content":"a"');
    expect(out).toContain('[DONE]');
    expect(r.usage).toBeUndefined();
  });

  it('removes a usage field riding on a content chunk (continuous usage) when stripping', () => {
    const r = new SseRelay(true);
    const out = relayAll(r, [
      'data: {"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}}\n\n',
    ]);
    expect(JSON.parse(out.slice(6))).toEqual({ choices: [{ delta: { content: 'a' } }] });
    expect(r.usage?.cachedTokens).toBe(0);
  });

  it('takes the usage event out of a chunk in place: the other events pass byte for byte (CRLF framing too), counted', () => {
    const crlf = (t: string) => t.replace(/\n/g, '\r\n');
    const r = new SseRelay(true);
    const whole = crlf(chunk(0) + chunk(1) + usage + done);
    expect(r.push(Buffer.from(whole)).toString()).toBe(crlf(chunk(0) + chunk(1) + done));
    expect(r.events).toBe(2);
    expect(r.usage?.cachedTokens).toBe(64);
    // The client's cached tokens rewritten (a disaggregated request): only the usage event is re-encoded.
    const rw = new SseRelay(false, 'openai', (u) => {
      (u.prompt_tokens_details as Record<string, unknown>).cached_tokens = 7;
    });
    const out = rw.push(Buffer.from(chunk(0) + usage + done)).toString();
    expect(out.startsWith(chunk(0))).toBe(true);
    expect(out.endsWith(done)).toBe(true);
    expect(JSON.parse(out.slice(chunk(0).length + 6, -done.length)).usage.prompt_tokens_details).toEqual({ cached_tokens: 7 });
    expect(rw.usage?.cachedTokens).toBe(64);
  });

  it('notices an in-band error event from the engine', () => {
    const r = new SseRelay(true);
    relayAll(r, [chunk(0), 'data: {"error":{"message":"boom"}}\n\n']);
    expect(r.sawError).toBe(true);
    expect(r.sawDone).toBe(false);
  });
});

describe('worker specs and config files', () => {
  it('parses every worker option', () => {
    expect(
      parseWorkerSpec(
        'http://gpu1:8000/,events=tcp://gpu1:5557,replay=tcp://gpu1:5558,dp=4,model=qwen,model=lora-a,id=g1,blocks=9000,engine=sglang',
      ),
    ).toEqual({
      engine: 'sglang',
      url: 'http://gpu1:8000',
      events: 'tcp://gpu1:5557',
      replay: 'tcp://gpu1:5558',
      dp: 4,
      models: ['qwen', 'lora-a'],
      id: 'g1',
      blocks: 9000,
    });
  });

  it('rejects bad specs with actionable messages', () => {
    expect(() => parseWorkerSpec('gpu1:8000')).toThrow(/http/);
    expect(() => parseWorkerSpec('http://a:1,events=gpu1:5557')).toThrow(/ZMQ endpoint/);
    expect(() => parseWorkerSpec('http://a:1,dp=0')).toThrow(/positive integer/);
    expect(() => parseWorkerSpec('http://a:1,colour=blue')).toThrow(/unknown worker option "colour"/);
    expect(() => parseWorkerSpec('http://a:1,dp')).toThrow(/key=value/);
    expect(() => parseWorkerSpec('http://a:1,engine=trt')).toThrow(/vllm, sglang or trtllm/);
  });

  it('loads YAML and JSON config files, rejecting unknown keys and bad values', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvroute-cfg-'));
    const yml = join(dir, 'kvroute.yaml');
    await writeFile(
      yml,
      'policy: round-robin\nblockSize: 32\nworkers:\n  - http://a:8000,events=tcp://a:5557\n  - url: http://b:8000\n    dp: 2\n    model: qwen\n',
    );
    const cfg = await loadConfigFile(yml);
    expect(cfg.policy).toBe('round-robin');
    expect(cfg.blockSize).toBe(32);
    expect(cfg.workers).toEqual([
      { url: 'http://a:8000', events: 'tcp://a:5557' },
      { url: 'http://b:8000', dp: 2, models: ['qwen'] },
    ]);
    const json = join(dir, 'bad.json');
    await writeFile(json, JSON.stringify({ polcy: 'kv' }));
    await expect(loadConfigFile(json)).rejects.toThrow(/unknown key "polcy"/);
    // Values are checked too, not only key names.
    const negative = join(dir, 'negative.yaml');
    await writeFile(negative, 'retries: -1\n');
    await expect(loadConfigFile(negative)).rejects.toThrow(
      `--retries (KVROUTE_RETRIES) must be an integer >= 0, got -1 (from ${negative}: retries)`,
    );
  });
});

describe('upstreamBody', () => {
  it('reuses the client bytes, appending the usage request to streams without it', async () => {
    const { parseRequest, upstreamBody } = await import('../../src/apis/openai-request.ts');
    const raw = '{"model":"m","prompt":[1,2,3],"stream":true}  \n';
    const out = upstreamBody(parseRequest('completions', JSON.parse(raw)), raw);
    expect(JSON.parse(out)).toEqual({ model: 'm', prompt: [1, 2, 3], stream: true, stream_options: { include_usage: true } });
    const plain = '{"model":"m","prompt":"x"}';
    expect(upstreamBody(parseRequest('completions', JSON.parse(plain)), plain)).toBe(plain);
    const withOpts = '{"model":"m","prompt":"x","stream":true,"stream_options":{"continuous_usage_stats":true},"kvroute":{"policy":"kv"}}';
    expect(JSON.parse(upstreamBody(parseRequest('completions', JSON.parse(withOpts)), withOpts))).toEqual({
      model: 'm',
      prompt: 'x',
      stream: true,
      stream_options: { continuous_usage_stats: true, include_usage: true },
    });
  });
});

describe('upstreamBytes', () => {
  it('gives the bytes of upstreamBody, built from the client bytes, or null where the body is re-serialised', async () => {
    const { parseRequest, upstreamBody, upstreamBytes } = await import('../../src/apis/openai-request.ts');
    const cases = [
      '{"model":"m","prompt":[1,2,3],"stream":true}  \n',
      '{"model":"m","prompt":[1,2,3],"stream":false}',
      '{"model":"é😀","prompt":"ü","stream":true}',
      '{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true}}',
      '{"model":"m","prompt":"x"}',
    ];
    for (const raw of cases) {
      const req = parseRequest('completions', JSON.parse(raw));
      const bytes = upstreamBytes(req, Buffer.from(raw));
      expect(bytes?.toString('utf8'), raw).toBe(upstreamBody(req, raw));
    }
    for (const raw of [
      '{"model":"m","prompt":"x","stream":true,"stream_options":{"continuous_usage_stats":true}}',
      '{"model":"m","prompt":"x","kvroute":{"policy":"kv"}}',
    ]) {
      expect(upstreamBytes(parseRequest('completions', JSON.parse(raw)), Buffer.from(raw)), raw).toBeNull();
    }
    // Unchanged: the very buffer the client sent.
    const same = Buffer.from('{"model":"m","prompt":[1]}');
    expect(upstreamBytes(parseRequest('completions', JSON.parse(same.toString())), same)).toBe(same);
  });
});
