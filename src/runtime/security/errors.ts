/**
 * Refusals of the security layer in the OpenAI error shape. A check returns a `Denial` (or null); the server either
 * throws it as its HttpError (`toHttpError`) or writes it directly (`sendDenial`), so the wiring is one line.
 */
import type { ServerResponse } from 'node:http';
import { type ErrorCode, type ErrorType, errorBody, HttpError } from '../../http/errors.ts';

/** OpenAI answers 401 with `invalid_request_error`/`invalid_api_key`, 429 with `rate_limit_exceeded`. */
export type DenialType = 'authentication_error' | 'permission_error' | 'rate_limit_error' | 'invalid_request_error';

export interface Denial {
  readonly status: 401 | 403 | 408 | 429;
  readonly message: string;
  readonly type: DenialType;
  readonly code: ErrorCode;
  readonly headers: Readonly<Record<string, string>>;
}

export function unauthorized(message: string, code: ErrorCode = 'invalid_api_key'): Denial {
  // WWW-Authenticate tells generic HTTP clients which scheme to use (RFC 9110 requires it on 401).
  return { status: 401, message, type: 'authentication_error', code, headers: { 'www-authenticate': 'Bearer' } };
}

export function forbidden(message: string, code: ErrorCode = 'forbidden'): Denial {
  return { status: 403, message, type: 'permission_error', code, headers: {} };
}

/** 429 with Retry-After in whole seconds (at least 1: clients treat 0 as "retry now" and hammer). */
export function tooManyRequests(message: string, retryAfterS: number): Denial {
  const s = Math.max(1, Math.ceil(retryAfterS));
  return { status: 429, message, type: 'rate_limit_error', code: 'rate_limit_exceeded', headers: { 'retry-after': String(s) } };
}

export function denialBody(d: Denial): string {
  return errorBody(d.message, d.type as ErrorType, d.code, null);
}

/** The server's own error class, so `throw toHttpError(d)` goes through its usual error path. */
export function toHttpError(d: Denial): HttpError {
  return new HttpError(d.status, d.message, d.type as ErrorType, d.code, null, { ...d.headers });
}

export function sendDenial(res: ServerResponse, d: Denial): void {
  const body = denialBody(d);
  res.writeHead(d.status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...d.headers });
  res.end(body);
}
