/**
 * vLLM's KV events over ZMQ, one set of sockets per data-parallel rank: a PUB socket sending `[topic, seq, payload]`
 * (bound, or connected to a router's SUB), and a ROUTER socket answering replay requests from the last `bufferSteps`
 * batches. Rank r uses port + r for both, as vLLM does.
 */
import * as zmq from 'zeromq';
import { encodeVllmBatch, vllmFrames, type HashType, type WireFormat } from '../engines/vllm/events.ts';
import type { EngineEvent } from './engine/index.ts';
import { toWireEvents } from './events.ts';
import type { MockerStats } from './types.ts';

const END_SEQ = Buffer.from('ffffffffffffffff', 'hex');
const EMPTY = Buffer.alloc(0);

interface TcpEndpoint {
  prefix: string;
  host: string;
  /** null: a free port (`*` or 0). */
  port: number | null;
}

function parseTcp(endpoint: string): TcpEndpoint | null {
  const m = /^(tcp:\/\/)(.+):(\*|\d+)$/.exec(endpoint);
  if (!m) return null;
  const port = m[3] === '*' || m[3] === '0' ? null : Number(m[3]);
  return { prefix: m[1], host: m[2], port };
}

function connectable(endpoint: string): string {
  return endpoint.replace('tcp://0.0.0.0:', 'tcp://127.0.0.1:').replace('tcp://*:', 'tcp://127.0.0.1:');
}

export interface ZmqEndpoints {
  /** KV events PUB endpoint; null disables events. */
  readonly events: string | null;
  /** Connect the PUB instead of binding it. */
  readonly connect: boolean;
  /** Replay ROUTER endpoint; null disables replay; undefined = the default rule (replayEndpointFor). */
  readonly replay: string | null | undefined;
  /** Data-parallel ranks: rank r uses port + r. */
  readonly ranks: number;
  /** The HTTP host, for sockets on a free port when the event endpoint says nothing better. */
  readonly host: string;
}

/**
 * The replay endpoint when none is given: the ports right after the event ports (event port + ranks), so one mocker's
 * ranks never collide with each other (events P..P+N-1, replay P+N..P+2N-1) and mockers whose event ports are 2N apart
 * never collide with each other. 5557 → 5558 for one rank, vLLM's usual pair. A free port when the event port is
 * free-chosen or the PUB connects elsewhere; none when events are disabled (nothing to replay).
 */
export function replayEndpointFor(e: ZmqEndpoints): string | null {
  if (e.replay !== undefined) return e.replay;
  if (e.events === null) return null;
  const tcp = parseTcp(e.events);
  if (e.connect || !tcp) return `tcp://${e.host}:*`;
  if (tcp.port === null) return `${tcp.prefix}${tcp.host}:*`;
  return `${tcp.prefix}${tcp.host}:${tcp.port + e.ranks}`;
}

/** Refuses (before binding anything) event and replay port ranges that overlap on one host: a clear error, not EADDRINUSE. */
function checkNoOverlap(events: string, replay: string, ranks: number): void {
  const a = parseTcp(events);
  const b = parseTcp(replay);
  if (!a || !b || a.port === null || b.port === null) return;
  const anyHost = (h: string) => h === '*' || h === '0.0.0.0';
  if (a.host !== b.host && !anyHost(a.host) && !anyHost(b.host)) return;
  if (a.port < b.port + ranks && b.port < a.port + ranks) {
    const range = (p: number) => (ranks === 1 ? `${p}` : `${p}-${p + ranks - 1}`);
    throw new RangeError(
      `replay ports ${range(b.port)} overlap event ports ${range(a.port)} (rank r uses port + r for both): ` +
        `give a replay endpoint at least ${ranks} ports away, or leave it out (default: event port + ${ranks})`,
    );
  }
}

/** Binds one socket per rank on consecutive ports (rank r on port + r), retrying free bases when the port is dynamic. */
async function bindRanks<T extends zmq.Socket>(make: () => T, endpoint: string, n: number): Promise<{ sockets: T[]; endpoints: string[] }> {
  const tcp = parseTcp(endpoint);
  if (!tcp) {
    if (n !== 1) throw new Error(`data parallelism needs a tcp:// endpoint to offset ports, got ${endpoint}`);
    const s = make();
    await s.bind(endpoint);
    return { sockets: [s], endpoints: [s.lastEndpoint ?? endpoint] };
  }
  for (let attempt = 0; ; attempt++) {
    const sockets: T[] = [];
    try {
      let base = tcp.port;
      for (let r = 0; r < n; r++) {
        const s = make();
        sockets.push(s);
        if (base === null) {
          await s.bind(`${tcp.prefix}${tcp.host}:*`);
          base = Number(/:(\d+)$/.exec(s.lastEndpoint ?? '')![1]);
        } else {
          await s.bind(`${tcp.prefix}${tcp.host}:${base + r}`);
        }
      }
      return { sockets, endpoints: sockets.map((s) => s.lastEndpoint!) };
    } catch (err) {
      for (const s of sockets) s.close();
      if (tcp.port !== null || attempt >= 20) throw err;
    }
  }
}

export interface PublisherOptions {
  readonly endpoints: ZmqEndpoints;
  readonly topic: string;
  readonly format: WireFormat;
  readonly hashType: HashType;
  readonly batchLayout: 'array' | 'map';
  /** Batches kept for replay per rank (vLLM buffer_steps). */
  readonly bufferSteps: number;
  /** The drop fault: true = this batch takes its seq and stays replayable but is not sent. */
  dropBatch(): boolean;
  readonly stats: MockerStats;
}

