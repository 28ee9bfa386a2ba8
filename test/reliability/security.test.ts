/** Unit tests of src/runtime/security: keys, constant-time compare, token bucket, allow-list, timeouts. */
import { chmod, mkdtemp, writeFile } from 'node:fs/promises';
import type { IncomingMessage } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  adminAuthorized,
  ApiKeySet,
  bearerToken,
  createSecurity,
  denialBody,
  fingerprint,
  httpServerTimeouts,
  KeyedRateLimiter,
  loadApiKeys,
  parseAllowList,
  parseRateLimit,
  secretEquals,
  TokenBucket,
  toHttpError,
} from '../../src/runtime/security/index.ts';

const K1 = 'sk-test-0123456789abcdef';
const K2 = 'sk-test-fedcba9876543210';

function fakeReq(authorization?: string, remoteAddress = '10.1.2.3'): IncomingMessage {
  return { headers: authorization === undefined ? {} : { authorization }, socket: { remoteAddress } } as unknown as IncomingMessage;
}

describe('API keys', () => {
  it('matches any configured key and returns its fingerprint, never the key', () => {
    const set = new ApiKeySet([K1, K2, K1]);
    expect(set.size).toBe(2);
    expect(set.match(K2)).toBe(fingerprint(K2));
    expect(set.match(K1)).toMatch(/^key-[0-9a-f]{8}$/);
    expect(set.match(K1)).not.toContain(K1.slice(3));
    expect(set.match(`${K1}x`)).toBeNull();
    expect(set.match('')).toBeNull();
    expect(set.match(K1.slice(0, -1))).toBeNull();
  });

  it('secretEquals compares secrets of different lengths without throwing (timingSafeEqual on digests)', () => {
    expect(secretEquals('a', 'a')).toBe(true);
    expect(secretEquals('a', 'ab')).toBe(false);
    expect(secretEquals('', 'x'.repeat(10_000))).toBe(false);
  });

  it('parses Bearer tokens strictly', () => {
    expect(bearerToken({ authorization: `Bearer ${K1}` })).toBe(K1);
    expect(bearerToken({ authorization: `bearer   ${K1} ` })).toBe(K1);
    expect(bearerToken({ authorization: `Basic ${K1}` })).toBeNull();
    expect(bearerToken({ authorization: `Bearer ${K1} extra` })).toBeNull();
    expect(bearerToken({ authorization: 'Bearer' })).toBeNull();
    expect(bearerToken({})).toBeNull();
  });

  it('loads keys from flags, env and a key file; refuses short keys; warns on a world-readable file', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvr-keys-'));
    const file = join(dir, 'keys');
    await writeFile(file, `# tenants\n${K2}\n\n  sk-file-third-key-000000  \n`);
    await chmod(file, 0o644);
    const { keys, warnings } = await loadApiKeys({ flags: [K1], env: `${K2}, sk-env-only-key-00000000`, file });
    expect(keys.size).toBe(4);
    expect(keys.match('sk-file-third-key-000000')).not.toBeNull();
    expect(keys.match('sk-env-only-key-00000000')).not.toBeNull();
    expect(warnings.join()).toMatch(/readable by every user/);
    expect(warnings.join()).not.toContain(K2);
    await chmod(file, 0o600);
    expect((await loadApiKeys({ file })).warnings).toEqual([]);
    await expect(loadApiKeys({ flags: ['short'] })).rejects.toThrow(/at least 16/);
    await expect(loadApiKeys({ file: join(dir, 'missing') })).rejects.toThrow(/ENOENT/);
    await writeFile(join(dir, 'empty'), '# nothing\n');
    await expect(loadApiKeys({ file: join(dir, 'empty') })).rejects.toThrow(/holds no key/);
  });

  it('checkApi: 401 OpenAI-style without or with a wrong key, null with a right one; the key never echoed', () => {
    const sec = createSecurity({ apiKeys: new ApiKeySet([K1]) });
    const missing = sec.checkApi(fakeReq());
    expect(missing?.status).toBe(401);
    expect(missing?.headers['www-authenticate']).toBe('Bearer');
    const wrong = sec.checkApi(fakeReq('Bearer sk-wrong-wrong-wrong-wrong'));
    expect(wrong?.status).toBe(401);
    const body = JSON.parse(denialBody(wrong!));
    expect(body).toEqual({ error: { message: expect.any(String), type: 'authentication_error', param: null, code: 'invalid_api_key' } });
    expect(denialBody(wrong!)).not.toContain('sk-wrong');
    expect(sec.checkApi(fakeReq(`Bearer ${K1}`))).toBeNull();
    expect(sec.keyIdOf(fakeReq(`Bearer ${K1}`))).toBe(fingerprint(K1));
    const e = toHttpError(wrong!);
    expect(e.status).toBe(401);
    expect(e.headers['www-authenticate']).toBe('Bearer');
  });

  it('without keys /v1 is open', () => {
    expect(createSecurity({}).checkApi(fakeReq())).toBeNull();
  });

  it('admin token: constant-time bearer compare', () => {
    expect(adminAuthorized(fakeReq('Bearer s3cret-admin'), 's3cret-admin')).toBe(true);
    expect(adminAuthorized(fakeReq('Bearer s3cret-admiN'), 's3cret-admin')).toBe(false);
    expect(adminAuthorized(fakeReq('s3cret-admin'), 's3cret-admin')).toBe(false);
    expect(adminAuthorized(fakeReq(), 's3cret-admin')).toBe(false);
  });
});

