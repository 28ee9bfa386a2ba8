/**
 * The mock vLLM engine's shell: an OpenAI-compatible HTTP server, vLLM's KV events over ZMQ (PUB + replay ROUTER),
 * vLLM's Prometheus metrics, and fault injection, around the pure engine model of ./engine/.
 *
 * Time: each data-parallel rank runs its engine on a virtual clock in ms. A step that starts at t lasts
 * durationMs · slowdown (modelled), its outputs and events are delivered after durationMs · slowdown / speedup of wall
 * time, and the next step starts at its modelled end. An idle rank re-syncs its clock to wall time · speedup, so TTFT
 * and latency histograms are in modelled seconds whatever the speedup.
 *
 * Several instances can run in one process: every socket, timer, registry and counter belongs to the instance.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { AddressInfo } from 'node:net';
import * as zmq from 'zeromq';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { encodeVllmBatch, vllmFrames, type HashType, type WireFormat } from '../engines/vllm.ts';
import { EngineInputError, MockEngine, type EngineConfig, type EngineEvent, type RequestOutput, type StepResult } from './engine/index.ts';
import { toWireEvents } from './events.ts';
import { SimpleTokenizer, loadHfTokenizer, type ChatMessage, type MockTokenizer } from './tokenizer.ts';
import { createRng } from '../core/rng.ts';

export interface MockerFaults {
  /** Fraction of event batches not sent on PUB (they still take a seq and stay replayable: a gap to recover). */
  dropEventFraction: number;
  /** Fraction of generation requests answered 500. */
  failRequestFraction: number;
  /** The instance dies (sockets closed, connections dropped) when request N+1 arrives; null = never. */
  dieAfterRequests: number | null;
  /** Steps take this many times longer (modelled time, hence TTFT, and wall time). */
  slowdown: number;
  /** The process stays up but the engine is dead, as vLLM after an engine-core crash: /health and generation answer 503. */
  unhealthy: boolean;
}

export interface MockerOptions {
  /** HTTP port; 0 or absent = a free port. */
  port?: number;
  host?: string;
  /** Served model name. */
  model?: string;
  /** Extra model names served as LoRA adapters: a request naming one runs under that lora_name. */
  loraModules?: string[];
  engine?: Partial<EngineConfig>;
  /** Wall time runs this many times faster than modelled time. */
  speedup?: number;
  /** ZMQ PUB endpoint for KV events (bound); port * or 0 = a free port; null disables events. Rank r binds port + r. */
  zmqEndpoint?: string | null;
  /**
   * Connect the PUB socket(s) to zmqEndpoint (rank r to port + r) instead of binding: what vLLM does when the endpoint
   * has no '*', so a router can bind one SUB and let engines come to it. Default false (bind).
   */
  zmqConnect?: boolean;
  /** ZMQ ROUTER endpoint answering replay requests; null disables replay. Rank r binds port + r. */
  replayEndpoint?: string | null;
  topic?: string;
  eventFormat?: WireFormat;
  hashType?: HashType;
  /** Outer batch layout (vLLM 0.26 sends an array batch). */
  batchLayout?: 'array' | 'map';
  dataParallelSize?: number;
  /** Batches kept for replay per rank (vLLM buffer_steps). */
  bufferSteps?: number;
  /** Directory with tokenizer.json (+ tokenizer_config.json); absent = the deterministic SimpleTokenizer. */
  tokenizer?: string;
  /** Report usage.prompt_tokens_details.cached_tokens (vLLM --enable-prompt-tokens-details). Default true. */
  enablePromptTokensDetails?: boolean;
  /** max_tokens when a request gives none. Default 16. */
  defaultMaxTokens?: number;
  faults?: Partial<MockerFaults>;
  /** Seed of the fault dice. */
  seed?: number;
}

export interface MockerStats {
  requests: number;
  failedRequests: number;
  badRequests: number;
  publishedBatches: number;
  droppedBatches: number;
  replayRequests: number;
  sendErrors: number;
}

