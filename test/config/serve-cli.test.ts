/**
 * `kvroute serve` settings as a process: a bad value from a flag, a KVROUTE_* variable or the config file exits 2
 * with one stderr line naming the setting, its range and the source; precedence holds end to end (read back from
 * GET /debug/state); --help lists every setting with its variable, config key and default.
 */
import { spawn } from 'node:child_process';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { DEFAULTS, serveSchema } from '../../src/config/serve.ts';
import { longFlag, settingsOf } from '../../src/config/settings.ts';

const CLI = fileURLToPath(new URL('../../bin/kvroute.mjs', import.meta.url));

/** The environment without any KVROUTE_* of the caller's, so each case sees only its own. */
function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('KVROUTE_')));
  return { ...env, ...extra };
}

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function runServe(args: string[], env: Record<string, string> = {}): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, 'serve', ...args], { env: cleanEnv(env), stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d));
    child.stderr.on('data', (d: Buffer) => (stderr += d));
    // A case that unexpectedly starts the router must not hang the suite.
    const guard = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.once('error', reject);
    child.once('exit', (code) => {
      clearTimeout(guard);
      resolve({ code, stdout, stderr });
    });
  });
}

async function yamlFile(text: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'kvroute-serve-cli-'));
  const path = join(dir, 'kvroute.yaml');
  await writeFile(path, text);
  return path;
}

type From = 'flag' | 'env' | 'file';
interface Case {
  readonly what: string;
  readonly flag?: string[];
  readonly env?: Record<string, string>;
  readonly file?: string;
  /** The message after "kvroute serve: ", given where the value came from. */
  readonly message: (from: string, source: From) => string;
}

const retries = (got: string, from: string) => `--retries (KVROUTE_RETRIES) must be an integer >= 0, got ${got} (from ${from})`;
const quoted = (source: From, text: string, fileValue: string = text) => (source === 'file' ? fileValue : `"${text}"`);

const CASES: Case[] = [
  {
    what: 'negative retries',
    flag: ['--retries', '-1'],
    env: { KVROUTE_RETRIES: '-1' },
    file: 'retries: -1\n',
    message: (from, s) => retries(quoted(s, '-1', '-1'), from),
  },
  {
    what: 'port 70000',
    flag: ['--port', '70000'],
    env: { KVROUTE_PORT: '70000' },
    file: 'port: 70000\n',
    message: (from, s) => `--port (KVROUTE_PORT) must be an integer in [0, 65535], got ${quoted(s, '70000')} (from ${from})`,
  },
  {
    what: 'block size 0',
    flag: ['--block-size', '0'],
    env: { KVROUTE_BLOCK_SIZE: '0' },
    file: 'blockSize: 0\n',
    message: (from, s) => `--block-size (KVROUTE_BLOCK_SIZE) must be an integer >= 1, got ${quoted(s, '0')} (from ${from})`,
  },
  {
    what: 'unknown policy',
    flag: ['--policy', 'telepathy'],
    env: { KVROUTE_POLICY: 'telepathy' },
    file: 'policy: telepathy\n',
    message: (from) =>
      `--policy (KVROUTE_POLICY) must be one of kv-pressure, kv, round-robin, random, least-loaded, prefix-hash, dynamo, llmd, llmd-baseline, smg, smg-legacy, aibrix, ps-kvaware, ps-prefixaware, got "telepathy" (from ${from})`,
  },
  {
    what: 'bad worker spec',
    flag: ['--worker', 'http://a:1,dp=zero'],
    env: { KVROUTE_WORKERS: 'http://a:1,dp=zero' },
    file: 'workers:\n  - http://a:1,dp=zero\n',
    message: (from, s) =>
      `--worker (KVROUTE_WORKERS): dp must be a positive integer, got "zero" (from ${from}${s === 'file' ? '[0].dp' : ''})`,
  },
  {
    what: 'bad body limit',
    flag: ['--body-limit', '32parsecs'],
    env: { KVROUTE_BODY_LIMIT: '32parsecs' },
    file: 'bodyLimitBytes: 32parsecs\n',
    message: (from) => `--body-limit (KVROUTE_BODY_LIMIT) must be a size like 32mb, 512kb or 1048576, got "32parsecs" (from ${from})`,
  },
  {
    what: 'a switch that is neither true nor false',
    env: { KVROUTE_TIER_CREDIT: 'maybe' },
    file: 'tierCredit: maybe\n',
    message: (from) => `--tier-credit (KVROUTE_TIER_CREDIT) must be true or false, got "maybe" (from ${from})`,
  },
  {
    what: 'wrong type in YAML',
    file: 'retries: [1, 2]\n',
    message: (from) => retries('[1,2]', from),
  },
  {
    what: 'a metrics host without a metrics port',
    flag: ['--metrics-host', '0.0.0.0'],
    env: { KVROUTE_METRICS_HOST: '0.0.0.0' },
    message: (from) => `--metrics-host (KVROUTE_METRICS_HOST) needs --metrics-port (KVROUTE_METRICS_PORT) (from ${from})`,
  },
];

