/**
 * The commands and code examples that README.md and docs/*.md show a user, read out of their fenced blocks, so that
 * test/docs/commands.test.ts can insist that each one is run by a test.
 *
 * What counts:
 *  - a block fenced as sh, bash, shell, console or zsh: every line (a `\` at the end joins the next), except blank
 *    lines and comments; a leading `$ ` and a trailing `# comment` are dropped;
 *  - a block with no language (or `text`): the lines that start with a command word (COMMAND_WORDS), since such
 *    blocks also hold diagrams and sample output;
 *  - a block fenced as js, javascript, mjs, ts or typescript: the whole block, as one code example.
 * Other languages (json, yaml, ...) are data, not commands.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

export interface DocCommand {
  /** The command (or code example) with runs of whitespace collapsed to one space. */
  readonly text: string;
  readonly kind: 'command' | 'code';
  /** file:line of the block's first line. */
  readonly where: string;
}

const SHELL = new Set(['sh', 'bash', 'shell', 'console', 'zsh']);
const CODE = new Set(['js', 'javascript', 'mjs', 'ts', 'typescript']);
const PLAIN = new Set(['', 'text']);
/** First words that make a line of an unlabelled block a command. */
export const COMMAND_WORDS = new Set([
  'kvroute',
  'npx',
  'npm',
  'node',
  'curl',
  'vllm',
  'python',
  'python3',
  'docker',
  'kubectl',
  'helm',
  'nats-server',
  'git',
  'bash',
  'sh',
]);

export const normalise = (s: string): string => s.replace(/\s+/g, ' ').trim();

/** Drops a trailing `# comment` that is outside quotes. */
function stripComment(line: string): string {
  let quote: string | null = null;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (quote) {
      if (c === quote) quote = null;
      else if (c === '\\' && quote === '"') i++;
    } else if (c === "'" || c === '"') quote = c;
    else if (c === '#' && (i === 0 || /\s/.test(line[i - 1]))) return line.slice(0, i);
  }
  return line;
}

/** Joins `\`-continued lines; returns each logical line with the line number it starts on. */
function logicalLines(lines: string[], firstLine: number): { text: string; line: number }[] {
  const out: { text: string; line: number }[] = [];
  let acc: string | null = null;
  let start = 0;
  lines.forEach((raw, i) => {
    if (acc === null) start = firstLine + i;
    const continued = /\\\s*$/.test(raw);
    const part = continued ? raw.replace(/\\\s*$/, ' ') : raw;
    acc = acc === null ? part : `${acc} ${part}`;
    if (!continued) {
      out.push({ text: acc, line: start });
      acc = null;
    }
  });
  if (acc !== null) out.push({ text: acc, line: start });
  return out;
}

export function extractCommands(markdown: string, file: string): DocCommand[] {
  const out: DocCommand[] = [];
  const lines = markdown.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const open = /^\s*(`{3,}|~{3,})\s*([\w+-]*)/.exec(lines[i]);
    if (!open) continue;
    const fence = open[1];
    const lang = open[2].toLowerCase();
    let end = i + 1;
    while (end < lines.length && !lines[end].trim().startsWith(fence)) end++;
    const body = lines.slice(i + 1, end);
    const where = `${file}:${i + 2}`;
    if (CODE.has(lang)) {
      out.push({ text: normalise(body.join('\n')), kind: 'code', where });
    } else if (SHELL.has(lang) || PLAIN.has(lang)) {
      for (const { text, line } of logicalLines(body, i + 2)) {
        const command = normalise(stripComment(text.replace(/^\s*\$\s+/, '')));
        if (command === '') continue;
        if (PLAIN.has(lang) && !COMMAND_WORDS.has(command.split(' ')[0])) continue;
        out.push({ text: command, kind: 'command', where: `${file}:${line}` });
      }
    }
    i = end;
  }
  return out;
}

/** The documents a user reads: README.md and every docs/*.md. */
export function documentedCommands(root: string): DocCommand[] {
  const files = [
    'README.md',
    ...readdirSync(join(root, 'docs'))
      .filter((f) => f.endsWith('.md'))
      .sort()
      .map((f) => `docs/${f}`),
  ];
  return files.flatMap((f) => extractCommands(readFileSync(join(root, f), 'utf8'), f));
}
