/** A start-up that can never settle says so on stderr instead of exiting 13 in silence (compiled, as it ships). */
import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';

const GUARD = new URL('../../dist/cli/startup-guard.js', import.meta.url).href;

function run(body: string) {
  const script = `const { guardStartup } = await import(${JSON.stringify(GUARD)});
    const settled = guardStartup(() => 'kvroute serve');
    ${body}`;
  return spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
}

describe('start-up guard', () => {
  it('prints one line and exits non-zero when start-up awaits something nothing can settle', () => {
    const r = run('await new Promise(() => {}); settled();');
    expect(r.status).toBe(13);
    const lines = r.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^kvroute serve: start-up stalled .*KVROUTE_DEBUG=1/);
  });

  it('stays quiet once start-up has settled, whatever the exit', () => {
    const ok = run('await new Promise((r) => setTimeout(r, 10)); settled(); console.log("served");');
    expect(ok.status).toBe(0);
    expect(ok.stdout).toBe('served\n');
    expect(ok.stderr).toBe('');
    const failed = run('settled(); process.exitCode = 2;');
    expect(failed.status).toBe(2);
    expect(failed.stderr).toBe('');
  });
});