describe('token bucket', () => {
  it('allows the burst, then refills at the rate; Retry-After is the time to the next token', () => {
    const b = new TokenBucket({ rps: 2, burst: 3 }, 0);
    expect([b.take(0), b.take(0), b.take(0)].every((r) => r.ok)).toBe(true);
    const r = b.take(0);
    expect(r).toEqual({ ok: false, retryAfterMs: 500 });
    expect(b.take(499).ok).toBe(false);
    expect(b.take(500 + 250).ok).toBe(true); // 1.5 tokens were refilled by 750 ms minus the refused ones (none taken)
    expect(b.available(10_000)).toBe(3); // capped at burst
  });

  it('a clock going backwards neither adds nor removes tokens', () => {
    const b = new TokenBucket({ rps: 1, burst: 1 }, 1000);
    expect(b.take(1000).ok).toBe(true);
    expect(b.take(0).ok).toBe(false);
    expect(b.take(1999).ok).toBe(false);
    expect(b.take(2000).ok).toBe(true);
  });

  it('parses --rate-limit', () => {
    expect(parseRateLimit('10,20')).toEqual({ rps: 10, burst: 20 });
    expect(parseRateLimit('0.5')).toEqual({ rps: 0.5, burst: 1 });
    expect(() => parseRateLimit('0,5')).toThrow(/> 0/);
    expect(() => parseRateLimit('ten')).toThrow(/rate-limit/);
    expect(() => parseRateLimit('1,0')).toThrow(/burst/);
  });

  it('per key: one key exhausted does not limit another; 429 with Retry-After >= 1 s', () => {
    let now = 0;
    const sec = createSecurity({ apiKeys: new ApiKeySet([K1, K2]), rateLimit: { rps: 1, burst: 2 }, clock: () => now });
    expect(sec.checkApi(fakeReq(`Bearer ${K1}`))).toBeNull();
    expect(sec.checkApi(fakeReq(`Bearer ${K1}`))).toBeNull();
    const d = sec.checkApi(fakeReq(`Bearer ${K1}`));
    expect(d?.status).toBe(429);
    expect(d?.headers['retry-after']).toBe('1');
    expect(JSON.parse(denialBody(d!)).error.code).toBe('rate_limit_exceeded');
    expect(sec.checkApi(fakeReq(`Bearer ${K2}`))).toBeNull();
    // A wrong key is refused by authentication and takes no token from anyone.
    for (let i = 0; i < 5; i++) expect(sec.checkApi(fakeReq('Bearer sk-nope-nope-nope-nope'))?.status).toBe(401);
    expect(sec.checkApi(fakeReq(`Bearer ${K2}`))).toBeNull();
    now = 1000;
    expect(sec.checkApi(fakeReq(`Bearer ${K1}`))).toBeNull();
  });

  it('without keys, buckets are per client address and the map stays bounded', () => {
    let now = 0;
    const lim = new KeyedRateLimiter({ rps: 1, burst: 1 }, () => now, 100);
    for (let i = 0; i < 1000; i++) lim.take(`addr:${i}`);
    expect(lim.size).toBeLessThanOrEqual(100);
    const sec = createSecurity({ rateLimit: { rps: 1, burst: 1 }, clock: () => now });
    expect(sec.checkApi(fakeReq(undefined, '10.0.0.1'))).toBeNull();
    expect(sec.checkApi(fakeReq(undefined, '10.0.0.1'))?.status).toBe(429);
    expect(sec.checkApi(fakeReq(undefined, '10.0.0.2'))).toBeNull();
    now = 5000;
    expect(sec.checkApi(fakeReq(undefined, '10.0.0.1'))).toBeNull();
  });
});

