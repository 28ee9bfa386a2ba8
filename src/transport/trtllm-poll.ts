/**
 * TensorRT-LLM's KV events over HTTP: `trtllm-serve` buffers the executor's events and `POST /kv_cache_events` drains
 * the buffer as a JSON list (docs/engines.md). This shell polls it every `intervalMs`, decodes each event
 * (src/engines/trtllm.ts, one decoder per attention-DP rank) and hands it to that rank's `SourceIngest` under its
 * `event_id`: the ids are consecutive per rank, so the sequence tracker sees a lost event (the engine's buffer
 * overflowed between polls) as a gap and a restart as ids going backwards. There is no replay: a gap clears the source
 * (degraded, `gap_without_replay`) and its decoder's block state, and the source is relearnt from the events after it;
 * a restart clears it whole (healed: the new process's cache starts empty).
 */
import { type Dispatcher, request } from 'undici';
import { parseTrtllmEvents, TrtllmDecoder } from '../engines/trtllm/events.ts';
import type { SourceHealth } from '../ingest/health.ts';
import type { SourceIngest } from '../ingest/source-ingest.ts';
import type { LogSink } from '../log.ts';

export interface TrtllmPollOptions {
  /** The worker's base URL (its OpenAI server); events come from `${url}/kv_cache_events`. */
  readonly url: string;
  /** One ingest per attention-DP rank, by rank. */
  readonly ingests: ReadonlyMap<number, SourceIngest>;
  readonly routerBlockSize: number;
  readonly log: LogSink;
  /** Poll period, ms. Default 100. */
  readonly intervalMs?: number;
  /** The worker's own connection pool (an h2c worker is polled over HTTP/2); default undici's global dispatcher. */
  readonly dispatcher?: Dispatcher;
  /**
   * Per-poll timeout, ms. Default 5000: trtllm-serve drains its queue with `get_kv_cache_events_async(2)` (NVIDIA/TensorRT-LLM
   * tensorrt_llm/serve/openai_server.py @e7f7345e31e5 `get_kv_cache_events`), a wait
   * of up to 2 s before it answers with what it drained; a poll aborted at that moment loses those events (a gap, so
   * a reset). The headroom keeps an answer that comes at the end of the server's wait.
   */
  readonly timeoutMs?: number;
}

/** The default per-poll timeout: headroom over older servers' 2 s drain wait. */
export const TRTLLM_POLL_TIMEOUT_MS = 5000;

export interface TrtllmPollCounters {
  polls: number;
  pollFailures: number;
  events: number;
  /** Events of a rank this worker does not have (attention_dp_rank beyond dp=). */
  unknownRankEvents: number;
}

export class TrtllmPoll {
  readonly counters: TrtllmPollCounters = { polls: 0, pollFailures: 0, events: 0, unknownRankEvents: 0 };
  private readonly decoders = new Map<number, TrtllmDecoder>();
  private readonly lastId = new Map<number, bigint>();
  private timer: NodeJS.Timeout | null = null;
  private closed = false;
  private running: Promise<void> | null = null;
  private failing = false;

  constructor(private readonly opts: TrtllmPollOptions) {
    for (const rank of opts.ingests.keys()) this.decoders.set(rank, new TrtllmDecoder({ blockSize: opts.routerBlockSize }));
  }

  /** The decoder's counters of one rank with the poll's own (for the source's health). */
  countersOf(rank: number): NonNullable<SourceHealth['trtllm']> | undefined {
    const d = this.decoders.get(rank);
    if (!d) return undefined;
    const { polls, pollFailures, unknownRankEvents } = this.counters;
    return { ...d.counters, polls, pollFailures, unknownRankEvents };
  }

  get endpoint(): string {
    return `${this.opts.url}/kv_cache_events`;
  }

  start(): void {
    this.schedule(0);
  }

  private schedule(ms: number): void {
    if (this.closed) return;
    this.timer = setTimeout(() => {
      this.running = this.pollOnce().finally(() => {
        this.running = null;
        this.schedule(this.opts.intervalMs ?? 100);
      });
    }, ms);
    this.timer.unref();
  }

  /** One poll: drain the engine's buffer and deliver what came. Never throws. */
  async pollOnce(): Promise<void> {
    this.counters.polls++;
    let text: string;
    try {
      const r = await request(this.endpoint, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{}',
        dispatcher: this.opts.dispatcher,
        signal: AbortSignal.timeout(this.opts.timeoutMs ?? TRTLLM_POLL_TIMEOUT_MS),
      });
      text = await r.body.text();
      if (r.statusCode !== 200) throw new Error(`answered ${r.statusCode}: ${text.slice(0, 100)}`);
    } catch (err) {
      this.counters.pollFailures++;
      if (!this.failing) this.opts.log.warn({ endpoint: this.endpoint, err: String(err) }, `KV event poll of ${this.endpoint} failed`);
      this.failing = true;
      for (const i of this.opts.ingests.values()) i.setConnected(false);
      return;
    }
    if (this.closed) return;
    if (this.failing) this.opts.log.info({ endpoint: this.endpoint }, `KV event poll of ${this.endpoint} recovered`);
    this.failing = false;
    for (const i of this.opts.ingests.values()) i.setConnected(true);
    this.deliver(text);
  }

  /** Decodes one drained body and feeds the ranks' ingests (exposed for tests). */
  deliver(text: string): void {
    const parsed = parseTrtllmEvents(text);
    if (!parsed.ok) {
      for (const i of this.opts.ingests.values()) i.onBadFrame('undecodable', parsed.error);
      return;
    }
    const first = this.opts.ingests.values().next().value;
    for (let k = 0; k < parsed.malformed; k++) first?.onBadFrame('undecodable', 'a KV cache event without an integer event_id or data');
    for (const ev of parsed.events) {
      const ingest = this.opts.ingests.get(ev.rank);
      const decoder = this.decoders.get(ev.rank);
      if (!ingest || !decoder) {
        this.counters.unknownRankEvents++;
        continue;
      }
      const last = this.lastId.get(ev.rank);
      // Ids going backwards: a new engine process; its window and partial-block state start over. Ids skipping ahead:
      // events were lost (the engine's buffer overflowed between polls); the tracker clears the source (no replay) and
      // the decoder forgets the blocks it knew, so the source is relearnt from the events that follow.
      if (last !== undefined && ev.eventId <= last) decoder.reset();
      else if (last !== undefined && ev.eventId > last + 1n) decoder.forgetBlocks();
      this.lastId.set(ev.rank, ev.eventId);
      this.counters.events++;
      ingest.onBatch(ev.eventId, decoder.decode(ev));
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    await this.running;
  }
}
