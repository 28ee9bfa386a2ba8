/**
 * Index benchmark workload: a Mooncake trace expanded to 16-token router blocks, routed to N sources whose per-worker
 * LRU caches emit Stored/Removed events. Everything here runs before timing starts; the result is a compact plan
 * (typed arrays of block keys) that is turned into `KvEvent` objects chunk by chunk, so the event stream never has to
 * hold hundreds of MB of tokens at once.
 *
 * Block key = hashId * 32 + j: the j-th 16-token block of the 512-token trace block `hashId`. Because a trace hash id
 * names a block together with everything before it, a key names a whole prefix, like the router's sequence hash.
 */
import { readFileSync } from 'node:fs';
import { gunzipSync } from 'node:zlib';
import { BASE_SEED, hashBlocksInto } from '../../src/core/hashing.ts';
import type { KvEvent } from '../../src/core/types.ts';

export const TRACE_BLOCK = 512;
export const BLOCK = 16;
export const PER_ID = TRACE_BLOCK / BLOCK;
const VOCAB = 151_936;

export interface TraceRequest {
  readonly inputLength: number;
  readonly hashIds: readonly number[];
}

/** Reads a JSONL trace, plain or gzip (the committed data/traces/*.jsonl.gz), recognised by gzip's magic bytes. */
export function loadTrace(path: string): TraceRequest[] {
  const out: TraceRequest[] = [];
  const raw = readFileSync(path);
  const text = raw[0] === 0x1f && raw[1] === 0x8b ? gunzipSync(raw).toString('utf8') : raw.toString('utf8');
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    const r = JSON.parse(line) as { input_length: number; hash_ids: number[] };
    out.push({ inputLength: r.input_length, hashIds: r.hash_ids });
  }
  return out;
}

function fmix32(x: number): number {
  x ^= x >>> 16;
  x = Math.imul(x, 0x85ebca6b);
  x ^= x >>> 13;
  x = Math.imul(x, 0xc2b2ae35);
  return (x ^ (x >>> 16)) >>> 0;
}

/** Deterministic pseudo-tokens of block `key` (a counter-based PRNG keyed by the block key and position). */
export function blockTokens(key: number, out: Uint32Array, at: number): void {
  const base = Math.imul(key, 0x9e3779b1);
  for (let p = 0; p < BLOCK; p++) out[at + p] = fmix32(base ^ Math.imul(p + 0x632be5ab, 0x27d4eb2f)) % VOCAB;
}

/** Growable Int32 list (the plan holds tens of millions of keys; JS arrays of numbers would double that). */
class IntList {
  data = new Int32Array(1 << 16);
  length = 0;
  push(v: number): void {
    if (this.length === this.data.length) {
      const next = new Int32Array(this.data.length * 2);
      next.set(this.data);
      this.data = next;
    }
    this.data[this.length++] = v;
  }
  trim(): Int32Array {
    return this.data.slice(0, this.length);
  }
}

export interface Workload {
  readonly sources: number;
  readonly capacityPerSource: number;
  /** Router blocks of every request, flattened; request r is keys[reqStart[r] .. reqStart[r+1]). */
  readonly reqKeys: Int32Array;
  readonly reqStart: Int32Array;
  readonly reqSource: Int32Array;
  /** Per key: the router's sequence hash and the engine's block id (a different hash chain). */
  readonly seqOf: BigUint64Array;
  readonly engineIdOf: BigUint64Array;
  /** Events: kind (0 stored, 1 removed), source, parent key (-1: none), keys[evStart[e] .. evStart[e+1]). */
  readonly evKind: Uint8Array;
  readonly evSource: Int32Array;
  readonly evParent: Int32Array;
  readonly evStart: Int32Array;
  readonly evKeys: Int32Array;
  readonly storedBlocks: number;
  readonly removedBlocks: number;
  /** (block, source) pairs cached by the simulated engines at the end: what an exact index must hold. */
  readonly finalPairs: number;
  readonly distinctFinalBlocks: number;
  /** Requests appended to the trace (the 128k-token probe), by request number. */
  readonly probeRequests: readonly number[];
}

export interface WorkloadOptions {
  readonly sources: number;
  readonly capacityPerSource: number;
  /** Extra requests of exactly this many tokens appended after the trace, extending its longest prompt. */
  readonly longProbeTokens: number;
  /** Sources the long probe is sent to (it becomes a fully resident 128k-token prefix on each). */
  readonly longProbeSources: readonly number[];
}

/**
 * Expands the trace and simulates the engines. Routing: round-robin in trace order (request r goes to source
 * r mod N): no prefix affinity, so the caches churn and few blocks are shared — the harder case for index memory.
 */
