/**
 * A real nats-server with JetStream for a test: its own free port and temporary store directory. stop() kills it,
 * restart() brings it back on the same port and store (the JetStream state survives, as in production).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, connect as tcpConnect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export function natsBinary(): string {
  // Under vitest the global setup has found or fetched one (test/fixtures/test-binaries.ts).
  if (process.env.KVR_TEST_NATS_SERVER) return process.env.KVR_TEST_NATS_SERVER;
  return existsSync('/usr/sbin/nats-server') ? '/usr/sbin/nats-server' : 'nats-server';
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const c = tcpConnect(port, '127.0.0.1');
    c.once('connect', () => {
      c.destroy();
      resolve(true);
    });
    c.once('error', () => resolve(false));
  });
}

export class NatsServer {
  readonly dir = mkdtempSync(join(tmpdir(), 'kvroute-nats-'));
  port = 0;
  private proc: ChildProcess | null = null;

  /**
   * `maxPayload`: the server's max_payload in bytes (default 1 MiB), set through a config file. `host`: the listen
   * address (default 127.0.0.1; the NATS soak listens on every address so a replica in a network namespace reaches it).
   */
  constructor(private readonly options: { maxPayload?: number; host?: string } = {}) {}

  get url(): string {
    return `nats://127.0.0.1:${this.port}`;
  }

  async start(): Promise<void> {
    if (this.port === 0) this.port = await freePort();
    const args = ['-js', '-sd', this.dir, '-a', this.options.host ?? '127.0.0.1', '-p', String(this.port)];
    if (this.options.maxPayload !== undefined) {
      const conf = join(this.dir, 'server.conf');
      writeFileSync(conf, `max_payload: ${this.options.maxPayload}\n`);
      args.push('-c', conf);
    }
    this.proc = spawn(natsBinary(), args, { stdio: 'ignore' });
    const end = Date.now() + 10_000;
    while (!(await canConnect(this.port))) {
      if (Date.now() > end) throw new Error(`nats-server did not start on port ${this.port}`);
      await new Promise((r) => setTimeout(r, 25));
    }
  }

  async stop(): Promise<void> {
    const p = this.proc;
    if (!p || p.exitCode !== null) return;
    this.proc = null;
    await new Promise<void>((resolve) => {
      p.once('exit', () => resolve());
      p.kill('SIGKILL');
    });
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  async dispose(): Promise<void> {
    await this.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** `what` names the condition in the timeout's message; a function is read at the timeout (a child's stderr so far). */
export async function until(
  cond: () => boolean | Promise<boolean>,
  ms = 10_000,
  what: string | (() => string) = 'condition',
): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${typeof what === 'function' ? what() : what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
