/**
 * GET /dashboard: the live hit-rate dashboard, served by the router itself from web/ (no CDN, no build step).
 *
 *   /dashboard, /dashboard/            the page (web/dashboard.html)
 *   /dashboard/dashboard.js|.css       its assets
 *   /dashboard/data.json               cumulative totals (RouterMetrics.dashboardState()); the page differences polls
 *
 * Stateless on the server: the browser keeps the history, so any number of tabs costs one JSON build per poll each.
 */
import { readFile } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { fileURLToPath } from 'node:url';

const WEB_DIR = fileURLToPath(new URL('../../web/', import.meta.url));

const ASSETS: Record<string, { file: string; type: string }> = {
  '/dashboard': { file: 'dashboard.html', type: 'text/html; charset=utf-8' },
  '/dashboard/': { file: 'dashboard.html', type: 'text/html; charset=utf-8' },
  '/dashboard/dashboard.js': { file: 'dashboard.js', type: 'text/javascript; charset=utf-8' },
  '/dashboard/dashboard.css': { file: 'dashboard.css', type: 'text/css; charset=utf-8' },
};

// Assets are small and immutable for the life of the process: read once.
const cache = new Map<string, Promise<Buffer>>();
function asset(file: string): Promise<Buffer> {
  let p = cache.get(file);
  if (!p) {
    p = readFile(WEB_DIR + file);
    p.catch(() => cache.delete(file)); // a missing file is retried next time, not cached as an error
    cache.set(file, p);
  }
  return p;
}

/** Self only: the page must work air-gapped, and this makes an accidental CDN reference fail loudly in tests. */
const CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'";

/** JSON with NaN/Infinity as null (no data is not 0) and bigint as decimal strings. */
export function toJson(value: unknown): string {
  return JSON.stringify(value, (_k, v) => (typeof v === 'number' && !Number.isFinite(v) ? null : typeof v === 'bigint' ? v.toString() : v));
}

function send(res: ServerResponse, status: number, type: string, body: string | Buffer, head: boolean): void {
  res.writeHead(status, {
    'content-type': type,
    'content-length': Buffer.byteLength(body),
    'cache-control': 'no-store',
    'x-content-type-options': 'nosniff',
    'content-security-policy': CSP,
  });
  res.end(head ? undefined : body);
}

/**
 * Serves the dashboard's paths; returns false (and touches nothing) for any other path so the caller can go on.
 * `stateJson` should return RouterMetrics.dashboardState(); a throw is answered with a 500, never propagated.
 */
export function dashboardHandler(req: IncomingMessage, res: ServerResponse, stateJson: () => unknown): boolean {
  const path = (req.url ?? '/').split('?')[0];
  if (path !== '/dashboard' && !path.startsWith('/dashboard/')) return false;
  const head = req.method === 'HEAD';
  if (req.method !== 'GET' && !head) {
    res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'application/json' });
    res.end(toJson({ error: { message: `${req.method} not allowed on ${path}`, type: 'invalid_request_error', code: 405 } }));
    return true;
  }
  if (path === '/dashboard/data.json') {
    let body: string;
    try {
      body = toJson(stateJson());
    } catch (err) {
      send(
        res,
        500,
        'application/json',
        toJson({ error: { message: `dashboard state failed: ${(err as Error).message}`, type: 'server_error' } }),
        head,
      );
      return true;
    }
    send(res, 200, 'application/json', body, head);
    return true;
  }
  const a = ASSETS[path];
  if (!a) {
    send(res, 404, 'text/plain; charset=utf-8', `no such dashboard asset: ${path}\n`, head);
    return true;
  }
  asset(a.file).then(
    (buf) => send(res, 200, a.type, buf, head),
    (err: Error) => send(res, 500, 'text/plain; charset=utf-8', `dashboard asset ${a.file} unreadable: ${err.message}\n`, head),
  );
  return true;
}
