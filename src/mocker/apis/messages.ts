/**
 * The mock engine's Anthropic Messages API, as vLLM serves it: `POST /v1/messages` (streamed as Anthropic's SSE events
 * message_start, content_block_start, ping, content_block_delta, content_block_stop, message_delta, message_stop, or
 * answered whole) and `POST /v1/messages/count_tokens`. The prompt is system + messages + tools rendered through the
 * chat template by the parser the router shares. Usage follows Anthropic's meaning: input_tokens is what was not
 * read from the cache, cache_read_input_tokens what was.
 */
import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { parseMessagesRequest } from '../../apis/messages-request.ts';
import { sendJson } from '../../http/body.ts';
import type { Surface } from './surface.ts';
import type { Sink } from '../rank-loop.ts';
import type { Answer } from '../responses.ts';
import type { MockTokenizer } from '../tokenizer.ts';

export class MessagesApi {
  constructor(
    private readonly surface: Surface,
    private readonly tokenizer: MockTokenizer,
    private readonly model: string,
  ) {}

  countTokens(res: ServerResponse, body: Record<string, unknown>): void {
    const m = parseMessagesRequest(body, true);
    this.surface.resolveModel(m.model);
    sendJson(res, 200, { input_tokens: this.tokenizer.encode(this.surface.renderChat(m.chat)).length });
  }

  handle(req: IncomingMessage, res: ServerResponse, body: Record<string, unknown>): void {
    const m = parseMessagesRequest(body);
    const loraName = this.surface.resolveModel(m.model);
    const prompt = this.tokenizer.encode(this.surface.renderChat(m.chat));
    const id = `msg_${randomBytes(12).toString('hex')}`;
    this.surface.run(req, res, {
      id,
      prompts: [prompt],
      maxTokens: m.maxTokens,
      loraName,
      cacheSalt: typeof body.cache_salt === 'string' && body.cache_salt !== '' ? body.cache_salt : null,
      promptParam: 'messages',
      answer: (arrivalMs) =>
        this.answer(res, { id, model: loraName ?? this.model, stream: m.stream, promptTokens: prompt.length, arrivalMs }),
    });
  }

  private answer(res: ServerResponse, o: { id: string; model: string; stream: boolean; promptTokens: number; arrivalMs: number }): Answer {
    const tokens: number[] = [];
    let cached = 0;
    let done = false;
    let started = false;
    let pending = '';
    const usage = (output: number) => ({
      input_tokens: o.promptTokens - cached,
      cache_creation_input_tokens: 0,
      cache_read_input_tokens: cached,
      output_tokens: output,
    });
    const message = (content: unknown[], stopReason: string | null, output: number) => ({
      id: o.id,
      type: 'message',
      role: 'assistant',
      model: o.model,
      content,
      stop_reason: stopReason,
      stop_sequence: null,
      usage: usage(output),
    });
    const event = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
    if (o.stream) res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    const sink: Sink = {
      arrivalMs: o.arrivalMs,
      flush() {
        if (pending.length === 0 || res.destroyed) return;
        res.write(pending);
        pending = '';
      },
      onOutput: (out) => {
        if (done) return;
        for (const t of out.newTokens) tokens.push(t);
        if (out.firstToken) cached = out.cachedTokens;
        if (o.stream) {
          // message_start waits for the first output: its usage says how much of the prompt the cache served.
          if (!started) {
            started = true;
            pending += event('message_start', { message: message([], null, 0) });
            pending += event('content_block_start', { index: 0, content_block: { type: 'text', text: '' } });
            pending += event('ping', {});
          }
          if (out.newTokens.length > 0) {
            pending += event('content_block_delta', {
              index: 0,
              delta: { type: 'text_delta', text: this.tokenizer.decode(out.newTokens) },
            });
          }
        }
        if (!out.finished) return;
        done = true;
        if (!o.stream) {
          sendJson(res, 200, message([{ type: 'text', text: this.tokenizer.decode(tokens) }], 'max_tokens', tokens.length));
          return;
        }
        pending += event('content_block_stop', { index: 0 });
        pending += event('message_delta', {
          delta: { stop_reason: 'max_tokens', stop_sequence: null },
          usage: { output_tokens: tokens.length },
        });
        pending += event('message_stop', {});
        sink.flush();
        res.end();
      },
      onAbort() {
        done = true;
        res.destroy();
      },
    };
    return {
      sinks: [sink],
      clientLeft() {
        if (done) return false;
        done = true;
        return true;
      },
    };
  }
}
