import { afterAll, describe, expect, it } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';

const children: ChildProcess[] = [];
afterAll(() => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
});

function run(args: string[]): { child: ChildProcess; firstLine: Promise<string>; stderr: () => string } {
  const child = spawn(process.execPath, ['bin/kvroute.mjs', ...args], { cwd: process.cwd(), stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let err = '';
  child.stderr!.on('data', (d) => (err += d));
  const firstLine = new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (d) => {
      out += d;
      const k = out.indexOf('\n');
      if (k >= 0) resolve(out.slice(0, k));
    });
    child.on('exit', (code) => reject(new Error(`exited ${code}: ${err}`)));
  });
  firstLine.catch(() => {}); // a test that expects the process to fail never awaits it
  return { child, firstLine, stderr: () => err };
}

describe('kvroute mocker CLI', () => {
  it('starts, serves, publishes on the reported endpoints, and stops on SIGTERM', async () => {
    const { child, firstLine } = run([
      'mocker',
      '--port',
      '0',
      '--host',
      '127.0.0.1',
      '--model',
      'cli-model',
      '--zmq-endpoint',
      'tcp://127.0.0.1:*',
      '--replay-endpoint',
      'none',
      '--data-parallel-size',
      '2',
      '--block-size',
      '32',
      '--speedup',
      '100',
      '--timing',
      'first-principles',
    ]);
    const info = JSON.parse(await firstLine);
    expect(info.zmqEndpoints).toHaveLength(2);
    expect(info.replayEndpoints).toEqual([]);
    const r = await fetch(`${info.url}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ model: 'cli-model', prompt: Array.from({ length: 70 }, (_, i) => i), max_tokens: 2 }),
    });
    expect(r.status).toBe(200);
    const metrics = await (await fetch(`${info.url}/metrics`)).text();
    expect(metrics).toMatch(/vllm:cache_config_info\{[^}]*block_size="32"/);
    child.kill('SIGTERM');
    const [code] = await once(child, 'exit');
    expect(code).toBe(0);
  });

  it('rejects bad flags with a clear message', async () => {
    const { child } = run(['mocker', '--block-size', 'zero']);
    let err = '';
    child.stderr!.on('data', (d) => (err += d));
    const [code] = await once(child, 'exit');
    expect(code).not.toBe(0);
    expect(err).toMatch(/--block-size must be an integer/);
  });
});