describe('worker host allow-list', () => {
  const list = parseAllowList('10.0.0.0/8, 192.168.1.7, fd00::/8, [2001:db8::1], gpu1.internal, *.pool.internal');

  it('matches IPv4 and IPv6 CIDRs, single addresses, IPv4-mapped IPv6', () => {
    expect(list.allows('10.200.3.4')).toBe(true);
    expect(list.allows('11.0.0.1')).toBe(false);
    expect(list.allows('192.168.1.7')).toBe(true);
    expect(list.allows('192.168.1.8')).toBe(false);
    expect(list.allows('fd12:3456::1')).toBe(true);
    expect(list.allows('[fd00::5]')).toBe(true);
    expect(list.allows('fe80::1')).toBe(false);
    expect(list.allows('2001:db8::1')).toBe(true);
    expect(list.allows('2001:db8::2')).toBe(false);
    expect(list.allows('::ffff:10.9.9.9')).toBe(true);
    expect(list.allows('::ffff:169.254.169.254')).toBe(false);
  });

  it('matches names as written (no DNS), suffix patterns on a label boundary', () => {
    expect(list.allows('gpu1.internal')).toBe(true);
    expect(list.allows('GPU1.internal')).toBe(true);
    expect(list.allows('gpu2.internal')).toBe(false);
    expect(list.allows('a.pool.internal')).toBe(true);
    expect(list.allows('pool.internal')).toBe(false);
    expect(list.allows('evilpool.internal')).toBe(false);
    expect(list.allows('localhost')).toBe(false);
    expect(list.allows('0x0a.1')).toBe(false); // a resolver might read this as 10.0.0.1: not a listed name
  });

  it('checks the URL and the ZMQ endpoints; canonicalises http hosts like undici', () => {
    const sec = createSecurity({ allowWorkerHosts: list });
    expect(sec.checkWorker({ url: 'http://10.0.0.5:8000', events: 'tcp://10.0.0.5:5557', replay: 'tcp://[fd00::1]:5558' })).toBeNull();
    expect(sec.checkWorker({ url: 'http://169.254.169.254/latest' })?.status).toBe(403);
    expect(sec.checkWorker({ url: 'http://10.0.0.5:8000', events: 'tcp://127.0.0.1:5557' })?.code).toBe('worker_host_not_allowed');
    expect(sec.checkWorker({ url: 'http://0x0a.1:8000' })).toBeNull(); // WHATWG URL reads 0x0a.1 as 10.0.0.1
    expect(sec.checkWorker({ url: 'http://user@127.0.0.1:8000' })?.status).toBe(403);
    expect(sec.checkWorker({ url: 'http://[::ffff:7f00:1]:8000' })?.status).toBe(403);
    expect(sec.checkWorker({ url: 'http://10.0.0.5:8000', events: 'ipc:///tmp/kv.sock' })).toBeNull();
    expect(createSecurity({}).checkWorker({ url: 'http://169.254.169.254' })).toBeNull();
  });

  it('refuses malformed entries at startup', () => {
    expect(() => parseAllowList('10.0.0.0/33')).toThrow(/CIDR/);
    expect(() => parseAllowList('10.0.0/8')).toThrow(/CIDR/);
    expect(() => parseAllowList('gpu_1!')).toThrow(/neither/);
  });
});

