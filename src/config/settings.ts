/**
 * Settings defined once: a zod object whose every field is registered with its flag, `KVROUTE_*` variable, help text
 * and kind (how text becomes a value, and how the accepted values read in words). From that one object come the
 * commander options, the environment mapping, config-file validation, the precedence merge
 * (flag > environment > config file > default) and the resolved type (`z.output`).
 *
 * Every refusal is one line naming the setting, the accepted values and where the bad value came from:
 *   --retries (KVROUTE_RETRIES) must be an integer >= 0, got "-1" (from KVROUTE_RETRIES)
 */
import { readFile } from 'node:fs/promises';
import { type Command, Option } from 'commander';
import { z } from 'zod';
import {
  boolText,
  bytesText,
  describeInt,
  describeNumber,
  formatBytes,
  intText,
  numberText,
  type Range,
  splitList,
  UsageError,
} from './parsers.ts';

/** A setting value that no source may give: printed alone by src/cli/main.ts, exit status 2. */
export class SettingError extends UsageError {}

/** How a setting's text (a flag's argument, an environment variable) becomes a value, and how its values read. */
export interface Kind<S extends z.ZodType = z.ZodType> {
  readonly schema: S;
  /** The accepted values in words, for messages: "an integer >= 0". */
  readonly accepts: string;
  /** The same for --help; empty: nothing worth saying (free text). */
  readonly range: string;
  /** Flag or environment text -> a candidate for `schema`; text that does not parse is passed on for the schema to refuse. */
  readonly fromText: (text: string) => unknown;
  /** A value as --help shows it ("32mb"). */
  readonly show: (value: unknown) => string;
  /** value: the flag takes one argument; list: repeatable, occurrences concatenated; switch: no argument. */
  readonly arg: 'value' | 'list' | 'switch';
  /** The schema's own issue messages say more than `accepts` (worker specs, CIDR lists): pass them on. */
  readonly detailed?: boolean;
}

export interface SettingMeta {
  /** commander flags, e.g. "-p, --port <n>" or "--no-remote-tokenize". */
  readonly flag: string;
  /** The environment variable, KVROUTE_*; empty for a setting only a flags-only command takes (relay, mocker). */
  readonly env: string;
  readonly help: string;
  /** --help section. */
  readonly group?: string;
  /** Never echo a refused value (tokens, keys). */
  readonly secret?: boolean;
}

export interface SettingEntry extends SettingMeta {
  readonly kind: Kind<z.ZodType>;
  readonly default?: unknown;
}

/**
 * Every setting's entry, keyed by its field schema (the value of its key in the settings object). A WeakMap rather
 * than a zod registry: zod rewrites a registry's metadata type, which cannot hold a schema-typed `kind`.
 */
const SETTINGS = new WeakMap<z.ZodType, SettingEntry>();

/** A setting with a default: its key is always present in the resolved settings. */
export function withDefault<S extends z.ZodType>(kind: Kind<S>, value: z.output<S>, meta: SettingMeta) {
  const schema = kind.schema.default(value as never);
  SETTINGS.set(schema, { ...meta, kind, default: value });
  return schema;
}

/** A setting without a default: absent unless a source gives it. */
export function optional<S extends z.ZodType>(kind: Kind<S>, meta: SettingMeta) {
  const schema = kind.schema.optional();
  SETTINGS.set(schema, { ...meta, kind });
  return schema;
}

function entryOf(field: z.ZodType): SettingEntry {
  const entry = SETTINGS.get(field);
  if (!entry) throw new Error('not a registered setting');
  return entry;
}

/**
 * The same setting with another default, for a command whose use of it differs (`kvroute sim --seed` also seeds the
 * engines and its scenarios, default 1); `meta` may add to its help. Flag, variable, kind and range stay the setting's.
 */
export function redefault<S extends z.ZodType>(field: S, value: z.output<S>, meta: Partial<SettingMeta> = {}) {
  const entry = entryOf(field);
  return withDefault(entry.kind as Kind<z.ZodType<z.output<S>>>, value, { ...entry, ...meta });
}

