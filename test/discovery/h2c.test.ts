/**
 * `spec.appProtocol: kubernetes.io/h2c` (GIE api/v1/inferencepool_types.go @84436a96b9e6): the model servers speak
 * HTTP/2 with prior knowledge on cleartext. The engine here is Node's own http2 server (createServer: h2c only, an
 * HTTP/1.1 request gets no answer), a real HTTP/2 implementation; kvroute serve reaches it through undici's h2c
 * (useH2c) for probes, model discovery and the proxied request when the worker says app-protocol=h2c (discovery sets
 * it from the pool), and cannot without it.
 */
import { createServer, type Http2Server } from 'node:http2';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseWorkerSpec } from '../../src/config/worker-spec.ts';
import type { RunningServer } from '../../src/server/app.ts';
import { serve, sleep } from '../server/helpers.ts';

let engine: Http2Server;
let url: string;
const versions: string[] = [];

beforeAll(async () => {
  engine = createServer((req, res) => {
    versions.push(req.httpVersion);
    let body = '';
    req.on('data', (d: Buffer) => (body += d));
    req.on('end', () => {
      const json = (status: number, v: unknown) => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(JSON.stringify(v));
      };
      if (req.url === '/health') return json(200, {});
      if (req.url === '/v1/models') return json(200, { object: 'list', data: [{ id: 'm', object: 'model', owned_by: 'x' }] });
      if (req.url === '/v1/completions') {
        const prompt = (JSON.parse(body) as { prompt: string }).prompt;
        return json(200, {
          id: 'c',
          object: 'text_completion',
          choices: [{ index: 0, text: `echo:${prompt}`, finish_reason: 'length' }],
          usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
        });
      }
      json(404, {});
    });
  });
  await new Promise<void>((r) => engine.listen(0, '127.0.0.1', () => r()));
  url = `http://127.0.0.1:${(engine.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await new Promise<void>((r) => engine.close(() => r()));
});

async function router(spec: string): Promise<RunningServer> {
  return serve({ workers: [parseWorkerSpec(spec)], healthIntervalMs: 100 });
}

const complete = (s: RunningServer) =>
  fetch(`${s.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 1 }),
  });

describe('workers that speak h2c', () => {
  it('app-protocol=h2c: probes, discovery and the request go over HTTP/2 with prior knowledge', async () => {
    const s = await router(`${url},id=h2,app-protocol=h2c`);
    try {
      const res = await complete(s);
      expect(res.status).toBe(200);
      expect(((await res.json()) as { choices: { text: string }[] }).choices[0].text).toBe('echo:hi');
      expect(versions.length).toBeGreaterThanOrEqual(2);
      expect(new Set(versions)).toEqual(new Set(['2.0']));
    } finally {
      await s.close(200);
    }
  }, 30_000);

  it('without it the same server is unreachable over HTTP/1.1: the worker is never healthy, the request fails', async () => {
    const s = await router(`${url},id=h1,model=m`);
    try {
      await sleep(500);
      const state = (await (await fetch(`${s.url}/debug/state`)).json()) as { workers: { id: string; healthy: boolean }[] };
      expect(state.workers.find((w) => w.id === 'h1')?.healthy).toBe(false);
      expect((await complete(s)).status).toBeGreaterThanOrEqual(500);
    } finally {
      await s.close(200);
    }
  }, 30_000);
});
