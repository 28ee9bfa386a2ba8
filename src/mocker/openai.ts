/**
 * The mock engine's OpenAI surface, as vLLM serves it: /v1/completions and /v1/chat/completions (streamed or whole),
 * /v1/models, /tokenize, /detokenize, /health, and kvroute's /load. Requests are parsed by the router's own parser
 * (src/openai/request.ts) plus vLLM's generation parameters, so router and engine accept and refuse the same bodies.
 */
import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { sendJson } from '../http/body.ts';
import { badRequest } from '../http/errors.ts';
import { type Endpoint, parseChatInput, parseOpenAiRequest } from '../openai/request.ts';
import { EngineInputError, type EngineConfig } from './engine/index.ts';
import type { FaultInjector } from './faults.ts';
import { vllmError, type Routes } from './http.ts';
import type { Rank, RankLoop } from './rank-loop.ts';
import { startAnswer } from './responses.ts';
import type { MockPd, PdPlan } from './pd.ts';
import type { MockTokenizer } from './tokenizer.ts';
import { rawMember } from '../openai/raw-json.ts';
import type { ChatPromptInput } from '../tokenizer/chat.ts';

/** vLLM's generation parameters the mock engine acts on (the rest of a request passes through, as in vLLM). */
export interface GenerationParams {
  /** null: the engine's default (defaultMaxTokens, capped by the context left). */
  readonly maxTokens: number | null;
  readonly seed: number | undefined;
  readonly returnTokenIds: boolean;
}

function optionalInteger(body: Record<string, unknown>, key: string, min?: number): number | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || (min !== undefined && v < min)) {
    throw badRequest(min === undefined ? `"${key}" must be an integer` : `"${key}" must be an integer >= ${min}`, key);
  }
  return v;
}

/**
 * The mock's own part of a request, by vLLM's rules: max_tokens (and chat's max_completion_tokens, which wins) at least 1,
 * n at least 1 (the mock serves n = 1 only), seed any integer, return_token_ids a boolean.
 */
export function parseGenerationParams(endpoint: Endpoint, body: Record<string, unknown>): GenerationParams {
  const maxTokens = optionalInteger(body, 'max_tokens', 1);
  const maxCompletionTokens = endpoint === 'chat' ? optionalInteger(body, 'max_completion_tokens', 1) : undefined;
  const n = optionalInteger(body, 'n', 1) ?? 1;
  if (n !== 1) throw badRequest('the mock engine supports n = 1 only', 'n');
  const seed = optionalInteger(body, 'seed');
  const r = body.return_token_ids;
  if (r !== undefined && r !== null && typeof r !== 'boolean') throw badRequest('"return_token_ids" must be a boolean', 'return_token_ids');
  return { maxTokens: maxCompletionTokens ?? maxTokens ?? null, seed, returnTokenIds: r === true };
}

export interface OpenAiSurfaceOptions {
  readonly model: string;
  readonly loraModules: ReadonlySet<string>;
  readonly tokenizer: MockTokenizer;
  readonly config: EngineConfig;
  readonly loop: RankLoop;
  readonly faults: FaultInjector;
  readonly promptTokensDetails: boolean;
  readonly defaultMaxTokens: number;
  /** A side of a disaggregated pair (absent: aggregated serving). */
  readonly pd?: MockPd;
}

export class OpenAiSurface {
  constructor(private readonly o: OpenAiSurfaceOptions) {}

  /** The routes this surface serves (generation routes are wrapped by the composition root for the crash fault). */
  routes(): Routes {
    return {
      get: {
        '/health': (_req, res) => this.health(res),
        '/v1/models': (_req, res) => this.models(res),
        '/load': (_req, res) => this.load(res),
      },
      post: {
        '/v1/completions': (req, res, body, raw) => this.generate('completions', req, res, body, raw),
        '/v1/chat/completions': (req, res, body, raw) => this.generate('chat', req, res, body, raw),
        ...this.o.pd?.routes(),
        '/tokenize': (_req, res, body) => this.tokenize(res, body),
        '/detokenize': (_req, res, body) => this.detokenize(res, body),
      },
    };
  }