/**
 * A list-valued variant of a setting, for a command that compares several values side by side (`kvroute sim --policy
 * kv-pressure,kv`): the same flag (its argument named <list>), variable, item kind and help; each item is checked as
 * the setting checks a value. `value`: the default list (default: the setting's default alone).
 */
export function sweepOf<S extends z.ZodType>(field: S, options: { default?: z.output<S>[]; help?: string } = {}) {
  const entry = entryOf(field);
  if (entry.kind.arg !== 'value') throw new Error(`${entry.flag}: only a one-value setting has a sweep variant`);
  const item = entry.kind;
  const kind: Kind<z.ZodArray<z.ZodType<z.output<S>>>> = {
    schema: z.array(item.schema as z.ZodType<z.output<S>>).min(1),
    accepts: `${item.accepts}, or several separated by commas`,
    range: item.range ? `each: ${item.range}` : '',
    fromText: (t) => splitList(t, /\s*,\s*/).map((x) => item.fromText(x)),
    show: (v) => (v as unknown[]).map((x) => item.show(x)).join(','),
    arg: 'list',
  };
  const value = options.default ?? (entry.default === undefined ? [] : [entry.default as z.output<S>]);
  return withDefault(kind, value, {
    ...entry,
    flag: entry.flag.replace(/<[^>]+>/, '<list>'),
    help: options.help ?? `${entry.help}; several, comma-separated, are compared side by side`,
  });
}

// ---- kinds ----

export function integer(range: Range = {}): Kind<z.ZodNumber> {
  let schema = z.int();
  if (range.min !== undefined) schema = range.minExclusive ? schema.gt(range.min) : schema.min(range.min);
  if (range.max !== undefined) schema = schema.max(range.max);
  const accepts = describeInt(range);
  return { schema, accepts, range: accepts, fromText: (t) => intText(t) ?? t, show: String, arg: 'value' };
}

/** A TCP port: 0 (any free port) to 65535, or from `min` (1: a port another process listens on). */
export function port(min: 0 | 1 = 0): Kind<z.ZodNumber> {
  return integer({ min, max: 65535 });
}

export function number(range: Range = {}): Kind<z.ZodNumber> {
  let schema = z.number();
  if (range.min !== undefined) schema = range.minExclusive ? schema.gt(range.min) : schema.min(range.min);
  if (range.max !== undefined) schema = schema.max(range.max);
  const accepts = describeNumber(range);
  return { schema, accepts, range: accepts, fromText: (t) => numberText(t) ?? t, show: String, arg: 'value' };
}

/** Free text; `pattern` narrows it (and `accepts` says how). */
export function text(options: { pattern?: RegExp; accepts?: string; allowEmpty?: boolean } = {}): Kind<z.ZodString> {
  let schema = options.allowEmpty ? z.string() : z.string().min(1);
  if (options.pattern) schema = schema.regex(options.pattern);
  const accepts = options.accepts ?? (options.allowEmpty ? 'a string' : 'a non-empty string');
  return {
    schema,
    accepts,
    range: options.accepts ?? '',
    fromText: (t) => t,
    show: (v) => (v === '' ? '""' : String(v)),
    arg: 'value',
  };
}

export function choice<const T extends readonly [string, ...string[]]>(values: T): Kind<z.ZodEnum<{ [K in T[number]]: K }>> {
  const accepts = `one of ${values.join(', ')}`;
  return { schema: z.enum(values), accepts, range: accepts, fromText: (t) => t, show: String, arg: 'value' };
}

/** On/off. The flag is a switch (`--tier-credit`, or `--no-x` for a setting on by default); the environment says true/false. */
export function flag(): Kind<z.ZodBoolean> {
  return { schema: z.boolean(), accepts: 'true or false', range: '', fromText: (t) => boolText(t) ?? t, show: String, arg: 'switch' };
}

