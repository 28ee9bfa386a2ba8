/**
 * The event ingestion shell: per worker and dp rank a ZMQ subscription (zmq-source), a replay client (replay) and a
 * `SourceIngest` (sequence tracking, annotation, health), delivering normalised `KvEvent[]` to a sink.
 *
 * Independent of the router: the server connects `sink` to `router.applyEvents(sourceKey, events)` and `onReset` to
 * `router.resetSource(sourceKey)` (the source is cold: clear it), and calls `noteRequestRouted(sourceKey)` per routed
 * request so that `health()` can flag blind sources.
 *
 * Timers (unref'd): blind transitions are logged every `blindCheckMs`; a quiet source with a replay endpoint gets one tail
 * probe after `tailProbeMs` (a dropped last batch is otherwise invisible until the engine publishes again).
 */
import { sourceKey, type SourceId } from '../core/types.ts';
import type { ZmqWire } from '../engines/common.ts';
import { replayClient } from './replay.ts';
import { TrtllmPoll, type TrtllmPollOptions } from './trtllm-poll.ts';
import { rankEndpoint, ZmqSource } from './zmq-source.ts';
import type { BlindRule, SourceHealth } from '../ingest/health.ts';
import { SourceIngest, type EventSink, type ResetSink } from '../ingest/source-ingest.ts';
import { consoleLog, type LogSink } from '../log.ts';

export interface EventSourceConfig {
  readonly workerId: string;
  /** Rank 0's event endpoint (`tcp://host:5557`); rank r uses port + r. In bind mode, the address we bind. */
  readonly endpoint: string;
  /** Rank 0's replay endpoint (`tcp://host:5558`); rank r uses port + r. Absent: gaps reset the source. */
  readonly replayEndpoint?: string | null;
  /** Data-parallel ranks of the worker (default 1) or an explicit list of ranks. */
  readonly dpRanks?: number | readonly number[];
  readonly mode?: 'connect' | 'bind';
  readonly topic?: string;
  /** Wire flavour of the ZMQ payloads (TensorRT-LLM's ZMQ publisher sends vLLM's fields: vllm). */
  readonly flavor?: ZmqWire;
}

export interface EventIngestOptions {
  readonly routerBlockSize: number;
  readonly sink: EventSink;
  readonly onReset: ResetSink;
  readonly log?: LogSink;
  readonly replayTimeoutMs?: number;
  readonly maxHeld?: number;
  readonly catchUp?: boolean;
  readonly blind?: BlindRule;
  readonly reconnectIntervalMs?: number;
  readonly reconnectMaxIntervalMs?: number;
  readonly heartbeatMs?: number;
  /** ZMQ receive high-water mark per subscription in messages (default 100,000, vLLM's publisher's): tests lower it. */
  readonly receiveHighWaterMark?: number;
  /** How often blind transitions are checked and logged (ms); 0 disables the timer. Default 5000. */
  readonly blindCheckMs?: number;
  /**
   * A source with a replay endpoint that has been quiet this long (ms) since its last batch is asked once for anything
   * newer, so a dropped last batch is recovered without waiting for the next one. 0 disables. Default 1000.
   */
  readonly tailProbeMs?: number;
  readonly now?: () => number;
}

interface Running {
  readonly ingest: SourceIngest;
  /** The ZMQ subscription, or the HTTP poll shared by a TensorRT-LLM worker's ranks (closed with its last rank). */
  readonly zmq?: ZmqSource;
  readonly poll?: TrtllmPoll;
}

/** A TensorRT-LLM worker whose events are polled from its HTTP server (POST /kv_cache_events). */
export interface PolledSourceConfig {
  readonly workerId: string;
  /** The worker's base URL. */
  readonly url: string;
  readonly dpRanks?: number | readonly number[];
  /** Poll period, ms (default 100). */
  readonly intervalMs?: number;
  /** The worker's connection pool (h2c workers), passed to the poll. */
  readonly dispatcher?: TrtllmPollOptions['dispatcher'];
}

