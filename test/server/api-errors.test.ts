/**
 * API-shaped failures: a stream cut mid-way ends with the API's own error event (Anthropic's, the Responses API's),
 * the router's own refusals and auth errors on /v1/messages come in Anthropic's shape, and pass-throughs are behind
 * the same API keys and rate limit as routed requests.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createSecurity, parseRateLimit } from '../../src/runtime/security/index.ts';
import { ApiKeySet } from '../../src/runtime/security/api-keys.ts';
import { startServer } from '../../src/server/app.ts';
import { json, post, serve, silent, testConfig } from './helpers.ts';

/** An engine whose streams die after their first event. */
let upstream: Server;
let upstreamUrl: string;
/** Requests that reached the engine past its probes. */
let upstreamHits = 0;
beforeAll(async () => {
  upstream = createServer((req, res) => {
    const path = req.url ?? '/';
    if (path === '/health') return void res.writeHead(200).end();
    if (path === '/metrics') return void res.writeHead(404).end(); // the router's engine-metrics scrape
    if (path === '/v1/models')
      return void res.writeHead(200, { 'content-type': 'application/json' }).end('{"data":[{"id":"m","object":"model"}]}');
    if (path === '/tokenize') return void res.writeHead(200, { 'content-type': 'application/json' }).end('{"count":1,"tokens":[1]}');
    upstreamHits++;
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      if (path === '/v1/messages')
        res.write(`event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":3}}}\n\n`);
      else res.write(`event: response.created\ndata: {"type":"response.created","response":{"id":"resp_x"}}\n\n`);
      setTimeout(() => res.socket?.destroy(), 20);
    });
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
});
afterAll(async () => {
  upstream.closeAllConnections();
  await new Promise<void>((r) => upstream.close(() => r()));
});

describe('a stream cut mid-way', () => {
  it('ends with the API’s own error event, and counts as the worker’s failure', async () => {
    const s = await serve({ workers: [{ url: upstreamUrl, id: 'cut' }] });
    try {
      const m = await post(`${s.url}/v1/messages`, { model: 'm', max_tokens: 5, stream: true, messages: [{ role: 'user', content: 'x' }] });
      expect(m.status).toBe(200);
      const text = await m.text();
      expect(text).toContain('event: message_start');
      const last = text.trim().split('\n\n').at(-1)!;
      expect(last.split('\n')[0]).toBe('event: error');
      expect(JSON.parse(last.split('\n')[1].slice(5))).toMatchObject({ type: 'error', error: { type: 'api_error' } });

      const r = await post(`${s.url}/v1/responses`, { model: 'm', input: 'x', stream: true });
      const rt = (await r.text()).trim().split('\n\n').at(-1)!;
      expect(rt.split('\n')[0]).toBe('event: error');
      expect(JSON.parse(rt.split('\n')[1].slice(5))).toMatchObject({ type: 'error', code: 'stream_failed' });
      // A cut response never pins its id: nothing was stored.
      expect(s.dispatcher.pins.size).toBe(0);
      const metrics = await (await fetch(`${s.url}/metrics`)).text();
      expect(metrics).toMatch(/router_requests_total\{outcome="error"\} 2/);
    } finally {
      await s.close(200);
    }
  });
});

describe('the router’s own errors on /v1/messages', () => {
  it('a refusal is Anthropic-shaped, with its status and Retry-After', async () => {
    const s = await serve({ workers: [] });
    try {
      const r = await post(`${s.url}/v1/messages`, { model: 'm', max_tokens: 1, messages: [{ role: 'user', content: 'x' }] });
      expect(r.status).toBe(503);
      expect(r.headers.get('retry-after')).not.toBeNull();
      const body = await json(r);
      expect(body).toMatchObject({ type: 'error', error: { type: 'overloaded_error' } });
      expect(body.error.message).toContain('no workers');
      // The same refusal elsewhere keeps OpenAI's shape.
      const o = await json(await post(`${s.url}/v1/responses`, { model: 'm', input: 'x' }));
      expect(o.error.code).toBe('no_workers');
    } finally {
      await s.close(200);
    }
  });

  it('API keys: Anthropic clients’ x-api-key is accepted; a wrong key is a 401 in the path’s shape; pass-throughs are limited too', async () => {
    const keys = new ApiKeySet(['sk-kvroute-test-key-000000000001']);
    const s = await startServer(testConfig({ workers: [{ url: upstreamUrl }] }), {
      logger: silent,
      security: createSecurity({ apiKeys: keys, rateLimit: parseRateLimit('1,2') }),
    });
    try {
      const ok = await post(`${s.url}/tokenize`, { model: 'm', prompt: 'x' }, { 'x-api-key': 'sk-kvroute-test-key-000000000001' });
      expect(ok.status).toBe(200);
      const bad = await post(
        `${s.url}/v1/messages`,
        { model: 'm', max_tokens: 1, messages: [] },
        { 'x-api-key': 'sk-wrong-key-0000000000000000' },
      );
      expect(bad.status).toBe(401);
      expect(await json(bad)).toMatchObject({ type: 'error', error: { type: 'authentication_error' } });
      const none = await post(`${s.url}/detokenize`, { tokens: [1] });
      expect(none.status).toBe(401);
      expect((await json(none)).error.code).toBe('missing_api_key');
      const auth = { authorization: 'Bearer sk-kvroute-test-key-000000000001' };
      const statuses: number[] = [];
      for (let i = 0; i < 3; i++) statuses.push((await post(`${s.url}/tokenize`, { model: 'm', prompt: 'x' }, auth)).status);
      expect(statuses).toContain(429);
    } finally {
      await s.close(200);
    }
  });
});

describe('bad bodies of every routed API', () => {
  it('are refused by the router with a 400 naming the field, before any engine sees them', async () => {
    const s = await serve({ workers: [{ url: upstreamUrl, id: 'cut' }] });
    const cases: [string, unknown, string][] = [
      ['/v1/responses', { model: 'm', input: 42 }, 'input'],
      ['/v1/responses', { model: 'm', input: [{ type: 'mystery' }] }, 'input[0].type'],
      ['/v1/responses', { model: 'm', input: 'x', previous_response_id: '' }, 'previous_response_id'],
      ['/v1/responses', { input: 'x' }, 'model'],
      ['/v1/messages', { model: 'm', max_tokens: 1, messages: [{ role: 'system', content: 'x' }] }, 'messages.0.role'],
      ['/v1/messages', { model: 'm', max_tokens: 0, messages: [{ role: 'user', content: 'x' }] }, 'max_tokens'],
      ['/v1/embeddings', { model: 'm', input: [1, 'a'] }, 'input'],
      ['/score', { model: 'm', text_1: ['a', 'b'], text_2: ['c', 'd', 'e'] }, 'text_1'],
      ['/rerank', { model: 'm', query: 'q', documents: [{ nope: 1 }] }, 'documents[0]'],
    ];
    const hits = upstreamHits;
    try {
      for (const [path, body, param] of cases) {
        const r = await post(`${s.url}${path}`, body);
        expect(r.status, `${path} ${JSON.stringify(body)}`).toBe(400);
        const j = await json(r);
        // Anthropic's shape has no param field: the message names it instead.
        if (path === '/v1/messages') expect(j.error.message).toContain(param);
        else expect(j.error.param).toBe(param);
      }
      expect(upstreamHits).toBe(hits);
    } finally {
      await s.close(200);
    }
  });
});
