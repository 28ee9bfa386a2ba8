/**
 * The mock engine's OpenAI surface, as vLLM serves it: /v1/completions and /v1/chat/completions (streamed or whole),
 * their render endpoints (/v1/chat/completions/render, /v1/completions/render: the token ids the engine would run),
 * /v1/models, /tokenize, /detokenize, /health, and kvroute's /load; the other APIs are in ./apis/ (responses,
 * Anthropic messages, pooling). Requests are parsed by the router's own parsers (src/apis/) plus
 * vLLM's generation parameters, so router and engine accept and refuse the same bodies.
 */
import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { sendJson } from '../http/body.ts';
import { badRequest } from '../http/errors.ts';
import { type Endpoint, parseChatInput, parseOpenAiRequest } from '../apis/openai-request.ts';
import { EngineInputError, type EngineConfig } from './engine/index.ts';
import type { FaultInjector } from './faults.ts';
import { vllmError, type Routes } from './http.ts';
import type { Rank, RankLoop } from './rank-loop.ts';
import { startAnswer } from './responses.ts';
import type { MockPd, PdPlan } from './disagg-side.ts';
import { chatMediaParts, MEDIA_MARKER, type MediaPart, withMediaMarkers } from '../tokenizer/multimodal.ts';
import type { MmItem } from '../core/types.ts';
import type { MockTokenizer } from './tokenizer.ts';
import type { ChatPromptInput } from '../tokenizer/chat.ts';
import { MessagesApi } from './apis/messages.ts';
import type { RunSpec, Surface } from './apis/surface.ts';
import { PoolingApis } from './apis/pooling.ts';
import { ResponsesApi } from './apis/responses.ts';

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

export type { RunSpec } from './apis/surface.ts';

/** Placeholder tokens the mock's "processor" expands every image or audio part into (docs/engines.md). */
export const MOCK_MM_PLACEHOLDER_TOKENS = 64;
/** Never produced by the mock tokenizer's text pieces, so it cannot occur in rendered text. */

export interface OpenAiSurfaceOptions {
  readonly model: string;
  readonly loraModules: ReadonlySet<string>;
  readonly tokenizer: MockTokenizer;
  readonly config: EngineConfig;
  readonly loop: RankLoop;
  readonly faults: FaultInjector;
  readonly promptTokensDetails: boolean;
  readonly defaultMaxTokens: number;
  /** Disaggregated prefill/decode: this engine's role and handoff protocol. */
  readonly pd?: MockPd;
}

/** The routes that run the engine (the composition root counts them for the crash fault). */
export const GENERATION_ROUTES = [
  '/v1/completions',
  '/v1/chat/completions',
  '/v1/responses',
  '/v1/messages',
  '/v1/embeddings',
  '/pooling',
  '/v1/pooling',
  '/score',
  '/v1/score',
  '/rerank',
  '/v1/rerank',
  '/v2/rerank',
] as const;

export class OpenAiSurface implements Surface {
  private readonly responses: ResponsesApi;
  private readonly messages: MessagesApi;
  private readonly pooling: PoolingApis;

