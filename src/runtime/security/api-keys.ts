/**
 * API keys for /v1 and the admin bearer token.
 *
 * Comparison: the presented secret and every configured one are reduced to SHA-256 digests and compared with
 * crypto.timingSafeEqual (equal 32-byte lengths, so neither the content nor the length of a key leaks through
 * timing), and every configured key is compared on every request (no early exit on a match).
 * Keys are never logged: logs and rate-limit buckets use a fingerprint `key-<first 8 hex of SHA-256>`.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFile, stat } from 'node:fs/promises';
import type { IncomingHttpHeaders } from 'node:http';

/** Shorter keys are refused at startup: a router in front of GPUs should not run behind a guessable secret. */
export const MIN_KEY_LENGTH = 16;

const sha256 = (s: string): Buffer => createHash('sha256').update(s, 'utf8').digest();

export function fingerprint(secret: string): string {
  return `key-${sha256(secret).toString('hex').slice(0, 8)}`;
}

/** The token of `Authorization: Bearer <token>` (scheme case-insensitive, RFC 9110), or null. */
export function bearerToken(headers: IncomingHttpHeaders): string | null {
  const h = headers.authorization;
  // Anthropic's clients send their key as x-api-key instead.
  if (h === undefined && typeof headers['x-api-key'] === 'string' && /^\S+$/.test(headers['x-api-key'])) return headers['x-api-key'];
  if (typeof h !== 'string') return null;
  const m = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(h);
  return m ? m[1] : null;
}

/** Constant-time equality of two secrets of any lengths (through their digests). */
export function secretEquals(presented: string, expected: string): boolean {
  return timingSafeEqual(sha256(presented), sha256(expected));
}

function checkKey(entry: string, where: string): void {
  const key = splitNamedKey(entry).key;
  if (key.length < MIN_KEY_LENGTH) {
    throw new Error(`API key from ${where} is ${key.length} characters; use at least ${MIN_KEY_LENGTH} (e.g. openssl rand -hex 24)`);
  }
  if (/\s/.test(key)) throw new Error(`API key from ${where} contains whitespace`);
}

/**
 * A key may carry the name of its tenant: `NAME=KEY` (in flags, the variable and the key file). The name is what flow
 * control, token budgets and metrics call the tenant; a key without one is known by its fingerprint.
 */
const NAMED = /^([A-Za-z0-9_.-]{1,64})=(.+)$/;

export function splitNamedKey(entry: string): { name: string | null; key: string } {
  const m = NAMED.exec(entry);
  return m ? { name: m[1], key: m[2] } : { name: null, key: entry };
}

export class ApiKeySet {
  private readonly digests: Buffer[];
  readonly ids: readonly string[];
  private readonly names = new Map<string, string>();

  constructor(entries: readonly string[]) {
    const byKey = new Map<string, string | null>();
    for (const e of entries) {
      const { name, key } = splitNamedKey(e);
      if (!byKey.has(key) || name) byKey.set(key, name);
    }
    const unique = [...byKey.keys()];
    this.digests = unique.map(sha256);
    this.ids = unique.map(fingerprint);
    unique.forEach((k, i) => {
      const name = byKey.get(k);
      if (name) this.names.set(this.ids[i], name);
    });
  }

  get size(): number {
    return this.digests.length;
  }

  /** The fingerprint of the matching key, or null. Time does not depend on which key matched or where. */
  match(presented: string): string | null {
    const d = sha256(presented);
    let found = -1;
    for (let i = 0; i < this.digests.length; i++) {
      // Non-short-circuit: every digest is compared whatever the earlier results.
      if (timingSafeEqual(d, this.digests[i]) && found < 0) found = i;
    }
    return found >= 0 ? this.ids[found] : null;
  }

  /** The tenant a matched key belongs to: its name, else its fingerprint. */
  tenantOf(id: string): string {
    return this.names.get(id) ?? id;
  }
}

/** Splits KVROUTE_API_KEYS / key-file text: keys separated by commas or whitespace; `#` starts a comment line. */
export function splitKeys(text: string): string[] {
  const out: string[] = [];
  for (const line of text.split(/\r?\n/)) {
    const t = line.trim();
    if (t === '' || t.startsWith('#')) continue;
    for (const k of t.split(/[,\s]+/)) if (k) out.push(k);
  }
  return out;
}

export interface KeySources {
  /** --api-key (repeatable). */
  readonly flags?: readonly string[];
  /** KVROUTE_API_KEYS. */
  readonly env?: string;
  /** --api-key-file: one key per line. */
  readonly file?: string;
}

export interface LoadedKeys {
  readonly keys: ApiKeySet;
  /** Operator-facing warnings (e.g. a key file readable by everyone); never contain a key. */
  readonly warnings: string[];
}

/** Union of the keys from flags, env and file; throws with an actionable message on a bad source. */
export async function loadApiKeys(src: KeySources): Promise<LoadedKeys> {
  const warnings: string[] = [];
  const keys: string[] = [];
  for (const k of src.flags ?? []) {
    for (const part of splitKeys(k)) {
      checkKey(part, '--api-key or KVROUTE_API_KEYS');
      keys.push(part);
    }
  }
  if (src.env) {
    for (const k of splitKeys(src.env)) {
      checkKey(k, 'KVROUTE_API_KEYS');
      keys.push(k);
    }
  }
  if (src.file) {
    let text: string;
    try {
      text = await readFile(src.file, 'utf8');
    } catch (err) {
      throw new Error(`--api-key-file ${src.file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
    const st = await stat(src.file);
    if ((st.mode & 0o004) !== 0) warnings.push(`API key file ${src.file} is readable by every user (chmod 600 it)`);
    const fromFile = splitKeys(text);
    for (const [i, k] of fromFile.entries()) checkKey(k, `${src.file} (key ${i + 1})`);
    if (fromFile.length === 0) throw new Error(`--api-key-file ${src.file} holds no key`);
    keys.push(...fromFile);
  }
  return { keys: new ApiKeySet(keys), warnings };
}
