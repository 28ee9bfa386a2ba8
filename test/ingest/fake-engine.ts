/**
 * A small engine cache model for ingestion tests: prompts sharing prefixes are cached block by block (engine ids are
 * random u64s, often >= 2^63), blocks are evicted, caches are reset; every step becomes one vLLM batch with a seq.
 * `truth()` is the set of router hashes the engine holds: what a correct index must hold for this source.
 */
import { computeSeqHashes, hashSeed } from '../../src/core/hashing.ts';
import { encodeVllmBatch, vllmFrames, type HashType, type WireEvent, type WireFormat } from '../../src/engines/vllm/events.ts';
import { xxh3 } from '@node-rs/xxhash';

import { createRng } from '../../src/core/rng.ts';
import { REPLAY_END_SEQ } from '../../src/engines/common.ts';

export const mulberry32 = createRng;

interface Block {
  routerHash: bigint;
  parent: bigint | null;
  children: number;
}

export interface FakeEngineOptions {
  blockSize: number;
  capacity: number;
  format: WireFormat;
  hashType: HashType;
  seed: number;
  salts?: boolean;
  /** Batches kept for replay (vLLM buffer_steps). */
  buffer?: number;
}

export class FakeEngine {
  seq = 0n;
  private readonly rnd: () => number;
  private readonly blocks = new Map<bigint, Block>();
  /** prefix key (router hash) -> engine id, so identical prefixes are cached once, like vLLM. */
  private readonly byRouterHash = new Map<bigint, bigint>();
  private readonly prefixes: number[][];
  readonly history = new Map<bigint, Buffer>();

  constructor(readonly o: FakeEngineOptions) {
    this.rnd = mulberry32(o.seed);
    this.prefixes = Array.from({ length: 4 }, (_, p) => Array.from({ length: o.blockSize * (2 + p) }, (_, i) => 1000 * (p + 1) + i));
  }

  private randomId(): bigint {
    const hi = BigInt(Math.floor(this.rnd() * 2 ** 32));
    const lo = BigInt(Math.floor(this.rnd() * 2 ** 32));
    return (hi << 32n) | lo;
  }

  private wireId(id: bigint): bigint | Uint8Array {
    return id;
  }

  /** One engine step: cache a prompt (sometimes evict, rarely reset). */
  step(): WireEvent[] {
    const bs = this.o.blockSize;
    const events: WireEvent[] = [];
    if (this.rnd() < 0.01) {
      this.blocks.clear();
      this.byRouterHash.clear();
      return [{ type: 'AllBlocksCleared' }];
    }
    const prefix = this.prefixes[Math.floor(this.rnd() * this.prefixes.length)];
    const extra = Math.floor(this.rnd() * 4) * bs + Math.floor(this.rnd() * bs);
    const tokens = prefix.concat(Array.from({ length: extra }, () => Math.floor(this.rnd() * 150000)));
    const salt = this.o.salts && this.rnd() < 0.3 ? `tenant-${Math.floor(this.rnd() * 3)}` : null;
    const hashes = computeSeqHashes(tokens, bs, hashSeed(null, salt));
    let parent: bigint | null = null;
    let i = 0;
    for (; i < hashes.length; i++) {
      const id = this.byRouterHash.get(hashes[i]);
      if (id === undefined) break;
      parent = id;
    }
    if (i < hashes.length) {
      const ids: bigint[] = [];
      for (let j = i; j < hashes.length; j++) {
        const id = this.randomId();
        ids.push(id);
        this.blocks.set(id, { routerHash: hashes[j], parent: j === i ? parent : ids[ids.length - 2], children: 0 });
        const p = j === i ? parent : ids[ids.length - 2];
        if (p !== null) this.blocks.get(p)!.children++;
        this.byRouterHash.set(hashes[j], id);
      }
      events.push({
        type: 'BlockStored',
        blockHashes: ids.map((x) => this.wireId(x)),
        parentBlockHash: parent === null ? null : this.wireId(parent),
        tokenIds: tokens.slice(i * bs, hashes.length * bs),
        blockSize: bs,
        medium: 'GPU',
        extraKeys: salt !== null && i === 0 ? ids.map((_, k) => (k === 0 ? [salt] : null)) : undefined,
      });
    }
    // Evict leaves over capacity.
    const evicted: bigint[] = [];
    while (this.blocks.size > this.o.capacity) {
      let victim: bigint | null = null;
      for (const [id, b] of this.blocks) {
        if (b.children === 0 && this.rnd() < 0.5) {
          victim = id;
          break;
        }
      }
      if (victim === null) continue;
      const b = this.blocks.get(victim)!;
      this.blocks.delete(victim);
      this.byRouterHash.delete(b.routerHash);
      if (b.parent !== null) {
        const p = this.blocks.get(b.parent);
        if (p) p.children--;
      }
      evicted.push(victim);
    }
    if (evicted.length > 0) events.push({ type: 'BlockRemoved', blockHashes: evicted.map((x) => this.wireId(x)), medium: 'GPU' });
    return events;
  }

  /** Runs one step and returns its ZMQ frames (recorded for replay). */
  publish(topic = 'kv-events'): [Buffer, Buffer, Buffer] {
    const payload = encodeVllmBatch({ ts: 1_789_000_000 + Number(this.seq) / 100, events: this.step(), dataParallelRank: 0 }, this.o);
    const seq = this.seq++;
    this.history.set(seq, payload);
    const keep = BigInt(this.o.buffer ?? 10_000);
    if (seq >= keep) this.history.delete(seq - keep);
    return vllmFrames(topic, seq, payload);
  }

  /**
   * The replay ROUTER's answer to one request (vLLM's reply frames, without the identity): every buffered batch from
   * the 8-byte big-endian seq `start` on, then the end marker (seq REPLAY_END_SEQ, empty payload).
   */
  *replayFrom(start: Buffer): Generator<[Buffer, Buffer, Buffer]> {
    // Lazily: a batch published while the reply is being sent is part of it, as from a live engine.
    for (let s = start.readBigUInt64BE(0); s < this.seq; s++) {
      const p = this.history.get(s);
      if (!p) continue;
      const seq = Buffer.alloc(8);
      seq.writeBigUInt64BE(s);
      yield [Buffer.alloc(0), seq, p];
    }
    const end = Buffer.alloc(8);
    end.writeBigUInt64BE(REPLAY_END_SEQ);
    yield [Buffer.alloc(0), end, Buffer.alloc(0)];
  }

  /** A restarted engine process: empty cache, seq from 0, empty replay buffer. */
  restart(): void {
    this.blocks.clear();
    this.byRouterHash.clear();
    this.history.clear();
    this.seq = 0n;
  }

  /** Router hashes of the blocks the engine holds. */
  truth(): Set<bigint> {
    return new Set([...this.blocks.values()].map((b) => b.routerHash));
  }

  /** Engine ids the router will key (bytes ids are folded like the decoder does). */
  static keyOf(id: bigint, hashType: HashType): bigint {
    if (hashType !== 'bytes') return id;
    const b = Buffer.alloc(8);
    b.writeBigUInt64BE(id);
    return xxh3.xxh64(b, 0n);
  }
}
