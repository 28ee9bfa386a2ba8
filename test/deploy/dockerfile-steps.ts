/**
 * The Dockerfile without a Docker daemon: its instructions are read, checked for the shape the image promises
 * (multi-stage, production dependencies only, non-root, a health check, `kvroute` as the entrypoint), and what it
 * runs is run here, in a fresh copy of the repository: the build stage's RUN (scripts/docker/build.sh: npm ci
 * --ignore-scripts, npm pack, whose prepack compiles), the final stage's install (scripts/docker/install.sh: the tarball with --omit=dev), then ENTRYPOINT + CMD
 * with the image's ENV, and the HEALTHCHECK command against the started router. The tarball and the installed package
 * are then handed to the caller (test/e2e/package.test.ts), which runs the package as a user installs it from there:
 * the build stage is `npm ci` (without install scripts) then `npm pack` and the final stage `npm install --omit=dev <tarball>`, the very
 * commands a user runs to pack and install the package, so one npm pack and one install serve both. Slow (a full npm
 * ci): ~1-2 minutes, so it runs inside test/e2e/package.test.ts, after that file's own install, never beside another
 * heavy install.
 */
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort, runShell, ShellProcess } from '../fixtures/processes.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
// The nested npm must not inherit the outer `npm test`'s lifecycle settings.
const ENV = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k))) as Record<string, string>;

interface Instruction {
  readonly op: string;
  readonly args: string;
  readonly stage: number;
}

/** The Dockerfile's instructions (continuation lines joined, comments dropped), each with its stage number. */
function readDockerfile(): Instruction[] {
  const text = readFileSync(join(ROOT, 'Dockerfile'), 'utf8').replace(/\\\n/g, ' ');
  const out: Instruction[] = [];
  let stage = -1;
  for (const line of text.split('\n')) {
    const t = line.trim();
    if (!t || t.startsWith('#')) continue;
    const m = /^([A-Z]+)\s+(.*)$/.exec(t);
    if (!m) throw new Error(`not an instruction: ${t}`);
    if (m[1] === 'FROM') stage++;
    out.push({ op: m[1], args: m[2].replace(/\s+/g, ' '), stage });
  }
  return out;
}

/** ENV instructions as a map (the KEY=value form). */
function envOf(instructions: Instruction[], stage: number): Record<string, string> {
  const env: Record<string, string> = {};
  for (const i of instructions.filter((x) => x.op === 'ENV' && x.stage === stage)) {
    for (const pair of i.args.split(' ')) {
      const [k, v] = pair.split('=');
      env[k] = v;
    }
  }
  return env;
}

