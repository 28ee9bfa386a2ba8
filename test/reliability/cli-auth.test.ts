/**
 * `kvroute serve` as operators start it: keys from KVROUTE_API_KEYS, the rate limit from --rate-limit, and a
 * refusal at startup for a guessable key. One child process per case, stopped with SIGTERM by its pid.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

const BIN = fileURLToPath(new URL('../../bin/kvroute.mjs', import.meta.url));
const K1 = 'sk-env-key-one-0123456789abcdef';
const K2 = 'sk-env-key-two-0123456789abcdef';
const children: ChildProcess[] = [];

function serve(args: string[], env: Record<string, string>): { child: ChildProcess; url: Promise<string>; output: () => string } {
  const child = spawn(process.execPath, [BIN, 'serve', '--port', '0', '--mock-workers', '1', '--log-level', 'info', ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let out = '';
  const url = new Promise<string>((resolve, reject) => {
    const onData = (d: Buffer) => {
      out += d.toString();
      const m = /kvroute listening on (http:\/\/[^\s)]+)/.exec(out);
      if (m) resolve(m[1]);
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    child.once('exit', (code) => reject(new Error(`exited with ${code}: ${out.slice(-500)}`)));
  });
  return { child, url, output: () => out };
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  await exited;
}

afterAll(async () => {
  for (const c of children) await stop(c);
});

const complete = (url: string, key: string | null) =>
  fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
    body: JSON.stringify({ model: 'mock-model', prompt: 'hello', max_tokens: 1 }),
  });

describe('kvroute serve with security settings', () => {
  it('KVROUTE_API_KEYS (comma separated) and --rate-limit: keys work, others get 401, a tenant past its burst 429', async () => {
    const s = serve(['--rate-limit', '1,2'], { KVROUTE_API_KEYS: `${K1}, ${K2}` });
    const url = await s.url;
    expect((await complete(url, null)).status).toBe(401);
    expect((await complete(url, 'sk-env-key-xxx-0123456789abcdef')).status).toBe(401);
    expect((await complete(url, K1)).status).toBe(200);
    expect((await complete(url, K1)).status).toBe(200);
    const limited = await complete(url, K1);
    expect(limited.status).toBe(429);
    expect(Number(limited.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect((await complete(url, K2)).status).toBe(200);
    for (const k of [K1, K2]) expect(s.output()).not.toContain(k);
    await stop(s.child);
  });

  it('refuses to start with a key shorter than 16 characters, naming the problem', async () => {
    const s = serve(['--api-key', 'changeme'], {});
    await expect(s.url).rejects.toThrow(/at least 16/);
    expect(s.child.exitCode).not.toBe(0);
  });
});
