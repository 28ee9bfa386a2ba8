/**
 * The settings family: the routing settings are defined once (src/config/routing.ts) and every command takes the keys
 * it needs from there (serve and epp all of them, sim the ones a simulation uses with list-valued sweep variants,
 * relay, mocker and hash the block size); the defaults the core also applies come from the core's constants; one
 * mapping turns resolved settings into the core's options for the live router and the simulator alike.
 */
import { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { registerEpp } from '../../src/cli/epp.ts';
import { registerHash } from '../../src/cli/hash.ts';
import { registerMocker } from '../../src/cli/mocker.ts';
import { registerRelay } from '../../src/cli/relay.ts';
import { registerServe } from '../../src/cli/serve.ts';
import { registerSim, simSettings } from '../../src/cli/sim.ts';
import { Dispatcher } from '../../src/core/dispatch/dispatcher.ts';
import { DEFAULT_KNOBS, KvRouter, TIER_CREDIT_ON } from '../../src/core/router.ts';
import { DEFAULT_POLICY } from '../../src/core/scheduling/registry.ts';
import { DEFAULT_STORE_ONLY_TTL_MS } from '../../src/core/tiers.ts';
import { dispatchOptionsFrom, ROUTING_DEFAULTS, routerOptionsFrom, routingSchema } from '../../src/config/routing.ts';
import { DEFAULTS, serveSchema } from '../../src/config/serve.ts';
import { FLAGS_ONLY, addSettingsOptions, flagValues, longFlag, SettingError, settingsFrom, settingsOf } from '../../src/config/settings.ts';
import { runSettings, simSchema } from '../../src/config/sim.ts';

/** Every command registered on a fresh program, as src/cli/main.ts does. */
function program(): Command {
  const p = new Command().exitOverride();
  for (const register of [registerServe, registerEpp, registerSim, registerRelay, registerMocker, registerHash]) register(p);
  for (const c of p.commands) c.exitOverride();
  return p;
}

const sub = (p: Command, name: string) => p.commands.find((c) => c.name() === name)!;

function simCommand(): Command {
  const cmd = new Command('sim-like').exitOverride();
  addSettingsOptions(cmd, simSchema, undefined, FLAGS_ONLY);
  return cmd;
}

describe('the routing settings, defined once', () => {
  it('serve and epp take every routing setting as it is defined', () => {
    for (const key of Object.keys(routingSchema.shape)) {
      expect(serveSchema.shape[key as keyof typeof serveSchema.shape], key).toBe(
        routingSchema.shape[key as keyof typeof routingSchema.shape],
      );
    }
    expect(ROUTING_DEFAULTS).toEqual(
      Object.fromEntries(Object.keys(routingSchema.shape).map((k) => [k, DEFAULTS[k as keyof typeof DEFAULTS]])),
    );
  });

  it("the defaults the core applies come from the core's constants", () => {
    expect(DEFAULTS.policy).toBe(DEFAULT_POLICY);
    expect(DEFAULTS.prefillLoadScale).toBe(DEFAULT_KNOBS.prefillLoadScale);
    expect(DEFAULTS.overlapCredit).toBe(DEFAULT_KNOBS.overlapCredit);
    expect(DEFAULTS.temperature).toBe(DEFAULT_KNOBS.temperature);
    expect(DEFAULTS.storeOnlyTtlMs).toBe(DEFAULT_STORE_ONLY_TTL_MS);
  });

  it('--block-size is one option across serve, epp, sim, relay, mocker and hash: same flag, range, help and default', () => {
    const p = program();
    const described = ['serve', 'epp', 'sim', 'relay', 'mocker', 'hash'].map((name) => {
      const o = sub(p, name).options.find((x) => x.long === '--block-size');
      expect(o, name).toBeDefined();
      return { name, flags: o!.flags, help: o!.description.replace(/ \(an integer >= 1.*$/, '') };
    });
    const serve = described[0];
    for (const d of described) expect({ ...d, name: serve.name }).toEqual(serve);
    expect(serve.flags).toBe('-b, --block-size <n>');
  });

  it("they read it from their flags: the router's KVROUTE_BLOCK_SIZE is not theirs", () => {
    // Options only (parseOptions): no command's action runs here.
    const mocker = sub(program(), 'mocker');
    mocker.parseOptions(['--block-size', '32']);
    expect(settingsFrom(mocker, serveSchema, ['blockSize'], { env: {} }).config.blockSize).toBe(32);
    const relay = sub(program(), 'relay');
    relay.parseOptions(['--nats', 'nats://x:4222']);
    expect(settingsFrom(relay, serveSchema, ['blockSize'], { env: {} }).config.blockSize).toBe(16);
  });

  it("hash requires the block size: a parity check must name the engine's", () => {
    const p = program();
    sub(p, 'hash').configureOutput({ writeErr: () => {} });
    expect(() => p.parse(['hash'], { from: 'user' })).toThrow(/required option '-b, --block-size <n>' not specified/);
    const help = sub(program(), 'hash').helpInformation();
    expect(help).toMatch(/--block-size <n>[\s\S]*required/);
  });
});

describe('sim: the routing settings it uses, with sweep variants', () => {
  it("takes its settings with serve's flags, ranges and help; the swept ones are lists of the same values", () => {
    for (const { key, entry } of settingsOf(simSchema)) {
      const serve = settingsOf(serveSchema, [key])[0].entry;
      expect(longFlag(entry), key).toBe(longFlag(serve));
      expect(entry.env, key).toBe(serve.env);
      if (entry.kind.arg === 'list' && serve.kind.arg === 'value')
        expect(entry.kind.accepts).toBe(`${serve.kind.accepts}, or several separated by commas`);
      else expect(entry.kind, key).toBe(serve.kind);
    }
  });

  it('lists: comma-separated or repeated, each item checked as serve checks a value; the seed defaults to 1', () => {
    const cmd = simCommand();
    cmd.parse(['--policy', 'kv,round-robin', '--policy', 'random', '--disagg-min-uncached-tokens', '0, 1024', '--queue-order', 'fifo'], {
      from: 'user',
    });
    const { config } = settingsFrom(cmd, simSchema, ['policy', 'disaggMinUncachedTokens', 'queueOrder', 'seed', 'blockSize'], { env: {} });
    expect(config).toEqual({
      policy: ['kv', 'round-robin', 'random'],
      disaggMinUncachedTokens: [0, 1024],
      queueOrder: ['fifo'],
      seed: 1,
      blockSize: 16,
    });
    expect(DEFAULTS.seed).toBe(0);

    const bad = simCommand();
    bad.parse(['--disagg-min-uncached-tokens', '0,-5'], { from: 'user' });
    expect(() => settingsFrom(bad, simSchema, ['disaggMinUncachedTokens'])).toThrow(
      new SettingError(
        '--disagg-min-uncached-tokens must be an integer >= 0, or several separated by commas, got -5 ' +
          '(from --disagg-min-uncached-tokens)',
      ),
    );
    const empty = simCommand();
    empty.parse(['--policy', ','], { from: 'user' });
    expect(() => settingsFrom(empty, simSchema, ['policy'])).toThrow(/^--policy must be one of kv-pressure/);
  });

  it('a scenario brings its own choices; a flag given wins over them', () => {
    const plain = simSettings({}, 'noisy-neighbour').settings;
    expect(plain.queueLimit).toBe(100_000);
    expect(plain.busyPrefillTokens).toBe(2_048);
    expect(plain.queueOrder).toEqual(['fifo', 'fair']);
    expect(plain.policy).toEqual([DEFAULT_POLICY]);
    expect(plain.retries).toBe(DEFAULTS.retries);
    const given = simSettings({ queueLimit: '5', policy: ['kv'], queueOrder: ['fair'] }, 'noisy-neighbour').settings;
    expect([given.queueLimit, given.policy, given.queueOrder, given.busyPrefillTokens]).toEqual([5, ['kv'], ['fair'], 2_048]);
    expect(simSettings({}).settings.policy).toEqual([DEFAULT_POLICY, 'kv', 'round-robin']);
  });

  it("a run is serve's configuration at one sweep point", () => {
    const settings = simSettings({ temperature: '0.5', retries: '1' }).settings;
    const run = runSettings(settings, { policy: 'kv', queueOrder: 'fifo', disaggMinUncachedTokens: 0 });
    expect(run).toEqual({
      ...ROUTING_DEFAULTS,
      temperature: 0.5,
      retries: 1,
      seed: 1,
      policy: 'kv',
      queueOrder: 'fifo',
      disaggMinUncachedTokens: 0,
    });
    expect(routingSchema.parse(run)).toEqual(run);
  });
});

describe('one mapping from settings to the core', () => {
  it('router and dispatcher options carry every routing setting', () => {
    const s = {
      ...ROUTING_DEFAULTS,
      tierCredit: true,
      tierRemoteCredit: 0.5,
      busyKvFraction: 0.9,
      busyPrefillTokens: 4096,
      bands: [],
      tenantWeights: { a: 2 },
      sessionTableMb: 1.5,
      approxTableMb: 2.5,
    };
    const r = routerOptionsFrom(s);
    expect(r).toEqual({
      blockSize: 16,
      policy: DEFAULT_POLICY,
      knobs: { prefillLoadScale: 1, overlapCredit: 1, temperature: 0, decodeOverlapCredit: 0, ...TIER_CREDIT_ON, remoteTierCredit: 0.5 },
      storeOnlyTtlMs: DEFAULT_STORE_ONLY_TTL_MS,
      approxTableBytes: 2.5 * 2 ** 20,
      seed: 0,
      selection: 'auto',
      busy: { activeBlockFraction: 0.9, activePrefillTokens: 4096 },
    });
    const d = dispatchOptionsFrom(s);
    expect(d).toEqual({
      queueLimit: 1024,
      queueTimeoutMs: 30_000,
      retries: 2,
      breaker: { threshold: 5, cooldownMs: 10_000 },
      pins: { limit: 100_000, ttlMs: 3_600_000, maxBytes: 32 * 2 ** 20 },
      flow: { bands: [], order: 'fair', weights: { a: 2 } },
      tokenBudgets: undefined,
      sessions: { ttlMs: 600_000, loadFactor: 0.5, maxBytes: 1.5 * 2 ** 20 },
      prefillTokensPerSecond: undefined,
      pd: { minUncachedTokens: 1024 },
    });
    // What the core takes: a router and its dispatcher build from them.
    expect(() => new Dispatcher(new KvRouter(r), d)).not.toThrow();
  });

  it('flag values reach the mapping through the same resolution (a sim flag line, read as a run)', () => {
    const cmd = simCommand();
    cmd.parse(['--busy-prefill-tokens', '2000', '--retries', '0', '--breaker-threshold', '3'], { from: 'user' });
    const { config } = settingsFrom(cmd, simSchema, Object.keys(simSchema.shape) as Array<keyof typeof simSchema.shape>, { env: {} });
    const run = runSettings(config, { policy: 'kv', queueOrder: 'fair', disaggMinUncachedTokens: 1024 });
    expect(routerOptionsFrom(run).busy).toEqual({ activeBlockFraction: undefined, activePrefillTokens: 2000 });
    expect(dispatchOptionsFrom(run)).toMatchObject({ retries: 0, breaker: { threshold: 3, cooldownMs: 10_000 } });
    expect(flagValues(cmd, simSchema)).toEqual({ busyPrefillTokens: '2000', retries: '0', breakerThreshold: '3' });
  });
});