/** A list. Flags repeat; a flag or variable may hold several items separated by `separators`. */
export function list<I extends z.ZodType>(
  item: I,
  options: { accepts: string; separators?: RegExp; detailed?: boolean; range?: string },
): Kind<z.ZodArray<I>> {
  const separators = options.separators ?? /[\s,]+/;
  return {
    schema: z.array(item),
    accepts: options.accepts,
    range: options.range ?? '',
    fromText: (t) => splitList(t, separators),
    show: (v) => (v as unknown[]).join(','),
    arg: 'list',
    detailed: options.detailed,
  };
}

/** A byte count, written as 1048576 or a size like 32mb, 512kb (binary units). */
export function bytes(min = 1): Kind<z.ZodType<number, unknown>> {
  const accepts = `a size like 32mb, 512kb or 1048576${min > 1 ? ` (at least ${min} bytes)` : ''}`;
  const schema = z.preprocess((v) => (typeof v === 'string' ? (bytesText(v) ?? v) : v), z.int().min(min));
  return { schema, accepts, range: accepts, fromText: (t) => t, show: (v) => formatBytes(v as number), arg: 'value' };
}

/** Any schema: for values with a grammar of their own. `detailed`: its issue messages are shown as they are. */
export function custom<S extends z.ZodType>(schema: S, accepts: string, options: { detailed?: boolean; range?: string } = {}): Kind<S> {
  return { schema, accepts, range: options.range ?? accepts, fromText: (t) => t, show: String, arg: 'value', detailed: options.detailed };
}

// ---- the settings of one object schema ----

export type SettingsShape = Record<string, z.ZodType>;
export type SettingsSchema<T extends SettingsShape = SettingsShape> = z.ZodObject<T>;
export type Source = 'flag' | 'env' | 'file' | 'default';

export interface Setting {
  readonly key: string;
  readonly entry: SettingEntry;
}

/** The settings of a schema, in the order of its keys (the order of --help). */
export function settingsOf(schema: SettingsSchema, keys?: readonly string[]): Setting[] {
  const wanted = keys ?? Object.keys(schema.shape);
  return wanted.map((key) => {
    const field = schema.shape[key];
    const entry = field && SETTINGS.get(field);
    if (!entry) throw new Error(`"${key}" is not a registered setting`);
    return { key, entry };
  });
}

/** "--retries" of "-r, --retries <n>". */
export function longFlag(entry: SettingMeta): string {
  const m = /--[a-z0-9-]+/i.exec(entry.flag);
  if (!m) throw new Error(`setting flag "${entry.flag}" has no long form`);
  return m[0];
}

/** `--retries (KVROUTE_RETRIES)`: how messages name a setting. */
export function settingLabel(entry: SettingMeta): string {
  return `${longFlag(entry)} (${entry.env})`;
}

/** Which sources a command reads its settings from, for --help: serve and epp read all three. */
export interface OptionSources {
  /** Its KVROUTE_* variables (default true). */
  readonly env?: boolean;
  /** Its --config file (default true). */
  readonly file?: boolean;
  /** Settings that must be given on this command (no default applies). */
  readonly required?: readonly string[];
  /** The --help section: the setting's own (default), another, or none (false: a command borrowing one setting). */
  readonly group?: string | false;
}

/** Flags only: a command borrowing settings whose variables configure the router, not it. */
export const FLAGS_ONLY: OptionSources = { env: false, file: false };

function helpText(key: string, entry: SettingEntry, sources: OptionSources): string {
  const notes: string[] = [];
  if (entry.kind.range) notes.push(entry.kind.range);
  // A switch's default is its form (--x: off, --no-x: on): its value shows only beside its variable.
  const shownDefault =
    entry.default !== undefined &&
    !(Array.isArray(entry.default) && entry.default.length === 0) &&
    !(entry.kind.arg === 'switch' && sources.env === false);
  if (sources.required?.includes(key)) notes.push('required');
  else if (shownDefault) notes.push(`default: ${entry.kind.show(entry.default)}`);
  if (sources.env !== false) notes.push(`env: ${entry.env}${entry.kind.arg === 'switch' ? '=true|false' : ''}`);
  if (sources.file !== false) notes.push(`config: ${key}`);
  return notes.length > 0 ? `${entry.help} (${notes.join('; ')})` : entry.help;
}