function ranksOf(cfg: EventSourceConfig): number[] {
  const r = cfg.dpRanks ?? 1;
  return typeof r === 'number' ? Array.from({ length: r }, (_, i) => i) : [...r];
}

export class EventIngest {
  private readonly sources = new Map<string, Running>();
  private readonly log: LogSink;
  private readonly blindNow = new Set<string>();
  private blindTimer: NodeJS.Timeout | null = null;
  private probeTimer: NodeJS.Timeout | null = null;

  constructor(private readonly opts: EventIngestOptions) {
    this.log = opts.log ?? consoleLog;
    const every = opts.blindCheckMs ?? 5000;
    if (every > 0) {
      this.blindTimer = setInterval(() => this.checkBlind(), every);
      this.blindTimer.unref();
    }
    const quiet = opts.tailProbeMs ?? 1000;
    if (quiet > 0) {
      this.probeTimer = setInterval(
        () => {
          for (const r of this.sources.values()) r.ingest.maybeProbeTail(quiet);
        },
        Math.max(50, quiet / 4),
      );
      this.probeTimer.unref();
    }
  }

  /** Logs sources that became blind (loudly) or recovered. Returns the keys blind now. */
  checkBlind(): string[] {
    const now: string[] = [];
    for (const h of this.health()) {
      if (h.blind) {
        now.push(h.sourceKey);
        if (!this.blindNow.has(h.sourceKey)) {
          this.blindNow.add(h.sourceKey);
          const silentS = ((this.opts.now ?? Date.now)() - (h.lastEventAtMs ?? h.startedAtMs)) / 1000;
          this.log.error(
            {
              source: h.sourceKey,
              endpoint: h.endpoint,
              requestsSinceLastEvent: h.requestsSinceLastEvent,
              silentSeconds: silentS,
              connected: h.connected,
            },
            `source ${h.sourceKey} is blind: ${h.requestsSinceLastEvent} requests routed to it and no KV event for ${silentS.toFixed(0)} s ` +
              `(check --kv-events-config, the endpoint ${h.endpoint}, and the topic); KV routing to it is guesswork until events resume`,
          );
        }
      } else if (this.blindNow.delete(h.sourceKey)) {
        this.log.info({ source: h.sourceKey }, `source ${h.sourceKey} is no longer blind`);
      }
    }
    return now;
  }

  /** Starts the subscriptions of one worker (all its dp ranks). Returns the source keys. */
  async addWorker(cfg: EventSourceConfig): Promise<string[]> {
    const keys: string[] = [];
    for (const dpRank of ranksOf(cfg)) {
      const source: SourceId = { workerId: cfg.workerId, dpRank };
      const key = sourceKey(source);
      if (this.sources.has(key)) await this.removeSource(key);
      const endpoint = rankEndpoint(cfg.endpoint, dpRank);
      const replayEndpoint = cfg.replayEndpoint ? rankEndpoint(cfg.replayEndpoint, dpRank) : null;
      const ingest = new SourceIngest({
        source,
        flavor: cfg.flavor,
        routerBlockSize: this.opts.routerBlockSize,
        sink: this.opts.sink,
        onReset: this.opts.onReset,
        replay: replayEndpoint ? replayClient(replayEndpoint, { timeoutMs: this.opts.replayTimeoutMs }) : null,
        log: this.log,
        maxHeld: this.opts.maxHeld,
        catchUp: this.opts.catchUp,
        blind: this.opts.blind,
        endpoint,
        mode: cfg.mode ?? 'connect',
        now: this.opts.now,
      });
      const zmq = new ZmqSource(
        {
          source,
          endpoint,
          mode: cfg.mode,
          topic: cfg.topic,
          flavor: cfg.flavor,
          reconnectIntervalMs: this.opts.reconnectIntervalMs,
          reconnectMaxIntervalMs: this.opts.reconnectMaxIntervalMs,
          heartbeatMs: this.opts.heartbeatMs,
          receiveHighWaterMark: this.opts.receiveHighWaterMark,
        },
        {
          onBatch: (seq, batch, wide) => ingest.onBatch(seq, batch, wide),
          onBadFrame: (kind, detail) => ingest.onBadFrame(kind, detail),
          onConnection: (connected) => ingest.setConnected(connected),
        },
      );
      await zmq.start();
      this.sources.set(key, { ingest, zmq });
      this.log.info({ source: key, endpoint: zmq.endpoint, replayEndpoint }, `subscribed to KV events of ${key}`);
      keys.push(key);
    }
    return keys;
  }

