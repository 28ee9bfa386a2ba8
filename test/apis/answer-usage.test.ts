/** A whole answer's usage, read from its tail (answerUsage): the same figures as parsing the answer, for every shape. */
import { describe, expect, it } from 'vitest';
import { answerUsage, tailUsage } from '../../src/apis/sse.ts';
import { chatApi } from '../../src/apis/openai.ts';
import { messagesApi } from '../../src/apis/messages.ts';
import { responsesApi } from '../../src/apis/responses.ts';

const usage = { prompt_tokens: 64, completion_tokens: 4, total_tokens: 68, prompt_tokens_details: { cached_tokens: 48 } };

describe('answerUsage', () => {
  it('reads the usage of a vLLM-shaped answer (usage before trailing fields) as the whole parse does, bytes unchanged', () => {
    const answer = {
      id: 'cmpl-1',
      object: 'chat.completion',
      choices: [{ index: 0, message: { role: 'assistant', content: 'a "usage": {"prompt_tokens": 1} in the text' } }],
      usage,
      prompt_logprobs: null,
      kv_transfer_params: null,
    };
    const body = Buffer.from(JSON.stringify(answer));
    const r = answerUsage(chatApi, body);
    expect(r.body).toBe(body);
    expect(r.usage).toEqual(chatApi.readAnswer(answer));
    expect(r.usage).toEqual({ promptTokens: 64, completionTokens: 4, cachedTokens: 48 });
  });

  it('finds the usage past a large answer, with pretty-printed spacing and strings holding braces and escapes', () => {
    const answer = {
      data: Array.from({ length: 2000 }, (_, i) => ({ index: i, embedding: [0.1, -0.2, 0.3] })),
      usage: { prompt_tokens: 9, completion_tokens: 0, note: 'a } brace and a \\" quote {' },
    };
    const body = Buffer.from(JSON.stringify(answer, null, 2));
    expect(body.length).toBeGreaterThan(100_000);
    expect(tailUsage(body)).toEqual(answer.usage);
    expect(answerUsage(chatApi, body).usage).toEqual({ promptTokens: 9, completionTokens: 0, cachedTokens: undefined });
  });

  it('falls back to parsing the whole answer when the usage is far from its end, and to nothing when it is not JSON', () => {
    const answer = { usage, choices: [{ text: 'x'.repeat(10_000) }] };
    const body = Buffer.from(JSON.stringify(answer));
    expect(tailUsage(body)).toBeUndefined();
    expect(answerUsage(chatApi, body).usage).toEqual({ promptTokens: 64, completionTokens: 4, cachedTokens: 48 });
    const junk = Buffer.from('{"usage": {"prompt_tokens": 3, ');
    expect(answerUsage(chatApi, junk)).toEqual({ usage: undefined, body: junk });
    expect(answerUsage(chatApi, Buffer.from('no json')).usage).toBeUndefined();
  });

  it('an Anthropic answer: its usage read by the adapter; a Responses answer: parsed whole for its id', () => {
    const msg = { id: 'msg_1', content: [], usage: { input_tokens: 10, cache_read_input_tokens: 30, output_tokens: 2 } };
    expect(answerUsage(messagesApi, Buffer.from(JSON.stringify(msg))).usage).toEqual({
      promptTokens: 40,
      completionTokens: 2,
      cachedTokens: 30,
    });
    const resp = { id: 'resp_7', output: [], usage: { input_tokens: 8, output_tokens: 1, input_tokens_details: { cached_tokens: 4 } } };
    expect(answerUsage(responsesApi, Buffer.from(JSON.stringify(resp))).usage).toEqual({
      promptTokens: 8,
      completionTokens: 1,
      cachedTokens: 4,
      responseId: 'resp_7',
    });
  });

  it('rewrites the cached tokens when told to (a disaggregated request), and removes them for null', () => {
    const body = Buffer.from(JSON.stringify({ choices: [], usage }));
    const set = answerUsage(chatApi, body, 16);
    expect(set.usage?.cachedTokens).toBe(48);
    expect(JSON.parse(set.body.toString()).usage.prompt_tokens_details).toEqual({ cached_tokens: 16 });
    const removed = answerUsage(chatApi, body, null);
    expect(JSON.parse(removed.body.toString()).usage.prompt_tokens_details).toEqual({});
  });

  it('rewrites the cached tokens in the usage object alone: every other byte of a pretty-printed answer as it came', () => {
    const answer = {
      id: 'cmpl-9',
      choices: [{ index: 0, text: 'a "usage": {"prompt_tokens": 1} and é ✓ in the text', finish_reason: 'stop' }],
      usage,
      kv_transfer_params: null,
    };
    const text = JSON.stringify(answer, null, 2);
    const body = Buffer.from(text);
    const start = text.lastIndexOf('"usage": {') + '"usage": '.length;
    const end = text.indexOf('\n  }', start) + '\n  }'.length;
    for (const override of [16, null]) {
      const r = answerUsage(chatApi, body, override);
      // The engine's figures are the ones read (the routing learns what the decode engine reported).
      expect(r.usage).toEqual({ promptTokens: 64, completionTokens: 4, cachedTokens: 48 });
      const out = r.body.toString('utf8');
      const details = override === null ? {} : { cached_tokens: override };
      const usageOut = JSON.stringify({ ...usage, prompt_tokens_details: details });
      expect(out).toBe(text.slice(0, start) + usageOut + text.slice(end));
      expect(JSON.parse(out)).toEqual({ ...answer, usage: { ...usage, prompt_tokens_details: details } });
    }
    expect(body.toString('utf8')).toBe(text); // the engine's buffer is not written to
  });

  it('rewrites the cached tokens of an answer whose usage is not in its tail by parsing it whole', () => {
    const answer = { id: 'cmpl-3', usage, choices: [{ text: 'x'.repeat(10_000) }] };
    const body = Buffer.from(JSON.stringify(answer));
    const r = answerUsage(chatApi, body, 7);
    expect(r.usage).toEqual({ promptTokens: 64, completionTokens: 4, cachedTokens: 48 });
    expect(JSON.parse(r.body.toString())).toEqual({ ...answer, usage: { ...usage, prompt_tokens_details: { cached_tokens: 7 } } });
    // Not JSON and no usage: passed on as it is.
    const junk = Buffer.from('not json');
    expect(answerUsage(chatApi, junk, 7)).toEqual({ usage: undefined, body: junk });
  });
});
