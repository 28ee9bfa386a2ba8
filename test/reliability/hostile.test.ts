/**
 * Hostile input against the real server (startServer + real mock engines over HTTP): property-based bodies
 * (malformed JSON, wrong types, huge token-id arrays, deep nesting, invalid UTF-8, unknown fields). Every answer must
 * be a 2xx or a well-formed OpenAI-style 4xx, never a 5xx; the process must not crash; the heap must stay bounded.
 */
import fc from 'fast-check';
import { connect } from 'node:net';
import { Agent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LocalTokenizer } from '../../src/tokenizer/local.ts';
import { heapUsedMB, notOpenAiError, QWEN3_DIR, startFleet, type Fleet } from './harness.ts';

let fleet: Fleet;
let base: string;
const agent = new Agent({ connections: 16 });
const failures: string[] = [];
let heapBefore = 0;

interface Answer {
  status: number;
  contentType: string | null;
  text: string;
}

async function send(path: string, body: string | Buffer, headers: Record<string, string> = {}): Promise<Answer> {
  const r = await request(`${base}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body,
    dispatcher: agent,
  });
  const text = await r.body.text();
  const ct = r.headers['content-type'];
  return { status: r.statusCode, contentType: Array.isArray(ct) ? ct[0] : (ct ?? null), text };
}

/** 2xx, or a well-formed OpenAI 4xx; anything else is recorded with its request. */
function acceptable(what: string, body: string | Buffer, a: Answer): boolean {
  let why: string | null = null;
  if (a.status >= 500) why = `status ${a.status}`;
  else if (a.status >= 400) why = notOpenAiError(a.status, a.contentType, a.text);
  else if (a.status !== 200) why = `unexpected status ${a.status}`;
  if (why) {
    const shown = typeof body === 'string' ? body : body.toString('latin1');
    failures.push(`${what}: ${why}; request ${JSON.stringify(shown.slice(0, 200))} -> ${a.status} ${a.text.slice(0, 200)}`);
    return false;
  }
  return true;
}

const endpoint = fc.constantFrom('/v1/chat/completions', '/v1/completions');

beforeAll(async () => {
  const tokenizer = await LocalTokenizer.load(QWEN3_DIR);
  fleet = await startFleet(2, { tokenizer, serve: { bodyLimitBytes: 8 * 1024 * 1024 } });
  base = fleet.server.url;
  heapBefore = heapUsedMB();
});

afterAll(async () => {
  await agent.close();
  await fleet?.close();
  if (failures.length) console.log(`hostile-input failures:\n${failures.join('\n')}`);
});

describe('hostile input against the real server', () => {
  it('malformed JSON and arbitrary bytes: OpenAI-style 400', async () => {
    await fc.assert(
      fc.asyncProperty(
        endpoint,
        fc.oneof(
          fc.string({ maxLength: 200 }),
          fc.uint8Array({ maxLength: 200 }).map((u) => Buffer.from(u)),
          // Truncations of a valid request.
          fc.nat(60).map((n) => JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hello' }] }).slice(0, n)),
        ),
        async (path, body) => {
          const a = await send(path, body);
          return acceptable('malformed', body, a) && a.status >= 400;
        },
      ),
      { numRuns: 300, seed: 1 },
    );
  });

  it('wrong types in every field the router reads: never a 5xx', async () => {
    const anyValue = fc.oneof(fc.anything({ maxDepth: 3 }), fc.constant(undefined));
    const request_ = fc.record(
      {
        model: fc.oneof(fc.constant('m'), anyValue),
        messages: fc.oneof(
          fc.constant([{ role: 'user', content: 'hi' }]),
          fc.array(fc.record({ role: anyValue, content: anyValue })),
          anyValue,
        ),
        prompt: fc.oneof(fc.constant('hi'), fc.array(fc.integer({ min: -5, max: 200_000 }), { maxLength: 40 }), anyValue),
        stream: fc.oneof(fc.boolean(), anyValue),
        stream_options: fc.oneof(fc.record({ include_usage: anyValue }), anyValue),
        max_tokens: fc.oneof(fc.integer({ min: -2, max: 8 }), anyValue),
        cache_salt: anyValue,
        kvroute: fc.oneof(fc.record({ policy: anyValue, knobs: anyValue }), anyValue),
        tools: anyValue,
        chat_template: anyValue,
        chat_template_kwargs: anyValue,
      },
      { requiredKeys: [] },
    );
    await fc.assert(
      fc.asyncProperty(endpoint, request_, async (path, value) => {
        const body = JSON.stringify(value);
        return acceptable('wrong types', body, await send(path, body));
      }),
      { numRuns: 400, seed: 2 },
    );
  });

  it('huge and out-of-range token-id arrays: 4xx, and 413 past the body limit', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 50_000, max: 600_000 }),
        fc.constantFrom(1, 151_000, 2 ** 32 - 1, 2 ** 32, -1, 1.5),
        async (n, filler) => {
          const body = `{"model":"m","max_tokens":1,"prompt":[${new Array(n).fill(filler).join(',')}]}`;
          const a = await send('/v1/completions', body);
          return acceptable(`token ids n=${n} filler=${filler}`, body, a) && a.status >= 400;
        },
      ),
      { numRuns: 8, seed: 3 },
    );
    const big = `{"model":"m","prompt":[${new Array(2_000_000).fill(123456).join(',')}]}`; // 14 MB > 8 MB limit
    const a = await send('/v1/completions', big);
    expect(a.status).toBe(413);
    expect(notOpenAiError(a.status, a.contentType, a.text)).toBeNull();
  });

  const nestedBody = (path: string, depth: number, open: string): string => {
    const close = open === '[' ? ']' : '}';
    const nested = open.repeat(depth) + (open === '[' ? '' : '1') + close.repeat(depth);
    return path === '/v1/completions'
      ? `{"model":"m","max_tokens":1,"prompt":${nested}}`
      : `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":${nested}}]}`;
  };

  it('moderately nested messages (up to 1,000 levels): 4xx or 2xx, never a 5xx', async () => {
    for (const path of ['/v1/chat/completions', '/v1/completions']) {
      for (const depth of [10, 100, 1_000]) {
        for (const open of ['[', '{"a":']) {
          const body = nestedBody(path, depth, open);
          expect(acceptable(`nested depth=${depth} ${open} ${path}`, body, await send(path, body))).toBe(true);
        }
      }
    }
  });

  // Found by this suite: chat messages nested >= ~5,000 levels made upstreamBody's JSON.stringify overflow the stack
  // (500 internal_error). Now refused before JSON.parse by checkJsonDepth (--max-json-depth, default 64).
  it('very deep nesting (10,000 and 100,000 levels): 400 nesting_too_deep, no leak, the server keeps serving', async () => {
    for (const path of ['/v1/chat/completions', '/v1/completions']) {
      for (const depth of [10_000, 100_000]) {
        for (const open of ['[', '{"a":']) {
          const a = await send(path, nestedBody(path, depth, open));
          expect(a.status).toBe(400);
          expect(notOpenAiError(a.status, a.contentType, a.text)).toBeNull();
          expect(JSON.parse(a.text).error.code).toBe('nesting_too_deep');
        }
      }
    }
    expect(fleet.server.router.state().inFlight).toBe(0);
    const ok = await send(
      '/v1/chat/completions',
      JSON.stringify({ model: 'm', max_tokens: 1, messages: [{ role: 'user', content: 'ok?' }] }),
    );
    expect(ok.status).toBe(200);
  });

  it('invalid UTF-8 inside strings: never a 5xx', async () => {
    await fc.assert(
      fc.asyncProperty(
        endpoint,
        fc.uint8Array({ minLength: 1, maxLength: 64 }).map((u) => Buffer.from(u.map((b) => (b < 0x80 ? 0xc0 | (b & 0x3f) : b)))),
        fc.constantFrom('prompt', 'content', 'model'),
        async (path, bad, where) => {
          const pre = Buffer.from(
            where === 'model'
              ? '{"model":"'
              : path === '/v1/completions'
                ? '{"model":"m","max_tokens":1,"prompt":"'
                : '{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"',
          );
          const post = Buffer.from(
            where === 'model' ? '","prompt":"x","messages":[{"role":"user","content":"x"}]}' : path === '/v1/completions' ? '"}' : '"}]}',
          );
          const body = Buffer.concat([pre, bad, post]);
          return acceptable(`invalid utf-8 in ${where}`, body, await send(path, body));
        },
      ),
      { numRuns: 150, seed: 5 },
    );
  });

  it('unknown fields pass through: 200 (or the engine’s 4xx), never a 5xx', async () => {
    let ok = 0;
    await fc.assert(
      fc.asyncProperty(
        endpoint,
        fc.dictionary(
          fc
            .string({ minLength: 1, maxLength: 12 })
            .filter((k) => !['model', 'messages', 'prompt', 'stream', 'stream_options', 'max_tokens', 'kvroute', '__proto__'].includes(k)),
          fc.jsonValue({ maxDepth: 2 }),
          { maxKeys: 6 },
        ),
        async (path, extra) => {
          const body = JSON.stringify({
            ...extra,
            model: 'm',
            max_tokens: 2,
            ...(path === '/v1/completions' ? { prompt: 'hello there' } : { messages: [{ role: 'user', content: 'hello there' }] }),
          });
          const a = await send(path, body);
          if (a.status === 200) ok++;
          return acceptable('unknown fields', body, a);
        },
      ),
      { numRuns: 60, seed: 6 },
    );
    expect(ok).toBeGreaterThan(30); // most of them are plain valid requests
  });

  it('malformed HTTP framing: 400 from node, server keeps serving', async () => {
    const raw = [
      'GARBAGE\r\n\r\n',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n',
      `GET /${'a'.repeat(20_000)} HTTP/1.1\r\nHost: x\r\nX: ${'b'.repeat(20_000)}\r\n\r\n`,
    ];
    const u = new URL(base);
    for (const r of raw) {
      const reply = await new Promise<string>((resolve) => {
        const c = connect(Number(u.port), u.hostname, () => c.write(r));
        let got = '';
        c.on('data', (d) => (got += d.toString()));
        c.on('close', () => resolve(got));
        c.on('error', () => resolve(got));
        setTimeout(() => c.destroy(), 2000);
      });
      expect(reply).toMatch(/^HTTP\/1\.1 4\d\d/);
    }
    const ok = await send('/v1/completions', JSON.stringify({ model: 'm', prompt: 'still alive', max_tokens: 1 }));
    expect(ok.status).toBe(200);
  });

  it('no unexpected 5xx overall, nothing left in flight, heap bounded', async () => {
    // Known failures are listed in the report; the suite records them instead of hiding them.
    expect(failures).toEqual([]);
    await new Promise((r) => setTimeout(r, 200));
    expect(fleet.server.inFlight()).toBe(0);
    expect(fleet.server.router.state().inFlight).toBe(0);
    const after = heapUsedMB();
    console.log(`hostile input: heap ${heapBefore.toFixed(1)} MB -> ${after.toFixed(1)} MB`);
    expect(after - heapBefore).toBeLessThan(64);
  });
});
