/**
 * A whole (non-streamed) answer through serve: the engine's bytes reach the client as they are (a pretty-printed 200,
 * an engine's own 4xx with its content type), and the 200's usage, read from its tail, reaches the routing ledger.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { post, serve } from './helpers.ts';

/** A pretty-printed answer with bytes a re-serialisation would change (spacing, an escaped slash, a raw é). */
const ANSWER = `{
  "id": "cmpl-7",
  "object": "text_completion",
  "choices": [ { "index": 0, "text": "a\\/b é \\u00e9", "finish_reason": "stop" } ],
  "usage": { "prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42, "prompt_tokens_details": { "cached_tokens": 32 } },
  "kv_transfer_params": null
}
`;
/** An engine's own 4xx, passed on as it came. */
const REFUSAL = '{ "error": { "message": "max_tokens too large é", "code": 422 } }\n';

let upstream: Server;
let upstreamUrl: string;
beforeAll(async () => {
  upstream = createServer((req, res) => {
    const path = req.url ?? '/';
    if (path === '/health') return void res.writeHead(200).end();
    if (path === '/metrics') return void res.writeHead(404).end();
    if (path === '/v1/models')
      return void res.writeHead(200, { 'content-type': 'application/json' }).end('{"data":[{"id":"m","object":"model"}]}');
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      const body = JSON.parse(Buffer.concat(parts).toString('utf8')) as { max_tokens?: number };
      if ((body.max_tokens ?? 0) > 100) {
        res.writeHead(422, { 'content-type': 'application/problem+json', 'x-engine-note': 'refused' });
        res.end(REFUSAL);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      // Two writes: the answer reaches the router in more than one chunk.
      const bytes = Buffer.from(ANSWER);
      res.write(bytes.subarray(0, 50));
      setTimeout(() => res.end(bytes.subarray(50)), 5);
    });
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
});
afterAll(async () => {
  upstream.closeAllConnections();
  await new Promise<void>((r) => upstream.close(() => r()));
});

describe('a whole answer', () => {
  it('passes a 200 and an engine 4xx on byte for byte, and reads the 200’s usage from its tail', async () => {
    const s = await serve({ workers: [{ url: upstreamUrl, id: 'w' }] });
    try {
      const prompt = Array.from({ length: 40 }, (_, i) => i + 1);
      const ok = await post(`${s.url}/v1/completions`, { model: 'm', prompt, max_tokens: 2 });
      expect(ok.status).toBe(200);
      expect(ok.headers.get('content-length')).toBe(String(Buffer.byteLength(ANSWER)));
      expect(ok.headers.get('x-kvroute-worker')).toBe('w');
      expect(Buffer.from(await ok.arrayBuffer()).equals(Buffer.from(ANSWER))).toBe(true);
      expect(s.router.ledger.total.deliveredCachedTokens).toBe(32);

      const refused = await post(`${s.url}/v1/completions`, { model: 'm', prompt, max_tokens: 1000 });
      expect(refused.status).toBe(422);
      expect(refused.headers.get('content-type')).toBe('application/problem+json');
      expect(refused.headers.get('x-engine-note')).toBe('refused');
      expect(Buffer.from(await refused.arrayBuffer()).equals(Buffer.from(REFUSAL))).toBe(true);
      // A 4xx is the request's fault: no delivered tokens from it, and the worker is not blamed.
      expect(s.router.ledger.total.deliveredCachedTokens).toBe(32);
      const metrics = await (await fetch(`${s.url}/metrics`)).text();
      expect(metrics).toMatch(/router_requests_total\{outcome="ok"\} 1/);
      expect(metrics).toMatch(/router_requests_total\{outcome="error"\} 1/);
    } finally {
      await s.close(200);
    }
  });
});
