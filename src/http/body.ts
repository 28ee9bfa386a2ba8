/**
 * Request bodies and JSON answers for every kvroute HTTP server (router, mock engine): one reader with a size limit
 * (413 on Content-Length first, then while reading) that settles when a client hangs up mid-body, one JSON writer.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { badRequest, HttpError } from './errors.ts';

export function tooLarge(limit: number): HttpError {
  return new HttpError(413, `request body exceeds the limit of ${limit} bytes`, 'invalid_request_error', 'request_too_large', null, {
    connection: 'close',
  });
}

/** Reads the request body up to `limit` bytes; a 413 HttpError beyond, a 400 when the client leaves mid-body. */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > limit) return Promise.reject(tooLarge(limit));
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > limit) {
        req.removeAllListeners('data');
        req.resume();
        reject(tooLarge(limit));
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks, size)));
    req.on('error', reject);
    // A client that hangs up mid-body: settle instead of leaving the handler waiting for an end that never comes.
    req.on('close', () => {
      if (!req.complete) reject(badRequest('the client closed the connection before sending the whole body', null, 'incomplete_body'));
    });
  });
}

/** JSON answer with its length; bigints (hashes) are written as decimal strings. */
export function sendJson(res: ServerResponse, status: number, value: unknown, headers: Record<string, string> = {}): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  const body = JSON.stringify(value, (_k, v) => (typeof v === 'bigint' ? v.toString() : v));
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...headers });
  res.end(body);
}
