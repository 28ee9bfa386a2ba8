/**
 * The NATS fault-injection soak, 2 rounds, run as a user runs it (`npm run chaos -- --nats --rounds 2`): nats-server
 * SIGKILLed and restarted on its store, then a relay SIGKILLed and restarted, under steady traffic to the engines.
 * After each, every replica's index must equal every engine's block set exactly, and no request may be lost. The
 * full soak (20 rounds, every fault kind) is the same command without --rounds.
 */
import { describe, expect, it } from 'vitest';
import { ShellProcess } from '../fixtures/processes.ts';

const ROOT = new URL('../..', import.meta.url).pathname;

describe('npm run chaos -- --nats --rounds 2', () => {
  it('heals after a nats-server restart and a relay SIGKILL, with no request lost', async () => {
    const p = new ShellProcess('npm run chaos -- --nats --rounds 2', { cwd: ROOT });
    const r = await p.exited;
    const out = `${r.stdout}\n${r.stderr}`;
    expect(out).toMatch(/round 1 nats-restart: healed in \d+ ms/);
    expect(out).toMatch(/round 2 relay-kill: healed in \d+ ms/);
    expect(out).toMatch(/recovered 2\/2; time to heal p50 \d+ ms, max \d+ ms; requests \d+, lost 0/);
    expect(r.code, out).toBe(0);
  }, 120_000);
});
