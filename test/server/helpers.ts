import pino from 'pino';
import { startServer, type RunningServer } from '../../src/server/app.ts';
import { DEFAULTS, type ServeConfig } from '../../src/config/serve.ts';
import type { LocalTokenizer } from '../../src/tokenizer/local.ts';

export const silent = pino({ level: 'silent' });

export function testConfig(overrides: Partial<ServeConfig> = {}): ServeConfig {
  return {
    ...DEFAULTS,
    port: 0,
    healthIntervalMs: 0,
    healthTimeoutMs: 500,
    remoteTokenize: false,
    shutdownGraceMs: 1000,
    logLevel: 'silent',
    ...overrides,
  };
}

export function serve(overrides: Partial<ServeConfig> = {}, tokenizer?: LocalTokenizer): Promise<RunningServer> {
  return startServer(testConfig(overrides), { logger: silent, tokenizer });
}

export async function post(url: string, body: unknown, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls until `cond` holds (or fails after `ms`). */
export async function until(cond: () => boolean, ms = 3000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await sleep(10);
  }
}

/** Deterministic pseudo-random token ids. */
export function randomTokens(n: number, seed: number): number[] {
  let x = seed * 2654435761 + 1;
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) % 2147483648;
    out[i] = x % 150000;
  }
  return out;
}

/** Response JSON as `any`: tests assert on its shape. */
// biome-ignore lint/suspicious/noExplicitAny: shared by every server test to read arbitrary OpenAI/admin bodies; one type per endpoint would restate the API
export async function json(r: Response): Promise<any> {
  return r.json();
}
