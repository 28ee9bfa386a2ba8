/**
 * What a user gets, end to end, as processes:
 *  1. the README's first command, `npm ci && npx kvroute serve`, verbatim, in a fresh copy of the repository (its
 *     files, no node_modules, no dist/): `prepare` builds, the router serves a streamed chat answer;
 *  2. the Dockerfile's steps (test/deploy/dockerfile-steps.ts), here so that its install never runs beside the one
 *     above: its build stage is `npm ci --ignore-scripts` then `npm pack` (one compile, by prepack) in a fresh copy, its final stage `npm install --omit=dev
 *     <tarball>` (production dependencies only: no tsx, no TypeScript), the commands a user packs and installs the
 *     package with;
 *  3. that tarball and that install, as a user runs the package: `kvroute --help`, `kvroute serve` (embedded fleet,
 *     free port) with a streamed chat answer and the dashboard's files served from the package, `kvroute epp`.
 * Slow (installs from the npm cache): a few minutes; the slowest file, so it starts first (test/sequencer.ts).
 */
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { EnvoySide } from '../epp/envoy-side.ts';
import { runShell, ShellProcess } from '../fixtures/processes.ts';
import { describeDockerfile } from '../deploy/dockerfile-steps.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const WORK = mkdtempSync(join(tmpdir(), 'kvroute-package-'));
const FRESH = join(WORK, 'kvroute');

// The nested npm must not inherit the outer `npm test`'s lifecycle settings (npm_config_*, npm_lifecycle_*).
const ENV = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k))) as Record<string, string>;
const PORT = { KVROUTE_PORT: '0', KVROUTE_LOG_LEVEL: 'info' };

const started: ShellProcess[] = [];
/** The fresh clone's removal, started as soon as its test is done: it waits on the disk, so it overlaps what follows. */
let freshRemoved: Promise<void> = Promise.resolve();
// Generous: stopping a process group and removing an install take a while on a loaded machine (over 120 s at load 20).
// fs.promises.rm, not rmSync: it unlinks a folder's entries in parallel (a node_modules of 29,000 files: 3-4.5 s
// against rmSync's 7.5-45 s, at load 10-15) and leaves the worker's event loop free.
afterAll(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await freshRemoved;
  await rm(WORK, { recursive: true, force: true });
}, 300_000);

function start(command: string, cwd: string, list = started): ShellProcess {
  const p = new ShellProcess(command, { cwd, env: { ...ENV, ...PORT } });
  list.push(p);
  return p;
}

/** The repository's files as a clone has them: tracked and new (not ignored) files, nothing built or installed. */
function copyRepository(to: string): void {
  const r = spawnSync('git', ['ls-files', '-z', '--cached', '--others', '--exclude-standard'], { cwd: ROOT, encoding: 'utf8' });
  expect(r.status, r.stderr).toBe(0);
  for (const file of r.stdout.split('\0').filter(Boolean)) {
    if (!existsSync(join(ROOT, file))) continue; // deleted in the work tree, not yet committed
    mkdirSync(dirname(join(to, file)), { recursive: true });
    copyFileSync(join(ROOT, file), join(to, file));
  }
}

async function streamedChat(url: string): Promise<string> {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock-model', stream: true, messages: [{ role: 'user', content: 'Where is the capital of China?' }] }),
  });
  expect(r.status).toBe(200);
  expect(r.headers.get('content-type')).toContain('text/event-stream');
  const events = (await r.text()).split('\n\n').filter((e) => e.trim());
  expect(events.at(-1)).toBe('data: [DONE]');
  return events
    .slice(0, -1)
    .map((e) => JSON.parse(e.slice('data: '.length)).choices[0]?.delta?.content ?? '')
    .join('');
}