  private health(res: ServerResponse): void {
    res.writeHead(this.o.faults.faults.unhealthy ? 503 : 200, { 'content-length': 0 });
    res.end();
  }

  private models(res: ServerResponse): void {
    const card = (id: string, parent: string | null) => ({
      id,
      object: 'model',
      created: Math.floor(Date.now() / 1000),
      owned_by: 'vllm',
      root: parent ?? id,
      parent,
      max_model_len: this.o.config.maxModelLen,
      permission: [],
    });
    const { model, loraModules } = this.o;
    sendJson(res, 200, { object: 'list', data: [card(model, null), ...[...loraModules].map((l) => card(l, model))] });
  }

  private load(res: ServerResponse): void {
    const per = this.o.loop.ranks.map((r) => ({
      rank: r.rank,
      running: r.engine.numRunning,
      waiting: r.engine.numWaiting,
      kv_usage: r.engine.kvUsage,
    }));
    sendJson(res, 200, {
      running: per.reduce((a, p) => a + p.running, 0),
      waiting: per.reduce((a, p) => a + p.waiting, 0),
      kv_usage: per.reduce((a, p) => a + p.kv_usage, 0) / per.length,
      ranks: per,
    });
  }

  /** The LoRA adapter a model name runs under (null: the base model, also when absent); 404 for a model not served. */
  private resolveModel(model: string | null): string | null {
    if (model === null || model === this.o.model) return null;
    if (this.o.loraModules.has(model)) return model;
    throw vllmError(404, `The model \`${model}\` does not exist.`, 'model');
  }

  /** `x-data-parallel-rank` picks a rank; without it, the least loaded one. */
  private pickRank(req: IncomingMessage): Rank {
    const ranks = this.o.loop.ranks;
    const h = req.headers['x-data-parallel-rank'];
    if (typeof h === 'string' && h !== '') {
      const n = Number(h);
      if (!Number.isInteger(n) || n < 0 || n >= ranks.length)
        throw vllmError(400, `x-data-parallel-rank must be in [0, ${ranks.length})`, 'x-data-parallel-rank');
      return ranks[n];
    }
    let best = ranks[0];
    for (const r of ranks) if (r.load < best.load) best = r;
    return best;
  }

  private renderChat(input: ChatPromptInput): string {
    try {
      return this.o.tokenizer.renderChat(input);
    } catch (err) {
      throw vllmError(400, `chat template failed: ${(err as Error).message}`);
    }
  }

