/**
 * Text -> value parsing for every `kvroute` command, in one place so that each command accepts the same forms and
 * refuses them with the same words: `--block-size must be an integer >= 1, got "zero"`.
 *
 * Two layers: `*Text` functions return the value or `undefined` (the settings schema uses them to coerce flags and
 * environment variables before validating), and `*Arg` functions are commander argument parsers that throw a
 * `UsageError` with the message above (src/cli/main.ts prints it on one line and exits 2).
 */

/** A bad command-line value. src/cli/main.ts prints the message alone and exits 2. */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

export interface Range {
  readonly min?: number;
  readonly max?: number;
  /** The minimum itself is refused (`> min`). */
  readonly minExclusive?: boolean;
}

/** "an integer >= 0", "an integer in [0, 65535]". */
export function describeInt(r: Range = {}): string {
  const min = r.min === undefined ? undefined : r.minExclusive ? r.min + 1 : r.min;
  if (min !== undefined && r.max !== undefined) return `an integer in [${min}, ${r.max}]`;
  if (min !== undefined) return `an integer >= ${min}`;
  if (r.max !== undefined) return `an integer <= ${r.max}`;
  return 'an integer';
}

/** "a number >= 0", "a number in (0, 1]". */
export function describeNumber(r: Range = {}): string {
  if (r.min !== undefined && r.max !== undefined) return `a number in ${r.minExclusive ? '(' : '['}${r.min}, ${r.max}]`;
  if (r.min !== undefined) return `a number ${r.minExclusive ? '>' : '>='} ${r.min}`;
  if (r.max !== undefined) return `a number <= ${r.max}`;
  return 'a number';
}

function inRange(n: number, r: Range): boolean {
  if (r.min !== undefined && (r.minExclusive ? n <= r.min : n < r.min)) return false;
  return r.max === undefined || n <= r.max;
}

/** A decimal integer ("12", "-3"; not "1e3", "0x10", "1.0" or ""). */
export function intText(text: string): number | undefined {
  const t = text.trim();
  if (!/^[+-]?\d+$/.test(t)) return undefined;
  const n = Number(t);
  return Number.isSafeInteger(n) ? n : undefined;
}

/** A finite decimal number ("0.5", "2", "1e-3"; not "", "Infinity" or "0x10"). */
export function numberText(text: string): number | undefined {
  const t = text.trim();
  if (!/^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i.test(t)) return undefined;
  const n = Number(t);
  return Number.isFinite(n) ? n : undefined;
}

const BOOLEANS: Record<string, boolean> = { true: true, false: false, '1': true, '0': false, yes: true, no: false, on: true, off: false };

/** true/false, 1/0, yes/no, on/off (any case). */
export function boolText(text: string): boolean | undefined {
  return BOOLEANS[text.trim().toLowerCase()];
}

const BYTE_UNITS: Record<string, number> = { b: 1, k: 1024, kb: 1024, m: 1024 ** 2, mb: 1024 ** 2, g: 1024 ** 3, gb: 1024 ** 3 };

/** "32mb", "512k", "1.5gb", "1048576" -> bytes (binary units: 1kb = 1024 bytes). */
export function bytesText(text: string): number | undefined {
  const m = /^(\d+(?:\.\d+)?)\s*(b|k|kb|m|mb|g|gb)?$/i.exec(text.trim());
  if (!m) return undefined;
  return Math.floor(Number(m[1]) * BYTE_UNITS[(m[2] ?? 'b').toLowerCase()]);
}

/** 33554432 -> "32mb": the largest unit that divides the count exactly. */
export function formatBytes(n: number): string {
  for (const [unit, size] of [
    ['gb', 1024 ** 3],
    ['mb', 1024 ** 2],
    ['kb', 1024],
  ] as const) {
    if (n >= size && n % size === 0) return `${n / size}${unit}`;
  }
  return String(n);
}

/** "60s", "2m", "500ms", "1h" or a bare number of seconds -> seconds. */
export function durationText(text: string): number | undefined {
  const m = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h)?$/.exec(text.trim());
  if (!m) return undefined;
  const n = Number(m[1]);
  const unit = m[2] ?? 's';
  return unit === 'ms' ? n / 1000 : unit === 'm' ? n * 60 : unit === 'h' ? n * 3600 : n;
}

/** "a, b c" -> ["a", "b", "c"]: items separated by commas and/or whitespace. */
export function splitList(text: string, separators: RegExp = /[\s,]+/): string[] {
  return text.split(separators).filter((s) => s.length > 0);
}

/** "a, b or c": a list of names as messages and help texts say it. */
export function namesText(names: readonly string[], conjunction = 'or'): string {
  return names.length === 1 ? names[0] : `${names.slice(0, -1).join(', ')} ${conjunction} ${names.at(-1)}`;
}

/** pino's levels, for every command's --log-level. */
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

/** ZMQ endpoints as engines and `kvroute mocker` write them: tcp://host:port, ipc://path, inproc://name. */
export const ZMQ_ENDPOINT = /^(tcp|ipc|inproc):\/\/.+/;

const fail = (name: string, accepts: string, text: string): never => {
  throw new UsageError(`${name} must be ${accepts}, got "${text}"`);
};

/** commander parser: an integer within `range`. */
export function intArg(name: string, range: Range = {}): (text: string) => number {
  return (text) => {
    const n = intText(text);
    return n !== undefined && inRange(n, range) ? n : fail(name, describeInt(range), text);
  };
}

/** commander parser: a number within `range` (`inf` accepted when `infinity` is set). */
export function numberArg(name: string, range: Range = {}, options: { infinity?: boolean } = {}): (text: string) => number {
  const accepts = `${describeNumber(range)}${options.infinity ? ' (or inf)' : ''}`;
  return (text) => {
    const n = options.infinity && text.trim() === 'inf' ? Infinity : numberText(text);
    return n !== undefined && inRange(n, range) ? n : fail(name, accepts, text);
  };
}

/** commander parser: a positive duration (60s, 2m, 500ms, 1h, or seconds) -> seconds. */
export function durationArg(name: string): (text: string) => number {
  return (text) => {
    const s = durationText(text);
    return s !== undefined && s > 0 ? s : fail(name, 'a positive duration like 60s, 2m, 500ms or 1h', text);
  };
}

/** commander parser: one of `choices`. */
export function choiceArg<T extends string>(name: string, choices: readonly T[]): (text: string) => T {
  return (text) => ((choices as readonly string[]).includes(text) ? (text as T) : fail(name, `one of ${choices.join(', ')}`, text));
}

/** commander parser: comma-separated numbers, each within `range` ("0.5,1,2"). */
export function numberListArg(name: string, range: Range = {}): (text: string) => number[] {
  const accepts = `comma-separated numbers, each ${describeNumber(range).replace(/^a number /, '')}`;
  return (text) => {
    const xs = text.split(',').map(numberText);
    return xs.every((x) => x !== undefined && inRange(x, range)) ? (xs as number[]) : fail(name, accepts, text);
  };
}
