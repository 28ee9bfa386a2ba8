/**
 * The mock engine as one side of a disaggregated pair. What each engine's legs look like on the wire, and what its
 * server answers, is the engine's (src/engines/NAME/mock.ts, by `mockHandoff(protocol)`); this is the host those
 * handoffs share:
 *
 * - leases: a prefill whose blocks stay held after it finishes (kv_lease_duration, default 30 s) until the decode side
 *   pulls them over the side channel (POST /mock/nixl/pull on the prefill's HTTP port), which ends the lease;
 * - bootstrap rooms (SGLang): the prefill side waits on its bootstrap server for the room's decode side (timeout like
 *   SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, 300 s), the decode side asks it for the room's KV (the waiting timeout);
 * - the transfer time: bytes over the transfer bandwidth.
 *
 * Both sides publish KV events: the decode side's received blocks join its prefix cache like computed ones.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { EngineName } from '../core/types.ts';
import type { MockHandoff, MockHandoffOptions, MockLeg, MockPdHost, MockPdStats, MockRoom, PdPlan } from '../engines/mock-handoff.ts';
import { engineAdapter } from '../engines/index.ts';
import { mockHandoff } from '../engines/mocks.ts';
import { readBody, sendJson } from '../http/body.ts';
import type { MockEngine } from './engine/index.ts';

export type { PdPlan } from '../engines/mock-handoff.ts';

export type PdRole = 'prefill' | 'decode' | 'both';
export type PdProtocol = EngineName;

export interface MockPdOptions extends MockHandoffOptions {
  readonly role: PdRole;
  readonly protocol: PdProtocol;
  /** Prefill: how long finished blocks wait to be pulled, ms. Default 30 s (kv_lease_duration). */
  readonly leaseMs?: number;
  /** Decode: what a failed KV load does. Default fail. */
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

/** One request of a leg, as the OpenAI surface hands it over. */
export interface MockLegInput {
  readonly engine: MockEngine;
  readonly rank: number;
  readonly endpoint: 'chat' | 'completions';
  readonly prompt: readonly number[];
  readonly body: Record<string, unknown>;
  readonly raw: string;
  readonly closed: () => boolean;
  readonly lora: { loraName: string | null; cacheSalt: string | null };
  readonly eosFirstToken: boolean;
}

interface Lease {
  readonly engine: MockEngine;
  readonly timer: NodeJS.Timeout;
  readonly numTokens: number;
}

