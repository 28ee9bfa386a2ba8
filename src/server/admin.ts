/**
 * The admin API (behind the bearer token of --admin-token): GET/POST /admin/workers, DELETE /admin/workers/:id, and
 * GET /debug/state, which exposes configuration, worker URLs and event health: never to anonymous callers once the
 * router is protected (API keys or an admin token set).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import { readBody, sendJson } from '../http/body.ts';
import { badRequest, HttpError } from '../http/errors.ts';
import type { ServeConfig } from '../config/serve.ts';
import { type WorkerSpec, workerFromUnknown } from '../config/worker-spec.ts';
import { adminAuthorized, checkJsonDepth, type Security, toHttpError } from '../runtime/security/index.ts';
import type { Worker, WorkerSet } from '../runtime/workers.ts';

export interface AdminContext {
  readonly config: ServeConfig;
  readonly log: Logger;
  readonly guard: Security;
  readonly workers: WorkerSet;
}

function requireAdmin(req: IncomingMessage, config: ServeConfig): void {
  if (!config.adminToken) {
    throw new HttpError(404, 'the admin API is disabled (start with --admin-token or KVROUTE_ADMIN_TOKEN)', 'not_found_error', 'not_found');
  }
  if (!adminAuthorized(req, config.adminToken)) {
    throw new HttpError(401, 'missing or wrong bearer token', 'authentication_error', 'invalid_token', null, {
      'www-authenticate': 'Bearer',
    });
  }
}

/**
 * /debug/state is open on an open router (the quick look a newcomer wants); once API keys or an admin token protect
 * the router, it needs the admin token like the rest of the admin surface.
 */
export function authorizeDebug(req: IncomingMessage, ctx: AdminContext): void {
  if (!ctx.config.adminToken && ctx.guard.enabled.apiKeys === 0) return;
  if (!ctx.config.adminToken) {
    throw new HttpError(
      403,
      '/debug/state exposes worker URLs and settings: with API keys set it needs --admin-token and "Authorization: Bearer <admin token>"',
      'permission_error',
      'forbidden',
    );
  }
  requireAdmin(req, ctx.config);
}

export async function handleAdmin(ctx: AdminContext, req: IncomingMessage, res: ServerResponse, path: string): Promise<void> {
  const { config, workers } = ctx;
  requireAdmin(req, config);
  if (path === '/admin/workers' && req.method === 'GET') {
    sendJson(res, 200, { workers: workers.list().map((w) => w.toJSON()) });
    return;
  }
  if (path === '/admin/workers' && req.method === 'POST') {
    const raw = await readBody(req, 64 * 1024);
    const tooDeep = checkJsonDepth(raw, config.maxJsonDepth);
    if (tooDeep) throw tooDeep;
    let value: unknown;
    try {
      value = JSON.parse(raw.toString('utf8'));
    } catch {
      throw badRequest(
        'body must be JSON: {"url": ..., "events"?, "replay"?, "dp"?, "model"?, "id"?, "role"?, "engine"?, "bootstrap"?} or {"spec": "URL,..."}',
      );
    }
    let spec: WorkerSpec;
    try {
      const v = value as { spec?: unknown };
      spec = workerFromUnknown(v && typeof v === 'object' && typeof v.spec === 'string' ? v.spec : value);
    } catch (err) {
      throw badRequest((err as Error).message);
    }
    const refused = ctx.guard.checkWorker(spec);
    if (refused) throw toHttpError(refused);
    let worker: Worker;
    try {
      worker = await workers.add(spec);
    } catch (err) {
      throw new HttpError(409, (err as Error).message, 'invalid_request_error', 'worker_exists');
    }
    ctx.log.info({ worker: worker.id, url: worker.url }, 'worker added through the admin API');
    sendJson(res, 201, worker.toJSON());
    return;
  }
  const m = /^\/admin\/workers\/([^/]+)$/.exec(path);
  if (m && req.method === 'DELETE') {
    const id = decodeURIComponent(m[1]);
    if (!(await workers.remove(id))) throw new HttpError(404, `no worker "${id}"`, 'not_found_error', 'worker_not_found');
    ctx.log.info({ worker: id }, 'worker removed through the admin API');
    sendJson(res, 200, { removed: id });
    return;
  }
  throw new HttpError(404, `no admin route ${req.method} ${path}`, 'not_found_error', 'not_found');
}
