/**
 * A purpose-built upstream for capacity benchmarks: an OpenAI-shaped engine that answers at once, so whatever limits
 * throughput is the proxy in front of it, not the engine. It never parses the body: `"stream":true` and
 * `"include_usage":true` are found by substring (the benchmarks write the bodies, and kvroute passes `stream` through as
 * written). Streaming answers are `chunks` SSE events, then usage when asked, then [DONE]; others one JSON object.
 *
 *   node --import tsx bench/lib/fast-upstream.ts [--chunks 4]     prints "PORT <n>" when listening on 127.0.0.1
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

export function startFastUpstream(chunks: number): Promise<number> {
  const chat = (i: number) =>
    `data: {"id":"u","object":"chat.completion.chunk","model":"bench","choices":[{"index":0,"delta":{"content":" t${i}"},"finish_reason":null}]}\n\n`;
  const text = (i: number) =>
    `data: {"id":"u","object":"text_completion","model":"bench","choices":[{"index":0,"text":" t${i}","finish_reason":null}]}\n\n`;
  const usage = (object: string) =>
    `data: {"id":"u","object":"${object}","model":"bench","choices":[],"usage":{"prompt_tokens":64,"completion_tokens":${chunks},"total_tokens":${64 + chunks},"prompt_tokens_details":{"cached_tokens":48}}}\n\n`;
  const streams = {
    chat: Array.from({ length: chunks }, (_, i) => chat(i)).join(''),
    text: Array.from({ length: chunks }, (_, i) => text(i)).join(''),
  };
  const whole = {
    chat: JSON.stringify({
      id: 'u',
      object: 'chat.completion',
      model: 'bench',
      choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }],
      usage: { prompt_tokens: 64, completion_tokens: chunks, total_tokens: 64 + chunks, prompt_tokens_details: { cached_tokens: 48 } },
    }),
    text: JSON.stringify({
      id: 'u',
      object: 'text_completion',
      model: 'bench',
      choices: [{ index: 0, text: 'ok', finish_reason: 'stop' }],
      usage: { prompt_tokens: 64, completion_tokens: chunks, total_tokens: 64 + chunks, prompt_tokens_details: { cached_tokens: 48 } },
    }),
  };
  const models = '{"object":"list","data":[{"id":"bench","object":"model","owned_by":"bench"}]}';
  const server = createServer((req, res) => {
    if (req.method !== 'POST') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(req.url === '/v1/models' ? models : '{}');
      return;
    }
    const isChat = req.url === '/v1/chat/completions';
    // The flags are near the start (the client's "stream") or the end (the stream_options kvroute appends): keep both.
    let head = '';
    let tail = '';
    req.setEncoding('latin1');
    req.on('data', (c: string) => {
      if (head.length < 256) head += c.slice(0, 256 - head.length);
      tail = (tail + c).slice(-256);
    });
    req.on('end', () => {
      head += tail;
      const stream = head.includes('"stream":true');
      if (!stream) {
        const body = isChat ? whole.chat : whole.text;
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
        res.end(body);
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const u = head.includes('"include_usage":true') ? usage(isChat ? 'chat.completion.chunk' : 'text_completion') : '';
      res.end(`${isChat ? streams.chat : streams.text}${u}data: [DONE]\n\n`);
    });
  });
  server.keepAliveTimeout = 65_000;
  server.maxRequestsPerSocket = 0;
  return new Promise((resolve) =>
    server.listen({ port: 0, host: '127.0.0.1', backlog: 4096 }, () => resolve((server.address() as AddressInfo).port)),
  );
}

if (process.argv[1] && import.meta.url.endsWith(process.argv[1].replace(/^.*\//, '/'))) {
  const i = process.argv.indexOf('--chunks');
  const port = await startFastUpstream(i >= 0 ? Number(process.argv[i + 1]) : 4);
  process.stdout.write(`PORT ${port}\n`);
}
