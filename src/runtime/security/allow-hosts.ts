/**
 * `--allow-worker-hosts` applied: every endpoint the router will connect to for an admin-registered worker (the HTTP
 * URL and the ZMQ events/replay endpoints) must be inside the allow-list (parsed by src/config/security.ts).
 */
import type { HostAllowList } from '../../config/security.ts';
import { forbidden, type Denial } from './errors.ts';

/** Host part of http(s)://host:port or tcp://host:port; null when there is none to check. */
export function endpointHost(endpoint: string): string | null {
  const m = /^[a-z][a-z0-9+.-]*:\/\/(?:[^@/]*@)?(\[[^\]]*\]|[^:/?#]*)/i.exec(endpoint);
  if (!m) return null;
  return m[1];
}

export interface WorkerEndpoints {
  readonly url: string;
  readonly events?: string;
  readonly replay?: string;
}

/** 403 when any endpoint of the worker is outside the allow-list; null when all are inside. */
export function checkWorkerHosts(list: HostAllowList, spec: WorkerEndpoints): Denial | null {
  for (const [what, ep] of [
    ['url', spec.url],
    ['events', spec.events],
    ['replay', spec.replay],
  ] as const) {
    if (ep === undefined) continue;
    if (ep.startsWith('ipc://') || ep.startsWith('inproc://')) continue; // local sockets reach no network host
    // The URL class canonicalises http(s) hosts (0x7f.1 -> 127.0.0.1) the same way undici will.
    let host: string | null;
    if (/^https?:/i.test(ep)) {
      try {
        host = new URL(ep).hostname;
      } catch {
        host = null;
      }
    } else host = endpointHost(ep);
    if (!host || !list.allows(host)) {
      return forbidden(
        `worker ${what} host "${host ?? ep}" is not in --allow-worker-hosts (${list.entries.join(', ') || 'empty'})`,
        'worker_host_not_allowed',
      );
    }
  }
  return null;
}