describe('server timeouts', () => {
  it('sweeps often enough for the shortest timeout and rejects request < headers', () => {
    expect(httpServerTimeouts({ headersTimeoutMs: 2000, requestTimeoutMs: 4000 })).toEqual({
      headersTimeout: 2000,
      requestTimeout: 4000,
      connectionsCheckingInterval: 500,
    });
    expect(httpServerTimeouts().connectionsCheckingInterval).toBe(1000);
    expect(() => httpServerTimeouts({ headersTimeoutMs: 5000, requestTimeoutMs: 1000 })).toThrow(/must be >=/);
  });
});

describe('JSON nesting depth (before JSON.parse)', () => {
  it('counts arrays and objects, ignores brackets in strings and escaped quotes', async () => {
    const { jsonDepth, checkJsonDepth } = await import('../../src/runtime/security/index.ts');
    const b = (s: string) => Buffer.from(s);
    expect(jsonDepth(b('{"a":[1,{"b":2}]}'))).toBe(3);
    expect(jsonDepth(b('"[[[[["'))).toBe(0);
    expect(jsonDepth(b('{"a":"x\\"[[[[","b":[]}'))).toBe(2);
    expect(jsonDepth(b('[[[[[[[[[['), 3)).toBe(4); // stops early
    expect(checkJsonDepth(b('['.repeat(65) + ']'.repeat(65)))?.status).toBe(400);
    expect(checkJsonDepth(b('['.repeat(64) + ']'.repeat(64)))).toBeNull();
    // Agrees with JSON.parse on generated JSON values.
    const fc = (await import('fast-check')).default;
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 6 }), (v) => {
        const depthOf = (x: unknown): number =>
          x !== null && typeof x === 'object' ? 1 + Math.max(0, ...Object.values(x as object).map(depthOf)) : 0;
        return jsonDepth(Buffer.from(JSON.stringify(v))) === depthOf(v);
      }),
      { numRuns: 300, seed: 7 },
    );
  });

  it('refuses exactly what the full scan refuses, whether the bracket count settles it or not', async () => {
    const { jsonDepth, checkJsonDepth } = await import('../../src/runtime/security/index.ts');
    const b = (s: string) => Buffer.from(s);
    // Many brackets, shallow: past the count's shortcut, the scan decides (depth 2, allowed).
    expect(checkJsonDepth(b(`[${Array.from({ length: 200 }, () => '[]').join(',')}]`), 64)).toBeNull();
    // Brackets inside strings count for the shortcut but not for depth: still allowed.
    expect(checkJsonDepth(b(`{"a":"${'['.repeat(500)}"}`), 64)).toBeNull();
    // Deep nesting behind many shallow siblings is still found.
    const deep = `[${'[],'.repeat(100)}${'['.repeat(70)}${']'.repeat(70)}]`;
    expect(checkJsonDepth(b(deep), 64)?.status).toBe(400);
    const fc = (await import('fast-check')).default;
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 8 }), fc.integer({ min: 1, max: 8 }), (v, limit) => {
        const buf = Buffer.from(JSON.stringify(v));
        return (checkJsonDepth(buf, limit) !== null) === jsonDepth(buf) > limit;
      }),
      { numRuns: 500, seed: 11 },
    );
  });
});

describe('log redaction', () => {
  it('LOG_REDACT_PATHS hides Authorization headers and configured secrets in pino output', async () => {
    const { LOG_REDACT_PATHS } = await import('../../src/runtime/security/index.ts');
    const pino = (await import('pino')).default;
    const { Writable } = await import('node:stream');
    let out = '';
    const sink = new Writable({
      write(c, _e, cb) {
        out += c.toString();
        cb();
      },
    });
    const log = pino({ redact: LOG_REDACT_PATHS }, sink);
    log.info({ req: { headers: { authorization: `Bearer ${K1}` } } }, 'a');
    log.info({ headers: { authorization: `Bearer ${K1}` } }, 'b');
    log.info({ authorization: `Bearer ${K1}`, adminToken: K2, apiKeys: [K1] }, 'c');
    log.info({ config: { adminToken: K2, apiKeys: [K1] } }, 'd');
    expect(out.split('\n').filter(Boolean)).toHaveLength(4);
    expect(out).not.toContain(K1);
    expect(out).not.toContain(K2);
    expect(out).toContain('[Redacted]');
  });
});