export function buildWorkload(trace: readonly TraceRequest[], opt: WorkloadOptions): Workload {
  let maxId = 0;
  let longest = 0;
  for (let r = 0; r < trace.length; r++) {
    for (const h of trace[r].hashIds) if (h > maxId) maxId = h;
    if (trace[r].inputLength > trace[longest].inputLength) longest = r;
  }
  // The long probe: the longest trace prompt, completed with fresh 512-token ids up to longProbeTokens.
  const probeIds = trace[longest].hashIds.slice();
  let nextId = maxId + 1;
  while (probeIds.length * TRACE_BLOCK < opt.longProbeTokens) probeIds.push(nextId++);
  const requests: TraceRequest[] = trace.slice();
  const probeRequests: number[] = [];
  for (let i = 0; i < opt.longProbeSources.length; i++) {
    probeRequests.push(requests.length);
    requests.push({ inputLength: opt.longProbeTokens, hashIds: probeIds });
  }
  const keySpace = nextId * PER_ID;

  // Flatten router blocks (full 16-token blocks only; the last 512-block is cut to input_length).
  const keys = new IntList();
  const reqStart = new Int32Array(requests.length + 1);
  const reqSource = new Int32Array(requests.length);
  for (let r = 0; r < requests.length; r++) {
    reqStart[r] = keys.length;
    const { inputLength, hashIds } = requests[r];
    const blocks = Math.min(Math.floor(inputLength / BLOCK), hashIds.length * PER_ID);
    for (let i = 0; i < blocks; i++) keys.push(hashIds[i >>> 5] * PER_ID + (i & 31));
    const p = probeRequests.indexOf(r);
    reqSource[r] = p >= 0 ? opt.longProbeSources[p] : r % opt.sources;
  }
  reqStart[requests.length] = keys.length;
  const reqKeys = keys.trim();

  // Router sequence hashes and engine ids per key, hashing each prefix once (batched per request).
  const seqOf = new BigUint64Array(keySpace);
  const engineIdOf = new BigUint64Array(keySpace);
  const eid32 = new Uint32Array(engineIdOf.buffer);
  const known = new Uint8Array(keySpace);
  let tokens = new Uint32Array(BLOCK * 1024);
  let out = new BigUint64Array(1024);
  for (let r = 0; r < requests.length; r++) {
    const a = reqStart[r];
    const b = reqStart[r + 1];
    let i = a;
    while (i < b && known[reqKeys[i]]) i++;
    if (i === b) continue;
    const n = b - i;
    if (tokens.length < n * BLOCK) tokens = new Uint32Array(n * BLOCK * 2);
    if (out.length < n) out = new BigUint64Array(n * 2);
    for (let k = 0; k < n; k++) blockTokens(reqKeys[i + k], tokens, k * BLOCK);
    hashBlocksInto({
      tokens,
      from: 0,
      count: n * BLOCK,
      blockSize: BLOCK,
      seed: BASE_SEED,
      parentSeq: i > a ? seqOf[reqKeys[i - 1]] : null,
      outSeq: out,
      outOffset: 0,
    });
    let pLo = i > a ? eid32[2 * reqKeys[i - 1]] : 0x2545f491;
    let pHi = i > a ? eid32[2 * reqKeys[i - 1] + 1] : 0x4f6cdd1d;
    for (let k = 0; k < n; k++) {
      const key = reqKeys[i + k];
      // Engine ids: a 64-bit chain over (parent id, key), unrelated to the router's xxh3 chain.
      const lo = fmix32(pLo ^ Math.imul(key, 0xcc9e2d51) ^ 0x1b873593);
      const hi = fmix32((pHi + Math.imul(lo ^ key, 0x85ebca77)) | 0);
      if (!known[key]) {
        seqOf[key] = out[k];
        eid32[2 * key] = lo;
        eid32[2 * key + 1] = hi;
        known[key] = 1;
      }
      pLo = eid32[2 * key];
      pHi = eid32[2 * key + 1];
    }
  }

  // Per-worker LRU caches (a Map's insertion order is its recency order), emitting events.
  const caches: Map<number, 1>[] = Array.from({ length: opt.sources }, () => new Map());
  const evKind = new IntList();
  const evSource = new IntList();
  const evParent = new IntList();
  const evStart = new IntList();
  const evKeys = new IntList();
  let storedBlocks = 0;
  let removedBlocks = 0;
  let present = new Uint8Array(8192);
  for (let r = 0; r < requests.length; r++) {
    const s = reqSource[r];
    const cache = caches[s];
    const a = reqStart[r];
    const n = reqStart[r + 1] - a;
    if (n > opt.capacityPerSource) throw new Error(`request ${r} has ${n} blocks, more than a cache holds (${opt.capacityPerSource})`);
    if (present.length < n) present = new Uint8Array(n);
    let fresh = 0;
    for (let k = 0; k < n; k++) {
      const key = reqKeys[a + k];
      if (cache.delete(key)) {
        cache.set(key, 1);
        present[k] = 1;
      } else {
        present[k] = 0;
        fresh++;
      }
    }
    // Evict before storing; this request's blocks were just touched, so they are not at the LRU end.
    const evict = cache.size + fresh - opt.capacityPerSource;
    if (evict > 0) {
      evKind.push(1);
      evSource.push(s);
      evParent.push(-1);
      evStart.push(evKeys.length);
      let left = evict;
      for (const key of cache.keys()) {
        if (left-- === 0) break;
        evKeys.push(key);
      }
      for (let e = evKeys.length - evict; e < evKeys.length; e++) cache.delete(evKeys.data[e]);
      removedBlocks += evict;
    }
    // One Stored event per run of new blocks, its parent the block before the run (cached by now).
    let k = 0;
    while (k < n) {
      if (present[k]) {
        k++;
        continue;
      }
      evKind.push(0);
      evSource.push(s);
      evParent.push(k > 0 ? reqKeys[a + k - 1] : -1);
      evStart.push(evKeys.length);
      while (k < n && !present[k]) {
        const key = reqKeys[a + k];
        evKeys.push(key);
        cache.set(key, 1);
        storedBlocks++;
        k++;
      }
    }
  }
  evStart.push(evKeys.length);
  let finalPairs = 0;
  const distinct = new Set<number>();
  for (const c of caches) {
    finalPairs += c.size;
    for (const key of c.keys()) distinct.add(key);
  }
  return {
    sources: opt.sources,
    capacityPerSource: opt.capacityPerSource,
    reqKeys,
    reqStart,
    reqSource,
    seqOf,
    engineIdOf,
    evKind: Uint8Array.from(evKind.trim()),
    evSource: evSource.trim(),
    evParent: evParent.trim(),
    evStart: evStart.trim(),
    evKeys: evKeys.trim(),
    storedBlocks,
    removedBlocks,
    finalPairs,
    distinctFinalBlocks: distinct.size,
    probeRequests,
  };
}

