/**
 * The mock engine's pooling APIs, as vLLM serves them for a pooling model: `/v1/embeddings`, `/pooling`, `/score`,
 * `/rerank` (also under /v1, and /v2/rerank). Every prompt runs through the engine as a prefill (one step of output,
 * discarded), so it is cached, timed and announced in KV events like a generation; the vectors are a deterministic
 * function of the prompt's token ids (no weights): 16 floats from an FNV hash, unit length. A score is the cosine of
 * the query's and the document's vectors, mapped to [0, 1]. Usage is prompt tokens only, as vLLM reports it.
 */
import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { sendJson } from '../../http/body.ts';
import { type PoolingApi, type PoolingInput, parsePoolingRequest } from '../../apis/pooling-request.ts';
import { vllmError } from '../http.ts';
import type { Surface } from './surface.ts';
import type { Sink } from '../rank-loop.ts';
import type { MockTokenizer } from '../tokenizer.ts';

const DIM = 16;

/** A unit vector from token ids: FNV-1a over the ids, one 32-bit state per dimension. */
export function mockEmbedding(ids: readonly number[]): number[] {
  const v = new Array<number>(DIM);
  let norm = 0;
  for (let d = 0; d < DIM; d++) {
    let h = (0x811c9dc5 ^ d) >>> 0;
    for (const t of ids) h = Math.imul(h ^ t, 0x01000193) >>> 0;
    v[d] = (h / 0xffffffff) * 2 - 1;
    norm += v[d] * v[d];
  }
  const n = Math.sqrt(norm) || 1;
  return v.map((x) => x / n);
}

function cosine01(a: readonly number[], b: readonly number[]): number {
  let dot = 0;
  for (let i = 0; i < a.length; i++) dot += a[i] * b[i];
  return (dot + 1) / 2;
}

export class PoolingApis {
  constructor(
    private readonly surface: Surface,
    private readonly tokenizer: MockTokenizer,
    private readonly model: string,
  ) {}

  private encode(input: PoolingInput): number[] {
    if (typeof input === 'string') return this.tokenizer.encode(input);
    if (Array.isArray(input)) return [...(input as number[])];
    const pair = input as { query: string; document: string };
    return [...this.tokenizer.encode(pair.query), ...this.tokenizer.encode(pair.document)];
  }

  handle(api: PoolingApi, req: IncomingMessage, res: ServerResponse, body: Record<string, unknown>): void {
    const p = parsePoolingRequest(api, body);
    const loraName = this.surface.resolveModel(p.model);
    const format = body.encoding_format ?? 'float';
    if (format !== 'float' && format !== 'base64') throw vllmError(400, '"encoding_format" must be "float" or "base64"', 'encoding_format');
    const prompts = p.chat ? [this.tokenizer.encode(this.surface.renderChat(p.chat))] : p.inputs.map((i) => this.encode(i));
    const id = `${api === 'embeddings' ? 'embd' : api}-${randomBytes(12).toString('hex')}`;
    const model = loraName ?? this.model;
    let left = prompts.length;
    let done = false;
    const promptTokens = prompts.reduce((a, x) => a + x.length, 0);
    const usage = { prompt_tokens: promptTokens, total_tokens: promptTokens, completion_tokens: 0, prompt_tokens_details: null };
    const created = Math.floor(Date.now() / 1000);
    const vector = (v: number[]) => (format === 'base64' ? Buffer.from(new Float32Array(v).buffer).toString('base64') : v);
    const finish = () => {
      done = true;
      if (api === 'embeddings' || api === 'pooling') {
        const data = prompts.map((ids, index) =>
          api === 'embeddings'
            ? { index, object: 'embedding', embedding: vector(mockEmbedding(ids)) }
            : { index, object: 'pooling', data: mockEmbedding(ids) },
        );
        sendJson(res, 200, { id, object: 'list', created, model, data, usage });
        return;
      }
      const scores = p.inputs.map((i) => {
        const pair = i as { query: string; document: string };
        return cosine01(mockEmbedding(this.tokenizer.encode(pair.query)), mockEmbedding(this.tokenizer.encode(pair.document)));
      });
      if (api === 'score') {
        sendJson(res, 200, {
          id,
          object: 'list',
          created,
          model,
          data: scores.map((score, index) => ({ index, object: 'score', score })),
          usage,
        });
        return;
      }
      const topN = typeof body.top_n === 'number' && body.top_n > 0 ? body.top_n : scores.length;
      const results = scores
        .map((relevance_score, index) => ({
          index,
          document: { text: (p.inputs[index] as { document: string }).document },
          relevance_score,
        }))
        .sort((a, b) => b.relevance_score - a.relevance_score)
        .slice(0, topN);
      sendJson(res, 200, { id, model, usage: { total_tokens: promptTokens }, results });
    };
    this.surface.run(req, res, {
      id,
      prompts,
      maxTokens: 1,
      loraName,
      cacheSalt: typeof body.cache_salt === 'string' && body.cache_salt !== '' ? body.cache_salt : null,
      promptParam: api === 'rerank' ? 'query' : api === 'score' ? 'text_1' : 'input',
      answer: (arrivalMs) => {
        const sinks = prompts.map(
          (): Sink => ({
            arrivalMs,
            flush() {},
            onOutput(out) {
              if (done || !out.finished) return;
              if (--left === 0) finish();
            },
            onAbort() {
              done = true;
              res.destroy();
            },
          }),
        );
        return {
          sinks,
          clientLeft() {
            if (done) return false;
            done = true;
            return true;
          },
        };
      },
    });
  }
}