  /** Starts polling a TensorRT-LLM worker's `POST /kv_cache_events` (all its attention-DP ranks). Returns the source keys. */
  addPolledWorker(cfg: PolledSourceConfig): string[] {
    const ranks = ranksOf({ workerId: cfg.workerId, endpoint: '', dpRanks: cfg.dpRanks });
    const ingests = new Map<number, SourceIngest>();
    const keys: string[] = [];
    for (const dpRank of ranks) {
      const source: SourceId = { workerId: cfg.workerId, dpRank };
      const key = sourceKey(source);
      if (this.sources.has(key)) void this.removeSource(key);
      ingests.set(
        dpRank,
        new SourceIngest({
          source,
          routerBlockSize: this.opts.routerBlockSize,
          sink: this.opts.sink,
          onReset: this.opts.onReset,
          replay: null,
          log: this.log,
          maxHeld: this.opts.maxHeld,
          blind: this.opts.blind,
          endpoint: `${cfg.url}/kv_cache_events`,
          mode: 'connect',
          now: this.opts.now,
        }),
      );
      keys.push(key);
    }
    const poll = new TrtllmPoll({
      url: cfg.url,
      ingests,
      routerBlockSize: this.opts.routerBlockSize,
      log: this.log,
      intervalMs: cfg.intervalMs,
      dispatcher: cfg.dispatcher,
    });
    for (const [dpRank, ingest] of ingests) this.sources.set(sourceKey({ workerId: cfg.workerId, dpRank }), { ingest, poll });
    poll.start();
    this.log.info({ worker: cfg.workerId, endpoint: poll.endpoint }, `polling KV events of ${cfg.workerId} (TensorRT-LLM)`);
    return keys;
  }

  /** The endpoint a source actually uses (bind mode with port `*` resolves here). */
  endpointOf(key: string): string | undefined {
    const r = this.sources.get(key);
    return r?.zmq?.endpoint ?? r?.poll?.endpoint;
  }

  async removeSource(key: string): Promise<void> {
    const r = this.sources.get(key);
    if (!r) return;
    this.sources.delete(key);
    r.ingest.close();
    if (r.zmq) await r.zmq.close();
    // A poll serves every rank of its worker: it stops with the last of them.
    if (r.poll && ![...this.sources.values()].some((o) => o.poll === r.poll)) await r.poll.close();
  }

  /** Input of the blind rule: the router sent a request to this source. */
  noteRequestRouted(key: string): void {
    this.sources.get(key)?.ingest.noteRequestRouted();
  }

  health(): SourceHealth[] {
    return [...this.sources.values()].map((r) => {
      const h = r.ingest.health();
      const t = r.poll?.countersOf(h.dpRank);
      return t ? { ...h, trtllm: t } : h;
    });
  }

  /** Keys of sources currently blind (configured for events, silent while serving traffic). */
  blindSources(): string[] {
    return this.health()
      .filter((h) => h.blind)
      .map((h) => h.sourceKey);
  }

  async close(): Promise<void> {
    if (this.blindTimer) clearInterval(this.blindTimer);
    if (this.probeTimer) clearInterval(this.probeTimer);
    await Promise.all([...this.sources.keys()].map((k) => this.removeSource(k)));
  }
}