  private async generate(
    endpoint: Endpoint,
    req: IncomingMessage,
    res: ServerResponse,
    body: Record<string, unknown>,
    raw = '',
  ): Promise<void> {
    const { tokenizer, config: cfg, loop } = this.o;
    const request = parseOpenAiRequest(endpoint, body);
    const gen = parseGenerationParams(endpoint, body);
    const loraName = this.resolveModel(request.model);
    const promptParam = endpoint === 'chat' ? 'messages' : 'prompt';
    const prompts: number[][] = request.chat
      ? [tokenizer.encode(this.renderChat(request.chat))]
      : request.prompts.map((p) => (typeof p === 'string' ? tokenizer.encode(p) : (p as number[])));
    const maxTokensFor = (p: number[]) => gen.maxTokens ?? Math.max(1, Math.min(this.o.defaultMaxTokens, cfg.maxModelLen - p.length));
    for (const p of prompts) {
      if (p.length === 0) throw vllmError(400, 'prompt is empty after tokenization', promptParam);
      const mt = maxTokensFor(p);
      if (p.length + mt > cfg.maxModelLen) {
        throw vllmError(
          400,
          `This model's maximum context length is ${cfg.maxModelLen} tokens. However, you requested ${p.length + mt} tokens (${p.length} in the messages, ${mt} in the completion). Please reduce the length of the messages or completion.`,
          promptParam,
        );
      }
    }
    const pd = this.o.pd;
    let rank = this.pickRank(req);
    if (pd?.protocol === 'sglang' && pd.role === 'prefill' && loop.ranks.length > 1) {
      // SGLang: a prefill's DP rank is bootstrap_room mod its DP size.
      const room = rawMember(raw, 'bootstrap_room');
      if (room !== undefined && /^\d+$/.test(room)) rank = loop.ranks[Number(BigInt(room) % BigInt(loop.ranks.length))];
    }
    this.o.faults.checkGeneration();

    const id = `${endpoint === 'chat' ? 'chatcmpl' : 'cmpl'}-${randomBytes(16).toString('hex')}`;
    const arrivalMs = loop.modelNow(rank);
    let gone = false;
    res.on('close', () => {
      if (!res.writableFinished) gone = true;
    });
    let plan: PdPlan | null = null;
    if (pd && prompts.length === 1) {
      plan = await pd.plan(rank.engine, prompts[0], body, raw, () => gone, { loraName, cacheSalt: request.cacheSalt });
      if (gone) return;
      if (plan?.failure) {
        if (!request.stream) throw vllmError(500, plan.failure);
        // vLLM streams: the head is out before the engine fails the request; the error comes in-band.
        res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
        res.write(
          `data: ${JSON.stringify({ error: { object: 'error', message: plan.failure, type: 'InternalServerError', param: null, code: 500 } })}\n\n`,
        );
        res.end('data: [DONE]\n\n');
        return;
      }
    }
    const engineIds = prompts.map((_, i) => (plan?.requestId && i === 0 ? plan.requestId : `${id}-${i}`));
    const added: string[] = [];
    try {
      prompts.forEach((p, i) => {
        rank.engine.addRequest(
          {
            requestId: engineIds[i],
            promptTokens: p,
            maxTokens: plan?.maxTokens ?? maxTokensFor(p),
            loraName,
            cacheSalt: request.cacheSalt,
            seed: gen.seed,
            preloadedTokens: plan?.preloadedTokens,
            holdOnFinish: plan?.holdOnFinish,
          },
          arrivalMs,
        );
        added.push(engineIds[i]);
      });
    } catch (err) {
      for (const a of added) rank.engine.abort(a);
      if (err instanceof EngineInputError) throw vllmError(400, err.message, promptParam);
      throw err;
    }

    const answer = startAnswer(res, tokenizer, {
      endpoint,
      id,
      created: Math.floor(Date.now() / 1000),
      model: loraName ?? this.o.model,
      prompts,
      stream: request.stream,
      includeUsage: request.includeUsage,
      returnTokenIds: gen.returnTokenIds,
      promptTokensDetails: this.o.promptTokensDetails,
      arrivalMs,
      extra: plan?.extra,
      onComplete: plan?.onComplete,
    });
    for (const [i, sink] of answer.sinks.entries()) rank.sinks.set(engineIds[i], sink);
    res.on('close', () => {
      if (!answer.clientLeft()) return;
      for (const eid of engineIds) {
        rank.sinks.delete(eid);
        rank.engine.abort(eid);
      }
    });
    loop.kick(rank);
  }

  /** vLLM's /tokenize: a string `prompt`, or `messages` rendered with the chat template (generation prompt by default). */
  private tokenize(res: ServerResponse, body: Record<string, unknown>): void {
    this.resolveModel(typeof body.model === 'string' && body.model !== '' ? body.model : null);
    let tokens: number[];
    if (typeof body.prompt === 'string') tokens = this.o.tokenizer.encode(body.prompt);
    else if (body.messages !== undefined) tokens = this.o.tokenizer.encode(this.renderChat(parseChatInput(body)));
    else throw vllmError(400, 'tokenize needs a string prompt or a list of messages', 'prompt');
    sendJson(res, 200, { count: tokens.length, max_model_len: this.o.config.maxModelLen, tokens, token_strs: null });
  }

  private detokenize(res: ServerResponse, body: Record<string, unknown>): void {
    const t = body.tokens;
    if (!Array.isArray(t) || !t.every((x) => typeof x === 'number' && Number.isInteger(x) && x >= 0 && x <= 0xffffffff)) {
      throw vllmError(400, 'tokens must be a list of token ids', 'tokens');
    }
    sendJson(res, 200, { prompt: this.o.tokenizer.decode(t as number[]) });
  }
}
