/**
 * The security layer of `kvroute serve` in one object, so the server wires it with a few lines:
 *
 *   const security = createSecurity({ apiKeys, rateLimit, allowWorkerHosts });
 *   // in dispatch, before the /v1 handlers:
 *   const denied = security.checkApi(req); if (denied) throw toHttpError(denied);
 *   // in POST /admin/workers, after parsing the spec:
 *   const refused = security.checkWorker(spec); if (refused) throw toHttpError(refused);
 */
import type { IncomingMessage, ServerOptions } from 'node:http';
import { bearerToken, secretEquals, type ApiKeySet } from './api-keys.ts';
import { tooManyRequests, unauthorized, type Denial } from './errors.ts';
import type { HostAllowList, RateLimitSpec } from '../../config/security.ts';
import { checkWorkerHosts, type WorkerEndpoints } from './allow-hosts.ts';
import { KeyedRateLimiter } from './rate-limit.ts';

export { ApiKeySet, bearerToken, fingerprint, loadApiKeys, secretEquals, splitKeys, MIN_KEY_LENGTH } from './api-keys.ts';
export { type HostAllowList, parseAllowList, parseRateLimit, type RateLimitSpec } from '../../config/security.ts';
export { checkWorkerHosts, endpointHost } from './allow-hosts.ts';
export { denialBody, forbidden, sendDenial, toHttpError, tooManyRequests, unauthorized, type Denial } from './errors.ts';
export { KeyedRateLimiter, TokenBucket } from './rate-limit.ts';

export interface SecurityOptions {
  /** Keys accepted on /v1 as `Authorization: Bearer <key>`; absent or empty: /v1 is open. */
  readonly apiKeys?: ApiKeySet | null;
  /** Per key (per client address when keys are off). */
  readonly rateLimit?: RateLimitSpec | null;
  /** Admin-registered workers must be inside; absent: any host (the admin token is the only guard). */
  readonly allowWorkerHosts?: HostAllowList | null;
  /** ms clock for the rate limiter (tests inject one). */
  readonly clock?: () => number;
}

export interface Security {
  /** Authentication then rate limit for a /v1 request; null = let it through. */
  checkApi(req: IncomingMessage): Denial | null;
  /** 403 when an admin-registered worker points outside --allow-worker-hosts. */
  checkWorker(spec: WorkerEndpoints): Denial | null;
  /** Fingerprint of the request's key (for logs), or null. Never the key. */
  keyIdOf(req: Pick<IncomingMessage, 'headers'>): string | null;
  /** With API keys: the tenant of the request's key (its name, else its fingerprint); null without keys. */
  tenantOf(req: Pick<IncomingMessage, 'headers'>): string | null;
  readonly enabled: { apiKeys: number; rateLimit: RateLimitSpec | null; allowWorkerHosts: readonly string[] | null };
}

export function createSecurity(options: SecurityOptions = {}): Security {
  const keys = options.apiKeys && options.apiKeys.size > 0 ? options.apiKeys : null;
  const limiter = options.rateLimit ? new KeyedRateLimiter(options.rateLimit, options.clock ?? Date.now) : null;
  const allow = options.allowWorkerHosts ?? null;
  const keyIdOf = (req: Pick<IncomingMessage, 'headers'>): string | null => {
    if (!keys) return null;
    const t = bearerToken(req.headers);
    return t ? keys.match(t) : null;
  };
  return {
    checkApi(req) {
      let bucket: string;
      if (keys) {
        const token = bearerToken(req.headers);
        if (!token) {
          return unauthorized(
            "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            'missing_api_key',
          );
        }
        const id = keys.match(token);
        // The message never echoes the presented key (OpenAI's does, partially; a log of responses would leak it).
        if (!id) return unauthorized('Incorrect API key provided.', 'invalid_api_key');
        bucket = id;
      } else {
        bucket = `addr:${req.socket.remoteAddress ?? 'unknown'}`;
      }
      if (limiter) {
        const r = limiter.take(bucket);
        if (!r.ok) {
          const spec = limiter.spec;
          return tooManyRequests(
            `Rate limit reached: ${spec.rps} requests per second (burst ${spec.burst}) per API key. Retry after the time in Retry-After.`,
            r.retryAfterMs / 1000,
          );
        }
      }
      return null;
    },
    checkWorker(spec) {
      return allow ? checkWorkerHosts(allow, spec) : null;
    },
    keyIdOf,
    tenantOf(req) {
      const id = keyIdOf(req);
      return id && keys ? keys.tenantOf(id) : null;
    },
    enabled: { apiKeys: keys?.size ?? 0, rateLimit: options.rateLimit ?? null, allowWorkerHosts: allow?.entries ?? null },
  };
}

/** Constant-time admin bearer check (the server's own compare returns early on a length mismatch). */
export function adminAuthorized(req: IncomingMessage, adminToken: string): boolean {
  const t = bearerToken(req.headers);
  return t !== null && secretEquals(t, adminToken);
}

export interface TimeoutOptions {
  /** Whole request head must arrive within this (slowloris on headers). */
  readonly headersTimeoutMs?: number;
  /** Whole request (head + body) must arrive within this. Node measures the REQUEST only: responses streamed for
   *  minutes are not cut (checked in test/reliability/slow-clients.test.ts). */
  readonly requestTimeoutMs?: number;
}

/**
 * node:http options that time out slow clients. Node enforces headersTimeout/requestTimeout from a periodic sweep
 * (connectionsCheckingInterval, default 30 s), so a timeout of 10 s fires after 10-40 s unless the sweep is faster.
 * These must be passed to createServer: the sweep interval cannot be changed after the server is created.
 */
export function httpServerTimeouts(
  o: TimeoutOptions = {},
): Pick<ServerOptions, 'headersTimeout' | 'requestTimeout' | 'connectionsCheckingInterval'> {
  const headersTimeout = o.headersTimeoutMs ?? 10_000;
  // Node requires requestTimeout >= headersTimeout when both are set (it throws otherwise); 0 disables.
  const requestTimeout = o.requestTimeoutMs ?? 60_000;
  if (requestTimeout !== 0 && requestTimeout < headersTimeout) {
    throw new Error(`--body-timeout-ms (${requestTimeout}) must be >= --header-timeout-ms (${headersTimeout}), or 0 to disable`);
  }
  const shortest = Math.min(headersTimeout || Infinity, requestTimeout || Infinity);
  const connectionsCheckingInterval = Number.isFinite(shortest) ? Math.max(100, Math.min(1_000, Math.floor(shortest / 4))) : 30_000;
  return { headersTimeout, requestTimeout, connectionsCheckingInterval };
}

/** pino redact paths: Authorization and the configured secrets never reach a log line. */
export const LOG_REDACT_PATHS = [
  'req.headers.authorization',
  'headers.authorization',
  'authorization',
  'apiKey',
  'apiKeys',
  'adminToken',
  'config.adminToken',
  'config.apiKeys',
];

export { checkJsonDepth, DEFAULT_MAX_JSON_DEPTH, jsonDepth } from './json-depth.ts';