export interface MockerHandle {
  readonly url: string;
  readonly port: number;
  /** Rank 0's endpoints in connectable form (tcp://127.0.0.1:PORT); null when disabled. */
  readonly zmqEndpoint: string | null;
  readonly replayEndpoint: string | null;
  readonly zmqEndpoints: string[];
  readonly replayEndpoints: string[];
  /** Rank 0's engine. */
  readonly engine: MockEngine;
  readonly engines: MockEngine[];
  /** Live fault settings (mutable). */
  readonly faults: MockerFaults;
  readonly stats: MockerStats;
  readonly dead: boolean;
  close(): Promise<void>;
  /** Restart in place: in-flight requests dropped, cache and counters cleared, seq back to 0; no AllBlocksCleared. */
  restart(): Promise<void>;
  /** Simulated crash: closes HTTP and ZMQ; restart() brings the instance back on the same ports. */
  die(): Promise<void>;
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type = 'BadRequestError',
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

interface Sink {
  onOutput(o: RequestOutput): void;
  /** Writes what onOutput buffered (one socket write per wake). */
  flush(): void;
  onAbort(): void;
  arrivalMs: number;
}

const MAX_STEPS_PER_WAKE = 4;

/**
 * Process-wide wake pump shared by every mocker instance in the process: ranks whose step is due are served in FIFO
 * order within a CPU budget per event-loop turn; the rest wait for the next turn. Without it, N engines that are all due
 * run in the same turn, and at high speedup (CPU-bound) one turn grows with the fleet size, which is exactly the
 * event-loop delay a many-engine process must avoid. Engine state stays per instance; only the turn is shared.
 */
const TURN_BUDGET_MS = 4;
const dueWakes: (() => void)[] = [];
let pumpScheduled = false;

function enqueueWake(fn: () => void): void {
  dueWakes.push(fn);
  if (!pumpScheduled) {
    pumpScheduled = true;
    setImmediate(pump);
  }
}

function pump(): void {
  pumpScheduled = false;
  const t0 = performance.now();
  // Wakes enqueued while pumping (a rank re-arming itself) run next turn.
  let n = dueWakes.length;
  while (n-- > 0) {
    dueWakes.shift()!();
    if (performance.now() - t0 > TURN_BUDGET_MS) break;
  }
  if (dueWakes.length > 0 && !pumpScheduled) {
    pumpScheduled = true;
    setImmediate(pump);
  }
}

/** The seeded dice (mulberry32), so a run replays. */
const rng = createRng;

const END_SEQ = Buffer.from('ffffffffffffffff', 'hex');
const EMPTY = Buffer.alloc(0);

/** One data-parallel rank: an engine, its clock, its event sockets and replay buffer. */
class Rank {
  readonly sinks = new Map<string, Sink>();
  pub: zmq.Publisher | null = null;
  replay: zmq.Router | null = null;
  seq = 0n;
  buffer: { seq: bigint; payload: Buffer }[] = [];
  inFlight = false;
  idle = true;
  stepStartMs = 0;
  stepEndMs = 0;
  timer: NodeJS.Timeout | null = null;
  /** Bumped by a restart: a wake armed before it must not deliver. */
  generation = 0;
  private pubChain: Promise<unknown> = Promise.resolve();

  constructor(
    readonly rank: number,
    readonly engine: MockEngine,
  ) {}

  sendPub(frames: Buffer[], onError: () => void): void {
    const pub = this.pub;
    if (!pub) return;
    this.pubChain = this.pubChain.then(() => pub.send(frames)).catch(onError);
  }
}

function parseTcp(endpoint: string): { prefix: string; host: string; port: number | null } | null {
  const m = /^(tcp:\/\/)(.+):(\*|\d+)$/.exec(endpoint);
  if (!m) return null;
  const port = m[3] === '*' || m[3] === '0' ? null : Number(m[3]);
  return { prefix: m[1], host: m[2], port };
}

function connectable(endpoint: string): string {
  return endpoint.replace('tcp://0.0.0.0:', 'tcp://127.0.0.1:').replace('tcp://*:', 'tcp://127.0.0.1:');
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

const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560];
const E2E_BUCKETS = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680];

function buildMetrics(reg: Registry, model: string, ranks: Rank[], cfg: EngineConfig) {
  const labelNames = ['model_name', 'engine'] as const;
  const each = (fn: (r: Rank, labels: { model_name: string; engine: string }) => void) => {
    for (const r of ranks) fn(r, { model_name: model, engine: String(r.rank) });
  };
  const counter = (name: string, help: string, pick: (e: MockEngine) => number) =>
    new Counter({
      name,
      help,
      labelNames,
      registers: [reg],
      collect() {
        this.reset();
        each((r, l) => this.inc(l, pick(r.engine)));
      },
    });
  const gauge = (name: string, help: string, pick: (e: MockEngine) => number) =>
    new Gauge({
      name,
      help,
      labelNames,
      registers: [reg],
      collect() {
        each((r, l) => this.set(l, pick(r.engine)));
      },
    });
  counter(
    'vllm:prefix_cache_queries_total',
    'Prefix cache queries, in terms of number of queried tokens.',
    (e) => e.counters.prefixCacheQueries,
  );
  counter('vllm:prefix_cache_hits_total', 'Prefix cache hits, in terms of number of cached tokens.', (e) => e.counters.prefixCacheHits);
  counter('vllm:prompt_tokens_total', 'Number of prefill tokens processed.', (e) => e.counters.promptTokens);
  counter('vllm:generation_tokens_total', 'Number of generation tokens processed.', (e) => e.counters.generationTokens);
  counter('vllm:num_preemptions_total', 'Cumulative number of preemption from the engine.', (e) => e.counters.preemptions);
  gauge('vllm:num_requests_running', 'Number of requests in model execution batches.', (e) => e.numRunning);
  gauge('vllm:num_requests_waiting', 'Number of requests waiting to be processed.', (e) => e.numWaiting);
  gauge('vllm:kv_cache_usage_perc', 'KV-cache usage. 1 means 100 percent usage.', (e) => e.kvUsage);
  const info = new Gauge({
    name: 'vllm:cache_config_info',
    help: 'Information of the LLMEngine CacheConfig',
    labelNames: ['model_name', 'engine', 'block_size', 'num_gpu_blocks', 'enable_prefix_caching', 'cache_dtype', 'num_cpu_blocks'],
    registers: [reg],
    collect() {
      each((_r, l) =>
        this.set(
          {
            ...l,
            block_size: String(cfg.blockSize),
            num_gpu_blocks: String(cfg.numGpuBlocks),
            enable_prefix_caching: cfg.enablePrefixCaching ? 'True' : 'False',
            cache_dtype: 'auto',
            num_cpu_blocks: 'None',
          },
          1,
        ),
      );
    },
  });
  void info;
  const ttft = new Histogram({
    name: 'vllm:time_to_first_token_seconds',
    help: 'Histogram of time to first token in seconds.',
    labelNames,
    buckets: TTFT_BUCKETS,
    registers: [reg],
  });
  const e2e = new Histogram({
    name: 'vllm:e2e_request_latency_seconds',
    help: 'Histogram of e2e request latency in seconds.',
    labelNames,
    buckets: E2E_BUCKETS,
    registers: [reg],
  });
  return { ttft, e2e };
}