function deferred<T>(): { promise: Promise<T>; resolve(v: T): void } {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

function newRoom(): MockRoom {
  const arrived = deferred<void>();
  const kv = deferred<{ numTokens: number } | { error: string }>();
  return { decodeArrived: arrived.promise, arrive: () => arrived.resolve(), kvReady: kv.promise, ready: (v) => kv.resolve(v) };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class MockPd {
  readonly role: PdRole;
  readonly protocol: PdProtocol;
  private readonly handoff: MockHandoff;
  private readonly leases = new Map<string, Lease>();
  private readonly rooms = new Map<string, MockRoom>();
  private bootstrap: Server | null = null;
  private seq = 0;
  /** Counters for tests and GET /fault. */
  readonly stats: MockPdStats = {
    leasesExpired: 0,
    pulls: 0,
    pullsGone: 0,
    transferredTokens: 0,
    bootstrapTimeouts: 0,
    disaggRequestIds: [],
    refusedLegs: 0,
    generationParams: [],
  };

  constructor(
    private readonly o: MockPdOptions,
    private readonly host: string,
    private readonly httpPort: () => number,
    private readonly speedup: number,
    private readonly engineId: string,
    private readonly ranks: number,
  ) {
    this.role = o.role;
    this.protocol = o.protocol;
    this.handoff = mockHandoff(o.protocol);
  }

  get bootstrapPort(): number | null {
    return this.bootstrap ? (this.bootstrap.address() as AddressInfo).port : null;
  }

  /** A bootstrap engine's (SGLang's) prefill: serve the bootstrap port. */
  async open(): Promise<void> {
    if (this.role !== 'prefill' || engineAdapter(this.protocol).pd.flow !== 'bootstrap') return;
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
    for (const r of this.rooms.values()) r.ready({ error: 'the prefill engine stopped' });
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
    for (const r of this.rooms.values()) r.ready({ error: 'the prefill engine restarted' });
    this.rooms.clear();
  }

  /** The side channel routes served on the HTTP port (the prefill's leased KV). */
  routes(): Record<string, (req: IncomingMessage, res: ServerResponse, body: Record<string, unknown>) => void> {
    return { '/mock/nixl/pull': (_req, res, body) => this.pull(res, body) };
  }

  /** The DP rank a request runs on as this engine picks it, or null for the mock's default. */
  rankFor(req: { role: 'prefill' | 'decode'; header: string | undefined; body: Record<string, unknown>; raw: string }): number | null {
    if (this.role === 'both' || !this.handoff.rank) return null;
    return this.handoff.rank({ ranks: this.ranks, options: this.o }, req);
  }

  /** Decides how one request is served (null: as an ordinary request). */
  async plan(input: MockLegInput): Promise<PdPlan | null> {
    if (this.role === 'both') return null;
    const leg: MockLeg = {
      role: this.role,
      endpoint: input.endpoint,
      prompt: input.prompt,
      body: input.body,
      raw: input.raw,
      rank: input.rank,
      closed: input.closed,
      localHitTokens: () => input.engine.prefixHitTokens(input.prompt, input.lora.loraName, input.lora.cacheSalt),
      eosFirstToken: input.eosFirstToken,
    };
    return this.handoff.plan(this.hostFor(input.engine), leg);
  }

  private hostFor(engine: MockEngine): MockPdHost {
    return {
      host: this.host,
      httpPort: this.httpPort,
      engineId: this.engineId,
      ranks: this.ranks,
      blockSize: engine.config.blockSize,
      loadFailurePolicy: this.o.loadFailurePolicy ?? 'fail',
      bootstrapTimeoutMs: this.o.bootstrapTimeoutMs ?? 300_000,
      options: this.o,
      stats: this.stats,
      nextSeq: () => ++this.seq,
      lease: (prompt, leaseId) => this.lease(engine, prompt, leaseId),
      pull: (where) => this.pullFrom(where),
      transfer: async (tokens) => {
        const bytes = tokens * (this.o.kvBytesPerToken ?? 147_456);
        await sleep((bytes / (this.o.transferBytesPerS ?? 50e9) / this.speedup) * 1000);
        this.stats.transferredTokens += tokens;
      },
      sleep: async (ms) => {
        await sleep(ms / this.speedup);
      },
      room: (key) => {
        let r = this.rooms.get(key);
        if (!r) {
          r = newRoom();
          this.rooms.set(key, r);
        }
        return r;
      },
      dropRoom: (key) => this.rooms.delete(key),
      fetchBootstrap: async (host, port, room, prefillRank) => {
        try {
          const q = prefillRank === null ? '' : `?rank=${prefillRank}`;
          const res = await fetch(`http://${host}:${port}/mock/bootstrap/${room}${q}`, {
            method: 'POST',
            signal: AbortSignal.timeout(Math.max(1, (this.o.bootstrapTimeoutMs ?? 300_000) / this.speedup)),
          });
          return (await res.json()) as { numTokens: number } | { error: string };
        } catch (err) {
          return { error: (err as Error).message };
        }
      },
    };
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

  private async pullFrom(where: { host: unknown; port: unknown; leaseId: unknown }): Promise<{ numTokens: number } | { error: string }> {
    const { host, port } = where;
    if (typeof host !== 'string' || typeof port !== 'number') return { error: 'the handoff names no remote host and port' };
    try {
      const res = await fetch(`http://${host}:${port}/mock/nixl/pull`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ remote_request_id: where.leaseId }),
        signal: AbortSignal.timeout(10_000),
      });
      const j = (await res.json()) as { num_tokens?: number; error?: { message?: string } };
      if (res.status !== 200 || typeof j.num_tokens !== 'number') return { error: j.error?.message ?? `pull answered ${res.status}` };
      return { numTokens: j.num_tokens };
    } catch (err) {
      return { error: (err as Error).message };
    }
  }

  /** The prefill's side channel: the decode side reads the leased blocks; the read ends the lease. */
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
    const url = new URL(req.url ?? '/', 'http://bootstrap');
    const m = /^\/mock\/bootstrap\/(\d+)$/.exec(url.pathname);
    await readBody(req, 1024).catch(() => undefined);
    if (req.method !== 'POST' || !m) {
      sendJson(res, 404, { error: 'no such bootstrap route' });
      return;
    }
    let r = this.rooms.get(m[1]);
    if (!r) {
      r = newRoom();
      this.rooms.set(m[1], r);
    }
    r.arrive();
    const got = await r.kvReady;
    // The decode side fetches from the rank it believes holds the room; another rank has no KV for it.
    const asked = url.searchParams.get('rank');
    if (!('error' in got) && asked !== null && r.prefillRank !== undefined) {
      const want = asked === 'room' ? Number(BigInt(m[1]) % BigInt(this.ranks)) : Number(asked);
      if (want !== r.prefillRank) {
        sendJson(res, 409, { error: `room ${m[1]} was prefilled on rank ${r.prefillRank}, not on rank ${want}` });
        return;
      }
    }
    sendJson(res, 'error' in got ? 409 : 200, got);
  }
}
