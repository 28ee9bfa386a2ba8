/**
 * Who is asking, how urgent it is, and which conversation it belongs to: read from the request, validated, handed to
 * the core dispatcher (flow control, budgets, affinity).
 *
 *   tenant    with API keys: the key's tenant (its name, else its fingerprint; a header cannot claim another tenant);
 *             without: the `x-kvroute-tenant` header, or `default`
 *   priority  the body's `priority` integer (vLLM's field: lower runs first; passed on to the engine as is), else the
 *             `x-kvroute-priority` header; default 0
 *   deadline  `x-kvroute-slo-ttft-ms`: the client's TTFT objective
 *   session   the first of the configured session headers present (`x-session-id` by default; presets for agent
 *             clients): a malformed value is ignored rather than refused (the request is routed without affinity)
 */
import type { IncomingMessage } from 'node:http';
import { type ServeConfig, SESSION_PRESETS } from '../config/serve.ts';
import { badRequest } from '../http/errors.ts';
import type { Security } from './security/index.ts';

export interface RequestIdentity {
  readonly tenant?: string;
  readonly priority?: number;
  readonly sloTtftMs?: number;
  readonly sessionId?: string;
}

const TENANT = /^[A-Za-z0-9_.-]{1,64}$/;
const SESSION = /^[\x21-\x7e]{1,256}$/;
const PRIORITY_LIMIT = 2 ** 31;

function header(req: RequestHeaders, name: string): string | undefined {
  const v = req.headers[name];
  return typeof v === 'string' ? v : Array.isArray(v) ? v[0] : undefined;
}

/** The session headers to read, in order (configured names first, then the presets'). */
export function sessionHeaderNames(config: Pick<ServeConfig, 'sessionHeaders' | 'sessionPresets'>): string[] {
  const names = [...config.sessionHeaders, ...config.sessionPresets.flatMap((p) => SESSION_PRESETS[p])];
  return [...new Set(names.map((n) => n.toLowerCase()))];
}

/** What is read of a request: its headers (an HTTP request, or the headers a gateway's proxy forwarded). */
export type RequestHeaders = Pick<IncomingMessage, 'headers'>;

export function requestIdentity(
  req: RequestHeaders,
  body: Record<string, unknown>,
  guard: Pick<Security, 'tenantOf'>,
  sessionHeaders: readonly string[],
): RequestIdentity {
  let tenant = guard.tenantOf(req) ?? undefined;
  if (tenant === undefined) {
    const h = header(req, 'x-kvroute-tenant');
    if (h !== undefined) {
      if (!TENANT.test(h)) throw badRequest('x-kvroute-tenant must be 1 to 64 characters of [A-Za-z0-9_.-]', 'x-kvroute-tenant');
      tenant = h;
    }
  }
  let priority: number | undefined;
  if (body.priority !== undefined && body.priority !== null) {
    if (!Number.isInteger(body.priority) || Math.abs(body.priority as number) >= PRIORITY_LIMIT) {
      throw badRequest('"priority" must be an integer (lower runs first)', 'priority');
    }
    priority = body.priority as number;
  } else {
    const h = header(req, 'x-kvroute-priority');
    if (h !== undefined) {
      const n = Number(h);
      if (!/^-?\d+$/.test(h.trim()) || Math.abs(n) >= PRIORITY_LIMIT) {
        throw badRequest('x-kvroute-priority must be an integer (lower runs first)', 'x-kvroute-priority');
      }
      priority = n;
    }
  }
  let sloTtftMs: number | undefined;
  const slo = header(req, 'x-kvroute-slo-ttft-ms');
  if (slo !== undefined) {
    const n = Number(slo);
    if (!/^\d+$/.test(slo.trim()) || n < 1 || n > 86_400_000) {
      throw badRequest('x-kvroute-slo-ttft-ms must be an integer number of milliseconds from 1 to 86400000', 'x-kvroute-slo-ttft-ms');
    }
    sloTtftMs = n;
  }
  let sessionId: string | undefined;
  for (const name of sessionHeaders) {
    const v = header(req, name);
    if (v !== undefined && SESSION.test(v)) {
      sessionId = v;
      break;
    }
  }
  return {
    ...(tenant !== undefined ? { tenant } : {}),
    ...(priority !== undefined ? { priority } : {}),
    ...(sloTtftMs !== undefined ? { sloTtftMs } : {}),
    ...(sessionId !== undefined ? { sessionId } : {}),
  };
}