async function readBody(req: IncomingMessage, limit = 64 << 20): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req) {
    size += (c as Buffer).length;
    if (size > limit) throw new HttpError(413, `request body larger than ${limit} bytes`);
    chunks.push(c as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  const s = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(s) });
  res.end(s);
}

function sendError(res: ServerResponse, e: HttpError): void {
  sendJson(res, e.status, { error: { message: e.message, type: e.type, param: e.param, code: e.status } });
}

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function optInt(body: Record<string, unknown>, key: string, min: number): number | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min)
    throw new HttpError(400, `${key} must be an integer >= ${min}`, 'BadRequestError', key);
  return v;
}

function optString(body: Record<string, unknown>, key: string): string | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') throw new HttpError(400, `${key} must be a string`, 'BadRequestError', key);
  return v;
}

function optBool(body: Record<string, unknown>, key: string): boolean | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw new HttpError(400, `${key} must be a boolean`, 'BadRequestError', key);
  return v;
}

function isTokenList(v: unknown): v is number[] {
  return Array.isArray(v) && v.length > 0 && v.every((t) => typeof t === 'number' && Number.isInteger(t) && t >= 0 && t <= 0xffffffff);
}

function validMessages(v: unknown): v is ChatMessage[] {
  return (
    Array.isArray(v) &&
    v.length > 0 &&
    v.every(
      (m) =>
        isObj(m) &&
        typeof m.role === 'string' &&
        (m.content === undefined || m.content === null || typeof m.content === 'string' || Array.isArray(m.content)),
    )
  );
}

