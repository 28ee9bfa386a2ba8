/**
 * The house's structure in figures, from the code's own imports and definitions (TypeScript's parser, no guessing from
 * text): files over 400 lines, functions over 100 lines, import cycles (file and folder level, all imports and value
 * imports only), imports that run the wrong way between layers, and the places that spell the engine list or a policy
 * name as string literals. `npm run house` prints them; `--json` for a machine-readable form. test/house/ holds the rules
 * that must stay true (test/house/imports.test.ts uses `analyseHouse`).
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { usage } from './usage.ts';

export interface ImportEdge {
  readonly from: string;
  readonly to: string;
  /** False for `import type` / `export type` and imports whose every name is a type. */
  readonly value: boolean;
}

export interface LongFunction {
  readonly file: string;
  readonly name: string;
  readonly line: number;
  readonly lines: number;
}

export interface HouseFigures {
  readonly files: number;
  readonly lines: number;
  readonly longFiles: ReadonlyArray<{ file: string; lines: number }>;
  readonly longFunctions: readonly LongFunction[];
  readonly edges: readonly ImportEdge[];
  /** Strongly connected components of more than one file (or a file importing itself). */
  readonly fileCycles: readonly string[][];
  readonly valueFileCycles: readonly string[][];
  readonly folderCycles: readonly string[][];
  readonly valueFolderCycles: readonly string[][];
  readonly wrongWay: ReadonlyArray<ImportEdge & { rule: string }>;
  /** Files outside the engine registry holding a string literal of two or more engine names together. */
  readonly engineListSpellings: readonly string[];
  /** Files outside the scheduling registry naming a built-in policy in a string literal. */
  readonly policyNameSpellings: ReadonlyArray<{ file: string; names: string[] }>;
}

const ENGINE_NAMES = ['vllm', 'sglang', 'trtllm'];

function listTs(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...listTs(p));
    else if (name.endsWith('.ts') && !name.endsWith('.d.ts')) out.push(p);
  }
  return out.sort();
}

/** The folder a file belongs to for layering: `core`, `server`, `cli`, ... (src/log.ts → `log`). */
export function folderOf(file: string): string {
  const parts = file.split('/');
  return parts.length > 2 ? parts[1] : parts[1].replace(/\.ts$/, '');
}

function isTypeOnlyImport(node: ts.ImportDeclaration | ts.ExportDeclaration): boolean {
  if (ts.isImportDeclaration(node)) {
    const clause = node.importClause;
    if (!clause) return false; // side-effect import
    if (clause.isTypeOnly) return true;
    if (clause.name) return false;
    const bindings = clause.namedBindings;
    if (!bindings) return true;
    if (ts.isNamespaceImport(bindings)) return false;
    return bindings.elements.length > 0 && bindings.elements.every((e) => e.isTypeOnly);
  }
  if (node.isTypeOnly) return true;
  const clause = node.exportClause;
  return !!clause && ts.isNamedExports(clause) && clause.elements.length > 0 && clause.elements.every((e) => e.isTypeOnly);
}

function functionName(node: ts.Node): string {
  if ((ts.isFunctionDeclaration(node) || ts.isMethodDeclaration(node)) && node.name) return node.name.getText();
  if (ts.isConstructorDeclaration(node)) return 'constructor';
  const parent = node.parent;
  if (parent && ts.isVariableDeclaration(parent)) return parent.name.getText();
  if (parent && ts.isPropertyAssignment(parent)) return parent.name.getText();
  if (parent && ts.isPropertyDeclaration(parent)) return parent.name.getText();
  return '(anonymous)';
}

