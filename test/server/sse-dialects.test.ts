/** The SSE relay's named-event dialects: where each API's stream ends and how its usage is read. */
import { describe, expect, it } from 'vitest';
import { readAnthropicUsage, readResponsesUsage, SseRelay } from '../../src/apis/sse.ts';

const ev = (type: string, data: unknown) => `event: ${type}\ndata: ${JSON.stringify({ type, ...(data as object) })}\n\n`;

describe('responses dialect', () => {
  it('reads usage and the response id from response.completed, split across chunks, and forwards every byte', () => {
    const r = new SseRelay(false, 'responses');
    const all =
      ev('response.created', { response: { id: 'resp_1', usage: null } }) +
      ev('response.output_text.delta', { delta: 'hi' }) +
      ev('response.completed', {
        response: { id: 'resp_1', usage: { input_tokens: 40, output_tokens: 2, input_tokens_details: { cached_tokens: 32 } } },
      });
    const bytes = Buffer.from(all);
    let out = '';
    for (let i = 0; i < bytes.length; i += 7) out += r.push(bytes.subarray(i, i + 7)).toString();
    out += r.flush().toString();
    expect(out).toBe(all);
    expect(r.sawDone).toBe(true);
    expect(r.sawError).toBe(false);
    expect(r.usage).toEqual({ promptTokens: 40, completionTokens: 2, cachedTokens: 32, responseId: 'resp_1' });
  });

  it('a stream without its terminal event is not done; response.failed is an error; absent details stay unknown', () => {
    const r = new SseRelay(false, 'responses');
    r.push(Buffer.from(ev('response.created', { response: { id: 'resp_2' } })));
    expect(r.sawDone).toBe(false);
    r.push(Buffer.from(ev('response.failed', { response: { id: 'resp_2', usage: { input_tokens: 5, output_tokens: 0 } } })));
    expect(r.sawDone).toBe(true);
    expect(r.sawError).toBe(true);
    expect(r.usage?.cachedTokens).toBeUndefined();
    expect(readResponsesUsage({ input_tokens: 3, input_tokens_details: null })).toEqual({
      promptTokens: 3,
      completionTokens: undefined,
      cachedTokens: undefined,
    });
  });
});

describe('anthropic dialect', () => {
  it('input and cache reads from message_start, output from message_delta, done at message_stop', () => {
    const r = new SseRelay(false, 'anthropic');
    r.push(
      Buffer.from(
        ev('message_start', { message: { id: 'msg_1', usage: { input_tokens: 8, cache_read_input_tokens: 48, output_tokens: 0 } } }),
      ),
    );
    r.push(Buffer.from(ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'x' } })));
    expect(r.sawDone).toBe(false);
    r.push(
      Buffer.from(ev('message_delta', { delta: { stop_reason: 'max_tokens' }, usage: { output_tokens: 4 } }) + ev('message_stop', {})),
    );
    expect(r.sawDone).toBe(true);
    expect(r.usage).toEqual({ promptTokens: 56, completionTokens: 4, cachedTokens: 48, responseId: undefined });
  });

  it('an error event marks the stream failed; usage without cache fields leaves delivered reuse unknown', () => {
    const r = new SseRelay(false, 'anthropic');
    r.push(Buffer.from(ev('error', { error: { type: 'overloaded_error', message: 'busy' } })));
    expect(r.sawError).toBe(true);
    expect(readAnthropicUsage({ input_tokens: 10, output_tokens: 1 })).toEqual({
      promptTokens: 10,
      completionTokens: 1,
      cachedTokens: undefined,
    });
    expect(readAnthropicUsage('nonsense')).toBeUndefined();
  });
});