/** One rank's sockets, sequence and replay buffer. */
class RankChannel {
  pub: zmq.Publisher | null = null;
  replay: zmq.Router | null = null;
  seq = 0n;
  buffer: { seq: bigint; payload: Buffer }[] = [];
  private pubChain: Promise<unknown> = Promise.resolve();

  send(frames: Buffer[], onError: () => void): void {
    const pub = this.pub;
    if (!pub) return;
    // Sends are chained: a Publisher accepts one send at a time.
    this.pubChain = this.pubChain.then(() => pub.send(frames)).catch(onError);
  }
}

export class KvEventPublisher {
  private readonly channels: RankChannel[];
  private pubEndpoints: string[] = [];
  private replayBound: string[] = [];
  private readonly replayEndpoint: string | null;

  constructor(private readonly opts: PublisherOptions) {
    this.channels = Array.from({ length: opts.endpoints.ranks }, () => new RankChannel());
    this.replayEndpoint = replayEndpointFor(opts.endpoints);
    const { events, connect, ranks } = opts.endpoints;
    if (events !== null && !connect && this.replayEndpoint !== null) checkNoOverlap(events, this.replayEndpoint, ranks);
  }

  /** Connectable endpoints (tcp://127.0.0.1:PORT), rank by rank; empty when disabled. */
  get eventEndpoints(): string[] {
    return this.pubEndpoints.map(connectable);
  }

  get replayEndpoints(): string[] {
    return this.replayBound.map(connectable);
  }

  /** Binds (or connects) every socket. The first open resolves free ports; a reopen after a crash reuses them. */
  async open(): Promise<void> {
    const first = this.pubEndpoints.length === 0 && this.replayBound.length === 0;
    const { events, connect, ranks } = this.opts.endpoints;
    const makePub = () => new zmq.Publisher({ linger: 0, sendHighWaterMark: 100_000 });
    if (events !== null) {
      if (connect) {
        const tcp = parseTcp(events);
        if (!tcp || tcp.port === null) throw new Error(`zmqConnect needs a tcp://host:port endpoint, got ${events}`);
        this.pubEndpoints = [];
        for (let i = 0; i < ranks; i++) {
          const s = makePub();
          const target = `${tcp.prefix}${tcp.host}:${tcp.port + i}`;
          s.connect(target);
          this.channels[i].pub = s;
          this.pubEndpoints.push(target);
        }
      } else if (first) {
        const { sockets, endpoints } = await bindRanks(makePub, events, ranks);
        for (const [i, s] of sockets.entries()) this.channels[i].pub = s;
        this.pubEndpoints = endpoints;
      } else {
        for (let i = 0; i < ranks; i++) {
          const s = makePub();
          await s.bind(this.pubEndpoints[i]);
          this.channels[i].pub = s;
        }
      }
    }
    if (this.replayEndpoint !== null) {
      const make = () => new zmq.Router({ linger: 0 });
      if (first) {
        const { sockets, endpoints } = await bindRanks(make, this.replayEndpoint, ranks);
        for (const [i, s] of sockets.entries()) this.channels[i].replay = s;
        this.replayBound = endpoints;
      } else {
        for (let i = 0; i < ranks; i++) {
          const s = make();
          await s.bind(this.replayBound[i]);
          this.channels[i].replay = s;
        }
      }
      for (const c of this.channels) void this.replayLoop(c, c.replay!);
    }
  }

  close(): void {
    for (const c of this.channels) {
      c.pub?.close();
      c.replay?.close();
      c.pub = null;
      c.replay = null;
    }
  }

  /** Forgets what was published: seq back to 0 and an empty replay buffer (an engine restart). */
  reset(): void {
    for (const c of this.channels) {
      c.seq = 0n;
      c.buffer = [];
    }
  }

  /** One engine step's events as one batch: the next seq, kept for replay, sent unless the drop fault takes it. */
  publish(rank: number, events: EngineEvent[]): void {
    const c = this.channels[rank];
    if (events.length === 0 || !c.pub) return;
    const { format, hashType, batchLayout, bufferSteps, stats } = this.opts;
    const payload = encodeVllmBatch(
      { ts: Date.now() / 1000, events: toWireEvents(events, hashType), dataParallelRank: rank },
      { format, hashType, batchLayout },
    );
    const seq = c.seq++;
    c.buffer.push({ seq, payload });
    if (c.buffer.length > bufferSteps) c.buffer.splice(0, c.buffer.length - bufferSteps);
    if (this.opts.dropBatch()) {
      stats.droppedBatches++;
      return;
    }
    stats.publishedBatches++;
    c.send(vllmFrames(this.opts.topic, seq, payload), () => stats.sendErrors++);
  }

  private async replayLoop(c: RankChannel, router: zmq.Router): Promise<void> {
    try {
      for await (const msg of router) {
        this.opts.stats.replayRequests++;
        const id = msg[0];
        // DEALER sends [empty, start_seq]; tolerate a missing empty delimiter.
        const startFrame = msg.length >= 3 ? msg[2] : msg[1];
        if (startFrame?.length !== 8) continue;
        const start = startFrame.readBigUInt64BE(0);
        const snapshot = c.buffer.slice();
        for (const b of snapshot) {
          if (b.seq < start) continue;
          const s = Buffer.alloc(8);
          s.writeBigUInt64BE(b.seq);
          await router.send([id, EMPTY, s, b.payload]);
        }
        await router.send([id, EMPTY, END_SEQ, EMPTY]);
      }
    } catch {
      // The socket was closed (close, die): the loop ends.
    }
  }
}
