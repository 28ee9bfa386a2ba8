/**
 * bench:hash-ab — the request hash of bench:route (a 32k-token plain-array prompt, 2,048 blocks of 16, a fresh array
 * each call as a parsed request is) with this tree's hasher against another commit's, interleaved call by call in one
 * process, so both sides see the same machine. Every call's hashes are compared between the sides.
 *
 *   npm run bench:hash-ab [-- --against <commit> --calls 3000 --tokens 32768]
 *     --against <commit>   the other side: that commit's src/core/wasm/{blocks.ts,xxh3-blocks.wasm.ts} (default HEAD)
 *
 * For instruction counts (valgrind's callgrind, independent of the machine's load) one side runs alone:
 *
 *   valgrind --tool=callgrind --callgrind-out-file=/dev/null node --import tsx bench/hash-ab.bench.ts --only this --calls N
 *     --only this|against|none   hash with one side only (none: build the prompts, hash nothing)
 *
 * Here the prompts are built once (32 of them, plain arrays) and hashed in turn. Run at two N and take the difference:
 * start-up and the prompts cancel out, and (N2 - N1) calls remain.
 */
import { numArg, strArg, usage } from '../scripts/usage.ts';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { performance } from 'node:perf_hooks';
import * as here from '../src/core/wasm/blocks.ts';

usage(import.meta.url);

const CALLS = numArg('calls', 3000);
const TOKENS = numArg('tokens', 32768);
const AGAINST = strArg('against', 'HEAD');
const ONLY = strArg('only', '');
const BS = 16;
const SEED = 1337n;

type Hasher = typeof here.hashBlocksWasm;

/** The other commit's WebAssembly hasher, loaded from a temporary copy of its two files. */
async function against(commit: string): Promise<Hasher> {
  const repo = fileURLToPath(new URL('..', import.meta.url));
  const dir = mkdtempSync(join(tmpdir(), 'kvroute-hash-ab-'));
  for (const f of ['blocks.ts', 'xxh3-blocks.wasm.ts']) {
    writeFileSync(join(dir, f), execFileSync('git', ['show', `${commit}:src/core/wasm/${f}`], { cwd: repo }));
  }
  const mod = (await import(pathToFileURL(join(dir, 'blocks.ts')).href)) as typeof here;
  return mod.hashBlocksWasm;
}

// bench:route's prompts: 16 families of TOKENS tokens; a prompt is a family's prefix plus a fresh 1,024-token turn.
const families = Array.from({ length: 16 }, (_, f) => Array.from({ length: TOKENS }, (_, i) => (f * 7_919 + i * 31) % 151_000));
const prompt = (i: number) =>
  families[i % families.length].slice(0, TOKENS - 1024).concat(Array.from({ length: 1024 }, (_, j) => (i * 1_003 + j) % 151_000));

/** One request's hashes as route() makes them (computeSeqHashes: a fresh output array). */
function hashWith(fn: Hasher, tokens: number[]): BigUint64Array {
  const out = new BigUint64Array(Math.floor(tokens.length / BS));
  fn({ tokens, blockSize: BS, seed: SEED, outSeq: out });
  return out;
}

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const us = (x: number) => (x * 1000).toFixed(1);

if (ONLY) {
  const fn = ONLY === 'this' ? here.hashBlocksWasm : ONLY === 'against' ? await against(AGAINST) : null;
  // Prompts built once (the instructions of building them, and the collections they cause, would dwarf the hash's).
  const prompts = Array.from({ length: 32 }, (_, i) => prompt(i));
  let sink = 0n;
  for (let i = 0; i < CALLS; i++) if (fn) sink ^= hashWith(fn, prompts[i % prompts.length])[0];
  console.log(`bench:hash-ab --only ${ONLY}: ${CALLS} calls (${sink})`);
} else {
  const other = await against(AGAINST);
  const times: Record<'this' | 'against', number[]> = { this: [], against: [] };
  const WARMUP = 200;
  const load = loadavg()[0];
  for (let i = 0; i < CALLS + WARMUP; i++) {
    // Alternate which side goes first; each side hashes a prompt built just before its call.
    const order: ('this' | 'against')[] = i % 2 === 0 ? ['this', 'against'] : ['against', 'this'];
    const results: BigUint64Array[] = [];
    for (const side of order) {
      const p = prompt(i);
      const t0 = performance.now();
      results.push(hashWith(side === 'this' ? here.hashBlocksWasm : other, p));
      const t1 = performance.now();
      if (i >= WARMUP) times[side].push(t1 - t0);
    }
    const [a, b] = results;
    for (let k = 0; k < a.length; k++) if (a[k] !== b[k]) throw new Error(`call ${i}: the sides differ at block ${k}`);
  }
  console.log(
    `bench:hash-ab  ${TOKENS}-token plain-array prompts (${TOKENS / BS} blocks of ${BS}), ${CALLS} calls a side, interleaved, ` +
      `node ${process.version}, load average ${load.toFixed(1)} -> ${loadavg()[0].toFixed(1)}; hashes identical on every call`,
  );
  console.log('side                 p50 us   p90 us   p99 us');
  for (const side of ['against', 'this'] as const) {
    const name = side === 'this' ? 'this tree' : AGAINST;
    const xs = times[side];
    console.log(`${name.padEnd(18)} ${us(pct(xs, 50)).padStart(8)} ${us(pct(xs, 90)).padStart(8)} ${us(pct(xs, 99)).padStart(8)}`);
  }
}
