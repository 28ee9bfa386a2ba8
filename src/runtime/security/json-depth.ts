/**
 * Nesting depth of a JSON text, measured on the raw bytes before JSON.parse. V8 parses deep nesting fine but
 * JSON.stringify (the proxy re-serialises the body) and template rendering recurse, and overflow the stack at a few
 * thousand levels: a 100 kB body of `[[[[...` then costs a 500. Real requests nest < 20 levels.
 */
import { badRequest, type HttpError } from '../../http/errors.ts';

export const DEFAULT_MAX_JSON_DEPTH = 64;

/** Depth of the deepest array/object, stopping early once it exceeds `limit`; brackets inside strings are ignored. */
export function jsonDepth(buf: Uint8Array, limit = Infinity): number {
  let depth = 0;
  let max = 0;
  let inString = false;
  for (let i = 0; i < buf.length; i++) {
    const c = buf[i];
    if (inString) {
      if (c === 0x5c)
        i++; // backslash: skip the escaped byte (\" does not end the string)
      else if (c === 0x22) inString = false;
      continue;
    }
    if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) {
        max = depth;
        if (max > limit) return max;
      }
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return max;
}

/**
 * Whether `buf` holds at most `limit` opening brackets (`[` or `{`, in strings or not): then no nesting can exceed
 * `limit`. Two native byte searches instead of a JavaScript loop over every byte; a typical request (a few objects, one
 * prompt array, long strings) is settled here.
 */
function fewOpenings(buf: Uint8Array, limit: number): boolean {
  const b = Buffer.isBuffer(buf) ? buf : Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
  let n = 0;
  for (const c of [0x5b, 0x7b]) {
    for (let i = b.indexOf(c); i >= 0; i = b.indexOf(c, i + 1)) if (++n > limit) return false;
  }
  return true;
}

/** 400 (invalid_request_error, code nesting_too_deep) when the body nests deeper than `limit`; null otherwise. */
export function checkJsonDepth(buf: Uint8Array, limit = DEFAULT_MAX_JSON_DEPTH): HttpError | null {
  if (fewOpenings(buf, limit)) return null;
  const d = jsonDepth(buf, limit);
  return d > limit ? badRequest(`request body nests deeper than ${limit} levels`, null, 'nesting_too_deep') : null;
}
