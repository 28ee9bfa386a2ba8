/**
 * `--allow-worker-hosts`: which addresses the admin API may register as workers, so a stolen admin token cannot turn
 * the router into a proxy to arbitrary hosts (cloud metadata at 169.254.169.254, internal services).
 *
 * Entries: IPv4 or IPv6 CIDRs (10.0.0.0/8, fd00::/8), single addresses, exact host names (gpu1.internal) and
 * suffix patterns (*.gpu.internal). Host names are matched as written and NOT resolved: a name resolved at
 * registration may resolve elsewhere at connect time (DNS rebinding), so resolving would only look safe. An address in
 * the worker URL must fall in a CIDR; a name must be listed. IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) match IPv4
 * rules. Every endpoint the router will connect to is checked: the HTTP URL and the ZMQ events/replay endpoints.
 */
import { BlockList, isIP } from 'node:net';
import { forbidden, type Denial } from './errors.ts';

export interface HostAllowList {
  /** The entries as given, for messages and /debug. */
  readonly entries: readonly string[];
  allows(host: string): boolean;
}

function isIPv4MappedIPv6(a: string): string | null {
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(a);
  return m && isIP(m[1]) === 4 ? m[1] : null;
}

/** Parses a comma/whitespace separated list; throws on an entry that is neither a CIDR, an address nor a name. */
export function parseAllowList(text: string | readonly string[]): HostAllowList {
  const entries = (typeof text === 'string' ? text.split(/[,\s]+/) : text.flatMap((t) => t.split(/[,\s]+/))).filter(Boolean);
  const ips = new BlockList();
  const names = new Set<string>();
  const suffixes: string[] = [];
  for (const raw of entries) {
    const e = raw.trim();
    const slash = e.indexOf('/');
    if (slash >= 0) {
      const addr = e.slice(0, slash).replace(/^\[|\]$/g, '');
      const prefixText = e.slice(slash + 1);
      const fam = isIP(addr);
      const prefix = Number(prefixText);
      const max = fam === 4 ? 32 : 128;
      if (fam === 0 || !/^\d+$/.test(prefixText) || prefix > max) {
        throw new Error(`--allow-worker-hosts: "${e}" is not a valid CIDR (e.g. 10.0.0.0/8 or fd00::/8)`);
      }
      ips.addSubnet(addr, prefix, fam === 4 ? 'ipv4' : 'ipv6');
      continue;
    }
    const bare = e.replace(/^\[|\]$/g, '');
    const fam = isIP(bare);
    if (fam !== 0) {
      ips.addAddress(bare, fam === 4 ? 'ipv4' : 'ipv6');
      continue;
    }
    if (/^\*\.[a-z0-9.-]+$/i.test(e)) {
      suffixes.push(e.slice(1).toLowerCase()); // "*.gpu.internal" -> ".gpu.internal"
      continue;
    }
    if (/^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$/i.test(e)) {
      names.add(e.toLowerCase());
      continue;
    }
    throw new Error(`--allow-worker-hosts: "${e}" is neither a CIDR, an IP address nor a host name`);
  }
  return {
    entries,
    allows(hostIn: string): boolean {
      const host = hostIn.replace(/^\[|\]$/g, '').toLowerCase();
      const fam = isIP(host);
      if (fam === 4) return ips.check(host, 'ipv4');
      if (fam === 6) {
        const v4 = isIPv4MappedIPv6(host);
        if (v4) return ips.check(v4, 'ipv4');
        return ips.check(host, 'ipv6');
      }
      // Not a canonical address: a name (or a non-canonical numeric form that a resolver might still accept,
      // like 0x7f.1 in a ZMQ endpoint): allowed only when listed as written.
      if (names.has(host)) return true;
      return suffixes.some((s) => host.endsWith(s) && host.length > s.length);
    },
  };
}

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