/** Tarjan's strongly connected components over a directed graph given as adjacency sets. */
export function stronglyConnected(nodes: readonly string[], next: (n: string) => Iterable<string>): string[][] {
  let index = 0;
  const idx = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const out: string[][] = [];
  const visit = (v: string): void => {
    idx.set(v, index);
    low.set(v, index);
    index++;
    stack.push(v);
    onStack.add(v);
    for (const w of next(v)) {
      if (!idx.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, idx.get(w)!));
    }
    if (low.get(v) === idx.get(v)) {
      const comp: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        comp.push(w);
      } while (w !== v);
      const selfLoop = comp.length === 1 && [...next(v)].includes(v);
      if (comp.length > 1 || selfLoop) out.push(comp.sort());
    }
  };
  for (const n of nodes) if (!idx.has(n)) visit(n);
  return out;
}

/** The front ends: each turns one kind of traffic into calls on the shared layers below. */
export const FRONT_ENDS: ReadonlySet<string> = new Set(['server', 'epp', 'sim', 'mocker']);

/**
 * The layering rules: `core` imports nothing outside itself; `config` imports only core (and log); no front end
 * (`server`, `epp`, `sim`, `mocker`) imports another, except the simulator running the mock engine's model
 * (sim -> mocker); the shared layers (runtime, apis, engines, transport, ...) import no front end; nothing imports `cli`.
 */
export function wrongWayRule(from: string, to: string): string | null {
  const a = folderOf(from);
  const b = folderOf(to);
  if (a === b) return null;
  if (a === 'core') return 'core imports nothing outside core';
  if (a === 'config' && b !== 'core' && b !== 'log') return 'config imports nothing above it (only core and log)';
  if (b === 'cli') return 'nothing imports the CLI';
  if (FRONT_ENDS.has(a) && FRONT_ENDS.has(b) && !(a === 'sim' && b === 'mocker')) return 'no front end imports another';
  if (FRONT_ENDS.has(b) && a !== 'cli' && !FRONT_ENDS.has(a)) return 'the shared layers import no front end';
  return null;
}

export function analyseHouse(root: string, policyNames: readonly string[] = []): HouseFigures {
  const srcDir = join(root, 'src');
  const files = listTs(srcDir).map((p) => relative(root, p));
  const fileSet = new Set(files);
  const edges: ImportEdge[] = [];
  const longFiles: { file: string; lines: number }[] = [];
  const longFunctions: LongFunction[] = [];
  const engineListSpellings: string[] = [];
  const policyNameSpellings: { file: string; names: string[] }[] = [];
  let lines = 0;

  for (const file of files) {
    const text = readFileSync(join(root, file), 'utf8');
    const n = text.split('\n').length - (text.endsWith('\n') ? 1 : 0);
    lines += n;
    if (n > 400) longFiles.push({ file, lines: n });
    const sf = ts.createSourceFile(file, text, ts.ScriptTarget.ES2022, true);
    const addEdge = (spec: string, value: boolean) => {
      if (!spec.startsWith('.')) return;
      let target = relative(root, resolve(dirname(join(root, file)), spec));
      if (target.endsWith('.js')) target = target.replace(/\.js$/, '.ts');
      if (!target.endsWith('.ts')) target = `${target}.ts`;
      if (fileSet.has(target)) edges.push({ from: file, to: target, value });
    };
    const literals = new Set<string>();
    const visit = (node: ts.Node): void => {
      if (
        (ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) &&
        node.moduleSpecifier &&
        ts.isStringLiteral(node.moduleSpecifier)
      ) {
        addEdge(node.moduleSpecifier.text, !isTypeOnlyImport(node));
      } else if (ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword) {
        const arg = node.arguments[0];
        if (arg && ts.isStringLiteral(arg)) addEdge(arg.text, true);
      }
      if (ts.isStringLiteral(node) || ts.isNoSubstitutionTemplateLiteral(node)) {
        const parent = node.parent;
        const isModuleSpec = parent && (ts.isImportDeclaration(parent) || ts.isExportDeclaration(parent));
        if (!isModuleSpec) literals.add(node.text);
      }
      if (
        ts.isFunctionDeclaration(node) ||
        ts.isMethodDeclaration(node) ||
        ts.isConstructorDeclaration(node) ||
        ts.isFunctionExpression(node) ||
        ts.isArrowFunction(node)
      ) {
        if (node.body) {
          const start = sf.getLineAndCharacterOfPosition(node.getStart(sf)).line;
          const end = sf.getLineAndCharacterOfPosition(node.getEnd()).line;
          const span = end - start + 1;
          if (span > 100) longFunctions.push({ file, name: functionName(node), line: start + 1, lines: span });
        }
      }
      ts.forEachChild(node, visit);
    };
    visit(sf);
    if (!file.startsWith('src/engines/') && ENGINE_NAMES.filter((e) => literals.has(e)).length >= 2) engineListSpellings.push(file);
    if (!file.startsWith('src/core/scheduling/')) {
      const names = policyNames.filter((p) => literals.has(p));
      if (names.length > 0) policyNameSpellings.push({ file, names });
    }
  }

  const cycles = (valueOnly: boolean, level: 'file' | 'folder'): string[][] => {
    const key = level === 'file' ? (f: string) => f : folderOf;
    const adj = new Map<string, Set<string>>();
    for (const e of edges) {
      if (valueOnly && !e.value) continue;
      const a = key(e.from);
      const b = key(e.to);
      if (level === 'folder' && a === b) continue;
      if (!adj.has(a)) adj.set(a, new Set());
      adj.get(a)!.add(b);
    }
    const nodes = [...new Set(files.map(key))];
    return stronglyConnected(nodes, (n) => adj.get(n) ?? []);
  };

  const wrongWay = edges.flatMap((e) => {
    const rule = wrongWayRule(e.from, e.to);
    return rule ? [{ ...e, rule }] : [];
  });

  return {
    files: files.length,
    lines,
    longFiles: longFiles.sort((a, b) => b.lines - a.lines),
    longFunctions: longFunctions.sort((a, b) => b.lines - a.lines),
    edges,
    fileCycles: cycles(false, 'file'),
    valueFileCycles: cycles(true, 'file'),
    folderCycles: cycles(false, 'folder'),
    valueFolderCycles: cycles(true, 'folder'),
    wrongWay,
    engineListSpellings,
    policyNameSpellings,
  };
}

