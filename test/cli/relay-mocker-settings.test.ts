/**
 * `kvroute relay` and `kvroute mocker` take their settings from the one family (src/config/relay.ts, mocker.ts): run
 * as a user runs them (the built CLI, as processes), a bad value is one line naming the flag with exit status 2, and
 * --help lists every option with its range and default.
 */
import { execFile, spawn } from 'node:child_process';
import { Command } from 'commander';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { MOCKER, registerMocker } from '../../src/cli/mocker.ts';
import { RELAY } from '../../src/cli/relay.ts';
import { settingsFrom, settingsOf } from '../../src/config/settings.ts';
import { K8S_SETTINGS } from '../../src/config/k8s.ts';

const exec = promisify(execFile);

async function kvroute(args: string[], env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await exec(process.execPath, ['bin/kvroute.mjs', ...args], { timeout: 20_000, env: { ...process.env, ...env } });
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

/** --help's options, each with its description joined into one line, keyed by the flags as written. */
function optionsOf(help: string): Map<string, string> {
  const blocks: string[] = [];
  for (const line of help.split('\n')) {
    if (/^ {2}-/.test(line)) blocks.push(line.trim());
    else if (/^ {6,}\S/.test(line) && blocks.length > 0) blocks[blocks.length - 1] += ` ${line.trim()}`;
    else if (line.trim() === '' || /^\S/.test(line)) blocks.push(''); // a section or the text after: ends the block
  }
  const out = new Map<string, string>();
  for (const b of blocks.filter(Boolean)) {
    const m = /^(\S.*?) {2,}(.*)$/.exec(b);
    if (m) out.set(m[1], m[2].replace(/\s+/g, ' '));
  }
  return out;
}

const NATS = ['--nats', 'nats://127.0.0.1:1'];

describe('kvroute relay and kvroute mocker: settings from the one family', () => {
  it.each([
    [['relay', ...NATS, '--dp', '0'], 'kvroute relay: --dp must be an integer >= 1, got "0" (from --dp)'],
    [['relay', ...NATS, '--heartbeat-ms', '1.5'], 'kvroute relay: --heartbeat-ms must be an integer >= 1, got "1.5" (from --heartbeat-ms)'],
    [
      ['relay', ...NATS, '--max-bytes', 'lots'],
      'kvroute relay: --max-bytes must be a size like 32mb, 512kb or 1048576, got "lots" (from --max-bytes)',
    ],
    [['relay', ...NATS, '--flavor', 'tgi'], 'kvroute relay: --flavor must be one of vllm, sglang, trtllm, got "tgi" (from --flavor)'],
    [
      ['relay', ...NATS, '--worker', 'w', '--events', 'tcp://*:5557'],
      'kvroute relay: --events must be a tcp://host:port endpoint, got "tcp://*:5557" (from --events)',
    ],
    [['relay', ...NATS, '--block-size', '0'], 'kvroute relay: --block-size must be an integer >= 1, got "0" (from --block-size)'],
    [['mocker', '--port', '70000'], 'kvroute mocker: --port must be an integer in [0, 65535], got "70000" (from --port)'],
    [['mocker', '--fp-mfu', '2'], 'kvroute mocker: --fp-mfu must be a number in [0.001, 1], got "2" (from --fp-mfu)'],
    [
      ['mocker', '--prefill-poly', '1,2'],
      'kvroute mocker: --prefill-poly must be 3 comma-separated numbers, got "1,2" (from --prefill-poly)',
    ],
    [
      ['mocker', '--zmq-endpoint', 'localhost:5557'],
      'kvroute mocker: --zmq-endpoint must be a ZMQ endpoint like tcp://*:5557 (or "none"), got "localhost:5557" (from --zmq-endpoint)',
    ],
    [
      ['mocker', '--event-format', 'json'],
      'kvroute mocker: --event-format must be one of array, map, trtllm, got "json" (from --event-format)',
    ],
    [['mocker', '--seed', '-1'], 'kvroute mocker: --seed must be an integer in [0, 4294967295], got "-1" (from --seed)'],
    [
      ['mocker', '--pd-protocol', 'nixl'],
      'kvroute mocker: --pd-protocol must be one of vllm, sglang, trtllm, got "nixl" (from --pd-protocol)',
    ],
  ])('%j: one line naming the flag, exit 2', async (args, message) => {
    const r = await kvroute(args);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe(`${message}\n`);
    expect(r.stdout).toBe('');
  });

  it("reads no KVROUTE_* variable: the router's (bad) values do not reach the mocker", async () => {
    const child = spawn(process.execPath, ['bin/kvroute.mjs', 'mocker', '--port', '0', '--zmq-endpoint', 'none'], {
      env: { ...process.env, KVROUTE_BLOCK_SIZE: 'zero', KVROUTE_PORT: 'nope', KVROUTE_SEED: '-1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    try {
      const [line] = (await once(createInterface({ input: child.stdout! }), 'line')) as [string];
      const started = JSON.parse(line) as { url: string; blockSize: number };
      expect(started.blockSize).toBe(16);
      expect(started.url).toMatch(/^http:\/\/[^:]+:\d+$/);
    } finally {
      child.kill('SIGTERM');
      await once(child, 'exit');
    }
  });

  it.each([
    ['mocker', MOCKER, 0],
    ['relay', RELAY, K8S_SETTINGS.length],
  ] as const)('kvroute %s --help lists every option with its range and default', async (command, schema, borrowed) => {
    const r = await kvroute([command, '--help']);
    expect(r.code).toBe(0);
    const options = optionsOf(r.stdout);
    const settings = settingsOf(schema);
    // Every setting, the help option, and (relay) Kubernetes discovery: nothing declared beside the family.
    expect(options.size).toBe(settings.length + 1 + borrowed);
    for (const { entry } of settings) {
      const help = options.get(entry.flag);
      expect(help, entry.flag).toBeDefined();
      expect(help).toContain(entry.help.replace(/\s+/g, ' '));
      if (entry.kind.range) expect(help, entry.flag).toContain(entry.kind.range);
      const shown = entry.default !== undefined && entry.kind.arg !== 'switch';
      if (shown) expect(help, entry.flag).toContain(`default: ${entry.kind.show(entry.default)}`);
      // No default: the notes after the help text name none (the help itself may say what happens without it).
      else expect(help!.slice(entry.help.replace(/\s+/g, ' ').length), entry.flag).not.toContain('default: ');
      expect(help, entry.flag).not.toMatch(/env: |config: |\(\)/);
    }
  });

  it('--help shows the documented defaults', async () => {
    const mocker = optionsOf((await kvroute(['mocker', '--help'])).stdout);
    expect(mocker.get('--port <n>')).toContain('default: 8100');
    expect(mocker.get('--model <name>')).toContain('default: mock-model');
    expect(mocker.get('--num-gpu-blocks <n>')).toContain('default: 16384');
    expect(mocker.get('--zmq-endpoint <ep>')).toContain('default: tcp://*:5557');
    expect(mocker.get('--bootstrap-port <n>')).toContain('default: 8998');
    expect(mocker.get('--role <role>')).toContain('default: both');
    const relay = optionsOf((await kvroute(['relay', '--help'])).stdout);
    expect(relay.get('--nats <url>')).toContain('required');
    expect(relay.get('--max-bytes <n>')).toContain('default: 1gb');
    expect(relay.get('--heartbeat-ms <n>')).toContain('default: 2000');
    expect(relay.get('--flavor <name>')).toContain('default: vllm');
    expect(relay.get('--log-level <level>')).toContain('default: info');
    expect(relay.get('-b, --block-size <n>')).toContain('default: 16');
  });

  it('the mocker reads variadic lists, --no-* switches and the hybrid layout from its flags', () => {
    const program = new Command().exitOverride();
    registerMocker(program);
    const mocker = program.commands.find((c) => c.name() === 'mocker')!.exitOverride();
    mocker.parseOptions(['--lora-modules', 'a', 'b', '--no-enable-prefix-caching', '--zmq-connect', '--hybrid', 'full,sliding:64']);
    const keys = ['loraModules', 'enablePrefixCaching', 'zmqConnect', 'hybrid', 'promptTokensDetails', 'model'] as const;
    expect(settingsFrom(mocker, MOCKER, keys).config).toEqual({
      loraModules: ['a', 'b'],
      enablePrefixCaching: false,
      zmqConnect: true,
      hybrid: [{ kind: 'full_attention' }, { kind: 'sliding_window', slidingWindow: 64 }],
      promptTokensDetails: true,
      model: 'mock-model',
    });
  });
});
