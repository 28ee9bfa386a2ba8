/**
 * The mock engine as one side of a disaggregated pair, speaking the engines' handoff protocols:
 *
 * vLLM (NixlConnector flow)
 *   prefill  a request with kv_transfer_params.do_remote_decode runs as usual (the router sends max_tokens 1); at the end
 *            its blocks stay pinned for a lease (kv_lease_duration, default 30 s) and the answer carries
 *            kv_transfer_params {do_remote_prefill: true, remote_block_ids, remote_engine_id, remote_request_id,
 *            remote_host, remote_port, tp_size, remote_num_tokens}; the decode side pulls over the side channel (here:
 *            POST /mock/nixl/pull on the prefill's HTTP port), which ends the lease
 *   decode   a request with kv_transfer_params.do_remote_prefill pulls the KV it does not hold (time: bytes over the
 *            transfer bandwidth), then decodes; the lease gone: kv_load_failure_policy fail (an error, default) or
 *            recompute (the prompt computed here)
 * SGLang (bootstrap)
 *   prefill  a request with bootstrap_room waits for its room's decode side on the bootstrap server (timeout like
 *            SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, 300 s), then prefills one token and hands the KV over
 *   decode   a request with bootstrap_host/port/room asks that bootstrap server for the room's KV (timeout like
 *            SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300 s), waits for the transfer, then decodes
 * Both sides publish KV events: the decode side's received blocks join its prefix cache like computed ones.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { readBody, sendJson } from '../http/body.ts';
import { rawMember } from '../openai/raw-json.ts';
import type { MockEngine } from './engine/index.ts';

export type PdRole = 'prefill' | 'decode' | 'both';
export type PdProtocol = 'vllm' | 'sglang' | 'trtllm';

export interface MockPdOptions {
  readonly role: PdRole;
  readonly protocol: PdProtocol;
  /** vLLM prefill: how long finished blocks wait to be pulled, ms. Default 30 s (kv_lease_duration). */
  readonly leaseMs?: number;
  /** vLLM decode: what a failed KV load does. Default fail. */
  readonly loadFailurePolicy?: 'fail' | 'recompute';
  /** KV transfer bandwidth, bytes per second. Default 50e9 (400 Gb/s RDMA). */
  readonly transferBytesPerS?: number;
  /** KV bytes per token (2 · layers · kv heads · head dim · bytes). Default an 8B model's 147,456. */
  readonly kvBytesPerToken?: number;
  /** SGLang prefill: the bootstrap server's port (0 = a free one). Default 8998. */
  readonly bootstrapPort?: number;
  /** SGLang: the bootstrap (prefill) and waiting (decode) timeouts, ms. Default 300 s each. */
  readonly bootstrapTimeoutMs?: number;
}

/** What the OpenAI surface does differently for one request of a P/D leg. */
export interface PdPlan {
  /** The engine request id to use (a vLLM prefill's lease id: its held blocks are found by it). */
  readonly requestId?: string;
  readonly maxTokens?: number;
  readonly preloadedTokens?: number;
  readonly holdOnFinish?: boolean;
  readonly extra?: () => Record<string, unknown>;
  /** Fields of the answer's first choice (TensorRT-LLM's disaggregated_params live there). */
  readonly choiceExtra?: () => Record<string, unknown>;
  readonly onComplete?: () => void;
  /** The leg cannot be served (KV load failed, bootstrap timed out): answer this error. */
  readonly failure?: string;
}

interface Lease {
  readonly engine: MockEngine;
  readonly timer: NodeJS.Timeout;
  readonly numTokens: number;
}

interface Deferred<T> {
  readonly promise: Promise<T>;
  resolve(v: T): void;
}

