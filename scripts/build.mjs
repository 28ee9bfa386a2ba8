/**
 * `npm run build` (and `prepare`, `prepack`): compiles src/ to dist/, one file at a time, with TypeScript's own
 * transpiler (`ts.transpileModule`) and tsconfig.build.json's options and files, in about a third of the CPU of
 * `tsc -p tsconfig.build.json`: the program is not type-checked here. The output is byte for byte what that tsc emits
 * (bench/RESULTS.md, "Build and test start-up", has the comparison's command): tsconfig.json sets isolatedModules, so
 * `npm run typecheck` refuses any code whose file-by-file transpile could differ from the whole program's. Type
 * checking is `npm run typecheck`'s, over src/ and the tests, bench and scripts together; `npm test` runs it first.
 *
 * Incremental: a file is compiled again only when its output is missing or older than its source, tsconfig.json,
 * tsconfig.build.json or this script; when nothing needs compiling, TypeScript is not even loaded (a test run's global
 * setup calls this on every run). Plain JavaScript, so that it runs before anything is built.
 *
 *   node scripts/build.mjs [--out DIR]   (default: tsconfig.build.json's outDir, dist/)
 */
import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const SRC = join(ROOT, 'src');
const at = process.argv.indexOf('--out');
const outDir = at > 0 ? process.argv[at + 1] : join(ROOT, 'dist');

const mtime = (path) => {
  try {
    return statSync(path).mtimeMs;
  } catch {
    return -1;
  }
};

/** src/**\/*.ts without declarations: what tsconfig.build.json includes (checked against its file list below). */
function sources(dir) {
  const out = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...sources(path));
    else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts')) out.push(path);
  }
  return out;
}

const outputOf = (file) => join(outDir, relative(SRC, file)).replace(/\.ts$/, '.js');
const settings = Math.max(...['tsconfig.json', 'tsconfig.build.json', 'scripts/build.mjs'].map((f) => mtime(join(ROOT, f))));
const stale = sources(SRC).filter((file) => mtime(outputOf(file)) <= Math.max(settings, mtime(file)));

if (stale.length > 0) {
  const ts = createRequire(import.meta.url)('typescript');
  const config = ts.getParsedCommandLineOfConfigFile(
    join(ROOT, 'tsconfig.build.json'),
    {},
    {
      ...ts.sys,
      onUnRecoverableConfigFileDiagnostic: (d) => {
        throw new Error(ts.flattenDiagnosticMessageText(d.messageText, '\n'));
      },
    },
  );
  if (config.errors.length > 0) throw new Error(config.errors.map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n')).join('\n'));
  const expected = new Set(sources(SRC));
  const listed = config.fileNames.filter((f) => !f.endsWith('.d.ts'));
  if (listed.length !== expected.size || !listed.every((f) => expected.has(f))) {
    throw new Error('tsconfig.build.json no longer includes exactly src/**/*.ts: update scripts/build.mjs');
  }
  // One file at a time, a file has no package.json to tell NodeNext its module format: it is ESM ("type": "module"),
  // which ESNext emits identically.
  const options = { ...config.options, module: ts.ModuleKind.ESNext, moduleResolution: ts.ModuleResolutionKind.Bundler };
  const problems = [];
  for (const file of stale) {
    const out = ts.transpileModule(readFileSync(file, 'utf8'), { compilerOptions: options, fileName: file, reportDiagnostics: true });
    const target = outputOf(file);
    if (out.diagnostics?.length) {
      for (const d of out.diagnostics) problems.push(`${relative(ROOT, file)}: ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`);
      // No output for a file that did not transpile, and none left from before: a rerun must not find a newer output
      // and skip the file (the build would then pass with broken JavaScript in dist/).
      rmSync(target, { force: true });
      continue;
    }
    mkdirSync(dirname(target), { recursive: true });
    writeFileSync(target, out.outputText);
  }
  if (problems.length > 0) {
    process.stderr.write(`${problems.join('\n')}\n`);
    process.exit(1);
  }
}