export interface SourcedEvent {
  readonly source: number;
  readonly event: KvEvent;
}

/**
 * KvEvent objects for events [from, to): Stored events carry either the tokens of the new blocks only (the router
 * hashes them) or the router's precomputed `seqHashes`.
 */
export function materialize(w: Workload, from: number, to: number, withTokens: boolean): SourcedEvent[] {
  const out: SourcedEvent[] = [];
  for (let e = from; e < to; e++) {
    const a = w.evStart[e];
    const b = w.evStart[e + 1];
    const engineIds: bigint[] = new Array(b - a);
    for (let i = a; i < b; i++) engineIds[i - a] = w.engineIdOf[w.evKeys[i]];
    if (w.evKind[e] === 1) {
      out.push({ source: w.evSource[e], event: { kind: 'removed', engineIds } });
      continue;
    }
    const parentKey = w.evParent[e];
    const parent = parentKey < 0 ? null : w.engineIdOf[parentKey];
    if (withTokens) {
      const tokens = new Uint32Array((b - a) * BLOCK);
      for (let i = a; i < b; i++) blockTokens(w.evKeys[i], tokens, (i - a) * BLOCK);
      out.push({ source: w.evSource[e], event: { kind: 'stored', parent, engineIds, tokens, blockSize: BLOCK } });
    } else {
      const seqHashes = new BigUint64Array(b - a);
      for (let i = a; i < b; i++) seqHashes[i - a] = w.seqOf[w.evKeys[i]];
      out.push({ source: w.evSource[e], event: { kind: 'stored', parent, engineIds, tokens: null, blockSize: BLOCK, seqHashes } });
    }
  }
  return out;
}

/** Splits the event stream into chunks of about `blocks` block events each. */
export function chunkBounds(w: Workload, blocks: number): number[] {
  const bounds = [0];
  const events = w.evKind.length;
  let acc = 0;
  for (let e = 0; e < events; e++) {
    acc += w.evStart[e + 1] - w.evStart[e];
    if (acc >= blocks) {
      bounds.push(e + 1);
      acc = 0;
    }
  }
  if (bounds[bounds.length - 1] !== events) bounds.push(events);
  return bounds;
}

/** The router's sequence hashes of request r's first `blocks` blocks. */
export function requestSeqHashes(w: Workload, r: number, blocks = Infinity): BigUint64Array {
  const a = w.reqStart[r];
  const n = Math.min(blocks, w.reqStart[r + 1] - a);
  const out = new BigUint64Array(n);
  for (let i = 0; i < n; i++) out[i] = w.seqOf[w.reqKeys[a + i]];
  return out;
}
