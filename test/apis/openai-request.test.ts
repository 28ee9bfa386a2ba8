/**
 * One request parser for the router and the mock engine (src/apis/openai-request.ts): the router (startServer, in front of a
 * real mocker) and the mocker itself, over real HTTP, must accept and refuse the same bodies, each refusal with the same
 * status, param and message (the router in OpenAI's error shape, code 'invalid_request'; the mock in vLLM's, code 400).
 */
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startMocker, type MockerHandle } from '../../src/mocker/server.ts';
import { parseOpenAiRequest, parseRequest } from '../../src/apis/openai-request.ts';
import type { RunningServer } from '../../src/server/app.ts';
import { serve } from '../server/helpers.ts';

let mock: MockerHandle;
let router: RunningServer;

beforeAll(async () => {
  mock = await startMocker({ model: 'm', speedup: 1000, zmqEndpoint: null, defaultMaxTokens: 2 });
  router = await serve({ workers: [{ url: mock.url, id: 'mock', models: ['m'] }], remoteTokenize: true });
});
afterAll(async () => {
  await router?.close(200);
  await mock?.close();
});

interface Reply {
  status: number;
  error: { message: string; type: string; param: string | null; code: string | number } | null;
}

async function send(base: string, path: string, body: string): Promise<Reply> {
  const r = await fetch(base + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  const text = await r.text();
  if (r.status === 200) return { status: 200, error: null };
  return { status: r.status, error: JSON.parse(text).error };
}

/** The same body to both; returns both replies. */
async function both(path: string, body: unknown) {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  const [viaRouter, direct] = await Promise.all([send(router.url, path, text), send(mock.url, path, text)]);
  return { viaRouter, direct };
}

/** Same answer from both: 200 and 200, or the same refusal (the router's own, or the engine's passed through). */
function expectAgree({ viaRouter, direct }: { viaRouter: Reply; direct: Reply }, what: string): void {
  expect(viaRouter.status, what).toBe(direct.status);
  if (direct.status === 200) return;
  expect(viaRouter.error?.message, what).toBe(direct.error?.message);
  expect(viaRouter.error?.param, what).toBe(direct.error?.param);
  // vLLM's shape on the engine; the router answers a refusal of its own in OpenAI's shape.
  expect(direct.error?.code, what).toBe(direct.status);
  const own = viaRouter.error?.code === 'invalid_request' || viaRouter.error?.code === 'invalid_json';
  expect(own || viaRouter.error?.code === direct.status, what).toBe(true);
}

const chat = '/v1/chat/completions';
const completions = '/v1/completions';
const msgs = [{ role: 'user', content: 'hello there' }];

describe('router and mock engine parse the shared part of a request alike', () => {
  it('refuse the same bad inputs with the same status, param and message', async () => {
    const cases: [string, unknown, string | null][] = [
      [completions, '{not json', null],
      [completions, '[1, 2]', null],
      [completions, { model: 7, prompt: 'x' }, 'model'],
      [completions, { model: 'm', prompt: 42 }, 'prompt'],
      [completions, { model: 'm', prompt: [1, -2] }, 'prompt'],
      [completions, { model: 'm', prompt: [] }, 'prompt'],
      [completions, { model: 'm', prompt: ['a', 1] }, 'prompt'],
      [completions, { model: 'm', prompt: [[1, 2], []] }, 'prompt'],
      [completions, { model: 'm', prompt: 'x', stream: 'yes' }, 'stream'],
      [completions, { model: 'm', prompt: 'x', stream: true, stream_options: 3 }, 'stream_options'],
      [completions, { model: 'm', prompt: 'x', stream: true, stream_options: { include_usage: 'yes' } }, 'stream_options.include_usage'],
      // vLLM: stream options only on a streaming request.
      [completions, { model: 'm', prompt: 'x', stream_options: { include_usage: true } }, 'stream_options'],
      // vLLM: cache_salt, when given, is a non-empty string.
      [completions, { model: 'm', prompt: 'x', cache_salt: '' }, 'cache_salt'],
      [completions, { model: 'm', prompt: 'x', cache_salt: 5 }, 'cache_salt'],
      [chat, { model: 'm', messages: 'hi' }, 'messages'],
      [chat, { model: 'm', messages: [] }, 'messages'],
      [chat, { model: 'm', messages: [{ content: 'no role' }] }, 'messages[0]'],
      [chat, { model: 'm', messages: [...msgs, 'nope'] }, 'messages[1]'],
      [chat, { model: 'm', messages: [{ role: 'user', content: 7 }] }, 'messages[0].content'],
      [chat, { model: 'm', messages: msgs, tools: {} }, 'tools'],
      [chat, { model: 'm', messages: msgs, chat_template: 1 }, 'chat_template'],
      [chat, { model: 'm', messages: msgs, chat_template_kwargs: 3 }, 'chat_template_kwargs'],
      [chat, { model: 'm', messages: msgs, add_generation_prompt: 'no' }, 'add_generation_prompt'],
      [chat, { model: 'm', messages: msgs, add_generation_prompt: true, continue_final_message: true }, 'continue_final_message'],
      [chat, { model: 'm', messages: msgs, documents: ['not an object'] }, 'documents'],
    ];
    for (const [path, body, param] of cases) {
      const what = `${path} ${typeof body === 'string' ? body : JSON.stringify(body)}`;
      const r = await both(path, body);
      expect(r.direct.status, what).toBe(400);
      expect(r.viaRouter.error?.code, what).toBe(r.viaRouter.error?.code === 'invalid_json' ? 'invalid_json' : 'invalid_request');
      expect(r.viaRouter.error?.type, what).toBe('invalid_request_error');
      expect(r.direct.error?.type, what).toBe('BadRequestError');
      expect(r.direct.error?.param, what).toBe(param);
      expectAgree(r, what);
    }
  });

  it('accept the same good inputs (the router forwards them; the engine answers 200)', async () => {
    const cases: [string, unknown][] = [
      [completions, { model: 'm', prompt: 'hello there' }],
      [completions, { model: 'm', prompt: [1, 2, 3] }],
      [completions, { model: 'm', prompt: ['a b', 'c d'] }],
      [completions, { model: 'm', prompt: [[1, 2], [3]] }],
      [completions, { model: 'm', prompt: 'x', stream: true, stream_options: { include_usage: false } }],
      // An empty stream_options passes without stream, as in Python ({} is falsy there).
      [completions, { model: 'm', prompt: 'x', stream_options: {} }],
      [completions, { model: 'm', prompt: 'x', stream: null, cache_salt: null, stream_options: null }],
      [completions, { model: 'm', prompt: 'x', cache_salt: 'tenant-a', unknown_field: { any: 1 } }],
      [
        chat,
        {
          model: 'm',
          messages: [
            { role: 'user', content: [{ type: 'text', text: 'hi' }] },
            { role: 'assistant', content: null },
          ],
        },
      ],
      [chat, { model: 'm', messages: msgs, tools: [], chat_template_kwargs: { enable_thinking: false }, documents: [{ title: 't' }] }],
      [chat, { model: 'm', messages: msgs, add_generation_prompt: false, continue_final_message: true }],
    ];
    for (const [path, body] of cases) {
      const what = `${path} ${JSON.stringify(body)}`;
      const r = await both(path, body);
      expect(r.direct.status, what).toBe(200);
      expectAgree(r, what);
    }
  });

  it('agree on arbitrary mixes of good and bad values of the shared fields (property, seeded)', async () => {
    const anyValue = fc.oneof(fc.jsonValue({ maxDepth: 2 }), fc.constant(undefined));
    const message = fc.oneof(
      fc.record({ role: fc.constantFrom('user', 'system', 'assistant'), content: fc.oneof(fc.string({ maxLength: 12 }), anyValue) }),
      anyValue,
    );
    const body = fc.record(
      {
        prompt: fc.oneof(
          fc.string({ minLength: 1, maxLength: 12 }),
          fc.array(fc.integer({ min: -2, max: 3000 }), { maxLength: 6 }),
          anyValue,
        ),
        messages: fc.oneof(fc.constant(msgs), fc.array(message, { maxLength: 3 }), anyValue),
        stream: fc.oneof(fc.boolean(), anyValue),
        stream_options: fc.oneof(fc.record({ include_usage: fc.oneof(fc.boolean(), anyValue) }, { requiredKeys: [] }), anyValue),
        cache_salt: fc.oneof(fc.constantFrom('tenant-a', ''), anyValue),
        tools: fc.oneof(fc.constant([]), anyValue),
        chat_template_kwargs: fc.oneof(fc.constant({ enable_thinking: false }), anyValue),
        add_generation_prompt: fc.oneof(fc.boolean(), anyValue),
        continue_final_message: fc.oneof(fc.boolean(), anyValue),
      },
      { requiredKeys: [] },
    );
    let accepted = 0;
    let refused = 0;
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(chat, completions), body, async (path, b) => {
        // The model stays valid: the router requires one (it routes by model) where vLLM serves its default.
        const r = await both(path, { ...b, model: 'm' });
        expectAgree(r, `${path} ${JSON.stringify(b)}`);
        if (r.direct.status === 200) accepted++;
        else refused++;
      }),
      { numRuns: 150, seed: 13 },
    );
    // Both outcomes were exercised.
    expect(accepted).toBeGreaterThan(10);
    expect(refused).toBeGreaterThan(10);
  });

  it('the one rule that differs: the router needs the model, the engine serves its default without one (as vLLM)', async () => {
    for (const model of [undefined, null, '']) {
      const r = await both(completions, { model, prompt: 'x' });
      expect(r.direct.status).toBe(200);
      expect(r.viaRouter.status).toBe(400);
      expect(r.viaRouter.error).toMatchObject({ param: 'model', code: 'invalid_request' });
    }
    expect(parseOpenAiRequest('completions', { prompt: 'x', model: '' }).model).toBe(null);
    expect(() => parseRequest('completions', { prompt: 'x' })).toThrow(/"model" is required/);
    // An unknown model: the engine's 404, which the router answers itself from its workers' model lists.
    const unknown = await both(completions, { model: 'nope', prompt: 'x' });
    expect(unknown.direct).toMatchObject({ status: 404, error: { type: 'NotFoundError', code: 404, param: 'model' } });
    expect(unknown.viaRouter).toMatchObject({ status: 404, error: { code: 'model_not_found', param: 'model' } });
  });
});

