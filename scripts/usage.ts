/**
 * `--help` for the repository's benchmarks and scripts (bench/*.ts, scripts/*.ts run by `npm run ...`): each one's
 * opening doc comment is its usage text. `usage(import.meta.url)` as a script's first statement prints that text and
 * exits 0 when the command line holds `--help` or `-h`, before the script parses its arguments or starts anything.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** The opening `/** ... *\/` comment of a source file, without its comment markers; '' when there is none. */
export function docComment(source: string): string {
  const m = /^\s*(?:#![^\n]*\n)?\s*\/\*\*([\s\S]*?)\*\//.exec(source);
  if (!m) return '';
  return m[1]
    .split('\n')
    .map((line) => line.replace(/^\s*\* ?/, '').trimEnd())
    .join('\n')
    .trim();
}

export function usage(moduleUrl: string, argv: readonly string[] = process.argv.slice(2)): void {
  if (!argv.includes('--help') && !argv.includes('-h')) return;
  const text = docComment(readFileSync(fileURLToPath(moduleUrl), 'utf8'));
  process.stdout.write(`${text || 'no usage text: read the file'}\n`);
  process.exit(0);
}

/** A bad option: one line on stderr saying what to give, exit 2 (as kvroute's own commands do). */
function refuse(message: string): never {
  process.stderr.write(`error: ${message} (--help lists the options)\n`);
  process.exit(2);
}

/** The string after `--name`, or `fallback` when the flag is absent; a flag with nothing after it is refused. */
export function strArg(name: string, fallback: string, argv: readonly string[] = process.argv): string {
  const i = argv.indexOf(`--${name}`);
  if (i < 0) return fallback;
  const v = argv[i + 1];
  if (v === undefined || v.startsWith('--')) refuse(`--${name} needs a value`);
  return v;
}

/** The number after `--name`, or `fallback` when the flag is absent; anything but a finite number is refused. */
export function numArg(name: string, fallback: number, argv: readonly string[] = process.argv): number {
  const i = argv.indexOf(`--${name}`);
  if (i < 0) return fallback;
  const raw = argv[i + 1];
  const v = raw === undefined || raw.trim() === '' ? Number.NaN : Number(raw);
  if (!Number.isFinite(v)) refuse(`--${name} needs a number, got ${raw === undefined ? 'nothing' : `"${raw}"`}`);
  return v;
}
