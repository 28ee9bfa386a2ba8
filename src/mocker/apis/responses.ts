/**
 * The mock engine's `POST /v1/responses`, as vLLM serves OpenAI's Responses API: input items and instructions rendered
 * through the chat template (the parser shared with the router), streamed as `response.*` events or answered whole.
 * Stored responses (store: true, the default) live in this engine's memory only, as in vLLM: a request naming
 * `previous_response_id` continues that conversation here, and any other engine answers 404. This is what the
 * router's pins are for.
 */
import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { sendJson } from '../../http/body.ts';
import { parseResponsesRequest } from '../../apis/responses-request.ts';
import { vllmError } from '../http.ts';
import type { Surface } from './surface.ts';
import type { Answer } from '../responses.ts';
import type { Sink } from '../rank-loop.ts';
import type { MockTokenizer } from '../tokenizer.ts';

/** Stored conversations kept per engine; the oldest is forgotten beyond. */
const STORE_LIMIT = 10_000;

interface Stored {
  /** The conversation so far (without instructions: they do not carry over to the next response). */
  readonly messages: unknown[];
}

export class ResponsesApi {
  private readonly store = new Map<string, Stored>();

  constructor(
    private readonly surface: Surface,
    private readonly tokenizer: MockTokenizer,
    private readonly model: string,
    private readonly promptTokensDetails: boolean,
  ) {}

  handle(req: IncomingMessage, res: ServerResponse, body: Record<string, unknown>): void {
    const r = parseResponsesRequest(body);
    const loraName = this.surface.resolveModel(r.model);
    let history: unknown[] = [];
    if (r.previousResponseId) {
      const prev = this.store.get(r.previousResponseId);
      if (!prev) throw vllmError(404, `Response with id '${r.previousResponseId}' not found.`, 'previous_response_id');
      history = prev.messages;
    }
    const [instructions, turn] =
      (r.chat.messages[0] as { role?: string } | undefined)?.role === 'system' &&
      body.instructions !== undefined &&
      body.instructions !== null
        ? [r.chat.messages.slice(0, 1), r.chat.messages.slice(1)]
        : [[], r.chat.messages];
    const messages = [...instructions, ...history, ...turn];
    const prompt = this.tokenizer.encode(this.surface.renderChat({ ...r.chat, messages }));
    const id = `resp_${randomBytes(12).toString('hex')}`;
    const model = loraName ?? this.model;
    this.surface.run(req, res, {
      id,
      prompts: [prompt],
      maxTokens: r.maxOutputTokens,
      loraName,
      cacheSalt: r.cacheSalt,
      promptParam: 'input',
      answer: (arrivalMs) =>
        this.answer(res, {
          id,
          model,
          stream: r.stream,
          promptTokens: prompt.length,
          arrivalMs,
          previousResponseId: r.previousResponseId,
          instructions: typeof body.instructions === 'string' ? body.instructions : null,
          onDone: (text) => {
            if (!r.store) return;
            this.store.set(id, { messages: [...history, ...turn, { role: 'assistant', content: text }] });
            if (this.store.size > STORE_LIMIT) this.store.delete(this.store.keys().next().value as string);
          },
        }),
    });
  }

  private answer(
    res: ServerResponse,
    o: {
      id: string;
      model: string;
      stream: boolean;
      promptTokens: number;
      arrivalMs: number;
      previousResponseId: string | null;
      instructions: string | null;
      onDone: (text: string) => void;
    },
  ): Answer {
    const created = Math.floor(Date.now() / 1000);
    const msgId = `msg_${randomBytes(12).toString('hex')}`;
    const tokens: number[] = [];
    let cached = 0;
    let done = false;
    let seq = 0;
    const usage = () => {
      const u: Record<string, unknown> = {
        input_tokens: o.promptTokens,
        output_tokens: tokens.length,
        output_tokens_details: { reasoning_tokens: 0 },
        total_tokens: o.promptTokens + tokens.length,
      };
      // Like chat's prompt_tokens_details: reported only with --enable-prompt-tokens-details.
      u.input_tokens_details = this.promptTokensDetails ? { cached_tokens: cached } : null;
      return u;
    };
    const response = (status: string, text: string | null) => ({
      id: o.id,
      object: 'response',
      created_at: created,
      model: o.model,
      status,
      error: null,
      incomplete_details: null,
      instructions: o.instructions,
      previous_response_id: o.previousResponseId,
      output:
        text === null
          ? []
          : [
              {
                type: 'message',
                id: msgId,
                role: 'assistant',
                status: 'completed',
                content: [{ type: 'output_text', text, annotations: [] }],
              },
            ],
      parallel_tool_calls: true,
      tool_choice: 'auto',
      tools: [],
      usage: status === 'completed' ? usage() : null,
    });
    const event = (type: string, fields: Record<string, unknown>) =>
      res.write(`event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq++, ...fields })}\n\n`);
    let pending = '';
    if (o.stream) {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      event('response.created', { response: response('in_progress', null) });
      event('response.in_progress', { response: response('in_progress', null) });
      event('response.output_item.added', {
        output_index: 0,
        item: { type: 'message', id: msgId, role: 'assistant', status: 'in_progress', content: [] },
      });
      event('response.content_part.added', {
        item_id: msgId,
        output_index: 0,
        content_index: 0,
        part: { type: 'output_text', text: '', annotations: [] },
      });
    }
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
        if (o.stream && out.newTokens.length > 0) {
          const delta = this.tokenizer.decode(out.newTokens);
          pending += `event: response.output_text.delta\ndata: ${JSON.stringify({ type: 'response.output_text.delta', sequence_number: seq++, item_id: msgId, output_index: 0, content_index: 0, delta, logprobs: [] })}\n\n`;
        }
        if (!out.finished) return;
        sink.flush();
        done = true;
        const text = this.tokenizer.decode(tokens);
        o.onDone(text);
        if (!o.stream) {
          sendJson(res, 200, response('completed', text));
          return;
        }
        const part = { type: 'output_text', text, annotations: [] };
        event('response.output_text.done', { item_id: msgId, output_index: 0, content_index: 0, text, logprobs: [] });
        event('response.content_part.done', { item_id: msgId, output_index: 0, content_index: 0, part });
        event('response.output_item.done', {
          output_index: 0,
          item: { type: 'message', id: msgId, role: 'assistant', status: 'completed', content: [part] },
        });
        event('response.completed', { response: response('completed', text) });
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
