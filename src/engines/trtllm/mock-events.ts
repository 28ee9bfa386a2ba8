/**
 * The mock engine's KV events as TensorRT-LLM publishes them (`kvroute mocker --event-format trtllm`): kept in a
 * bounded buffer per engine and drained by `POST /kv_cache_events` as trtllm-serve does (./events.ts has the format).
 * Each rank numbers its events from 0 (event_id) and starts with a `created` event; with more than one rank every event
 * carries its `attention_dp_rank`. A full buffer drops its oldest events (the router sees the gap in the ids). Blocks
 * carry the newer releases' per-block `cache_salt`, and `mm_keys` for the multimodal items they overlap: the item's
 * hash (the hex of a `sha256:` identifier, else the sha256 of the identifier, which no router can read back, as with
 * a real engine's hash) and TensorRT-LLM's start_offset (how far into the item the block starts, 0 when it starts
 * inside the block).
 */
import { createHash } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import type { MmBlockKey } from '../../core/types.ts';
import { encodeTrtllmEvents, type TrtllmEvent } from './events.ts';

/** What the mock engine announces (structurally the mock engine's EngineEvent). */
export type MockEngineEvent =
  | {
      readonly kind: 'stored';
      readonly parent: bigint | null;
      readonly engineIds: readonly bigint[];
      readonly tokens: readonly number[];
      readonly loraName: string | null;
      readonly loraId: number | null;
      readonly cacheSalt: string | null;
      readonly mmKeys?: readonly (readonly MmBlockKey[] | null)[];
    }
  | { readonly kind: 'removed'; readonly engineIds: readonly bigint[] };

/** A router multimodal key as TensorRT-LLM's mm_key. */
function mmKey([identifier, offset]: MmBlockKey): { type: 'mm_key'; hash: string; start_offset: number } {
  const hash = identifier.startsWith('sha256:') ? identifier.slice(7) : createHash('sha256').update(identifier).digest('hex');
  return { type: 'mm_key', hash, start_offset: Math.max(0, -offset) };
}

export interface TrtllmEventOptions {
  readonly ranks: number;
  readonly blockSize: number;
  /** KV blocks per rank, for the `created` event. */
  readonly capacityBlocks: number;
  /** Attention window announced on every event (the model's max sequence length). Default 4096. */
  readonly windowSize?: number;
  /** Events kept between drains (TensorRT-LLM's event_buffer_max_size). Default 10,000. */
  readonly bufferEvents?: number;
}

export class TrtllmEventBuffer {
  private nextId: number[];
  private buffer: TrtllmEvent[] = [];
  dropped = 0;

  constructor(private readonly o: TrtllmEventOptions) {
    this.nextId = Array.from({ length: o.ranks }, () => 0);
    this.reset();
  }

  /** An engine (re)start: ids from 0, one `created` event per rank. */
  reset(): void {
    this.nextId = this.nextId.map(() => 0);
    this.buffer = [];
    for (let r = 0; r < this.o.ranks; r++) this.add(r, { type: 'created', numBlocksPerCacheLevel: [this.o.capacityBlocks, 0] });
  }

  private add(rank: number, data: TrtllmEvent['data']): void {
    const ev: TrtllmEvent = {
      eventId: this.nextId[rank]++,
      data,
      windowSize: this.o.windowSize ?? 4096,
      ...(this.o.ranks > 1 ? { attentionDpRank: rank } : {}),
    };
    this.buffer.push(ev);
    const cap = this.o.bufferEvents ?? 10_000;
    if (this.buffer.length > cap) {
      this.dropped += this.buffer.length - cap;
      this.buffer.splice(0, this.buffer.length - cap);
    }
  }

  /** One engine step's events of a rank. */
  publish(rank: number, events: readonly MockEngineEvent[]): void {
    const bs = this.o.blockSize;
    for (const e of events) {
      if (e.kind === 'removed') {
        this.add(rank, { type: 'removed', blockHashes: [...e.engineIds] });
        continue;
      }
      this.add(rank, {
        type: 'stored',
        parentHash: e.parent,
        blocks: e.engineIds.map((h, j) => ({
          blockHash: h,
          tokens: e.tokens.slice(j * bs, (j + 1) * bs),
          loraId: e.loraId,
          cacheLevel: 0,
          priority: 35,
          ...(e.cacheSalt !== null ? { cacheSalt: e.cacheSalt } : {}),
          ...(e.mmKeys?.[j] ? { mmKeys: e.mmKeys[j]!.map(mmKey) } : {}),
        })),
        ...(e.loraName !== null ? { loraName: e.loraName } : {}),
      });
    }
  }

  /** POST /kv_cache_events: everything buffered, oldest first, and the buffer empties. */
  drain(res: ServerResponse): void {
    const events = this.buffer;
    this.buffer = [];
    const body = encodeTrtllmEvents(events);
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  }
}
