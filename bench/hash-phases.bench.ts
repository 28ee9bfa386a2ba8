/**
 * bench:hash-phases — the hash phase of route() split into its parts, on bench:route's prompts (a family prefix plus a
 * fresh 1,024-token turn, built fresh every call as a plain array): the copy of the prompt into wasm memory, the
 * output array's allocation, the wasm call, the copy of the hashes out. The last `--keep` outputs are kept alive
 * (default 64: bench:route's requests in flight; 2,100 is what bench:route's active load and overlay ring hold, 64 in
 * flight plus 2,000 calls of finished chains). `--out slab:<bytes>` carves the outputs out of shared ArrayBuffers of
 * that size instead of one fresh BigUint64Array each (an alternative measured for issue 29 and not adopted),
 * `--out unsafe` uses Buffer.allocUnsafeSlow (no zero fill), `--out recycled` takes views of keep + 1 buffers allocated
 * and touched before the timed calls, in turn (never one still kept): the steady state of route()'s recycled outputs
 * (src/core/hash-buffers.ts; bench/RESULTS.md, "Issue 29: the hash phase's tail").
 *
 *   npm run bench:hash-phases [-- --calls 4000 --tokens 32768 --keep 64 --out fresh|unsafe|recycled|slab:65536]
 */
import { usage } from '../scripts/usage.ts';
import { loadavg } from 'node:os';
import { performance } from 'node:perf_hooks';
import { instantiateXxh3, WASM_SIMD } from '../src/core/wasm/blocks.ts';

usage(import.meta.url);

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

const CALLS = Number(arg('calls', '4000'));
const TOKENS = Number(arg('tokens', '32768'));
const OUT = arg('out', 'fresh');
const KEEP = Number(arg('keep', '64'));
const SLAB = OUT.startsWith('slab:') ? Number(OUT.slice(5)) : 0;
const BS = 16;
const N = Math.floor(TOKENS / BS);
const WARMUP = 500;

// A private instance of the hasher's build, so the parts can be timed one by one (blocks.ts does them in one call).
const w = instantiateXxh3(WASM_SIMD);
const BASE = (Number(w.__heap_base.value) + 7) & ~7;
const seqPtr = BASE + ((TOKENS * 4 + 7) & ~7);
w.memory.grow(Math.ceil((seqPtr + N * 8) / 65536));
const u32 = new Uint32Array(w.memory.buffer);
const u64 = new BigUint64Array(w.memory.buffer);

const families = Array.from({ length: 16 }, (_, f) => Array.from({ length: TOKENS }, (_, i) => (f * 7_919 + i * 31) % 151_000));
const prompt = (i: number): number[] =>
  families[i % families.length].slice(0, TOKENS - 1024).concat(Array.from({ length: 1024 }, (_, j) => (i * 1_003 + j) % 151_000));

// --out recycled: one more buffer than are kept, so the one handed out is never still kept.
const recycled =
  OUT === 'recycled'
    ? Array.from({ length: KEEP + 1 }, () => {
        const b = new ArrayBuffer(N * 8);
        new Uint8Array(b).fill(1);
        return b;
      })
    : [];
let recycledAt = 0;

let slab = new ArrayBuffer(8);
let slabOff = Number.POSITIVE_INFINITY;
function output(): BigUint64Array {
  if (SLAB > 0) {
    if (slabOff + N * 8 > SLAB) {
      slab = new ArrayBuffer(SLAB);
      slabOff = 0;
    }
    const out = new BigUint64Array(slab, slabOff, N);
    slabOff += N * 8;
    return out;
  }
  if (OUT === 'recycled') {
    const out = new BigUint64Array(recycled[recycledAt], 0, N);
    recycledAt = (recycledAt + 1) % recycled.length;
    return out;
  }
  if (OUT === 'unsafe') {
    const b = Buffer.allocUnsafeSlow(N * 8);
    return new BigUint64Array(b.buffer, b.byteOffset, N);
  }
  return new BigUint64Array(N);
}

const parts = { copy: [] as number[], alloc: [] as number[], wasm: [] as number[], out: [] as number[], all: [] as number[] };
const kept: BigUint64Array[] = [];
for (let i = 0; i < CALLS + WARMUP; i++) {
  const p = prompt(i);
  const t0 = performance.now();
  u32.set(p, BASE / 4);
  const t1 = performance.now();
  const out = output();
  const t2 = performance.now();
  w.hash_blocks(BASE, N, BS, 1337n, 0, 0n, seqPtr, 0);
  const t3 = performance.now();
  out.set(u64.subarray(seqPtr / 8, seqPtr / 8 + N));
  const t4 = performance.now();
  kept.push(out);
  if (kept.length > KEEP) kept.shift();
  if (i >= WARMUP) {
    parts.copy.push(t1 - t0);
    parts.alloc.push(t2 - t1);
    parts.wasm.push(t3 - t2);
    parts.out.push(t4 - t3);
    parts.all.push(t4 - t0);
  }
}

const q = (a: number[], p: number): string => {
  const s = [...a].sort((x, y) => x - y);
  return (s[Math.floor(p * (s.length - 1))] * 1000).toFixed(1);
};
console.log(
  `bench:hash-phases  ${TOKENS} tokens bs ${BS}, ${CALLS} calls, output ${OUT}, ${KEEP} kept, node ${process.version}, load average ${loadavg()[0].toFixed(1)}`,
);
for (const [name, a] of Object.entries(parts))
  console.log(`${name.padEnd(6)} p50 ${q(a, 0.5).padStart(7)} us   p99 ${q(a, 0.99).padStart(7)} us`);
