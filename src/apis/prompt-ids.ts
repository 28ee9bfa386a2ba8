/**
 * A completions body's token-id prompt read straight from the bytes. `JSON.parse` of a 2,048-id prompt is most of what
 * parsing a token-id request costs (one number object per digit run, then the array grown element by element); a
 * byte scan into a reused Uint32Array and one exact-size copy does the same work in well under half the time.
 *
 * The scan walks the top-level object only and gives up (null) on anything it does not fully understand: a key with
 * an escape, a second "prompt", a prompt that is not one flat array of plain non-negative integers (a sign, a
 * fraction, an exponent, a leading zero, more than 10 digits, > 2^32 - 1), a value it cannot skip, trailing bytes.
 * The caller then parses the whole body with `JSON.parse` as before, so a body that is not this exact shape gets
 * the same object, or the same error, as it always did. When the scan succeeds, the rest of the body (the prompt
 * replaced by `0`) is parsed with `JSON.parse` and the ids put back in place: the object is the one `JSON.parse`
 * would build, keys in the same order.
 */

/** Arrays built here hold only integers in [0, 2^32 - 1]: the prompt check need not look at them again. */
const SCANNED = new WeakSet<readonly number[]>();

/** The ids were read by {@link parseWithPromptIds} (so every element is an integer in [0, 2^32 - 1]). */
export function isScannedIds(v: unknown): boolean {
  return typeof v === 'object' && v !== null && SCANNED.has(v as number[]);
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const COLON = 0x3a;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;
const ZERO = 0x30;
const NINE = 0x39;
const MAX_ID = 0xffffffff;

// "prompt" as bytes
const PROMPT = [0x70, 0x72, 0x6f, 0x6d, 0x70, 0x74];

let scratch = new Uint32Array(4096);

function isWs(c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

function skipWs(b: Uint8Array, i: number): number {
  while (i < b.length && isWs(b[i])) i++;
  return i;
}

/** End (exclusive) of the string starting at b[i] === '"', or -1. */
function skipString(b: Uint8Array, i: number): number {
  for (i++; i < b.length; i++) {
    const c = b[i];
    if (c === QUOTE) return i + 1;
    if (c === BACKSLASH) i++;
  }
  return -1;
}

/** End (exclusive) of the value starting at b[i], or -1; its syntax is left to JSON.parse of the rest. */
function skipValue(b: Uint8Array, i: number): number {
  const c = b[i];
  if (c === QUOTE) return skipString(b, i);
  if (c === OPEN_BRACE || c === OPEN_BRACKET) {
    let depth = 0;
    for (; i < b.length; i++) {
      const d = b[i];
      if (d === QUOTE) {
        i = skipString(b, i);
        if (i < 0) return -1;
        i--;
      } else if (d === OPEN_BRACE || d === OPEN_BRACKET) depth++;
      else if (d === CLOSE_BRACE || d === CLOSE_BRACKET) {
        depth--;
        if (depth === 0) return i + 1;
      }
    }
    return -1;
  }
  // A number or a literal: up to the next delimiter.
  const start = i;
  while (i < b.length) {
    const d = b[i];
    if (d === COMMA || d === CLOSE_BRACE || d === CLOSE_BRACKET || isWs(d)) break;
    i++;
  }
  return i > start ? i : -1;
}

/** The ids of the flat integer array starting at b[i] === '[' into `scratch`: its count and end, or null. */
function scanIds(b: Uint8Array, i: number): { n: number; end: number } | null {
  let n = 0;
  i = skipWs(b, i + 1);
  if (b[i] === CLOSE_BRACKET) return null; // an empty prompt: JSON.parse's path refuses it
  for (;;) {
    let c = b[i];
    if (c < ZERO || c > NINE) return null;
    const first = i;
    let v = 0;
    while (c >= ZERO && c <= NINE) {
      v = v * 10 + (c - ZERO);
      c = b[++i];
    }
    const digits = i - first;
    if (digits > 10 || v > MAX_ID || (digits > 1 && b[first] === ZERO)) return null;
    if (n === scratch.length) {
      const next = new Uint32Array(scratch.length * 2);
      next.set(scratch);
      scratch = next;
    }
    scratch[n++] = v;
    if (isWs(c)) {
      i = skipWs(b, i);
      c = b[i];
    }
    if (c === CLOSE_BRACKET) return { n, end: i + 1 };
    if (c !== COMMA) return null;
    i = skipWs(b, i + 1);
  }
}

/**
 * The body parsed as `JSON.parse` would, with a top-level `"prompt"` array of token ids read from the bytes; null when
 * the body is not of that shape (the caller parses it whole). JSON.parse errors of the rest also give null.
 */
export function parseWithPromptIds(b: Uint8Array): Record<string, unknown> | null {
  let i = skipWs(b, 0);
  if (b[i] !== OPEN_BRACE) return null;
  i = skipWs(b, i + 1);
  let found: { start: number; end: number; n: number } | null = null;
  if (b[i] === CLOSE_BRACE) return null;
  for (;;) {
    if (b[i] !== QUOTE) return null;
    const keyStart = i + 1;
    const keyEnd = skipString(b, i);
    if (keyEnd < 0) return null;
    const keyLen = keyEnd - 1 - keyStart;
    let isPrompt = keyLen === PROMPT.length;
    for (let k = keyStart; k < keyEnd - 1; k++) {
      if (b[k] === BACKSLASH) return null; // an escaped key could spell "prompt": leave it to JSON.parse
      if (isPrompt && b[k] !== PROMPT[k - keyStart]) isPrompt = false;
    }
    i = skipWs(b, keyEnd);
    if (b[i] !== COLON) return null;
    i = skipWs(b, i + 1);
    if (isPrompt) {
      if (found || b[i] !== OPEN_BRACKET) return null;
      const ids = scanIds(b, i);
      if (!ids) return null;
      found = { start: i, end: ids.end, n: ids.n };
      i = ids.end;
    } else {
      i = skipValue(b, i);
      if (i < 0) return null;
    }
    i = skipWs(b, i);
    if (b[i] === COMMA) {
      i = skipWs(b, i + 1);
      continue;
    }
    if (b[i] !== CLOSE_BRACE) return null;
    i = skipWs(b, i + 1);
    if (i !== b.length || !found) return null;
    break;
  }
  const rest = `${Buffer.from(b.buffer, b.byteOffset, found.start).toString('utf8')}0${Buffer.from(b.buffer, b.byteOffset + found.end, b.length - found.end).toString('utf8')}`;
  let body: unknown;
  try {
    body = JSON.parse(rest);
  } catch {
    return null;
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return null;
  const ids: number[] = new Array(found.n);
  for (let k = 0; k < found.n; k++) ids[k] = scratch[k];
  SCANNED.add(ids);
  (body as Record<string, unknown>).prompt = ids;
  return body as Record<string, unknown>;
}
