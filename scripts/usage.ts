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