const rows = CASES.flatMap((c) => {
  const out: Array<[string, From, Case]> = [];
  if (c.flag) out.push([c.what, 'flag', c]);
  if (c.env) out.push([c.what, 'env', c]);
  if (c.file) out.push([c.what, 'file', c]);
  return out;
});

describe('kvroute serve refuses bad settings from every source (process)', () => {
  it.for(rows)('%s from the %s: exit 2, one line', async ([, source, c], { expect }) => {
    let args: string[] = [];
    let env: Record<string, string> = {};
    let from: string;
    if (source === 'flag') {
      args = c.flag!;
      from = c.flag![0];
    } else if (source === 'env') {
      env = c.env!;
      from = Object.keys(c.env!)[0];
    } else {
      const path = await yamlFile(c.file!);
      args = ['--config', path];
      from = `${path}: ${c.file!.split(':')[0]}`; // the file's one key
    }
    const r = await runServe(args, env);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe(`kvroute serve: ${c.message(from, source)}\n`);
    expect(r.stdout).toBe(''); // refused before the router (or a mock fleet) started
  });

  it('an unknown config-file key (also through KVROUTE_CONFIG)', async ({ expect }) => {
    const path = await yamlFile('polcy: kv\n');
    const r = await runServe([], { KVROUTE_CONFIG: path });
    expect(r.code).toBe(2);
    expect(r.stderr.split('\n')).toHaveLength(2);
    expect(r.stderr).toMatch(new RegExp(`^kvroute serve: config file ${path}: unknown key "polcy" \\(known: workers, host, port, `));
  });

  it('a config file with a YAML syntax error', async ({ expect }) => {
    const path = await yamlFile('retries: [1\nport: 1\n');
    const r = await runServe(['--config', path]);
    expect(r.code).toBe(2);
    expect(r.stderr.split('\n')).toHaveLength(2);
    expect(r.stderr.startsWith(`kvroute serve: config file ${path}: `)).toBe(true);
  });
});

describe('kvroute serve settings (process)', () => {
  it('--help lists every setting with its variable, config key and default', async () => {
    const r = await runServe(['--help']);
    expect(r.code).toBe(0);
    const help = r.stdout.replace(/\s+/g, ' ');
    for (const { key, entry } of settingsOf(serveSchema)) {
      expect(help, key).toContain(longFlag(entry));
      expect(help, key).toContain(`env: ${entry.env}`);
      expect(help, key).toContain(`config: ${key}`);
      if (entry.default !== undefined && !(Array.isArray(entry.default) && entry.default.length === 0)) {
        expect(help, key).toContain(`default: ${entry.kind.show(entry.default)}`);
      }
      if (entry.kind.range) expect(help, key).toContain(entry.kind.range);
    }
    expect(help).toContain('default: 32mb; env: KVROUTE_BODY_LIMIT');
    expect(help).toContain('an integer >= 0; default: 2; env: KVROUTE_RETRIES; config: retries');
    expect(help).toContain('env: KVROUTE_CONFIG');
  });

  it('flag > env > file > default, read back from the running router', async () => {
    const path = await yamlFile('queueLimit: 9\nretries: 4\nbreakerThreshold: 11\nallowWorkerHosts: [10.0.0.0/8]\nmetricsPrefix: file_\n');
    const child = spawn(
      process.execPath,
      [CLI, 'serve', '--config', path, '--port', '0', '--mock-workers', '0', '--health-interval-ms', '0', '--queue-limit', '7'],
      {
        env: cleanEnv({
          KVROUTE_QUEUE_LIMIT: '8',
          KVROUTE_RETRIES: '3',
          KVROUTE_ALLOW_WORKER_HOSTS: '192.168.0.0/16, gpu.internal',
          KVROUTE_LOG_LEVEL: 'info',
        }),
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    try {
      const url = await new Promise<string>((resolve, reject) => {
        let out = '';
        child.stdout.on('data', (d: Buffer) => {
          out += d;
          const m = /listening on (http:\/\/[\d.:]+)/.exec(out);
          if (m) resolve(m[1]);
        });
        child.once('exit', (code) => reject(new Error(`exited ${code}: ${out}`)));
      });
      const state = (await (await fetch(`${url}/debug/state`)).json()) as { config: Record<string, unknown> };
      expect(state.config.queueLimit).toBe(7); // flag over env and file
      expect(state.config.retries).toBe(3); // env over file
      expect(state.config.allowWorkerHosts).toEqual(['192.168.0.0/16', 'gpu.internal']); // a list, whole, from env
      expect(state.config.breakerThreshold).toBe(11); // file over default
      expect(state.config.metricsPrefix).toBe('file_');
      expect(state.config.ejectAfter).toBe(DEFAULTS.ejectAfter); // default
      const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  });
});
