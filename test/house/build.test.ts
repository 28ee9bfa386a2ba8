/**
 * scripts/build.mjs (`npm run build`, `prepare`, `prepack`): a file that does not transpile fails the build, and keeps
 * failing it on a rerun (its output is not written, and an older one is removed, so the rerun cannot take the file as
 * up to date); fixed, the build passes again. Run on a scratch project holding the repository's build script and
 * tsconfig files, with this checkout's node_modules.
 */
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'kvroute-build-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function build(): { status: number | null; stderr: string } {
  const r = spawnSync(process.execPath, [join(dir, 'scripts/build.mjs')], { cwd: dir, encoding: 'utf8' });
  return { status: r.status, stderr: r.stderr };
}

describe('scripts/build.mjs', () => {
  it('fails on a file that does not transpile, again on a rerun, and passes once it is fixed', () => {
    mkdirSync(join(dir, 'scripts'));
    mkdirSync(join(dir, 'src'));
    for (const f of ['scripts/build.mjs', 'tsconfig.json', 'tsconfig.build.json', 'package.json'])
      copyFileSync(join(ROOT, f), join(dir, f));
    symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'), 'dir');
    writeFileSync(join(dir, 'src/a.ts'), "import { b } from './b.ts';\nexport const a: number = b + 1;\n");
    writeFileSync(join(dir, 'src/b.ts'), 'export const b = 1;\n');

    expect(build().status).toBe(0);
    expect(readFileSync(join(dir, 'dist/a.js'), 'utf8')).toContain('from "./b.js"');
    expect(existsSync(join(dir, 'dist/b.js'))).toBe(true);

    writeFileSync(join(dir, 'src/b.ts'), 'export const b = (;\n');
    const broken = build();
    expect(broken.status).toBe(1);
    expect(broken.stderr).toMatch(/src\/b\.ts: /);
    expect(existsSync(join(dir, 'dist/b.js'))).toBe(false);
    expect(build().status).toBe(1);

    writeFileSync(join(dir, 'src/b.ts'), 'export const b = 2;\n');
    expect(build().status).toBe(0);
    expect(readFileSync(join(dir, 'dist/b.js'), 'utf8')).toContain('b = 2');
  }, 60_000);
});