export async function startMocker(options: MockerOptions = {}): Promise<MockerHandle> {
  const model = options.model ?? 'mock-model';
  const loraModules = new Set(options.loraModules ?? []);
  const host = options.host ?? '127.0.0.1';
  const speedup = options.speedup ?? 1;
  if (!(speedup > 0)) throw new RangeError(`speedup must be > 0, got ${speedup}`);
  const dp = options.dataParallelSize ?? 1;
  if (!Number.isInteger(dp) || dp < 1) throw new RangeError(`dataParallelSize must be a positive integer, got ${dp}`);
  const tokenizer: MockTokenizer = options.tokenizer
    ? await loadHfTokenizer(options.tokenizer)
    : new SimpleTokenizer(options.engine?.vocabSize ?? 32000);
  const engineCfg: Partial<EngineConfig> = { ...options.engine, vocabSize: options.engine?.vocabSize ?? tokenizer.vocabSize };
  const ranks = Array.from({ length: dp }, (_, r) => new Rank(r, new MockEngine(engineCfg)));
  const cfg = ranks[0].engine.config;
  const topic = options.topic ?? '';
  const format = options.eventFormat ?? 'map';
  const hashType = options.hashType ?? 'u64';
  const batchLayout = options.batchLayout ?? 'array';
  const bufferSteps = options.bufferSteps ?? 10_000;
  const details = options.enablePromptTokensDetails ?? true;
  const defaultMaxTokens = options.defaultMaxTokens ?? 16;
  const faults: MockerFaults = {
    dropEventFraction: 0,
    failRequestFraction: 0,
    dieAfterRequests: null,
    slowdown: 1,
    unhealthy: false,
    ...options.faults,
  };
  const dice = rng(options.seed ?? 12345);
  const stats: MockerStats = {
    requests: 0,
    failedRequests: 0,
    badRequests: 0,
    publishedBatches: 0,
    droppedBatches: 0,
    replayRequests: 0,
    sendErrors: 0,
  };
  const registry = new Registry();
  const { ttft, e2e } = buildMetrics(registry, model, ranks, cfg);
  const wall0 = performance.now();
  const wallModelMs = () => (performance.now() - wall0) * speedup;
  let dead = false;
  let closed = false;
  let requestsSinceStart = 0;

  // ------------------------------------------------------------------------------------------ engine loop

  function modelNow(r: Rank): number {
    if (r.idle) return Math.max(r.stepEndMs, wallModelMs());
    return Math.min(Math.max(wallModelMs(), r.stepStartMs), r.stepEndMs);
  }

  /**
   * Runs the next step(s) of a rank. Steps shorter than a timer tick in wall time (high speedup) are run back to back,
   * up to 1 ms of wall time, MAX_STEPS_PER_WAKE steps or 3 ms of CPU, and delivered together: every SSE event is still its own
   * `data:` line, but each stream gets one socket write per wake instead of one per token (writev dominated the CPU).
   */
  function kick(r: Rank): void {
    if (r.inFlight || closed || dead || !r.engine.hasWork()) return;
    const start = r.idle ? Math.max(r.stepEndMs, wallModelMs()) : r.stepEndMs;
    let t = start;
    const cpu0 = performance.now();
    const batch: { res: StepResult; endMs: number }[] = [];
    while (batch.length < MAX_STEPS_PER_WAKE) {
      const res = r.engine.step(t);
      if (res.scheduledRequests === 0) {
        publish(r, res.events);
        break;
      }
      t += res.durationMs * faults.slowdown;
      batch.push({ res, endMs: t });
      // Also bounded by real CPU time, so one wake never becomes a long task for the event loop.
      if ((t - start) / speedup >= 1 || !r.engine.hasWork() || performance.now() - cpu0 > 3) break;
    }
    if (batch.length === 0) {
      r.idle = true;
      // Not expected (a lone request always fits), but never leave queued work without a next wake.
      if (r.engine.hasWork() && !r.timer) {
        r.timer = setTimeout(() => {
          r.timer = null;
          kick(r);
        }, 1);
      }
      return;
    }
    r.idle = false;
    r.inFlight = true;
    r.stepStartMs = start;
    r.stepEndMs = t;
    const wallDelay = (t - start) / speedup;
    const gen = r.generation;
    const done = () => {
      if (closed || dead || gen !== r.generation) return;
      r.inFlight = false;
      const touched = new Set<Sink>();
      for (const b of batch) {
        deliver(r, b.res, b.endMs, touched);
        publish(r, b.res.events);
      }
      for (const s of touched) s.flush();
      if (r.engine.hasWork()) kick(r);
      else r.idle = true;
    };
    if (wallDelay < 1) enqueueWake(done);
    else
      r.timer = setTimeout(() => {
        r.timer = null;
        enqueueWake(done);
      }, wallDelay);
  }

  function deliver(r: Rank, res: StepResult, endMs: number, touched: Set<Sink>): void {
    const labels = { model_name: model, engine: String(r.rank) };
    for (const o of res.outputs) {
      const sink = r.sinks.get(o.requestId);
      if (!sink) continue;
      if (o.finished) r.sinks.delete(o.requestId);
      if (o.firstToken) ttft.observe(labels, Math.max(0, endMs - sink.arrivalMs) / 1000);
      if (o.finished) e2e.observe(labels, Math.max(0, endMs - sink.arrivalMs) / 1000);
      sink.onOutput(o);
      touched.add(sink);
    }
  }

  function publish(r: Rank, events: EngineEvent[]): void {
    if (events.length === 0 || !r.pub) return;
    const payload = encodeVllmBatch(
      { ts: Date.now() / 1000, events: toWireEvents(events, hashType), dataParallelRank: r.rank },
      { format, hashType, batchLayout },
    );
    const seq = r.seq++;
    r.buffer.push({ seq, payload });
    if (r.buffer.length > bufferSteps) r.buffer.splice(0, r.buffer.length - bufferSteps);
    if (faults.dropEventFraction > 0 && dice() < faults.dropEventFraction) {
      stats.droppedBatches++;
      return;
    }
    stats.publishedBatches++;
    r.sendPub(vllmFrames(topic, seq, payload), () => stats.sendErrors++);
  }

  // ------------------------------------------------------------------------------------------ ZMQ

  let pubEndpoints: string[] = [];
  let replayEndpoints: string[] = [];

  async function replayLoop(r: Rank, router: zmq.Router): Promise<void> {
    try {
      for await (const msg of router) {
        stats.replayRequests++;
        const id = msg[0];
        // DEALER sends [empty, start_seq]; tolerate a missing empty delimiter.
        const startFrame = msg.length >= 3 ? msg[2] : msg[1];
        if (startFrame?.length !== 8) continue;
        const start = startFrame.readBigUInt64BE(0);
        const snapshot = r.buffer.slice();
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

  async function openZmq(first: boolean): Promise<void> {
    if (options.zmqEndpoint !== null) {
      const ep = first ? (options.zmqEndpoint ?? `tcp://${host}:*`) : null;
      if (options.zmqConnect) {
        const tcp = parseTcp(options.zmqEndpoint ?? '');
        if (!tcp || tcp.port === null) throw new Error(`zmqConnect needs a tcp://host:port endpoint, got ${options.zmqEndpoint}`);
        pubEndpoints = [];
        for (let i = 0; i < dp; i++) {
          const s = new zmq.Publisher({ linger: 0, sendHighWaterMark: 100_000 });
          const target = `${tcp.prefix}${tcp.host}:${tcp.port + i}`;
          s.connect(target);
          ranks[i].pub = s;
          pubEndpoints.push(target);
        }
      } else if (first) {
        const { sockets, endpoints } = await bindRanks(() => new zmq.Publisher({ linger: 0, sendHighWaterMark: 100_000 }), ep!, dp);
        for (const [i, s] of sockets.entries()) ranks[i].pub = s;
        pubEndpoints = endpoints;
      } else {
        for (let i = 0; i < dp; i++) {
          const s = new zmq.Publisher({ linger: 0, sendHighWaterMark: 100_000 });
          await s.bind(pubEndpoints[i]);
          ranks[i].pub = s;
        }
      }
    }
    if (options.replayEndpoint !== null) {
      const make = () => new zmq.Router({ linger: 0 });
      if (first) {
        const { sockets, endpoints } = await bindRanks(make, options.replayEndpoint ?? `tcp://${host}:*`, dp);
        for (const [i, s] of sockets.entries()) ranks[i].replay = s;
        replayEndpoints = endpoints;
      } else {
        for (let i = 0; i < dp; i++) {
          const s = make();
          await s.bind(replayEndpoints[i]);
          ranks[i].replay = s;
        }
      }
      for (const r of ranks) void replayLoop(r, r.replay!);
    }
  }

  function closeZmq(): void {
    for (const r of ranks) {
      r.pub?.close();
      r.replay?.close();
      r.pub = null;
      r.replay = null;
    }
  }

  // ------------------------------------------------------------------------------------------ HTTP

  function pickRank(req: IncomingMessage): Rank {
    const h = req.headers['x-data-parallel-rank'];
    if (typeof h === 'string' && h !== '') {
      const n = Number(h);
      if (!Number.isInteger(n) || n < 0 || n >= dp)
        throw new HttpError(400, `x-data-parallel-rank must be in [0, ${dp})`, 'BadRequestError', 'x-data-parallel-rank');
      return ranks[n];
    }
    let best = ranks[0];
    for (const r of ranks) if (r.engine.numRunning + r.engine.numWaiting < best.engine.numRunning + best.engine.numWaiting) best = r;
    return best;
  }

  function resolveModel(body: Record<string, unknown>): string | null {
    const m = optString(body, 'model');
    if (m === undefined || m === model) return null;
    if (loraModules.has(m)) return m;
    throw new HttpError(404, `The model \`${m}\` does not exist.`, 'NotFoundError', 'model');
  }

  function usageOf(prompt: number, completion: number, cached: number) {
    const u: Record<string, unknown> = { prompt_tokens: prompt, total_tokens: prompt + completion, completion_tokens: completion };
    if (details) u.prompt_tokens_details = { cached_tokens: cached };
    return u;
  }

  async function generate(
    kind: 'completion' | 'chat',
    req: IncomingMessage,
    res: ServerResponse,
    body: Record<string, unknown>,
  ): Promise<void> {
    const loraName = resolveModel(body);
    const stream = optBool(body, 'stream') ?? false;
    const so = body.stream_options;
    if (so !== undefined && so !== null && !isObj(so))
      throw new HttpError(400, 'stream_options must be an object', 'BadRequestError', 'stream_options');
    const includeUsage = stream && isObj(so) && so.include_usage === true;
    const cacheSalt = optString(body, 'cache_salt') || null;
    const seed = optInt(body, 'seed', 0);
    const returnTokenIds = optBool(body, 'return_token_ids') ?? false;
    const n = optInt(body, 'n', 1) ?? 1;
    if (n !== 1) throw new HttpError(400, 'the mock engine supports n = 1 only', 'BadRequestError', 'n');
    const maxTokens =
      kind === 'chat' ? (optInt(body, 'max_completion_tokens', 1) ?? optInt(body, 'max_tokens', 1)) : optInt(body, 'max_tokens', 1);

    let prompts: number[][];
    if (kind === 'completion') {
      const p = body.prompt;
      if (typeof p === 'string') prompts = [tokenizer.encode(p)];
      else if (isTokenList(p)) prompts = [p];
      else if (Array.isArray(p) && p.length > 0 && p.every((x) => typeof x === 'string'))
        prompts = (p as string[]).map((s) => tokenizer.encode(s));
      else if (Array.isArray(p) && p.length > 0 && p.every(isTokenList)) prompts = p as number[][];
      else
        throw new HttpError(
          400,
          'prompt must be a string, a list of strings, a list of token ids or a list of such lists',
          'BadRequestError',
          'prompt',
        );
    } else {
      if (!validMessages(body.messages))
        throw new HttpError(400, 'messages must be a non-empty list of {role, content}', 'BadRequestError', 'messages');
      const kw = body.chat_template_kwargs;
      if (kw !== undefined && kw !== null && !isObj(kw))
        throw new HttpError(400, 'chat_template_kwargs must be an object', 'BadRequestError', 'chat_template_kwargs');
      const tools = Array.isArray(body.tools) ? body.tools : undefined;
      let text: string;
      try {
        text = tokenizer.renderChat(body.messages, { chatTemplateKwargs: isObj(kw) ? kw : undefined, tools });
      } catch (err) {
        throw new HttpError(400, `chat template failed: ${(err as Error).message}`);
      }
      prompts = [tokenizer.encode(text)];
    }
    for (const p of prompts) {
      if (p.length === 0)
        throw new HttpError(400, 'prompt is empty after tokenization', 'BadRequestError', kind === 'chat' ? 'messages' : 'prompt');
      const mt = maxTokens ?? Math.max(1, Math.min(defaultMaxTokens, cfg.maxModelLen - p.length));
      if (p.length + mt > cfg.maxModelLen) {
        throw new HttpError(
          400,
          `This model's maximum context length is ${cfg.maxModelLen} tokens. However, you requested ${p.length + mt} tokens (${p.length} in the messages, ${mt} in the completion). Please reduce the length of the messages or completion.`,
          'BadRequestError',
          kind === 'chat' ? 'messages' : 'prompt',
        );
      }
    }
    const rank = pickRank(req);

    // Faults after validation, so bad input stays a 400.
    if (faults.unhealthy) throw new HttpError(503, 'the engine is dead (injected fault)', 'EngineDeadError');
    if (faults.failRequestFraction > 0 && dice() < faults.failRequestFraction) {
      stats.failedRequests++;
      throw new HttpError(500, 'injected failure', 'InternalServerError');
    }

    const id = `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${randomBytes(16).toString('hex')}`;
    const created = Math.floor(Date.now() / 1000);
    const object = kind === 'chat' ? 'chat.completion.chunk' : 'text_completion';
    const engineIds = prompts.map((_, i) => `${id}-${i}`);
    const arrival = modelNow(rank);
    const added: string[] = [];
    try {
      prompts.forEach((p, i) => {
        const mt = maxTokens ?? Math.max(1, Math.min(defaultMaxTokens, cfg.maxModelLen - p.length));
        rank.engine.addRequest({ requestId: engineIds[i], promptTokens: p, maxTokens: mt, loraName, cacheSalt, seed }, arrival);
        added.push(engineIds[i]);
      });
    } catch (err) {
      for (const a of added) rank.engine.abort(a);
      if (err instanceof EngineInputError)
        throw new HttpError(400, err.message, 'BadRequestError', kind === 'chat' ? 'messages' : 'prompt');
      throw err;
    }

    const tokens: number[][] = prompts.map(() => []);
    const cached: number[] = prompts.map(() => 0);
    const counts: number[] = prompts.map(() => 0);
    let finished = 0;
    let done = false;
    const write = (chunk: unknown) => res.write(`data: ${JSON.stringify(chunk)}\n\n`);
    const chunkHead = `data: {"id":"${id}","object":"${object}","created":${created},"model":${JSON.stringify(loraName ?? model)},"choices":[{"index":`;

    if (stream) {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      if (kind === 'chat') {
        const first: Record<string, unknown> = {
          id,
          object,
          created,
          model: loraName ?? model,
          choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }],
        };
        if (returnTokenIds) first.prompt_token_ids = prompts[0];
        write(first);
      }
    }

    let pending = '';
    const flush = () => {
      if (pending.length === 0 || res.destroyed) return;
      res.write(pending);
      pending = '';
    };
    const finishAll = () => {
      flush();
      done = true;
      let pt = 0;
      let ct = 0;
      let cc = 0;
      prompts.forEach((p, i) => {
        pt += p.length;
        ct += stream ? counts[i] : tokens[i].length;
        cc += cached[i];
      });
      const usage = usageOf(pt, ct, cc);
      if (stream) {
        if (includeUsage) write({ id, object, created, model: loraName ?? model, choices: [], usage });
        res.end('data: [DONE]\n\n');
        return;
      }
      const choices = prompts.map((p, i) => {
        const text = tokenizer.decode(tokens[i]);
        if (kind === 'chat') {
          const c: Record<string, unknown> = {
            index: i,
            message: { role: 'assistant', content: text, tool_calls: [] },
            logprobs: null,
            finish_reason: 'length',
            stop_reason: null,
          };
          if (returnTokenIds) c.token_ids = tokens[i];
          return c;
        }
        const c: Record<string, unknown> = {
          index: i,
          text,
          logprobs: null,
          finish_reason: 'length',
          stop_reason: null,
          prompt_logprobs: null,
        };
        if (returnTokenIds) {
          c.prompt_token_ids = p;
          c.token_ids = tokens[i];
        }
        return c;
      });
      const out: Record<string, unknown> = {
        id,
        object: kind === 'chat' ? 'chat.completion' : 'text_completion',
        created,
        model: loraName ?? model,
        choices,
        usage,
      };
      if (returnTokenIds && kind === 'chat') out.prompt_token_ids = prompts[0];
      sendJson(res, 200, out);
    };

    engineIds.forEach((eid, i) => {
      const sink: Sink = {
        arrivalMs: arrival,
        flush,
        onOutput(o) {
          if (done) return;
          // Streams only need the count; whole responses need the tokens for their text.
          if (stream) counts[i] += o.newTokens.length;
          else for (const t of o.newTokens) tokens[i].push(t);
          if (o.firstToken) cached[i] = o.cachedTokens;
          if (stream) {
            // Hot path (one write per token per stream): the chunk is assembled from a prebuilt head, not stringified whole.
            const text = JSON.stringify(tokenizer.decode(o.newTokens));
            const ids = returnTokenIds ? `,"token_ids":${JSON.stringify(o.newTokens)}` : '';
            const fin = o.finishReason === null ? 'null' : `"${o.finishReason}"`;
            pending +=
              kind === 'chat'
                ? `${chunkHead}${i},"delta":{"content":${text}},"logprobs":null,"finish_reason":${fin}${o.finished ? ',"stop_reason":null' : ''}${ids}}]}\n\n`
                : `${chunkHead}${i},"text":${text},"logprobs":null,"finish_reason":${fin},"stop_reason":null${ids}}]}\n\n`;
          }
          if (o.finished && ++finished === prompts.length) finishAll();
        },
        onAbort() {
          done = true;
          res.destroy();
        },
      };
      rank.sinks.set(eid, sink);
    });
    res.on('close', () => {
      if (done) return;
      done = true;
      for (const eid of engineIds) {
        rank.sinks.delete(eid);
        rank.engine.abort(eid);
      }
    });
    kick(rank);
  }

  function tokenizeBody(body: Record<string, unknown>): number[] {
    if (typeof body.prompt === 'string') return tokenizer.encode(body.prompt);
    if (validMessages(body.messages)) {
      const kw = body.chat_template_kwargs;
      const text = tokenizer.renderChat(body.messages, {
        chatTemplateKwargs: isObj(kw) ? kw : undefined,
        addGenerationPrompt: body.add_generation_prompt !== false,
        tools: Array.isArray(body.tools) ? body.tools : undefined,
      });
      return tokenizer.encode(text);
    }
    throw new HttpError(400, 'tokenize needs a string prompt or a list of messages', 'BadRequestError', 'prompt');
  }

  function applyFaults(body: Record<string, unknown>): void {
    const frac = (k: keyof MockerFaults) => {
      const v = body[k];
      if (v === undefined) return;
      if (typeof v !== 'number' || !(v >= 0 && v <= 1)) throw new HttpError(400, `${k} must be a number in [0, 1]`, 'BadRequestError', k);
      (faults as unknown as Record<string, number>)[k] = v;
    };
    frac('dropEventFraction');
    frac('failRequestFraction');
    if (body.dieAfterRequests !== undefined) {
      const v = body.dieAfterRequests;
      if (v !== null && (typeof v !== 'number' || !Number.isInteger(v) || v < 0))
        throw new HttpError(400, 'dieAfterRequests must be a non-negative integer or null', 'BadRequestError', 'dieAfterRequests');
      faults.dieAfterRequests = v as number | null;
      requestsSinceStart = 0;
    }
    if (body.unhealthy !== undefined) {
      if (typeof body.unhealthy !== 'boolean') throw new HttpError(400, 'unhealthy must be a boolean', 'BadRequestError', 'unhealthy');
      faults.unhealthy = body.unhealthy;
    }
    if (body.slowdown !== undefined) {
      const v = body.slowdown;
      if (typeof v !== 'number' || !(v > 0)) throw new HttpError(400, 'slowdown must be a number > 0', 'BadRequestError', 'slowdown');
      faults.slowdown = v;
    }
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = (req.url ?? '/').split('?')[0];
    const method = req.method ?? 'GET';
    try {
      if (method === 'GET' && url === '/health') {
        res.writeHead(faults.unhealthy ? 503 : 200, { 'content-length': 0 });
        res.end();
        return;
      }
      if (method === 'GET' && url === '/v1/models') {
        const card = (id: string, parent: string | null) => ({
          id,
          object: 'model',
          created: Math.floor(Date.now() / 1000),
          owned_by: 'vllm',
          root: parent ?? id,
          parent,
          max_model_len: cfg.maxModelLen,
          permission: [],
        });
        sendJson(res, 200, { object: 'list', data: [card(model, null), ...[...loraModules].map((l) => card(l, model))] });
        return;
      }
      if (method === 'GET' && url === '/metrics') {
        const text = await registry.metrics();
        res.writeHead(200, { 'content-type': registry.contentType });
        res.end(text);
        return;
      }
      if (method === 'GET' && url === '/load') {
        const per = ranks.map((r) => ({
          rank: r.rank,
          running: r.engine.numRunning,
          waiting: r.engine.numWaiting,
          kv_usage: r.engine.kvUsage,
        }));
        sendJson(res, 200, {
          running: per.reduce((a, p) => a + p.running, 0),
          waiting: per.reduce((a, p) => a + p.waiting, 0),
          kv_usage: per.reduce((a, p) => a + p.kv_usage, 0) / per.length,
          ranks: per,
        });
        return;
      }
      if (method === 'GET' && url === '/fault') {
        sendJson(res, 200, { faults, stats });
        return;
      }
      if (method !== 'POST') throw new HttpError(404, `no route ${method} ${url}`, 'NotFoundError');
      const known = ['/v1/completions', '/v1/chat/completions', '/tokenize', '/detokenize', '/fault'];
      if (!known.includes(url)) throw new HttpError(404, `no route ${method} ${url}`, 'NotFoundError');
      const raw = await readBody(req);
      let body: unknown;
      try {
        body = JSON.parse(raw);
      } catch (err) {
        throw new HttpError(400, `invalid JSON body: ${(err as Error).message}`);
      }
      if (!isObj(body)) throw new HttpError(400, 'the request body must be a JSON object');
      if (url === '/tokenize') {
        const tokens = tokenizeBody(body);
        sendJson(res, 200, { count: tokens.length, max_model_len: cfg.maxModelLen, tokens, token_strs: null });
        return;
      }
      if (url === '/detokenize') {
        if (!isTokenList(body.tokens) && !(Array.isArray(body.tokens) && body.tokens.length === 0)) {
          throw new HttpError(400, 'tokens must be a list of token ids', 'BadRequestError', 'tokens');
        }
        sendJson(res, 200, { prompt: tokenizer.decode(body.tokens as number[]) });
        return;
      }
      if (url === '/fault') {
        applyFaults(body);
        if (body.restart === true) await restart();
        sendJson(res, 200, { faults, stats });
        if (body.die === true) setImmediate(() => void die());
        return;
      }
      // Generation requests: the crash fault counts them.
      stats.requests++;
      requestsSinceStart++;
      if (faults.dieAfterRequests !== null && requestsSinceStart > faults.dieAfterRequests) {
        req.socket.destroy();
        await die();
        return;
      }
      await generate(url === '/v1/chat/completions' ? 'chat' : 'completion', req, res, body);
    } catch (err) {
      if (err instanceof HttpError) {
        if (err.status === 400) stats.badRequests++;
        sendError(res, err);
      } else {
        sendError(res, new HttpError(500, `internal error: ${(err as Error)?.message ?? String(err)}`, 'InternalServerError'));
      }
    }
  }

  let server: Server = createServer((req, res) => void handle(req, res));
  server.keepAliveTimeout = 60_000;
  const listen = (s: Server, port: number) =>
    new Promise<number>((resolve, reject) => {
      s.once('error', reject);
      s.listen(port, host, () => {
        s.off('error', reject);
        resolve((s.address() as AddressInfo).port);
      });
    });
  const port = await listen(server, options.port ?? 0);
  try {
    await openZmq(true);
  } catch (err) {
    server.close();
    closeZmq();
    throw err;
  }

  function dropInFlight(): void {
    for (const r of ranks) {
      if (r.timer) {
        clearTimeout(r.timer);
        r.timer = null;
      }
      r.generation++;
      r.inFlight = false;
      r.idle = true;
      r.engine.reset();
      const sinks = [...r.sinks.values()];
      r.sinks.clear();
      for (const s of sinks) s.onAbort();
      r.seq = 0n;
      r.buffer = [];
    }
    registry.resetMetrics();
    requestsSinceStart = 0;
  }

  async function closeHttp(): Promise<void> {
    await new Promise<void>((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    });
  }

  async function die(): Promise<void> {
    if (dead || closed) return;
    dead = true;
    dropInFlight();
    closeZmq();
    await closeHttp();
  }

  async function restart(): Promise<void> {
    if (closed) throw new Error('mocker is closed');
    dropInFlight();
    if (dead) {
      server = createServer((req, res) => void handle(req, res));
      server.keepAliveTimeout = 60_000;
      await listen(server, port);
      await openZmq(false);
      dead = false;
    }
  }

  async function close(): Promise<void> {
    if (closed) return;
    const wasDead = dead;
    dropInFlight();
    closed = true;
    closeZmq();
    if (!wasDead) await closeHttp();
  }

  return {
    url: `http://${host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host}:${port}`,
    port,
    get zmqEndpoint() {
      return pubEndpoints.length ? connectable(pubEndpoints[0]) : null;
    },
    get replayEndpoint() {
      return replayEndpoints.length ? connectable(replayEndpoints[0]) : null;
    },
    get zmqEndpoints() {
      return pubEndpoints.map(connectable);
    },
    get replayEndpoints() {
      return replayEndpoints.map(connectable);
    },
    engine: ranks[0].engine,
    engines: ranks.map((r) => r.engine),
    faults,
    stats,
    get dead() {
      return dead;
    },
    close,
    restart,
    die,
  };
}