describe('stream_options.include_usage defaults to true once stream_options is given (vLLM StreamOptions)', () => {
  it('parses as vLLM does', () => {
    const usage = (so: unknown, stream = true) =>
      parseOpenAiRequest('completions', { prompt: 'x', stream, stream_options: so }).includeUsage;
    expect(usage(undefined)).toBe(false);
    expect(usage(null)).toBe(false);
    expect(usage({})).toBe(true);
    expect(usage({ continuous_usage_stats: true })).toBe(true);
    expect(usage({ include_usage: true })).toBe(true);
    expect(usage({ include_usage: false })).toBe(false);
    expect(usage({ include_usage: null })).toBe(false);
    expect(usage({}, false)).toBe(false);
  });

  it('a client sending stream_options: {} gets the usage chunk from the engine and through the router alike', async () => {
    const body = JSON.stringify({ model: 'm', prompt: 'hello there', stream: true, stream_options: {} });
    const chunks = async (base: string) => {
      const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      expect(r.status).toBe(200);
      const text = await r.text();
      return text
        .split('\n\n')
        .filter((p) => p.startsWith('data: {'))
        .map((p) => JSON.parse(p.slice(6)) as { usage?: { prompt_tokens: number } });
    };
    for (const base of [mock.url, router.url]) {
      const usage = (await chunks(base)).filter((c) => c.usage);
      expect(usage, base).toHaveLength(1);
      expect(usage[0].usage!.prompt_tokens).toBe(2);
    }
  });
});
