/**
 * Engine paths the router does not route by prefix: `/tokenize`, `/detokenize`, `/v1/messages/count_tokens` and any
 * other `/v1/*` path the engines serve. Each goes to a worker serving the model named in the body (any worker when the
 * body names none): the dispatcher picks it by the same worker filters as routed requests (health, breaker, model),
 * the least busy first. Auth, body limits and metrics apply as to routed requests; the answer streams back as it comes.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Dispatcher as UndiciDispatcher } from 'undici';
import { HttpError } from '../http/errors.ts';
import type { RouterMetrics } from '../metrics/registry.ts';
import type { Dispatcher } from '../core/dispatch/dispatcher.ts';
import type { ServeConfig } from '../config/serve.ts';
import { readBody } from '../http/body.ts';
import { parseJsonBody } from '../apis/openai-request.ts';
import { sanitizeRequestId } from '../runtime/request-flow.ts';
import { checkJsonDepth } from '../runtime/security/index.ts';
import { refusalError } from '../runtime/refusals.ts';
import type { RequestTrace } from '../runtime/tracing.ts';
import type { WorkerSet } from '../runtime/workers.ts';

/** Path labels of the pass-through metric: these, or "other" (bounded cardinality whatever clients send). */
const KNOWN = new Set([
  '/tokenize',
  '/detokenize',
  '/v1/messages/count_tokens',
  '/v1/chat/completions/render',
  '/v1/completions/render',
  '/v1/models',
  '/v1/load_lora_adapter',
  '/v1/unload_lora_adapter',
  '/v1/audio/transcriptions',
  '/v1/audio/translations',
  '/classify',
  '/v1/classify',
]);

const SKIP_RESPONSE_HEADERS = new Set(['connection', 'keep-alive', 'transfer-encoding', 'date', 'server']);

export function passthroughPath(method: string | undefined, path: string): boolean {
  if (path === '/tokenize' || path === '/detokenize') return method === 'POST';
  return path.startsWith('/v1/');
}

export interface PassthroughContext {
  readonly config: ServeConfig;
  readonly dispatcher: Dispatcher;
  readonly workers: WorkerSet;
  readonly metrics: RouterMetrics;
  readonly log: { warn(o: object, m: string): void };
}

export async function handlePassthrough(
  ctx: PassthroughContext,
  req: IncomingMessage,
  res: ServerResponse,
  pathAndQuery: string,
  path: string,
  trace: RequestTrace,
): Promise<void> {
  const label = KNOWN.has(path) ? path : 'other';
  const hasBody = req.method !== 'GET' && req.method !== 'HEAD';
  let raw: Buffer | undefined;
  let model: string | null = null;
  try {
    if (hasBody) {
      raw = await readBody(req, ctx.config.bodyLimitBytes);
      // JSON bodies are checked like routed ones and name the model; others (multipart audio) go as bytes to any worker.
      if ((req.headers['content-type'] ?? '').includes('json')) {
        const tooDeep = checkJsonDepth(raw, ctx.config.maxJsonDepth);
        if (tooDeep) throw tooDeep;
        const b = parseJsonBody(raw.toString('utf8')) as { model?: unknown } | null;
        if (b && typeof b === 'object' && typeof b.model === 'string' && b.model !== '') model = b.model;
      }
    }
    const target = ctx.dispatcher.passthroughTarget(model, Date.now());
    if (!('workerId' in target)) throw refusalError(target, ctx.config);
    const worker = ctx.workers.get(target.workerId);
    if (!worker) throw new HttpError(503, `worker ${target.workerId} left`, 'service_unavailable', 'no_workers');
    trace.set({ 'kvroute.worker': worker.id, 'kvroute.passthrough': true, ...(model ? { 'gen_ai.request.model': model } : {}) });
    const headers: Record<string, string> = {};
    const ct = req.headers['content-type'];
    if (ct) headers['content-type'] = ct;
    const accept = req.headers.accept;
    if (accept) headers.accept = accept;
    const rid = sanitizeRequestId(req.headers['x-request-id']);
    if (rid) headers['x-request-id'] = rid;
    const span = trace.attempt({ 'kvroute.worker': worker.id, 'server.address': worker.url, 'url.path': path }, headers);
    const abort = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) abort.abort();
    });
    let upstream: UndiciDispatcher.ResponseData;
    try {
      upstream = await worker.pool.request({
        method: (req.method ?? 'GET') as UndiciDispatcher.HttpMethod,
        path: pathAndQuery,
        headers,
        body: raw,
        signal: abort.signal,
      });
    } catch (err) {
      span.end((err as Error).message);
      throw new HttpError(502, `${worker.id}: ${(err as Error).message}`, 'upstream_error', 'upstream_error');
    }
    span.set({ 'http.response.status_code': upstream.statusCode });
    const out: Record<string, string | string[]> = { 'x-kvroute-worker': worker.id };
    for (const [k, v] of Object.entries(upstream.headers)) if (v !== undefined && !SKIP_RESPONSE_HEADERS.has(k)) out[k] = v;
    res.writeHead(upstream.statusCode, out);
    try {
      for await (const chunk of upstream.body) if (!res.write(chunk)) await new Promise((r) => res.once('drain', r));
      res.end();
      span.end();
    } catch (err) {
      span.end((err as Error).message);
      res.destroy();
    }
    ctx.metrics.passthrough(label, upstream.statusCode);
  } catch (err) {
    ctx.metrics.passthrough(label, err instanceof HttpError ? err.status : 500);
    throw err;
  }
}
