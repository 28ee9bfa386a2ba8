/**
 * A tiny OpenAI-compatible upstream for server tests: a real HTTP server with a block-level prefix cache over token-id
 * prompts (so delivered `cached_tokens` is meaningful), and switchable failure modes.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface FakeEngineOptions {
  model?: string;
  adapters?: string[];
  blockSize?: number;
  /** Output chunks per stream. */
  chunks?: number;
  /** Delay before the first chunk and between chunks, ms. */
  firstChunkDelayMs?: number;
  chunkDelayMs?: number;
}

export type FailMode = 'none' | 'status500' | 'midstream' | 'health503';

export class FakeEngine {
  server!: Server;
  url = '';
  fail: FailMode = 'none';
  requests = 0;
  tokenizeCalls = 0;
  active = 0;
  aborted = 0;
  lastBody: Record<string, unknown> | null = null;
  /** The last routed request's body bytes as received. */
  lastRaw: Buffer | null = null;
  lastHeaders: IncomingMessage['headers'] = {};
  readonly blocks = new Set<string>();
  readonly opts: Required<FakeEngineOptions>;

  constructor(opts: FakeEngineOptions = {}) {
    this.opts = {
      model: 'fake-model',
      adapters: [],
      blockSize: 16,
      chunks: 3,
      firstChunkDelayMs: 0,
      chunkDelayMs: 0,
      ...opts,
    };
  }

  async start(port = 0): Promise<this> {
    this.server = createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((r) => this.server.listen(port, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  /** Cached prefix of a token prompt, in tokens; registers its full blocks. Never the last token (vLLM rule). */
  private cache(tokens: number[]): number {
    const bs = this.opts.blockSize;
    let hit = 0;
    let key = '';
    let stillHitting = true;
    for (let b = 0; (b + 1) * bs <= tokens.length; b++) {
      key += `${tokens.slice(b * bs, (b + 1) * bs).join(',')}|`;
      if (stillHitting && this.blocks.has(key)) hit++;
      else stillHitting = false;
      this.blocks.add(key);
    }
    return Math.min(hit * bs, Math.floor((tokens.length - 1) / bs) * bs);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = req.url ?? '/';
    if (req.method === 'GET' && path === '/health') {
      res.writeHead(this.fail === 'health503' ? 503 : 200).end();
      return;
    }
    if (req.method === 'GET' && path === '/v1/models') {
      const data = [
        { id: this.opts.model, object: 'model', owned_by: 'fake', root: this.opts.model, parent: null },
        ...this.opts.adapters.map((a) => ({ id: a, object: 'model', owned_by: 'fake', root: a, parent: this.opts.model })),
      ];
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ object: 'list', data }));
      return;
    }
    if (req.method !== 'POST') {
      res.writeHead(404).end();
      return;
    }
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const raw = Buffer.concat(chunks);
    const body = JSON.parse(raw.toString('utf8')) as Record<string, unknown>;
    if (path === '/tokenize') {
      // Deterministic stand-in: one token per character of the prompt or the messages' JSON.
      this.tokenizeCalls++;
      const text = typeof body.prompt === 'string' ? body.prompt : JSON.stringify(body.messages);
      const tokens = Array.from(text, (c) => c.codePointAt(0)!);
      res
        .writeHead(200, { 'content-type': 'application/json' })
        .end(JSON.stringify({ count: tokens.length, max_model_len: 32768, tokens }));
      return;
    }
    this.lastBody = body;
    this.lastRaw = raw;
    this.lastHeaders = req.headers;
    this.requests++;
    if (this.fail === 'status500') {
      res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"engine exploded"}}');
      return;
    }
    const chat = path === '/v1/chat/completions';
    const prompt = body.prompt;
    const tokens = Array.isArray(prompt) && typeof prompt[0] === 'number' ? (prompt as number[]) : [];
    const promptTokens = tokens.length > 0 ? tokens.length : JSON.stringify(body.messages ?? prompt).length;
    const cached = tokens.length > 0 ? this.cache(tokens) : 0;
    const usage = {
      prompt_tokens: promptTokens,
      completion_tokens: this.opts.chunks,
      total_tokens: promptTokens + this.opts.chunks,
      prompt_tokens_details: { cached_tokens: cached },
    };
    const id = `fake-${this.requests}`;
    this.active++;
    let closed = false;
    res.on('close', () => {
      if (!res.writableFinished) this.aborted++;
      closed = true;
      this.active--;
    });
    const sleep = (ms: number) => (ms > 0 ? new Promise((r) => setTimeout(r, ms)) : Promise.resolve());
    if (!body.stream) {
      await sleep(this.opts.firstChunkDelayMs);
      const text = 'x'.repeat(this.opts.chunks);
      const out = chat
        ? {
            id,
            object: 'chat.completion',
            model: body.model,
            choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: 'stop' }],
            usage,
          }
        : { id, object: 'text_completion', model: body.model, choices: [{ index: 0, text, finish_reason: 'stop' }], usage };
      const whole = JSON.stringify(out);
      if (this.fail === 'midstream') {
        // The head and half the answer, then the connection drops.
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(whole.length) });
        res.write(whole.slice(0, whole.length >> 1), () => res.destroy());
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end(whole);
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    await sleep(this.opts.firstChunkDelayMs);
    for (let i = 0; i < this.opts.chunks && !closed; i++) {
      if (i > 0) await sleep(this.opts.chunkDelayMs);
      if (this.fail === 'midstream' && i === 1) {
        res.destroy();
        return;
      }
      const chunk = chat
        ? {
            id,
            object: 'chat.completion.chunk',
            model: body.model,
            choices: [{ index: 0, delta: i === 0 ? { role: 'assistant', content: 'x' } : { content: 'x' }, finish_reason: null }],
          }
        : { id, object: 'text_completion', model: body.model, choices: [{ index: 0, text: 'x', finish_reason: null }] };
      res.write(`data: ${JSON.stringify(chunk)}\n\n`);
    }
    if (closed) return;
    const so = body.stream_options as { include_usage?: boolean } | undefined;
    if (so?.include_usage) {
      res.write(
        `data: ${JSON.stringify({ id, object: chat ? 'chat.completion.chunk' : 'text_completion', model: body.model, choices: [], usage })}\n\n`,
      );
    }
    res.end('data: [DONE]\n\n');
  }
}
