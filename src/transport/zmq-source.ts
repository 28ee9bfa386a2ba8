/**
 * Live KV-event subscription of one source (a worker's dp rank) over ZMQ (docs/protocols.md §2).
 *
 * - connect mode: the engine binds (`tcp://*:5557`), we connect a SUB; libzmq reconnects by itself with backoff from
 *   `reconnectInterval` doubling up to `reconnectMaxInterval`, and ZMTP heartbeats drop a dead peer so the reconnect
 *   starts even when the TCP connection hangs silently.
 * - bind mode: we bind one SUB per source and the engine's publisher connects to us (endpoint without `*`). One port per
 *   source: a shared port could not tell the engines apart (the frames carry no engine identity).
 *
 * Each message is checked (3 frames, 8-byte seq) and decoded; decoded batches go to `onBatch` with their seq, frames
 * that cannot be used are counted and reported to `onBadFrame`. Nothing throws out of the receive loop.
 */
import { Subscriber } from 'zeromq';
import type { SourceId } from '../core/types.ts';
import type { DecodedBatch, ZmqWire } from '../engines/common.ts';
import { parseFrames, type BadFrameKind, type WideFrame } from '../ingest/source-ingest.ts';

export interface ZmqSourceOptions {
  readonly source: SourceId;
  /** `tcp://host:port` to connect to, or (bind mode) to bind (`tcp://0.0.0.0:5557`, `tcp://127.0.0.1:*`). */
  readonly endpoint: string;
  readonly mode?: 'connect' | 'bind';
  /** Topic prefix filter; '' (default) receives every topic. */
  readonly topic?: string;
  readonly flavor?: ZmqWire;
  readonly reconnectIntervalMs?: number;
  readonly reconnectMaxIntervalMs?: number;
  /** ZMTP heartbeat interval (0 disables); the peer is dropped after 3 missed intervals. Default 2000. */
  readonly heartbeatMs?: number;
  readonly receiveHighWaterMark?: number;
}

export interface ZmqSourceHandlers {
  /** `wide`: the message came in the wider frame (its publisher epoch, whether it was a heartbeat). */
  onBatch(seq: bigint, batch: DecodedBatch, wide?: WideFrame): void;
  onBadFrame(kind: BadFrameKind, detail: string): void;
  onConnection?(connected: boolean, address: string): void;
}

export interface ZmqSourceCounters {
  messages: number;
  frameCount: number;
  seqLength: number;
  undecodable: number;
  /** Receive calls that failed (the loop restarts after each). */
  receiveErrors: number;
}

/** The endpoint of dp rank `r`: the engine's port + r (docs/protocols.md §2). Leaves `*` ports alone. */
export function rankEndpoint(endpoint: string, dpRank: number): string {
  if (dpRank === 0) return endpoint;
  const m = /^(.*):(\d+)$/.exec(endpoint);
  if (!m) throw new Error(`cannot offset endpoint ${endpoint} for dp rank ${dpRank}: no numeric port`);
  return `${m[1]}:${Number(m[2]) + dpRank}`;
}

export class ZmqSource {
  readonly counters: ZmqSourceCounters = { messages: 0, frameCount: 0, seqLength: 0, undecodable: 0, receiveErrors: 0 };
  private readonly sub: Subscriber;
  private loop: Promise<void> | null = null;
  private closed = false;
  /** The endpoint actually bound (bind mode, resolves `*` ports) or connected to. */
  endpoint: string;

  constructor(
    private readonly opts: ZmqSourceOptions,
    private readonly handlers: ZmqSourceHandlers,
  ) {
    this.endpoint = opts.endpoint;
    this.sub = new Subscriber({
      linger: 0,
      reconnectInterval: opts.reconnectIntervalMs ?? 100,
      reconnectMaxInterval: opts.reconnectMaxIntervalMs ?? 5000,
      heartbeatInterval: opts.heartbeatMs ?? 2000,
      heartbeatTimeout: (opts.heartbeatMs ?? 2000) * 3,
      // Matches vLLM's publisher hwm: a burst must not be dropped on our side (drops become gaps -> replays).
      receiveHighWaterMark: opts.receiveHighWaterMark ?? 100_000,
    });
    const conn = handlers.onConnection;
    if (conn) {
      this.sub.events.on('connect', (e) => conn(true, e.address));
      this.sub.events.on('accept', (e) => conn(true, e.address));
      this.sub.events.on('disconnect', (e) => conn(false, e.address));
    }
  }

  /** Subscribes and starts receiving. Resolves once bound/connecting. */
  async start(): Promise<void> {
    this.sub.subscribe(this.opts.topic ?? '');
    if (this.opts.mode === 'bind') {
      await this.sub.bind(this.opts.endpoint);
      this.endpoint = this.sub.lastEndpoint ?? this.opts.endpoint;
    } else {
      this.sub.connect(this.opts.endpoint);
    }
    this.loop = this.receive();
  }

  private async receive(): Promise<void> {
    // A receive loop that ended silently would be the worst failure (events stop, nobody knows): restart it.
    while (!this.closed) {
      await this.receiveUntilError();
      if (!this.closed) await new Promise((r) => setTimeout(r, 100));
    }
  }

  private async receiveUntilError(): Promise<void> {
    const flavor = this.opts.flavor ?? 'vllm';
    try {
      for await (const frames of this.sub) {
        this.counters.messages++;
        const parsed = parseFrames(frames, flavor);
        if (!parsed.ok) {
          if (parsed.kind === 'frame_count') this.counters.frameCount++;
          else this.counters.seqLength++;
          this.safe(() => this.handlers.onBadFrame(parsed.kind, parsed.detail));
          continue;
        }
        if (!parsed.batch.ok) this.counters.undecodable++;
        const wide = parsed.epoch !== undefined ? { epoch: parsed.epoch, heartbeat: parsed.heartbeat === true } : undefined;
        this.safe(() => this.handlers.onBatch(parsed.seq, parsed.batch, wide));
      }
    } catch (err) {
      if (!this.closed) {
        this.counters.receiveErrors++;
        this.safe(() => this.handlers.onBadFrame('receive_error', `receive failed: ${String(err)}`));
      }
    }
  }

  private safe(fn: () => void): void {
    try {
      fn();
    } catch {
      // Handlers count and log their own failures; the loop must survive them.
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.sub.close();
    await this.loop;
  }
}
