/** `kvroute serve` as a process: help, settings precedence (flag > env > config file > default), SIGTERM. */
import { spawn, spawnSync } from 'node:child_process';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { FakeEngine } from './fake-engine.ts';
import { json } from './helpers.ts';

const CLI = fileURLToPath(new URL('../../bin/kvroute.mjs', import.meta.url));

describe('kvroute serve (process)', () => {
  it('documents every setting with its environment variable in --help', () => {
    const r = spawnSync(process.execPath, [CLI, 'serve', '--help'], { encoding: 'utf8' });
    expect(r.status).toBe(0);
    for (const env of [
      'KVROUTE_WORKERS',
      'KVROUTE_POLICY',
      'KVROUTE_BLOCK_SIZE',
      'KVROUTE_QUEUE_LIMIT',
      'KVROUTE_QUEUE_TIMEOUT_MS',
      'KVROUTE_BODY_LIMIT',
      'KVROUTE_ADMIN_TOKEN',
      'KVROUTE_TOKENIZER',
      'KVROUTE_BUSY_PREFILL_TOKENS',
    ]) {
      expect(r.stdout).toContain(env);
    }
  });

  it('rejects a bad worker spec with a clear message', () => {
    const r = spawnSync(process.execPath, [CLI, 'serve', '--worker', 'http://a:1,dp=zero'], { encoding: 'utf8' });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('dp must be a positive integer');
  });

  it('applies flag > env > config file > default, serves, and exits cleanly on SIGTERM', async () => {
    const engine = await new FakeEngine().start();
    const dir = await mkdtemp(join(tmpdir(), 'kvroute-cli-'));
    const cfg = join(dir, 'kvroute.yaml');
    await writeFile(cfg, `policy: random\nblockSize: 32\nretries: 5\nworkers:\n  - ${engine.url}\n`);
    const child = spawn(process.execPath, [CLI, 'serve', '--config', cfg, '--port', '0', '--retries', '1', '--health-interval-ms', '0'], {
      env: { ...process.env, KVROUTE_POLICY: 'round-robin', KVROUTE_LOG_LEVEL: 'info' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    try {
      const url = await new Promise<string>((resolve, reject) => {
        let out = '';
        const t = setTimeout(() => reject(new Error(`no listening line: ${out}`)), 15_000);
        child.stdout.on('data', (d: Buffer) => {
          out += d.toString();
          const m = /listening on (http:\/\/[\d.:]+)/.exec(out);
          if (m) {
            clearTimeout(t);
            resolve(m[1]);
          }
        });
      });
      const state = await json(await fetch(`${url}/debug/state`));
      expect(state.router.policy).toBe('round-robin'); // env beats the config file
      expect(state.router.blockSize).toBe(32); // config file beats the default
      expect(state.config.retries).toBe(1); // the flag beats the config file
      expect(state.config.adminApi).toBe(false);
      expect(state.workers).toHaveLength(1);
      const r = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'fake-model', prompt: [1, 2, 3] }),
      });
      expect(r.status).toBe(200);
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
      await engine.stop();
    }
  });

  it('--metrics-port moves /metrics and /dashboard to their own listener; /debug/state needs the admin token once keys are set', async () => {
    const engine = await new FakeEngine().start();
    const key = 'sk-test-0123456789abcdef';
    const child = spawn(
      process.execPath,
      [
        CLI,
        'serve',
        '-w',
        engine.url,
        '--port',
        '0',
        '--metrics-port',
        '0',
        '--health-interval-ms',
        '0',
        '--api-key',
        key,
        '--admin-token',
        'admin-secret-123',
      ],
      { env: { ...process.env, KVROUTE_LOG_LEVEL: 'info' }, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    try {
      const [url, metricsUrl] = await new Promise<[string, string]>((resolve, reject) => {
        let out = '';
        const t = setTimeout(() => reject(new Error(`no listening line: ${out}`)), 20_000);
        child.stdout.on('data', (d: Buffer) => {
          out += d.toString();
          const m = /listening on (http:\/\/[\d.:]+).*metrics and dashboard on (http:\/\/[\d.:]+)/.exec(out);
          if (m) {
            clearTimeout(t);
            resolve([m[1], m[2]]);
          }
        });
      });
      expect(metricsUrl).not.toBe(url);
      const metrics = await fetch(`${metricsUrl}/metrics`);
      expect(metrics.status).toBe(200);
      expect(await metrics.text()).toContain('router_kv_isl_blocks_total');
      expect((await fetch(`${metricsUrl}/dashboard`)).status).toBe(200);
      expect((await fetch(`${metricsUrl}/v1/models`)).status).toBe(404); // the metrics listener serves nothing else
      expect((await fetch(`${url}/metrics`)).status).toBe(404);
      const anon = await fetch(`${url}/debug/state`);
      expect(anon.status).toBe(401);
      expect((await json(anon)).error.code).toBe('invalid_token');
      expect((await fetch(`${url}/debug/state`, { headers: { authorization: `Bearer ${key}` } })).status).toBe(401);
      const admin = await fetch(`${url}/debug/state`, { headers: { authorization: 'Bearer admin-secret-123' } });
      expect(admin.status).toBe(200);
      expect(JSON.stringify(await json(admin))).not.toContain(key);
    } finally {
      child.kill('SIGTERM');
      await new Promise((r) => child.once('exit', r));
      await engine.stop();
    }
  });
});
