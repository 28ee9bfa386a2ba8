/**
 * The mock engine's HTTP plumbing: a route table over node:http, request bodies read and parsed as JSON objects, and
 * every error answered in vLLM's shape (`type` named after the status, `code` the HTTP status number). A crash (die)
 * closes the server; a restart listens again on the same port with a fresh one.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { readBody } from '../http/body.ts';
import { HttpError, sendError, type ErrorType } from '../http/errors.ts';
import { parseJsonBody, requireObject } from '../apis/openai-request.ts';
import { sendAnthropicError } from '../apis/messages-request.ts';

/** Request bodies past this are refused (413): token-id prompts of a long context fit many times over. */
const BODY_LIMIT_BYTES = 64 << 20;

function vllmErrorType(status: number): ErrorType {
  if (status === 404) return 'NotFoundError';
  if (status === 503) return 'ServiceUnavailableError';
  if (status >= 500) return 'InternalServerError';
  return 'BadRequestError';
}

/** An error as vLLM answers it. */
export function vllmError(status: number, message: string, param: string | null = null): HttpError {
  return new HttpError(status, message, vllmErrorType(status), status, param);
}

/** Any error in vLLM's shape: the shared parsers' errors keep their status, message and param; anything else is a 500. */
export function asVllmError(err: unknown): HttpError {
  if (err instanceof HttpError) {
    if (err.code === err.status) return err;
    return new HttpError(err.status, err.message, vllmErrorType(err.status), err.status, err.param, err.headers);
  }
  return vllmError(500, `internal error: ${(err as Error)?.message ?? String(err)}`);
}

export type GetHandler = (req: IncomingMessage, res: ServerResponse) => void | Promise<void>;
/** `raw` is the body's text (values JSON.parse would round, like SGLang's 63-bit bootstrap_room, are read from it). */
export type PostHandler = (req: IncomingMessage, res: ServerResponse, body: Record<string, unknown>, raw: string) => void | Promise<void>;

export interface Routes {
  readonly get: Readonly<Record<string, GetHandler>>;
  /** POST routes take a JSON object body. */
  readonly post: Readonly<Record<string, PostHandler>>;
}

export class MockHttpServer {
  private server: Server | null = null;

  constructor(
    private readonly host: string,
    private readonly routes: Routes,
    /** Every error answer, after conversion (the bad-request counter). */
    private readonly onError: (err: HttpError) => void,
    /** Every request, before it is handled. */
    private readonly onRequest: (req: IncomingMessage) => void = () => {},
  ) {}

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = (req.url ?? '/').split('?')[0];
    const method = req.method ?? 'GET';
    this.onRequest(req);
    try {
      const get = method === 'GET' ? this.routes.get[url] : undefined;
      if (get) return await get(req, res);
      const post = method === 'POST' ? this.routes.post[url] : undefined;
      if (!post) throw vllmError(404, `no route ${method} ${url}`);
      const raw = (await readBody(req, BODY_LIMIT_BYTES)).toString('utf8');
      await post(req, res, requireObject(parseJsonBody(raw)), raw);
    } catch (err) {
      const e = asVllmError(err);
      this.onError(e);
      // vLLM's Anthropic endpoints answer errors in Anthropic's shape.
      if (url === '/v1/messages' || url.startsWith('/v1/messages/')) sendAnthropicError(res, e);
      else sendError(res, e);
    }
  }

  /** Listens on `port` (0 = a free one) and resolves the port. */
  listen(port: number): Promise<number> {
    const s = createServer((req, res) => void this.handle(req, res));
    s.keepAliveTimeout = 60_000;
    this.server = s;
    return new Promise<number>((resolve, reject) => {
      s.once('error', reject);
      s.listen(port, this.host, () => {
        s.off('error', reject);
        resolve((s.address() as AddressInfo).port);
      });
    });
  }

  /** Stops listening and drops every open connection (in-flight responses included). */
  async close(): Promise<void> {
    const s = this.server;
    if (!s) return;
    this.server = null;
    await new Promise<void>((resolve) => {
      s.close(() => resolve());
      s.closeAllConnections();
    });
  }
}