/**
 * Adds the settings' options to a command (all of the schema's, or `keys`): flag, help with range, default and, as the
 * command reads them, variable and config key.
 */
export function addSettingsOptions(
  command: Command,
  schema: SettingsSchema,
  keys?: readonly string[],
  sources: OptionSources = {},
): Command {
  for (const { key, entry } of settingsOf(schema, keys)) {
    const option = new Option(entry.flag, helpText(key, entry, sources));
    // No commander parsing or env: the resolver reads every source itself, so it knows where a bad value came from.
    if (entry.kind.arg === 'list') option.argParser((v: string, previous: string[] = []) => [...previous, v]);
    const group = sources.group === undefined ? entry.group : sources.group;
    if (group) option.helpGroup(group);
    if (sources.required?.includes(key)) option.makeOptionMandatory();
    command.addOption(option);
  }
  return command;
}

/** The values given as flags on the command line (raw: strings, string lists, switches), by setting key. */
export function flagValues(command: Command, schema: SettingsSchema, keys?: readonly string[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const { key, entry } of settingsOf(schema, keys)) {
    const long = longFlag(entry);
    const option = command.options.find((o) => o.long === long);
    if (!option) continue;
    const attr = option.attributeName();
    if (command.getOptionValueSource(attr) === 'cli') out[key] = command.getOptionValue(attr);
  }
  return out;
}

export interface ConfigFile {
  readonly path: string;
  readonly values: Record<string, unknown>;
}