/** Replaces the image's paths by this test's in one pass (a replacement is never replaced again), longest first. */
function substitute(text: string, map: Record<string, string>): string {
  const keys = Object.keys(map).sort((a, b) => b.length - a.length);
  const re = new RegExp(keys.map((k) => k.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|'), 'g');
  return text.replace(re, (k) => map[k]);
}

/** The repository's files as a clone has them, minus what .dockerignore keeps out of the build context. */
function copyContext(to: string): void {
  const ignored = readFileSync(join(ROOT, '.dockerignore'), 'utf8')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'));
  const r = spawnSync('git', ['ls-files', '-z', '--cached', '--others', '--exclude-standard'], { cwd: ROOT, encoding: 'utf8' });
  expect(r.status, r.stderr).toBe(0);
  for (const file of r.stdout.split('\0').filter(Boolean)) {
    if (!existsSync(join(ROOT, file))) continue;
    if (ignored.some((p) => file === p || file.startsWith(`${p}/`) || (p.startsWith('*') && file.endsWith(p.slice(1))))) continue;
    mkdirSync(dirname(join(to, file)), { recursive: true });
    copyFileSync(join(ROOT, file), join(to, file));
  }
}

/**
 * A private npm cache for the image's install step, seeded from the user's: install.sh ends with `npm cache clean
 * --force` (it keeps the image small), which run as written here would empty the cache of the machine the tests run
 * on, and of every other npm install running on it at the time. Hard links (a copy where they cannot be made): the
 * clean only unlinks the private names. The install still finds what `npm ci` fetched, so it needs no network.
 */
function privateNpmCache(to: string): { readonly cache: string; readonly userCacache: string | null } {
  const userCache = spawnSync('npm', ['config', 'get', 'cache'], { env: ENV, encoding: 'utf8' }).stdout.trim();
  mkdirSync(to, { recursive: true });
  const userCacache = userCache && existsSync(join(userCache, '_cacache')) ? join(userCache, '_cacache') : null;
  if (userCacache !== null) {
    const linked = spawnSync('cp', ['-al', userCacache, to]);
    if (linked.status !== 0) {
      rmSync(join(to, '_cacache'), { recursive: true, force: true });
      const copied = spawnSync('cp', ['-a', userCacache, to], { encoding: 'utf8' });
      expect(copied.status, copied.stderr).toBe(0);
    }
  }
  return { cache: to, userCacache };
}

/** What the image's build and install left, for tests of the installed package (registered by the caller). */
export interface Installed {
  /** The build stage's tarball (`npm pack` after `npm ci`). */
  readonly tarball: string;
  /** The final stage's prefix: the tarball installed with `npm install --omit=dev`; node_modules/.bin/kvroute. */
  readonly prefix: string;
  /** Processes the caller starts, stopped (by process group) before the folders are removed. */
  readonly started: ShellProcess[];
}

/**
 * Registers the Dockerfile's tests (called by test/e2e/package.test.ts); `then` registers tests that use the
 * tarball and the installed package, which run after these and before the folders are removed.
 */
export function describeDockerfile(then?: (installed: Installed) => void): void {
  describe('the Dockerfile, run without Docker', () => {
    const WORK = mkdtempSync(join(tmpdir(), 'kvroute-image-'));
    const SRC = join(WORK, 'src');
    const OUT = join(WORK, 'out');
    const PREFIX = join(WORK, 'opt-kvroute');
    const started: ShellProcess[] = [];
    /** The build stage's node_modules, removed once the tarball is made (the disk's work overlaps the install). */
    let buildModulesRemoved: Promise<void> = Promise.resolve();
    // Removing a full node_modules copy takes a while on a loaded machine (over 120 s at load 20); fs.promises.rm
    // unlinks in parallel (see test/e2e/package.test.ts).
    afterAll(async () => {
      await Promise.all(started.map((p) => p.stop()));
      await buildModulesRemoved;
      await rm(WORK, { recursive: true, force: true });
    }, 300_000);
    const ins = readDockerfile();
    const last = Math.max(...ins.map((i) => i.stage));
    const final = ins.filter((i) => i.stage === last);

    it('is multi-stage, installs the packed package, runs as non-root with a health check and kvroute as entrypoint', () => {
      expect(last).toBeGreaterThanOrEqual(1);
      expect(ins.filter((i) => i.op === 'FROM').map((i) => i.args)).toEqual(['node:20-bookworm-slim AS build', 'node:20-bookworm-slim']);
      const user = final.filter((i) => i.op === 'USER').at(-1)?.args;
      expect(user).toBeDefined();
      expect(['root', '0', '0:0']).not.toContain(user);
      expect(final.find((i) => i.op === 'COPY' && i.args.startsWith('--from=build'))?.args).toBe(
        '--from=build /out/kvroute.tgz /tmp/kvroute.tgz',
      );
      expect(JSON.parse(final.find((i) => i.op === 'ENTRYPOINT')!.args)).toEqual(['kvroute']);
      expect(final.find((i) => i.op === 'HEALTHCHECK')?.args).toMatch(/CMD \["node", "\/opt\/kvroute-image\/healthcheck.mjs"\]$/);
      expect(envOf(ins, last)).toMatchObject({ NODE_ENV: 'production', KVROUTE_HOST: '0.0.0.0' });
    });

    it("runs the build stage's and the final stage's commands; the started router answers /health and the HEALTHCHECK passes", async () => {
      copyContext(SRC);
      // Paths of the image, mapped to this test's folders.
      const paths = {
        '/out': OUT,
        '/tmp/kvroute.tgz': join(OUT, 'kvroute.tgz'),
        '/opt/kvroute-image/': `${join(SRC, 'scripts/docker')}/`,
        '/opt/kvroute': PREFIX,
      };
      const buildRuns = ins.filter((i) => i.op === 'RUN' && i.stage === 0).map((i) => i.args);
      expect(buildRuns).toEqual(['sh scripts/docker/build.sh /out']);
      const build = await runShell(substitute(buildRuns[0], paths), { cwd: SRC, env: ENV }, 400_000);
      expect(build.code, build.stderr.slice(-3000)).toBe(0);
      expect(existsSync(join(OUT, 'kvroute.tgz'))).toBe(true);
      buildModulesRemoved = rm(join(SRC, 'node_modules'), { recursive: true, force: true }).catch(() => {});

      const finalRuns = final.filter((i) => i.op === 'RUN').map((i) => i.args);
      expect(finalRuns).toHaveLength(1);
      const [install, ...rest] = finalRuns[0].split(' && ');
      expect(install).toBe('sh /opt/kvroute-image/install.sh /tmp/kvroute.tgz /opt/kvroute');
      expect(rest).toEqual(['rm /tmp/kvroute.tgz', 'ln -s /opt/kvroute/node_modules/.bin/kvroute /usr/local/bin/kvroute']);
      const npm = privateNpmCache(join(WORK, 'npm-cache'));
      const installed = await runShell(substitute(install, paths), { cwd: WORK, env: { ...ENV, npm_config_cache: npm.cache } }, 300_000);
      expect(installed.code, installed.stderr.slice(-3000)).toBe(0);
      expect(installed.stderr).not.toContain('EBADENGINE');
      expect(installed.stdout).toContain('0.1.0'); // install.sh ends with `kvroute --version`
      // Its `npm cache clean --force` emptied the private cache, not the user's.
      expect(existsSync(join(npm.cache, '_cacache'))).toBe(false);
      if (npm.userCacache !== null) expect(existsSync(npm.userCacache)).toBe(true);
      const modules = readdirSync(join(PREFIX, 'node_modules'));
      expect(modules).toContain('kvroute');
      for (const dev of ['tsx', 'typescript', 'vitest', '@biomejs']) expect(modules).not.toContain(dev);

      const entry = JSON.parse(final.find((i) => i.op === 'ENTRYPOINT')!.args) as string[];
      const cmd = JSON.parse(final.find((i) => i.op === 'CMD')!.args) as string[];
      const port = String(await freePort());
      const env = { ...ENV, ...envOf(ins, last), KVROUTE_PORT: port };
      const bin = join(PREFIX, 'node_modules/.bin', entry[0]);
      const router = new ShellProcess([bin, ...entry.slice(1), ...cmd].join(' '), { cwd: WORK, env });
      started.push(router);
      await router.waitFor(/kvroute listening on/, 120_000);
      expect(router.stdout).toContain(`"url":"http://127.0.0.1:${port}"`); // KVROUTE_HOST=0.0.0.0, shown as loopback
      expect((await fetch(`http://127.0.0.1:${port}/health`)).status).toBe(200);

      const check = JSON.parse(final.find((i) => i.op === 'HEALTHCHECK')!.args.replace(/^.*?CMD /, '')) as string[];
      const healthcheck = substitute(check.join(' '), paths);
      expect((await runShell(healthcheck, { cwd: WORK, env })).code).toBe(0);
      await router.stop();
      expect((await runShell(healthcheck, { cwd: WORK, env })).code).toBe(1);
    }, 600_000);

    then?.({ tarball: join(OUT, 'kvroute.tgz'), prefix: PREFIX, started });
  });
}