function deferred<T>(): Deferred<T> {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

interface Room {
  /** The decode side asked for the room's KV. */
  readonly decodeArrived: Deferred<void>;
  /** The prefill side computed it: the prompt tokens handed over (or an error). */
  readonly kvReady: Deferred<{ numTokens: number } | { error: string }>;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

export class MockPd {
  readonly role: PdRole;
  readonly protocol: PdProtocol;
  private readonly leases = new Map<string, Lease>();
  private readonly rooms = new Map<string, Room>();
  private bootstrap: Server | null = null;
  private seq = 0;
  /** Counters for tests and GET /fault. */
  readonly stats = {
    leasesExpired: 0,
    pulls: 0,
    pullsGone: 0,
    transferredTokens: 0,
    bootstrapTimeouts: 0,
    /** TensorRT-LLM context legs: the disagg_request_id of each (as sent, decimal), the last 1,000. */
    disaggRequestIds: [] as string[],
  };

  constructor(
    private readonly o: MockPdOptions,
    private readonly host: string,
    private readonly httpPort: () => number,
    private readonly speedup: number,
    private readonly engineId: string,
  ) {
    this.role = o.role;
    this.protocol = o.protocol;
  }

  get bootstrapPort(): number | null {
    return this.bootstrap ? (this.bootstrap.address() as AddressInfo).port : null;
  }

  /** SGLang prefill: serve the bootstrap port. */
  async open(): Promise<void> {
    if (this.role !== 'prefill' || this.protocol !== 'sglang') return;
    const s = createServer((req, res) => void this.handleBootstrap(req, res));
    this.bootstrap = s;
    await new Promise<void>((resolve, reject) => {
      s.once('error', reject);
      s.listen(this.o.bootstrapPort ?? 8998, this.host, () => resolve());
    });
  }

  async close(): Promise<void> {
    for (const l of this.leases.values()) clearTimeout(l.timer);
    this.leases.clear();
    for (const r of this.rooms.values()) r.kvReady.resolve({ error: 'the prefill engine stopped' });
    this.rooms.clear();
    const s = this.bootstrap;
    this.bootstrap = null;
    if (s)
      await new Promise<void>((resolve) => {
        s.close(() => resolve());
        s.closeAllConnections();
      });
  }

  /** Engine restart: leases and rooms are lost with the engine's memory. */
  reset(): void {
    for (const l of this.leases.values()) clearTimeout(l.timer);
    this.leases.clear();
    for (const r of this.rooms.values()) r.kvReady.resolve({ error: 'the prefill engine restarted' });
    this.rooms.clear();
  }

  /** The side channel routes served on the HTTP port (vLLM prefill). */
  routes(): Record<string, (req: IncomingMessage, res: ServerResponse, body: Record<string, unknown>) => void> {
    return { '/mock/nixl/pull': (_req, res, body) => this.pull(res, body) };
  }

  private room(key: string): Room {
    let r = this.rooms.get(key);
    if (!r) {
      r = { decodeArrived: deferred(), kvReady: deferred() };
      this.rooms.set(key, r);
    }
    return r;
  }

  private transferMs(tokens: number): number {
    const bytes = tokens * (this.o.kvBytesPerToken ?? 147_456);
    return (bytes / (this.o.transferBytesPerS ?? 50e9)) * 1000;
  }

  /** Decides how one request is served. `closed` tells whether the client already left. */
  async plan(
    engine: MockEngine,
    prompt: readonly number[],
    body: Record<string, unknown>,
    raw: string,
    closed: () => boolean,
    lora: { loraName: string | null; cacheSalt: string | null },
  ): Promise<PdPlan | null> {
    if (this.role === 'both') return null;
    const timeout = this.o.bootstrapTimeoutMs ?? 300_000;
    if (this.protocol === 'vllm') {
      const ktp = body.kv_transfer_params;
      if (!isObject(ktp)) return null;
      if (this.role === 'prefill' && ktp.do_remote_decode === true) {
        const leaseId = `${this.engineId}-lease-${++this.seq}`;
        const blocks = Array.from({ length: Math.ceil(prompt.length / engine.config.blockSize) }, (_, i) => i);
        return {
          ...this.lease(engine, prompt, leaseId),
          extra: () => ({
            kv_transfer_params: {
              do_remote_prefill: true,
              do_remote_decode: false,
              remote_block_ids: [blocks],
              remote_engine_id: this.engineId,
              remote_request_id: leaseId,
              remote_host: this.host,
              remote_port: this.httpPort(),
              tp_size: 1,
              remote_num_tokens: prompt.length,
            },
          }),
        };
      }
      if (this.role === 'decode' && ktp.do_remote_prefill === true) {
        const local = engine.prefixHitTokens(prompt, lora.loraName, lora.cacheSalt);
        const got = await this.pullFrom(ktp);
        if ('error' in got) {
          if ((this.o.loadFailurePolicy ?? 'fail') === 'fail') return { failure: `KV load failed: ${got.error}` };
          return {}; // recompute: the prompt is computed here
        }
        await sleep(this.transferMs(Math.max(0, prompt.length - local)) / this.speedup);
        this.stats.transferredTokens += Math.max(0, prompt.length - local);
        return { preloadedTokens: prompt.length };
      }
      return null;
    }
    if (this.protocol === 'trtllm') return this.planTrtllm(engine, prompt, body, raw, lora);
    // SGLang
    const roomText = rawMember(raw, 'bootstrap_room');
    if (roomText === undefined || !/^\d+$/.test(roomText)) return null;
    if (this.role === 'prefill') {
      const r = this.room(roomText);
      const arrived = await Promise.race([r.decodeArrived.promise.then(() => true), sleep(timeout / this.speedup).then(() => false)]);
      if (!arrived || closed()) {
        this.rooms.delete(roomText);
        if (!arrived) this.stats.bootstrapTimeouts++;
        r.kvReady.resolve({ error: arrived ? 'the prefill request was cancelled' : 'bootstrap timeout' });
        return { failure: arrived ? 'cancelled' : `bootstrap timeout: no decode side for room ${roomText}` };
      }
      return {
        maxTokens: 1,
        onComplete: () => {
          this.rooms.delete(roomText);
          r.kvReady.resolve({ numTokens: prompt.length });
        },
      };
    }
    const host = body.bootstrap_host;
    const port = body.bootstrap_port;
    if (typeof host !== 'string' || typeof port !== 'number')
      return { failure: 'bootstrap_host and bootstrap_port are required with bootstrap_room' };
    const local = engine.prefixHitTokens(prompt, lora.loraName, lora.cacheSalt);
    let got: { numTokens: number } | { error: string };
    try {
      const res = await fetch(`http://${host}:${port}/mock/bootstrap/${roomText}`, {
        method: 'POST',
        signal: AbortSignal.timeout(Math.max(1, timeout / this.speedup)),
      });
      got = (await res.json()) as { numTokens: number } | { error: string };
    } catch (err) {
      got = { error: (err as Error).message };
    }
    if ('error' in got) return { failure: `KV transfer failed: ${got.error}` };
    await sleep(this.transferMs(Math.max(0, prompt.length - local)) / this.speedup);
    this.stats.transferredTokens += Math.max(0, prompt.length - local);
    return { preloadedTokens: prompt.length };
  }

  /**
   * TensorRT-LLM: a context_only request prefills (one token) and keeps its blocks for a lease like vLLM's prefill; its
   * answer's first choice carries disaggregated_params {request_type, ctx_request_id, disagg_request_id (echoed),
   * first_gen_tokens, opaque_state (here: where to pull the KV from)} and the answer the prompt_token_ids. A
   * generation_only request pulls that KV (a missing or stale handoff fails or recomputes, as loadFailurePolicy says).
   */
  private async planTrtllm(
    engine: MockEngine,
    prompt: readonly number[],
    body: Record<string, unknown>,
    raw: string,
    lora: { loraName: string | null; cacheSalt: string | null },
  ): Promise<PdPlan | null> {
    const dp = body.disaggregated_params;
    if (!isObject(dp)) return null;
    if (this.role === 'prefill' && dp.request_type === 'context_only') {
      // The id is an int64 that JSON.parse may round: read its digits from the raw body.
      const idText = /"disagg_request_id"\s*:\s*(-?\d+)/.exec(rawMember(raw, 'disaggregated_params') ?? '')?.[1];
      if (idText !== undefined) {
        this.stats.disaggRequestIds.push(idText);
        if (this.stats.disaggRequestIds.length > 1000) this.stats.disaggRequestIds.shift();
      }
      const leaseId = `${this.engineId}-ctx-${++this.seq}`;
      const ctxRequestId = this.seq;
      return {
        ...this.lease(engine, prompt, leaseId),
        maxTokens: 1,
        extra: () => ({ prompt_token_ids: prompt }),
        choiceExtra: () => ({
          disaggregated_params: {
            request_type: 'context_only',
            first_gen_tokens: [],
            ctx_request_id: ctxRequestId,
            ...(idText !== undefined ? { disagg_request_id: Number(idText) } : {}),
            opaque_state: Buffer.from(JSON.stringify({ host: this.host, port: this.httpPort(), lease: leaseId })).toString('base64'),
            draft_tokens: null,
          },
        }),
      };
    }
    if (this.role === 'decode' && dp.request_type === 'generation_only') {
      let where: Record<string, unknown> = {};
      try {
        where = JSON.parse(Buffer.from(String(dp.opaque_state ?? ''), 'base64').toString('utf8')) as Record<string, unknown>;
      } catch {
        /* a handoff without our opaque state: the pull below fails */
      }
      const local = engine.prefixHitTokens(prompt, lora.loraName, lora.cacheSalt);
      const got = await this.pullFrom({ remote_host: where.host, remote_port: where.port, remote_request_id: where.lease });
      if ('error' in got) {
        if ((this.o.loadFailurePolicy ?? 'fail') === 'fail') return { failure: `KV transfer failed: ${got.error}` };
        return {};
      }
      await sleep(this.transferMs(Math.max(0, prompt.length - local)) / this.speedup);
      this.stats.transferredTokens += Math.max(0, prompt.length - local);
      return { preloadedTokens: prompt.length };
    }
    return null;
  }

  /** A prefill whose blocks stay held after it finishes, until pulled or until the lease runs out. */
  private lease(engine: MockEngine, prompt: readonly number[], leaseId: string): PdPlan {
    return {
      requestId: leaseId,
      holdOnFinish: true,
      onComplete: () => {
        if (this.o.leaseMs === 0) {
          // A zero lease (tests): the blocks are freed at once, as if the lease had already run out.
          this.stats.leasesExpired++;
          queueMicrotask(() => engine.releaseHeld(leaseId));
          return;
        }
        const timer = setTimeout(() => {
          if (!this.leases.delete(leaseId)) return;
          this.stats.leasesExpired++;
          engine.releaseHeld(leaseId);
        }, this.o.leaseMs ?? 30_000);
        timer.unref();
        this.leases.set(leaseId, { engine, timer, numTokens: prompt.length });
      },
    };
  }

  private async pullFrom(ktp: Record<string, unknown>): Promise<{ numTokens: number } | { error: string }> {
    const host = ktp.remote_host;
    const port = ktp.remote_port;
    if (typeof host !== 'string' || typeof port !== 'number') return { error: 'kv_transfer_params without remote_host/remote_port' };
    try {
      const res = await fetch(`http://${host}:${port}/mock/nixl/pull`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ remote_request_id: ktp.remote_request_id, remote_engine_id: ktp.remote_engine_id }),
        signal: AbortSignal.timeout(10_000),
      });
      const j = (await res.json()) as { num_tokens?: number; error?: { message?: string } };
      if (res.status !== 200 || typeof j.num_tokens !== 'number') return { error: j.error?.message ?? `pull answered ${res.status}` };
      return { numTokens: j.num_tokens };
    } catch (err) {
      return { error: (err as Error).message };
    }
  }

  /** vLLM prefill side channel: the decode side reads the leased blocks; the read ends the lease. */
  private pull(res: ServerResponse, body: Record<string, unknown>): void {
    this.stats.pulls++;
    const id = typeof body.remote_request_id === 'string' ? body.remote_request_id : '';
    const lease = this.leases.get(id);
    if (!lease) {
      this.stats.pullsGone++;
      sendJson(res, 410, { error: { message: `no KV held for ${id || '(no id)'}: the lease expired or the request is unknown` } });
      return;
    }
    this.leases.delete(id);
    clearTimeout(lease.timer);
    lease.engine.releaseHeld(id);
    sendJson(res, 200, { num_tokens: lease.numTokens });
  }

  private async handleBootstrap(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const m = /^\/mock\/bootstrap\/(\d+)$/.exec((req.url ?? '').split('?')[0]);
    await readBody(req, 1024).catch(() => undefined);
    if (req.method !== 'POST' || !m) {
      sendJson(res, 404, { error: 'no such bootstrap route' });
      return;
    }
    const r = this.room(m[1]);
    r.decodeArrived.resolve();
    const got = await r.kvReady.promise;
    sendJson(res, 'error' in got ? 409 : 200, got);
  }
}
