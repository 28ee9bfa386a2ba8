/**
 * bench:hash — block hashing (docs/protocols.md §1), the napi path (`hashBlocksNapi`, two @node-rs/xxhash calls per
 * block) against the WASM path (`hashBlocksWasm`, one call per prompt), side by side in one run. Both are checked to
 * give identical hashes before timing.
 *
 *   npm run bench:hash [-- --calls 1000 --tokens 32768]
 */
import { numArg, usage } from '../scripts/usage.ts';
import { loadavg } from 'node:os';
import { hashBlocksNapi } from '../src/core/hashing.ts';
import { hashBlocksWasm } from '../src/core/wasm/blocks.ts';
import { latency, type Latency } from './lib/measure.ts';

usage(import.meta.url);

const CALLS = numArg('calls', 1000);
const TOKENS = numArg('tokens', 32768);

type Hasher = typeof hashBlocksNapi;
const impls: ReadonlyArray<readonly [string, Hasher]> = [
  ['napi', hashBlocksNapi],
  ['wasm', hashBlocksWasm],
];

/** Four distinct prompts (so neither path hashes the same bytes every call), as number[] and as Uint32Array. */
function prompts(tokens: number): number[][] {
  return Array.from({ length: 4 }, (_, p) => Array.from({ length: tokens }, (_, i) => (p * 104_729 + i * 7_919) % 151_936));
}

interface Row {
  readonly case: string;
  readonly impl: string;
  readonly blocks: number;
  readonly lat: Latency;
}

function run(name: string, inputs: ReadonlyArray<ArrayLike<number>>, bs: number, calls: number): Row[] {
  const blocks = Math.floor(inputs[0].length / bs);
  const seq = new BigUint64Array(blocks);
  // Parity first: a benchmark of two functions that disagree would be meaningless.
  const ref = new BigUint64Array(blocks);
  for (const input of inputs) {
    hashBlocksNapi({ tokens: input, from: 0, count: input.length, blockSize: bs, seed: 1337n, parentSeq: null, outSeq: ref, outOffset: 0 });
    hashBlocksWasm({ tokens: input, from: 0, count: input.length, blockSize: bs, seed: 1337n, parentSeq: null, outSeq: seq, outOffset: 0 });
    for (let b = 0; b < blocks; b++) if (seq[b] !== ref[b]) throw new Error(`${name}: wasm and napi differ at block ${b}`);
  }
  return impls.map(([impl, fn]) => ({
    case: name,
    impl,
    blocks,
    lat: latency(inputs, calls, (input) =>
      fn({ tokens: input, from: 0, count: input.length, blockSize: bs, seed: 1337n, parentSeq: null, outSeq: seq, outOffset: 0 }),
    ),
  }));
}

const big = prompts(TOKENS);
const rows: Row[] = [
  ...run(`${TOKENS} tokens, bs 16, number[]`, big, 16, CALLS),
  ...run(
    `${TOKENS} tokens, bs 16, Uint32Array`,
    big.map((p) => Uint32Array.from(p)),
    16,
    CALLS,
  ),
  ...run(`${TOKENS} tokens, bs 32, number[]`, big, 32, CALLS),
  ...run('2048 tokens, bs 16, number[]', prompts(2048), 16, CALLS * 10),
  // One block per call: the incremental (decode growth, event) case where per-call overhead dominates.
  ...run('16 tokens (1 block), bs 16, number[]', prompts(16), 16, CALLS * 50),
];

const f = (x: number) => x.toFixed(x < 10 ? 2 : 1);
// ns/block from the median: on a shared machine the mean and p99 carry other processes' scheduling noise.
console.log(
  `node ${process.version}, load average ${loadavg()[0].toFixed(1)}, ${CALLS} calls per 32k case ` +
    '(latency in µs per call; ns/block = p50 / blocks)',
);
console.log('| case | impl | blocks | p50 µs | p99 µs | mean µs | ns/block |');
console.log('|---|---|---|---|---|---|---|');
for (const r of rows) {
  const nsPerBlock = (r.lat.p50 * 1000) / r.blocks;
  console.log(`| ${r.case} | ${r.impl} | ${r.blocks} | ${f(r.lat.p50)} | ${f(r.lat.p99)} | ${f(r.lat.mean)} | ${nsPerBlock.toFixed(0)} |`);
}
