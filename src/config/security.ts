/**
 * The values of the security settings, parsed: `--allow-worker-hosts` (which addresses the admin API may register as
 * workers, so a stolen admin token cannot turn the router into a proxy to arbitrary hosts such as cloud metadata at
 * 169.254.169.254) and `--rate-limit` (a token bucket's rate and burst). The settings schema checks values with these
 * parsers; src/runtime/security applies them.
 *
 * Allow-list entries: IPv4 or IPv6 CIDRs (10.0.0.0/8, fd00::/8), single addresses, exact host names (gpu1.internal) and
 * suffix patterns (*.gpu.internal). Host names are matched as written and NOT resolved: a name resolved at
 * registration may resolve elsewhere at connect time (DNS rebinding), so resolving would only look safe. An address
 * must fall in a CIDR; a name must be listed. IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) match IPv4 rules.
 */
import { BlockList, isIP } from 'node:net';

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

export interface RateLimitSpec {
  /** Sustained requests per second. */
  readonly rps: number;
  /** Bucket size: requests allowed at once after idling. */
  readonly burst: number;
}

/** Parses `--rate-limit <rps>,<burst>` (burst defaults to max(1, rps)). */
export function parseRateLimit(text: string): RateLimitSpec {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(?:,\s*(\d+)\s*)?$/.exec(text);
  if (!m) throw new Error(`--rate-limit must be "<rps>" or "<rps>,<burst>" (e.g. 10,20), got "${text}"`);
  const rps = Number(m[1]);
  const burst = m[2] !== undefined ? Number(m[2]) : Math.max(1, Math.ceil(rps));
  if (!(rps > 0)) throw new Error(`--rate-limit rate must be > 0, got "${text}"`);
  if (!Number.isInteger(burst) || burst < 1) throw new Error(`--rate-limit burst must be an integer >= 1, got "${text}"`);
  return { rps, burst };
}