describe('a fresh clone and the packed package, as a user runs them', () => {
  it('npm ci && npx kvroute serve: prepare builds dist/, the router answers a streamed chat', async () => {
    copyRepository(FRESH);
    expect(existsSync(join(FRESH, 'node_modules'))).toBe(false);
    expect(existsSync(join(FRESH, 'dist'))).toBe(false);
    const serve = start('npm ci && npx kvroute serve', FRESH);
    // A deadline, not a pause: npm ci and the build took over 240 s on a machine loaded 10 times over its cores.
    const url = (await serve.waitFor(/kvroute listening on (http:\/\/[\d.:]+)/, 420_000))[1];
    expect(existsSync(join(FRESH, 'dist/cli/main.js'))).toBe(true);
    expect((await streamedChat(url)).length).toBeGreaterThan(0);
    const done = await serve.stop();
    expect(done.stdout).toContain('shutting down');
    freshRemoved = rm(FRESH, { recursive: true, force: true }).catch(() => {}); // afterAll removes what is left
  }, 480_000);
});

describeDockerfile((installed) => {
  it('the tarball holds the compiled package and nothing else; installed with --omit=dev, kvroute --help, serve and epp work from it', async () => {
    expect(existsSync(installed.tarball), 'needs the tarball of the build stage above').toBe(true);
    const listing = spawnSync('tar', ['-tzf', installed.tarball], { encoding: 'utf8' }).stdout.split('\n');
    for (const f of [
      'package/bin/kvroute.mjs',
      'package/dist/cli/main.js',
      'package/dist/tokenizer/thread.js',
      'package/web/dashboard.html',
      'package/proto/envoy/service/ext_proc/v3/external_processor.proto',
      'package/proto/grpc/health/v1/health.proto',
    ]) {
      expect(listing).toContain(f);
    }
    expect(listing.filter((f) => /^package\/(src|test|bench|scripts|data)\//.test(f) || f.endsWith('.tsbuildinfo'))).toEqual([]);

    const app = installed.prefix;
    const modules = readdirSync(join(app, 'node_modules'));
    expect(modules).toContain('kvroute');
    expect(modules).not.toContain('tsx'); // a dev dependency: nothing at run time needs a TypeScript loader
    expect(modules).not.toContain('typescript');

    const help = await runShell('npx kvroute --help', { cwd: app, env: ENV });
    expect(help.code, help.stderr).toBe(0);
    expect(help.stdout).toContain('Usage: kvroute');
    expect(help.stdout).toContain('serve');

    const serve = start('npx kvroute serve', app, installed.started);
    const url = (await serve.waitFor(/kvroute listening on (http:\/\/[\d.:]+)/, 120_000))[1];
    expect(serve.stdout).toMatch(/"mode":"thread"/); // the tokenizer thread runs the compiled dist/tokenizer/thread.js
    expect((await streamedChat(url)).length).toBeGreaterThan(0);
    const dashboard = await fetch(`${url}/dashboard`);
    expect(dashboard.status).toBe(200);
    expect(await dashboard.text()).toContain('<canvas');
    const done = await serve.stop();
    expect(done.stdout).toContain('shutting down');

    // The endpoint picker from the installed package: its proto files load from the package, a request played from
    // Envoy's side is picked and served, health answers.
    // ext_proc over TLS (the default: a self-signed certificate the installed package makes at start).
    const epp = start('npx kvroute epp --port 0 --grpc-health-port 0 --metrics-port 0', app, installed.started);
    const address = (await epp.waitFor(/kvroute epp listening on grpc:\/\/(\S+) \(ext_proc\) over TLS/, 120_000))[1];
    const envoy = new EnvoySide(address, { tls: true });
    try {
      const r = await envoy.roundTrip({
        path: '/v1/chat/completions',
        body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'Where is the capital of China?' }] }),
      });
      if (!('picked' in r)) throw new Error(`immediate response: ${JSON.stringify(r.immediate)}`);
      expect(r.response.status).toBe(200);
      expect(JSON.parse(r.response.body).choices[0].message.content.length).toBeGreaterThan(0);
      expect((await envoy.check('readiness')).status).toBe(1);
    } finally {
      envoy.close();
    }
    const eppDone = await epp.stop();
    expect(eppDone.stdout).toContain('shutting down');
  }, 240_000);
});
