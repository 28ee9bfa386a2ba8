/**
 * HTTP errors of every kvroute server (router, endpoint picker, mock engine), in one class with stable codes. The body is
 * `{error: {message, type, param, code}}`: the shape OpenAI's and vLLM's servers use, so SDKs surface the message.
 */
import type { ServerResponse } from 'node:http';

export type ErrorType =
  | 'invalid_request_error'
  | 'not_found_error'
  | 'authentication_error'
  | 'permission_error'
  | 'rate_limit_error'
  | 'service_unavailable'
  | 'upstream_error'
  | 'server_error'
  // vLLM's own error types (the mock engine answers as vLLM does).
  | 'BadRequestError'
  | 'NotFoundError'
  | 'InternalServerError'
  | 'ServiceUnavailableError';

/**
 * Every error code kvroute answers with, in one place: clients and tests match on these, never on messages. vLLM puts the
 * HTTP status in `code`, so the mock engine's errors carry a number instead.
 */
export type ErrorCode =
  // request shape
  | 'invalid_request'
  | 'invalid_json'
  | 'incomplete_body'
  | 'request_too_large'
  | 'nesting_too_deep'
  | 'method_not_allowed'
  | 'not_found'
  // auth and limits
  | 'invalid_api_key'
  | 'missing_api_key'
  | 'invalid_token'
  | 'forbidden'
  | 'rate_limit_exceeded'
  | 'request_timeout'
  // routing and admission
  | 'model_not_found'
  | 'no_workers'
  | 'no_healthy_workers'
  | 'no_workers_for_role'
  | 'subset_unavailable'
  | 'all_busy'
  | 'queue_full'
  | 'queue_timeout'
  | 'shed'
  | 'token_budget_exceeded'
  | 'deadline_unmeetable'
  | 'duplicate_request'
  | 'no_sources'
  | 'shutting_down'
  // upstream
  | 'upstream_error'
  | 'stream_failed'
  // admin
  | 'worker_exists'
  | 'worker_not_found'
  | 'worker_host_not_allowed'
  // ours
  | 'internal_error';

export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: ErrorType,
    readonly code: ErrorCode | number,
    readonly param: string | null = null,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }
}

export const badRequest = (message: string, param: string | null = null, code: ErrorCode = 'invalid_request'): HttpError =>
  new HttpError(400, message, 'invalid_request_error', code, param);

export function errorBody(message: string, type: ErrorType, code: ErrorCode | number, param: string | null = null): string {
  return JSON.stringify({ error: { message, type, param, code } });
}

/** Writes an error response unless headers are already out (then the connection is the only channel left). */
export function sendError(res: ServerResponse, err: HttpError): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = errorBody(err.message, err.type, err.code, err.param);
  res.writeHead(err.status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
    ...err.headers,
  });
  res.end(body);
}

/** The SSE frame sent when a stream fails after its first byte: the status line is gone, the error goes in-band. */
export function sseErrorFrame(message: string, code: ErrorCode = 'upstream_error'): string {
  return `data: ${errorBody(message, 'upstream_error', code)}\n\n`;
}
