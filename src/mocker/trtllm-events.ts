/**
 * The mock engine's KV events as TensorRT-LLM publishes them (`--event-format trtllm`): kept in a bounded buffer per
 * engine and drained by `POST /kv_cache_events` as trtllm-serve does (src/engines/trtllm.ts has the format). Each rank
 * numbers its events from 0 (event_id) and starts with a `created` event; with more than one rank every event carries
 * its `attention_dp_rank`. A full buffer drops its oldest events (the router sees the gap in the ids).
 */
import type { ServerResponse } from 'node:http';
import { encodeTrtllmEvents, type TrtllmEvent } from '../engines/trtllm.ts';
import type { EngineEvent } from './engine/index.ts';

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
  publish(rank: number, events: readonly EngineEvent[]): void {
    const bs = this.o.blockSize;
    for (const e of events) {
      if (e.kind === 'removed') {
        this.add(rank, { type: 'removed', blockHashes: e.engineIds });
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
        })),
        ...(e.loraName !== null ? { loraName: e.loraName } : {}),
        ...(e.cacheSalt !== null ? { cacheSalt: e.cacheSalt } : {}),
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
