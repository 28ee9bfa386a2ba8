/**
 * The serve settings schema in-process: precedence (flag > env > file > default) for scalars and lists, config-file
 * checks, worker specs in every form, the shape of the table itself, and the admission settings on another command.
 */
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { ADMISSION_SETTINGS, routerOptionsFrom } from '../../src/config/routing.ts';
import { KvRouter } from '../../src/core/router.ts';
import { addServeOptions, DEFAULTS, loadConfigFile, resolveServeConfig, serveSchema, serveSettingsFrom } from '../../src/config/serve.ts';
import { longFlag, SettingError, settingsOf } from '../../src/config/settings.ts';
import { parseWorkerSpec, workerFromUnknown } from '../../src/config/worker-spec.ts';

async function configFile(name: string, text: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'kvroute-settings-'));
  const path = join(dir, name);
  await writeFile(path, text);
  return path;
}

async function refusal(p: Promise<unknown>): Promise<string> {
  const err = await p.then(
    () => null,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(SettingError);
  const message = (err as Error).message;
  expect(message).not.toContain('\n');
  return message;
}

describe('precedence', () => {
  it('flag > env > file > default, per setting, and says where each value came from', async () => {
    const path = await configFile('kvroute.yaml', 'queueLimit: 9\nretries: 4\nbreakerThreshold: 11\npolicy: random\n');
    const { config, sources } = await resolveServeConfig({
      flags: { queueLimit: '7' },
      env: { KVROUTE_QUEUE_LIMIT: '8', KVROUTE_RETRIES: '3', KVROUTE_POLICY: 'round-robin' },
      configPath: path,
    });
    expect(config.queueLimit).toBe(7);
    expect(config.retries).toBe(3);
    expect(config.breakerThreshold).toBe(11);
    expect(config.policy).toBe('round-robin');
    expect(config.ejectAfter).toBe(DEFAULTS.ejectAfter);
    expect(sources).toMatchObject({ queueLimit: 'flag', retries: 'env', breakerThreshold: 'file', policy: 'env', ejectAfter: 'default' });
  });

  it('a list is taken whole from the highest source; flags repeat and each may hold several items', async () => {
    const path = await configFile('kvroute.json', JSON.stringify({ workers: ['http://file:1'], allowWorkerHosts: ['10.0.0.0/8'] }));
    const fromFile = await resolveServeConfig({ configPath: path });
    expect(fromFile.config.workers).toEqual([{ url: 'http://file:1' }]);
    const fromEnv = await resolveServeConfig({ configPath: path, env: { KVROUTE_WORKERS: 'http://e1:1;http://e2:2 http://e3:3' } });
    expect(fromEnv.config.workers.map((w) => w.url)).toEqual(['http://e1:1', 'http://e2:2', 'http://e3:3']);
    const fromFlags = await resolveServeConfig({
      configPath: path,
      env: { KVROUTE_WORKERS: 'http://e1:1' },
      flags: { workers: ['http://f1:1,dp=2', 'http://f2:2 http://f3:3'], allowWorkerHosts: ['10.1.0.0/16,gpu.internal', '*.lab'] },
    });
    expect(fromFlags.config.workers).toEqual([{ url: 'http://f1:1', dp: 2 }, { url: 'http://f2:2' }, { url: 'http://f3:3' }]);
    expect(fromFlags.config.allowWorkerHosts).toEqual(['10.1.0.0/16', 'gpu.internal', '*.lab']);
  });

  it('an empty variable counts as unset; switches read true/false from the environment', async () => {
    const { config } = await resolveServeConfig({
      env: { KVROUTE_ADMIN_TOKEN: '', KVROUTE_RETRIES: '', KVROUTE_TIER_CREDIT: 'true', KVROUTE_REMOTE_TOKENIZE: 'false' },
    });
    expect(config.adminToken).toBeUndefined();
    expect(config.retries).toBe(2);
    expect(config.tierCredit).toBe(true);
    expect(config.remoteTokenize).toBe(false);
    // A switch flag beats the variable.
    const flagged = await resolveServeConfig({ flags: { remoteTokenize: true }, env: { KVROUTE_REMOTE_TOKENIZE: 'false' } });
    expect(flagged.config.remoteTokenize).toBe(true);
  });

  it('two resolutions never share the default list', async () => {
    const a = await resolveServeConfig({});
    a.config.workers.push({ url: 'http://x:1' });
    expect((await resolveServeConfig({})).config.workers).toEqual([]);
    expect(DEFAULTS.workers).toEqual([]);
  });

  it('reports KVROUTE_* variables that name no setting', async () => {
    const r = await resolveServeConfig({ env: { KVROUTE_RETRYS: '1', KVROUTE_DEBUG: '1', KVROUTE_CONFIG: '', HOME: '/root' } });
    expect(r.unknownEnv).toEqual(['KVROUTE_RETRYS']);
  });
});

describe('memory budgets', () => {
  it('are in --help, default to 64 / 32 / 32 / 64 MiB, and refuse what is not a size', async () => {
    const cmd = new Command('serve').exitOverride();
    addServeOptions(cmd);
    const help = cmd.helpInformation();
    for (const flag of ['--tokenizer-cache-mb <mb>', '--session-table-mb <mb>', '--response-pin-table-mb <mb>', '--approx-table-mb <mb>'])
      expect(help).toContain(flag);
    const { config } = await resolveServeConfig({});
    expect([config.tokenizerCacheMb, config.sessionTableMb, config.responsePinTableMb, config.approxTableMb]).toEqual([64, 32, 32, 64]);
    // The approximate table's budget reaches the router in bytes.
    const approx = await resolveServeConfig({ env: { KVROUTE_APPROX_TABLE_MB: '8' } });
    expect(routerOptionsFrom(approx.config).approxTableBytes).toBe(8 * 2 ** 20);
    expect(new KvRouter(routerOptionsFrom(approx.config)).approxTable.maxBytes).toBe(8 * 2 ** 20);
    expect(await refusal(resolveServeConfig({ flags: { approxTableMb: '0' } }))).toMatch(
      /^--approx-table-mb \(KVROUTE_APPROX_TABLE_MB\) must be a number/,
    );
    expect((await resolveServeConfig({ env: { KVROUTE_TOKENIZER_CACHE_MB: '0.5' } })).config.tokenizerCacheMb).toBe(0.5);
    expect(await refusal(resolveServeConfig({ env: { KVROUTE_TOKENIZER_CACHE_MB: '-1' } }))).toMatch(
      /^--tokenizer-cache-mb \(KVROUTE_TOKENIZER_CACHE_MB\) must be a number/,
    );
    expect(await refusal(resolveServeConfig({ flags: { sessionTableMb: 'lots' } }))).toMatch(
      /^--session-table-mb \(KVROUTE_SESSION_TABLE_MB\) must be a number/,
    );
  });
});

describe('refusals', () => {
  it('name the setting, the accepted range and the source', async () => {
    expect(await refusal(resolveServeConfig({ env: { KVROUTE_RETRIES: '-1' } }))).toBe(
      '--retries (KVROUTE_RETRIES) must be an integer >= 0, got "-1" (from KVROUTE_RETRIES)',
    );
    expect(await refusal(resolveServeConfig({ flags: { busyKvFraction: '0' } }))).toBe(
      '--busy-kv-fraction (KVROUTE_BUSY_KV_FRACTION) must be a number in (0, 1], got "0" (from --busy-kv-fraction)',
    );
    const path = await configFile('bad.yaml', 'workers:\n  - http://a:1\n  - url: http://b:2\n    dp: 0\n');
    expect(await refusal(resolveServeConfig({ configPath: path }))).toBe(
      `--worker (KVROUTE_WORKERS): dp must be a positive integer, got 0 (from ${path}: workers[1].dp)`,
    );
  });

  it('a value the flag overrides is not checked: only the value in force counts', async () => {
    const { config } = await resolveServeConfig({ flags: { retries: '1' }, env: { KVROUTE_RETRIES: '-1' } });
    expect(config.retries).toBe(1);
  });

  it('refuse secrets without echoing them', async () => {
    const path = await configFile('secret.yaml', 'adminToken: 12345\n');
    const message = await refusal(resolveServeConfig({ configPath: path }));
    expect(message).toBe(`--admin-token (KVROUTE_ADMIN_TOKEN) must be a non-empty string, got (hidden) (from ${path}: adminToken)`);
  });

  it('refuse combinations no single value can', async () => {
    expect(await refusal(resolveServeConfig({ flags: { metricsHost: '0.0.0.0' } }))).toBe(
      '--metrics-host (KVROUTE_METRICS_HOST) needs --metrics-port (KVROUTE_METRICS_PORT) (from --metrics-host)',
    );
    expect(await refusal(resolveServeConfig({ env: { KVROUTE_METRICS_PORT: '8080' } }))).toMatch(
      /^--metrics-port \(KVROUTE_METRICS_PORT\) must differ from --port \(KVROUTE_PORT\), got 8080 for both/,
    );
    expect(await refusal(resolveServeConfig({ flags: { bodyTimeoutMs: '5000' } }))).toMatch(
      /^--body-timeout-ms \(KVROUTE_BODY_TIMEOUT_MS\) must be 0 or >= --header-timeout-ms/,
    );
    const ok = await resolveServeConfig({ flags: { metricsPort: '9090', metricsHost: '0.0.0.0' } });
    expect([ok.config.metricsHost, ok.config.metricsPort]).toEqual(['0.0.0.0', 9090]);
  });

  it('config files: unknown keys, wrong types, non-mappings, syntax errors and missing files', async () => {
    const cases: Array<[string, string, RegExp]> = [
      ['typo.yaml', 'polcy: kv\n', /unknown key "polcy" \(known: workers, host, port/],
      ['type.yaml', 'retries: two\n', /--retries \(KVROUTE_RETRIES\) must be an integer >= 0, got "two" \(from .*: retries\)$/],
      ['quoted.json', '{"port": "8080"}', /--port \(KVROUTE_PORT\) must be an integer in \[0, 65535\], got "8080"/],
      ['switch.yaml', 'tierCredit: "yes"\n', /--tier-credit \(KVROUTE_TIER_CREDIT\) must be true or false, got "yes"/],
      ['list.yaml', 'workers: http://a:1\n', /--worker \(KVROUTE_WORKERS\) must be worker specs URL\[,events=/],
      ['top.yaml', '- a\n- b\n', /expected a mapping of settings at the top/],
      ['syntax.yaml', 'retries: [1\n', /^config file .*syntax\.yaml: /],
    ];
    for (const [name, text, pattern] of cases) {
      const path = await configFile(name, text);
      expect(await refusal(resolveServeConfig({ configPath: path })), name).toMatch(pattern);
    }
    expect(await refusal(resolveServeConfig({ configPath: '/nonexistent/kvroute.yaml' }))).toBe(
      'config file /nonexistent/kvroute.yaml: cannot read it (ENOENT)',
    );
  });

  it('an empty config file sets nothing; sizes may be written as sizes in files too', async () => {
    expect((await resolveServeConfig({ configPath: await configFile('empty.yaml', '') })).config).toEqual(DEFAULTS);
    const path = await configFile('size.yaml', 'bodyLimitBytes: 1mb\n');
    expect(await loadConfigFile(path)).toEqual({ bodyLimitBytes: 1024 * 1024 });
  });
});

describe('worker specs: one parser for flags, env, file and the admin API', () => {
  it('the string grammar and the object form give the same worker', () => {
    const fromString = parseWorkerSpec('http://gpu1:8000/,events=tcp://gpu1:5557,dp=2,model=a,model=b,blocks=100,engine=sglang,id=g1');
    const fromObject = workerFromUnknown({
      url: 'http://gpu1:8000/',
      events: 'tcp://gpu1:5557',
      dp: 2,
      models: ['a'],
      model: 'b',
      blocks: 100,
      engine: 'sglang',
      id: 'g1',
    });
    expect(fromObject).toEqual(fromString);
    expect(fromString).toEqual({
      url: 'http://gpu1:8000',
      events: 'tcp://gpu1:5557',
      dp: 2,
      models: ['a', 'b'],
      blocks: 100,
      engine: 'sglang',
      id: 'g1',
    });
  });

  it('objects refuse unknown fields and wrong types instead of dropping them', () => {
    expect(() => workerFromUnknown({ url: 'http://a:1', colour: 'blue' })).toThrow('unknown worker option "colour"');
    expect(() => workerFromUnknown({ url: 'http://a:1', dp: '2' })).toThrow('dp must be a positive integer, got "2"');
    expect(() => workerFromUnknown({ url: 'http://a:1', id: 'a,b=c' })).toThrow('worker id "a,b=c" may use only');
    expect(() => workerFromUnknown({ dp: 1 })).toThrow('a worker needs a string "url"');
    expect(() => workerFromUnknown(42)).toThrow('a worker must be a spec string or an object with "url"');
  });
});

describe('the table', () => {
  const settings = settingsOf(serveSchema);

  it('every setting has a distinct flag and KVROUTE_* variable, and the defaults are the schema defaults', () => {
    const flags = settings.map((s) => longFlag(s.entry));
    const envs = settings.map((s) => s.entry.env);
    expect(new Set(flags).size).toBe(settings.length);
    expect(new Set(envs).size).toBe(settings.length);
    for (const env of envs) expect(env).toMatch(/^KVROUTE_[A-Z0-9_]+$/);
    for (const { key, entry } of settings) expect(DEFAULTS[key as keyof typeof DEFAULTS]).toEqual(entry.default);
    // The fields startServer reads, and the two new listener settings.
    for (const key of ['port', 'retries', 'bodyLimitBytes', 'tokenizerDir', 'apiKeys', 'metricsHost', 'metricsPort']) {
      expect(Object.keys(serveSchema.shape)).toContain(key);
    }
  });
});

describe('admission settings on another command', () => {
  const simLike = () => {
    const cmd = new Command('sim-like').exitOverride();
    addServeOptions(cmd, ADMISSION_SETTINGS);
    return cmd;
  };

  it('adds the same flags with the same ranges and defaults, and nothing else', () => {
    const cmd = simLike();
    expect(cmd.options.map((o) => o.long).sort()).toEqual(
      ['--busy-kv-fraction', '--busy-prefill-tokens', '--queue-limit', '--queue-timeout-ms', '--retries'].sort(),
    );
    cmd.parse(['--retries', '5', '--busy-prefill-tokens', '4096'], { from: 'user' });
    expect(serveSettingsFrom(cmd, ADMISSION_SETTINGS, { env: {} })).toEqual({
      retries: 5,
      busyPrefillTokens: 4096,
      queueLimit: DEFAULTS.queueLimit,
      queueTimeoutMs: DEFAULTS.queueTimeoutMs,
    });
  });

  it('refuses with the same message as serve (naming no variable unless it reads them), and ignores KVROUTE_* unless asked', () => {
    const cmd = simLike();
    cmd.parse(['--queue-timeout-ms', '0'], { from: 'user' });
    expect(() => serveSettingsFrom(cmd, ADMISSION_SETTINGS)).toThrow(
      '--queue-timeout-ms must be an integer >= 1, got "0" (from --queue-timeout-ms)',
    );
    expect(() => serveSettingsFrom(cmd, ADMISSION_SETTINGS, { env: {} })).toThrow(
      '--queue-timeout-ms (KVROUTE_QUEUE_TIMEOUT_MS) must be an integer >= 1, got "0" (from --queue-timeout-ms)',
    );
    const quiet = simLike();
    quiet.parse([], { from: 'user' });
    expect(serveSettingsFrom(quiet, ['retries']).retries).toBe(2);
    expect(serveSettingsFrom(quiet, ['retries'], { env: { KVROUTE_RETRIES: '6' } }).retries).toBe(6);
  });
});