function printFigures(h: HouseFigures): void {
  const say = (s: string) => process.stdout.write(`${s}\n`);
  say(`src: ${h.files} files, ${h.lines} lines, ${h.edges.length} relative imports`);
  say(`files over 400 lines: ${h.longFiles.length}`);
  for (const f of h.longFiles) say(`  ${String(f.lines).padStart(5)}  ${f.file}`);
  say(`functions over 100 lines: ${h.longFunctions.length}`);
  for (const f of h.longFunctions) say(`  ${String(f.lines).padStart(5)}  ${f.file}:${f.line} ${f.name}`);
  const cyc = (label: string, list: readonly string[][]) => {
    say(`${label}: ${list.length}`);
    for (const c of list) say(`  ${c.join(' <-> ')}`);
  };
  cyc('file import cycles (all imports)', h.fileCycles);
  cyc('file import cycles (value imports)', h.valueFileCycles);
  cyc('folder cycles (all imports)', h.folderCycles);
  cyc('folder cycles (value imports)', h.valueFolderCycles);
  say(`imports the wrong way: ${h.wrongWay.length}`);
  for (const e of h.wrongWay) say(`  ${e.from} -> ${e.to}  (${e.rule})`);
  say(`files spelling the engine list outside src/engines/: ${h.engineListSpellings.length}`);
  for (const f of h.engineListSpellings) say(`  ${f}`);
  say(`files naming a built-in policy outside src/core/scheduling/: ${h.policyNameSpellings.length}`);
  for (const p of h.policyNameSpellings) say(`  ${p.file}: ${p.names.join(', ')}`);
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  usage(import.meta.url);
  const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
  const { POLICY_NAMES } = await import('../src/core/scheduling/registry.ts');
  const figures = analyseHouse(root, POLICY_NAMES);
  if (process.argv.includes('--json')) {
    const { edges: _edges, ...rest } = figures;
    process.stdout.write(`${JSON.stringify(rest, null, 2)}\n`);
  } else printFigures(figures);
}
