/** `kvroute serve` as a process, traced by the standard OTEL_* variables alone (the documented way to turn it on). */
import { randomBytes } from 'node:crypto';
import { spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { startMocker } from '../../src/mocker/server.ts';
import { post, until } from './helpers.ts';
import { OtlpReceiver } from './otlp-receiver.ts';

const CLI = fileURLToPath(new URL('../../bin/kvroute.mjs', import.meta.url));

describe('kvroute serve with OTEL_* variables (process)', () => {
  it('exports the request’s spans under the client’s trace to OTEL_EXPORTER_OTLP_ENDPOINT, named by OTEL_SERVICE_NAME', async () => {
    const receiver = await new OtlpReceiver().start();
    const engine = await startMocker({ zmqEndpoint: null, replayEndpoint: null, speedup: 20 });
    const child = spawn(process.execPath, [CLI, 'serve', '-w', engine.url, '--port', '0', '--health-interval-ms', '0'], {
      env: {
        ...process.env,
        KVROUTE_LOG_LEVEL: 'info',
        OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
        OTEL_SERVICE_NAME: 'kvroute-process',
        OTEL_BSP_SCHEDULE_DELAY: '100',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    try {
      const url = await new Promise<string>((resolve, reject) => {
        let out = '';
        const t = setTimeout(() => reject(new Error(`no listening line: ${out}`)), 20_000);
        child.stdout.on('data', (d: Buffer) => {
          out += d.toString();
          const m = /listening on (http:\/\/[\d.:]+)/.exec(out);
          if (m) {
            clearTimeout(t);
            resolve(m[1]);
          }
        });
      });
      const traceId = randomBytes(16).toString('hex');
      const r = await post(
        `${url}/v1/completions`,
        { model: 'mock-model', prompt: 'traced by the environment', max_tokens: 2 },
        { traceparent: `00-${traceId}-${randomBytes(8).toString('hex')}-01` },
      );
      expect(r.status).toBe(200);
      await until(() => receiver.spans.filter((s) => s.traceId === traceId).length >= 4, 10_000);
      const mine = receiver.spans.filter((s) => s.traceId === traceId);
      expect(new Set(mine.map((s) => s.name))).toEqual(new Set(['POST /v1/completions', 'tokenize', 'route', 'upstream', 'first_token']));
      expect(mine.every((s) => s.service === 'kvroute-process')).toBe(true);
      expect(receiver.contentTypes[0]).toContain('protobuf'); // the default OTLP encoding
      expect(engine.stats.traceparents.some((t) => t.includes(traceId))).toBe(true);
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
      await engine.close();
      await receiver.close();
    }
  });

  it('a bad OTEL_* value stops start-up with one line naming it', () => {
    const r = spawnSync(process.execPath, [CLI, 'serve', '-w', 'http://127.0.0.1:9', '--port', '0'], {
      encoding: 'utf8',
      env: { ...process.env, OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:9', OTEL_TRACES_SAMPLER: 'sometimes' },
      timeout: 20_000,
    });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('OTEL_TRACES_SAMPLER must be one of');
  });
});