  constructor(private readonly o: OpenAiSurfaceOptions) {
    this.responses = new ResponsesApi(this, o.tokenizer, o.model, o.promptTokensDetails);
    this.messages = new MessagesApi(this, o.tokenizer, o.model);
    this.pooling = new PoolingApis(this, o.tokenizer, o.model);
  }

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
        '/v1/chat/completions/render': (_req, res, body) => this.render('chat', res, body),
        '/v1/completions/render': (_req, res, body) => this.render('completions', res, body),
        '/v1/responses': (req, res, body) => this.responses.handle(req, res, body),
        '/v1/messages': (req, res, body) => this.messages.handle(req, res, body),
        '/v1/messages/count_tokens': (_req, res, body) => this.messages.countTokens(res, body),
        '/v1/embeddings': (req, res, body) => this.pooling.handle('embeddings', req, res, body),
        '/pooling': (req, res, body) => this.pooling.handle('pooling', req, res, body),
        '/v1/pooling': (req, res, body) => this.pooling.handle('pooling', req, res, body),
        '/score': (req, res, body) => this.pooling.handle('score', req, res, body),
        '/v1/score': (req, res, body) => this.pooling.handle('score', req, res, body),
        '/rerank': (req, res, body) => this.pooling.handle('rerank', req, res, body),
        '/v1/rerank': (req, res, body) => this.pooling.handle('rerank', req, res, body),
        '/v2/rerank': (req, res, body) => this.pooling.handle('rerank', req, res, body),
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
  resolveModel(model: string | null): string | null {
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

  /**
   * A chat prompt with images or audio, as a processor gives it to vLLM's engine: the template renders a marker where
   * each media part was; each marker becomes MOCK_MM_PLACEHOLDER_TOKENS placeholder tokens, one multimodal item.
   */
  private chatWithMedia(chat: ChatPromptInput, media: readonly MediaPart[]): { tokens: number[]; items: MmItem[] } {
    const { tokenizer } = this.o;
    const text = this.renderChat({ ...chat, messages: withMediaMarkers(chat.messages, MEDIA_MARKER) });
    const pieces = text.split(MEDIA_MARKER);
    if (pieces.length !== media.length + 1) throw vllmError(400, 'the chat template dropped a multimodal part', 'messages');
    const placeholder = tokenizer.vocabSize - 1;
    const tokens: number[] = [];
    const items: MmItem[] = [];
    pieces.forEach((piece, i) => {
      if (piece.length > 0) tokens.push(...tokenizer.encode(piece));
      if (i < media.length) {
        items.push({ identifier: media[i].identifier, offset: tokens.length, length: MOCK_MM_PLACEHOLDER_TOKENS });
        for (let k = 0; k < MOCK_MM_PLACEHOLDER_TOKENS; k++) tokens.push(placeholder);
      }
    });
    return { tokens, items };
  }

  renderChat(input: ChatPromptInput): string {
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
    const { tokenizer, loop } = this.o;
    const request = parseOpenAiRequest(endpoint, body);
    const gen = parseGenerationParams(endpoint, body);
    const loraName = this.resolveModel(request.model);
    const media = request.chat ? chatMediaParts(request.chat.messages) : [];
    let mmItems: MmItem[] | undefined;
    let prompts: number[][];
    if (request.chat && media.length > 0) {
      const chat = this.chatWithMedia(request.chat, media);
      prompts = [chat.tokens];
      mmItems = chat.items;
    } else {
      prompts = request.chat
        ? [tokenizer.encode(this.renderChat(request.chat))]
        : request.prompts.map((p) => (typeof p === 'string' ? tokenizer.encode(p) : (p as number[])));
    }
    const id = `${endpoint === 'chat' ? 'chatcmpl' : 'cmpl'}-${randomBytes(16).toString('hex')}`;
    const pd = this.o.pd;
    // An engine that picks the DP rank its own way (SGLang: per release, from the header, the body or the room).
    const header = req.headers['x-data-parallel-rank'];
    const chosen =
      pd && pd.role !== 'both' ? pd.rankFor({ role: pd.role, header: typeof header === 'string' ? header : undefined, body, raw }) : null;
    const rank = chosen !== null ? loop.ranks[chosen] : this.pickRank(req);
    // Faults first: an injected failure must not leave a P/D lease or bootstrap room behind.
    this.o.faults.checkGeneration();
    let plan: PdPlan | null = null;
    if (pd && prompts.length === 1) {
      let gone = false;
      res.on('close', () => {
        if (!res.writableFinished) gone = true;
      });
      plan = await pd.plan({
        engine: rank.engine,
        rank: rank.rank,
        endpoint,
        prompt: prompts[0],
        body,
        raw,
        closed: () => gone,
        lora: { loraName, cacheSalt: request.cacheSalt },
        eosFirstToken: this.o.faults.faults.eosFirstToken,
      });
      if (gone) return;
      if (plan?.refusal) {
        // The engine's request validation refused the leg before it ran.
        res.writeHead(plan.refusal.status, { 'content-type': 'application/json' });
        res.end(plan.refusal.body);
        return;
      }
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
    this.run(req, res, {
      id,
      prompts,
      maxTokens: gen.maxTokens,
      loraName,
      cacheSalt: request.cacheSalt,
      seed: gen.seed,
      promptParam: endpoint === 'chat' ? 'messages' : 'prompt',
      rank,
      plan,
      faultsChecked: true,
      mmItems,
      answer: (arrivalMs) =>
        startAnswer(res, tokenizer, {
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
          choiceExtra: plan?.choiceExtra,
          onComplete: plan?.onComplete,
          rewrite: plan?.rewrite,
        }),
    });
  }

  /**
   * Runs prompts through the engine on one rank (the x-data-parallel-rank header's, or the least loaded) and feeds
   * the answer's sinks, one per prompt: every generating API of the mock (chat, completions, responses, messages,
   * pooling) goes through here, so each is cached, timed and announced in KV events the same way.
   */
  run(req: IncomingMessage, res: ServerResponse, spec: RunSpec): void {
    const { config: cfg, loop } = this.o;
    const maxTokensFor = (p: number[]) => spec.maxTokens ?? Math.max(1, Math.min(this.o.defaultMaxTokens, cfg.maxModelLen - p.length));
    for (const p of spec.prompts) {
      if (p.length === 0) throw vllmError(400, 'prompt is empty after tokenization', spec.promptParam);
      const mt = maxTokensFor(p);
      if (p.length + mt > cfg.maxModelLen) {
        throw vllmError(
          400,
          `This model's maximum context length is ${cfg.maxModelLen} tokens. However, you requested ${p.length + mt} tokens (${p.length} in the messages, ${mt} in the completion). Please reduce the length of the messages or completion.`,
          spec.promptParam,
        );
      }
    }
    const rank = spec.rank ?? this.pickRank(req);
    if (!spec.faultsChecked) this.o.faults.checkGeneration();

    const plan = spec.plan;
    const engineIds = spec.prompts.map((_, i) => (plan?.requestId && i === 0 ? plan.requestId : `${spec.id}-${i}`));
    const arrivalMs = loop.modelNow(rank);
    const added: string[] = [];
    try {
      spec.prompts.forEach((p, i) => {
        rank.engine.addRequest(
          {
            requestId: engineIds[i],
            promptTokens: p,
            maxTokens: plan?.maxTokens ?? maxTokensFor(p),
            loraName: spec.loraName,
            cacheSalt: spec.cacheSalt,
            seed: spec.seed,
            preloadedTokens: plan?.preloadedTokens,
            holdOnFinish: plan?.holdOnFinish,
            mmItems: i === 0 ? spec.mmItems : undefined,
          },
          arrivalMs,
        );
        added.push(engineIds[i]);
      });
    } catch (err) {
      for (const a of added) rank.engine.abort(a);
      if (err instanceof EngineInputError) throw vllmError(400, err.message, spec.promptParam);
      throw err;
    }

    const answer = spec.answer(arrivalMs);
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

  /**
   * vLLM's render endpoints: the prompt of a chat or completion request as the engine would run it, without running
   * it. Chat answers one object `{token_ids, ...}`; completions a list, one per prompt.
   */
  private render(endpoint: Endpoint, res: ServerResponse, body: Record<string, unknown>): void {
    const request = parseOpenAiRequest(endpoint, body);
    this.resolveModel(request.model);
    const model = request.model ?? this.o.model;
    const requestId = `${endpoint === 'chat' ? 'chatcmpl' : 'cmpl'}-${randomBytes(16).toString('hex')}`;
    if (request.chat) {
      const tokenIds = this.o.tokenizer.encode(this.renderChat(request.chat));
      sendJson(res, 200, { request_id: requestId, model, token_ids: tokenIds });
      return;
    }
    sendJson(
      res,
      200,
      request.prompts.map((p, i) => ({
        request_id: `${requestId}-${i}`,
        model,
        token_ids: typeof p === 'string' ? this.o.tokenizer.encode(p) : p,
      })),
    );
  }

  private detokenize(res: ServerResponse, body: Record<string, unknown>): void {
    const t = body.tokens;
    if (!Array.isArray(t) || !t.every((x) => typeof x === 'number' && Number.isInteger(x) && x >= 0 && x <= 0xffffffff)) {
      throw vllmError(400, 'tokens must be a list of token ids', 'tokens');
    }
    sendJson(res, 200, { prompt: this.o.tokenizer.decode(t as number[]) });
  }
}