/** Reads a YAML or JSON mapping (JSON when the name ends in .json). Values are checked by `resolveSettings`. */
export async function readConfigFile(path: string): Promise<ConfigFile> {
  let textIn: string;
  try {
    textIn = await readFile(path, 'utf8');
  } catch (err) {
    throw new SettingError(`config file ${path}: cannot read it (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
  }
  let raw: unknown;
  try {
    // The YAML parser (73 files, ~45 ms of CPU to load) only for a YAML file: most start-ups read none.
    raw = path.endsWith('.json') ? JSON.parse(textIn) : (await import('yaml')).parse(textIn);
  } catch (err) {
    // YAML messages carry a code frame on later lines: the first line says what and where.
    throw new SettingError(`config file ${path}: ${(err as Error).message.split('\n')[0]}`);
  }
  if (raw === null || raw === undefined) raw = {}; // an empty file sets nothing
  if (typeof raw !== 'object' || Array.isArray(raw))
    throw new SettingError(`config file ${path}: expected a mapping of settings at the top`);
  return { path, values: raw as Record<string, unknown> };
}

export interface SettingSources {
  /** Raw flag values by key (`flagValues`). */
  readonly flags?: Readonly<Record<string, unknown>>;
  /** The environment; a variable set to "" counts as unset. Absent: the command reads none (its messages name none). */
  readonly env?: Readonly<Record<string, string | undefined>>;
  readonly file?: ConfigFile;
}

export interface Resolved<T> {
  readonly config: T;
  /** Where each setting's value came from. */
  readonly sources: Record<string, Source>;
}

function showValue(value: unknown, secret: boolean | undefined): string {
  if (secret) return '(hidden)';
  const s = JSON.stringify(value) ?? String(value);
  return s.length > 80 ? `${s.slice(0, 77)}...` : s;
}

function fromOf(source: Exclude<Source, 'default'>, entry: SettingEntry, file?: ConfigFile, path: PropertyKey[] = []): string {
  if (source === 'flag') return longFlag(entry);
  if (source === 'env') return entry.env;
  const at = path.map((p) => (typeof p === 'number' ? `[${p}]` : `.${String(p)}`)).join('');
  return `${file?.path}: ${at.replace(/^\./, '')}`;
}

/**
 * The settings `keys` of `schema` a parsed command was given: its flags (and `env` when given; for a command that
 * borrows the router's settings pass none), checked, defaults filled in, with where each value came from.
 */
export function settingsFrom<T extends SettingsSchema, const K extends keyof z.output<T> & string>(
  command: Command,
  schema: T,
  keys: readonly K[],
  options: { env?: Readonly<Record<string, string | undefined>> } = {},
): Resolved<Pick<z.output<T>, K>> {
  const picked = schema.pick(Object.fromEntries(keys.map((k) => [k, true])) as never) as unknown as SettingsSchema;
  const resolved = resolveSettings(picked, { flags: flagValues(command, schema, keys), env: options.env });
  return resolved as Resolved<Pick<z.output<T>, K>>;
}

/** Checks one value of one setting from one source; throws the one-line SettingError. */
function check(
  key: string,
  entry: SettingEntry,
  candidate: unknown,
  shown: unknown,
  source: Exclude<Source, 'default'>,
  file: ConfigFile | undefined,
  withEnv: boolean,
): unknown {
  // A command that reads no KVROUTE_* variable names none in its messages.
  const label = withEnv ? settingLabel(entry) : longFlag(entry);
  const r = entry.kind.schema.safeParse(candidate);
  if (r.success) return r.data;
  const issue = r.error.issues[0];
  const from = fromOf(source, entry, file, source === 'file' ? [key, ...issue.path] : []);
  // A detailed kind's own messages (a bad worker spec, a bad CIDR) say more than its range; a wrong type at the top does not.
  if (entry.kind.detailed && (issue.code === 'custom' || issue.path.length > 0)) {
    throw new SettingError(`${label}: ${issue.message} (from ${from})`);
  }
  // A list refused for one item: show that item, not the whole list.
  const item = issue.path[0];
  if (Array.isArray(candidate) && typeof item === 'number' && source !== 'file') shown = candidate[item];
  throw new SettingError(`${label} must be ${entry.kind.accepts}, got ${showValue(shown, entry.secret)} (from ${from})`);
}

/** flag or environment text -> a candidate value (lists: every occurrence split and concatenated). */
function fromRaw(entry: SettingEntry, raw: unknown): unknown {
  if (typeof raw === 'string') return entry.kind.fromText(raw);
  if (Array.isArray(raw)) return raw.flatMap((t) => entry.kind.fromText(String(t)) as unknown[]);
  return raw; // a switch: true/false already
}

/**
 * The precedence merge: for each setting, the flag, else the environment variable, else the config file, else the
 * default. Each value is checked where it comes from (so a refusal names its source); a list is taken whole from
 * the highest source that gives it. Unknown config-file keys are refused.
 */
export function resolveSettings<T extends SettingsSchema>(schema: T, sources: SettingSources): Resolved<z.output<T>> {
  const settings = settingsOf(schema);
  const file = sources.file;
  if (file) {
    const known = new Set(settings.map((s) => s.key));
    for (const k of Object.keys(file.values)) {
      if (!known.has(k)) throw new SettingError(`config file ${file.path}: unknown key "${k}" (known: ${[...known].join(', ')})`);
    }
  }
  const values: Record<string, unknown> = {};
  const from: Record<string, Source> = {};
  const withEnv = sources.env !== undefined;
  for (const { key, entry } of settings) {
    const flagRaw = sources.flags?.[key];
    const envRaw = sources.env?.[entry.env];
    if (flagRaw !== undefined) {
      values[key] = check(key, entry, fromRaw(entry, flagRaw), flagRaw, 'flag', file, withEnv);
      from[key] = 'flag';
    } else if (envRaw !== undefined && envRaw !== '') {
      values[key] = check(key, entry, fromRaw(entry, envRaw), envRaw, 'env', file, withEnv);
      from[key] = 'env';
    } else if (file && file.values[key] !== undefined) {
      values[key] = check(key, entry, file.values[key], file.values[key], 'file', file, withEnv);
      from[key] = 'file';
    } else {
      from[key] = 'default';
      // A copy: the default list of one resolution must not be the list another one appends to.
      if (entry.default !== undefined) values[key] = structuredClone(entry.default);
    }
  }
  return { config: values as z.output<T>, sources: from };
}
