/**
 * OpenAI-style errors: every 4xx/5xx the router produces has the body `{error: {message, type, param, code}}`, so
 * SDKs surface the message instead of a parse failure.
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
  | 'server_error';

export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: ErrorType,
    readonly code: string,
    readonly param: string | null = null,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }
}

export const badRequest = (message: string, param: string | null = null, code = 'invalid_request'): HttpError =>
  new HttpError(400, message, 'invalid_request_error', code, param);

export function errorBody(message: string, type: ErrorType, code: string, param: string | null = null): string {
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
export function sseErrorFrame(message: string, code = 'upstream_error'): string {
  return `data: ${errorBody(message, 'upstream_error', code)}\n\n`;
}
