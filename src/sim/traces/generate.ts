/**
 * Synthetic traces in the Mooncake format, deterministic for a seed.
 *
 * Prompts are built as growing token contexts cut into 512-token blocks: a full block keeps its id for as long as a
 * context only grows past it (so the next turn of a session reuses it), while a trailing partial block always gets
 * a fresh id (the next turn extends it, which makes it a different block). Shared system prompts are shared ids.
 */
import { Sfc32 } from '../../core/rng.ts';
import { TRACE_BLOCK_TOKENS, type TraceRequest } from './format.ts';
import { sortByTimestamp } from './reader.ts';

export type TraceKind = 'skewed' | 'shared-prefix' | 'multi-turn' | 'noisy-neighbour' | 'agentic';
export const TRACE_KINDS: readonly TraceKind[] = ['skewed', 'shared-prefix', 'multi-turn', 'noisy-neighbour', 'agentic'];

/** Hands out fresh block ids. */
class IdAllocator {
  private next = 0;
  take(): number {
    return this.next++;
  }
}

/** A token context that only grows: full blocks keep their ids, the partial tail is re-identified per prompt. */
class Context {
  private readonly fullIds: number[];
  private length: number;

  constructor(
    private readonly ids: IdAllocator,
    base?: { fullIds: readonly number[]; length: number },
  ) {
    this.fullIds = base ? [...base.fullIds] : [];
    this.length = base ? base.length : 0;
  }

  get tokens(): number {
    return this.length;
  }

  append(tokens: number): void {
    this.length += Math.max(0, Math.round(tokens));
    const full = Math.floor(this.length / TRACE_BLOCK_TOKENS);
    while (this.fullIds.length < full) this.fullIds.push(this.ids.take());
  }

  /** The hash ids of a prompt equal to the current context. */
  promptIds(): number[] {
    const out = this.fullIds.slice();
    if (this.length % TRACE_BLOCK_TOKENS !== 0) out.push(this.ids.take());
    return out;
  }

  snapshot(): { fullIds: readonly number[]; length: number } {
    return { fullIds: this.fullIds.slice(), length: this.length };
  }
}

function request(ts: number, ctx: Context, outputLength: number): TraceRequest {
  return {
    timestamp: Math.round(ts),
    inputLength: ctx.tokens,
    outputLength: Math.max(1, Math.round(outputLength)),
    hashIds: ctx.promptIds(),
  };
}

export interface SkewedOptions {
  requests: number;
  seed: number;
  /** Mean arrival rate over all request classes, requests per second. */
  rate: number;
  /** Fraction of one-shot short requests (under 1,800 tokens), mostly cold. */
  shortFraction: number;
  /** Fraction of one-shot medium documents (1,800 to 12k tokens), cold. */
  mediumFraction: number;
  /** Mean turns per agentic session (geometric). */
  meanTurns: number;
  /** Agentic sessions end once their context passes this many tokens. */
  maxContext: number;
  /** Mean tool/think time between turns of a session, seconds (on top of a fixed 2 s). */
  thinkTimeS: number;
}

export const SKEWED_DEFAULTS: SkewedOptions = {
  requests: 10_000,
  seed: 1,
  rate: 1,
  shortFraction: 0.42,
  mediumFraction: 0.12,
  meanTurns: 12,
  maxContext: 160_000,
  thinkTimeS: 6,
};

/**
 * docs/protocols.md §6's production shape: about 44% of requests under 1,800 tokens and mostly cold, a mean near 14k
 * and a tail past 130k made of agentic sessions whose context grows turn by turn (tool output appended each turn), so
 * a few long warm requests hold most of the blocks while many short cold ones hold most of the requests.
 */
export function generateSkewed(opts: Partial<SkewedOptions> = {}): TraceRequest[] {
  const o = { ...SKEWED_DEFAULTS, ...opts };
  const ids = new IdAllocator();
  // One shared system-prompt block for some short requests; a few agent templates of 4 blocks for sessions.
  const chatSystem = new Context(ids);
  chatSystem.append(TRACE_BLOCK_TOKENS);
  const chatBase = chatSystem.snapshot();
  const agents = Array.from({ length: 6 }, () => {
    const c = new Context(ids);
    c.append(4 * TRACE_BLOCK_TOKENS);
    return c.snapshot();
  });

  const sessionFraction = Math.max(0, 1 - o.shortFraction - o.mediumFraction);
  let horizon = ((1.5 * o.requests) / o.rate) * 1000;
  for (;;) {
    const rng = new Sfc32(o.seed, 1);
    const out: TraceRequest[] = [];
    // One-shot classes: Poisson arrivals.
    const oneShot = (fraction: number, make: (t: number) => TraceRequest) => {
      if (fraction <= 0) return;
      const meanGap = 1000 / (o.rate * fraction);
      for (let t = rng.exp(meanGap); t < horizon; t += rng.exp(meanGap)) out.push(make(t));
    };
    oneShot(o.shortFraction, (t) => {
      const len = Math.round(rng.logUniform(24, 1799));
      const warm = len > TRACE_BLOCK_TOKENS + 16 && rng.chance(0.15);
      const ctx = new Context(ids, warm ? chatBase : undefined);
      ctx.append(len - ctx.tokens);
      return request(t, ctx, rng.logNormal(120, 0.8));
    });
    oneShot(o.mediumFraction, (t) => {
      const ctx = new Context(ids);
      ctx.append(rng.logUniform(1800, 12_000));
      return request(t, ctx, rng.logNormal(200, 0.7));
    });
    // Agentic sessions: Poisson session starts, each turn appends the previous answer and a tool result.
    if (sessionFraction > 0) {
      const meanGap = (1000 * o.meanTurns) / (o.rate * sessionFraction);
      for (let start = rng.exp(meanGap); start < horizon; start += rng.exp(meanGap)) {
        const ctx = new Context(ids, agents[rng.int(0, agents.length - 1)]);
        ctx.append(rng.logNormal(4000, 0.6));
        let t = start;
        while (t < horizon) {
          const output = rng.logNormal(150, 0.8);
          out.push(request(t, ctx, output));
          if (rng.chance(1 / o.meanTurns)) break;
          ctx.append(output + rng.logNormal(1600, 0.9));
          if (ctx.tokens > o.maxContext) break;
          // Think and tool time between turns.
          t += 2000 + rng.exp(o.thinkTimeS * 1000);
        }
      }
    }
    if (out.length >= o.requests || horizon > 1e12) {
      sortByTimestamp(out);
      return out.slice(0, o.requests);
    }
    horizon *= 1.5;
  }
}

export interface SharedPrefixOptions {
  requests?: number;
  seed: number;
  /** Requests per second (Poisson); Infinity sends everything at time 0, like SGLang's default request rate. */
  rate: number;
  groups: number;
  promptsPerGroup: number;
  systemPromptLen: number;
  questionLen: number;
  outputLen: number;
}

/** SGLang bench_serving's generated-shared-prefix defaults (`--gsp-*`). */
export const SHARED_PREFIX_DEFAULTS: SharedPrefixOptions = {
  seed: 1,
  rate: 8,
  groups: 64,
  promptsPerGroup: 16,
  systemPromptLen: 2048,
  questionLen: 128,
  outputLen: 256,
};

/**
 * SGLang's generated-shared-prefix benchmark: `groups` system prompts of `systemPromptLen` tokens, each followed by
 * `promptsPerGroup` distinct questions of `questionLen` tokens; all prompts shuffled, then sent at `rate`.
 * `requests`, when set, sizes the number of groups to cover it and keeps the first N after shuffling.
 */
export function generateSharedPrefix(opts: Partial<SharedPrefixOptions> = {}): TraceRequest[] {
  const o = { ...SHARED_PREFIX_DEFAULTS, ...opts };
  const groups = o.requests !== undefined && opts.groups === undefined ? Math.ceil(o.requests / o.promptsPerGroup) : o.groups;
  const ids = new IdAllocator();
  const rng = new Sfc32(o.seed, 2);
  const prompts: Array<{ ctx: Context }> = [];
  for (let g = 0; g < groups; g++) {
    const system = new Context(ids);
    system.append(o.systemPromptLen);
    const base = system.snapshot();
    for (let p = 0; p < o.promptsPerGroup; p++) {
      const ctx = new Context(ids, base);
      ctx.append(o.questionLen);
      prompts.push({ ctx });
    }
  }
  // Fisher-Yates with the seeded generator (SGLang shuffles the prompts too).
  for (let i = prompts.length - 1; i > 0; i--) {
    const j = rng.int(0, i);
    [prompts[i], prompts[j]] = [prompts[j], prompts[i]];
  }
  const n = Math.min(prompts.length, o.requests ?? prompts.length);
  const out: TraceRequest[] = [];
  let t = 0;
  for (let i = 0; i < n; i++) {
    out.push(request(t, prompts[i].ctx, o.outputLen));
    if (Number.isFinite(o.rate) && o.rate > 0) t += rng.exp(1000 / o.rate);
  }
  return out;
}

export interface MultiTurnOptions {
  requests: number;
  seed: number;
  /** Requests per second over all sessions. */
  rate: number;
  meanTurns: number;
  /** Shared system prompt in tokens (a full first block is shared by every session when it is >= 512). */
  systemPromptLen: number;
  /** Median user message and answer lengths in tokens. */
  userLen: number;
  answerLen: number;
  /** Mean user think time between turns, seconds. */
  thinkTimeS: number;
  /** When set, each conversation's requests carry session_id `<prefix><n>`. */
  sessionPrefix: string;
}

export const MULTI_TURN_DEFAULTS: MultiTurnOptions = {
  requests: 5_000,
  seed: 1,
  rate: 4,
  meanTurns: 4,
  systemPromptLen: 600,
  userLen: 400,
  answerLen: 350,
  thinkTimeS: 30,
  sessionPrefix: '',
};

/** Plain chat sessions: a shared system prompt, then user message + answer appended per turn. */
export function generateMultiTurn(opts: Partial<MultiTurnOptions> = {}): TraceRequest[] {
  const o = { ...MULTI_TURN_DEFAULTS, ...opts };
  const ids = new IdAllocator();
  const system = new Context(ids);
  system.append(o.systemPromptLen);
  const base = system.snapshot();
  let horizon = ((1.5 * o.requests) / o.rate) * 1000;
  for (;;) {
    const rng = new Sfc32(o.seed, 3);
    const out: TraceRequest[] = [];
    let sessions = 0;
    const meanGap = (1000 * o.meanTurns) / o.rate;
    for (let start = rng.exp(meanGap); start < horizon; start += rng.exp(meanGap)) {
      const ctx = new Context(ids, base);
      const session = `${o.sessionPrefix}${sessions++}`;
      // The first message is often a pasted document; later ones are short.
      ctx.append(rng.logNormal(o.userLen * 3, 1.0));
      let t = start;
      for (;;) {
        const answer = rng.logNormal(o.answerLen, 0.7);
        out.push(o.sessionPrefix ? { ...request(t, ctx, answer), sessionId: session } : request(t, ctx, answer));
        if (rng.chance(1 / o.meanTurns) || t >= horizon) break;
        ctx.append(answer + rng.logNormal(o.userLen, 0.9));
        t += rng.exp(o.thinkTimeS * 1000);
      }
    }
    if (out.length >= o.requests || horizon > 1e12) {
      sortByTimestamp(out);
      return out.slice(0, o.requests);
    }
    horizon *= 1.5;
  }
}

export interface NoisyNeighbourOptions {
  requests: number;
  seed: number;
  /** Requests per second of each steady tenant. */
  rate: number;
  /** Steady tenants (tenant-0, tenant-1, ...) besides the noisy one. */
  steadyTenants: number;
  /** The noisy tenant sends this many times a steady tenant's rate, during its burst. */
  noisyFactor: number;
  /** The burst: fraction of the trace's duration [from, to). */
  burstFrom: number;
  burstTo: number;
  /** Priority of the noisy tenant's requests (steady tenants send 0). */
  noisyPriority: number;
}

export const NOISY_NEIGHBOUR_DEFAULTS: NoisyNeighbourOptions = {
  requests: 3_000,
  seed: 1,
  rate: 1,
  steadyTenants: 3,
  noisyFactor: 12,
  burstFrom: 0.25,
  burstTo: 0.6,
  noisyPriority: 0,
};

/**
 * Several tenants of multi-turn chat (tenant-0, ...) at a steady rate, and one tenant (`noisy`) that floods the fleet
 * for part of the run: the flow-control benchmark. Every request carries its tenant, priority and session.
 */
export function generateNoisyNeighbour(opts: Partial<NoisyNeighbourOptions> = {}): TraceRequest[] {
  const o = { ...NOISY_NEIGHBOUR_DEFAULTS, ...opts };
  const tenants = o.steadyTenants + 1;
  if (tenants > 15) throw new RangeError('noisy-neighbour: at most 14 steady tenants (block ids are shifted per tenant)');
  const shares = o.steadyTenants + o.noisyFactor * (o.burstTo - o.burstFrom);
  const durationMs = (1000 * o.requests) / (o.rate * shares);
  const out: TraceRequest[] = [];
  for (let k = 0; k < tenants; k++) {
    const noisy = k === o.steadyTenants;
    const name = noisy ? 'noisy' : `tenant-${k}`;
    const rate = noisy ? o.rate * o.noisyFactor : o.rate;
    const span = noisy ? durationMs * (o.burstTo - o.burstFrom) : durationMs;
    const offset = noisy ? durationMs * o.burstFrom : 0;
    const n = Math.max(1, Math.round((rate * span) / 1000));
    const part = generateMultiTurn({ requests: n, seed: o.seed * 31 + k, rate, thinkTimeS: 5, sessionPrefix: `${name}/c` });
    for (const r of part) {
      if (r.timestamp > span) continue;
      out.push({
        ...r,
        // Each tenant's generator numbers its blocks from the same start: shift them apart (no false sharing).
        hashIds: r.hashIds.map((id) => id + k * 2 ** 28),
        timestamp: r.timestamp + offset,
        tenant: name,
        ...(noisy && o.noisyPriority !== 0 ? { priority: o.noisyPriority } : {}),
      });
    }
  }
  sortByTimestamp(out);
  return out;
}

export interface AgenticOptions {
  requests: number;
  seed: number;
  /** Mean arrival rate over all sessions, requests per second. */
  rate: number;
  /** Agent types: each has its own long system prompt (tool definitions, instructions), shared by all its sessions. */
  agentTypes: number;
  /** Zipf exponent of agent-type popularity: a few agents carry most sessions (Mooncake's hot keys, FAST'25 Fig. 11). */
  agentSkew: number;
  /** Median system-prompt length in tokens (log-normal per agent type, sigma 0.6, clamped to [512, 24k]). */
  systemPromptLen: number;
  /** Median first user message (the task) in tokens. */
  taskLen: number;
  /** Median tool result appended per turn in tokens (log-normal, sigma 1.1: file reads and web pages make the tail). */
  toolOutputLen: number;
  /** Median model output per turn in tokens (log-normal, sigma 0.9: mean = 1.5 × median). */
  outputLen: number;
  /** Mean turns per session (geometric). */
  meanTurns: number;
  /** Per turn, the chance the agent rewrites its context after the system prompt (compaction, a dynamic header). */
  contextReset: number;
  /** A session ends before its context passes this many tokens (a task is at most a quarter of it). */
  maxContext: number;
  /** Median tool latency between an answer and the next turn, seconds (log-normal, sigma 1). */
  toolTimeS: number;
  /** Decode time assumed per output token when timing the next turn, ms (a trace is open-loop: no engine feedback). */
  tpotMs: number;
  /** Tenants (tenant-0, ...): agent type k belongs to tenant k mod tenants. 0 leaves requests without a tenant. */
  tenants: number;
}

/**
 * Defaults fitted to the Mooncake FAST'25 tool&agent trace's published statistics (paper, Table 2 and §5.2.1: 23,608
 * requests over one hour, mean input 8,596 and output 182 tokens, cache ratio 59%, "pre-designed, often lengthy,
 * system prompts that are fully repetitive"): docs/calibration.md lists what this generator reproduces.
 */
export const AGENTIC_DEFAULTS: AgenticOptions = {
  requests: 23_608,
  seed: 1,
  rate: 23_608 / 3600,
  agentTypes: 24,
  agentSkew: 1.1,
  systemPromptLen: 2000,
  taskLen: 1700,
  toolOutputLen: 1300,
  outputLen: 121,
  meanTurns: 3,
  contextReset: 0.3,
  maxContext: 131_072,
  toolTimeS: 2,
  tpotMs: 30,
  tenants: 4,
};

/** Cumulative Zipf weights over n ranks, for drawing a rank with one uniform. */
function zipfCdf(n: number, s: number): Float64Array {
  const cdf = new Float64Array(n);
  let sum = 0;
  for (let k = 0; k < n; k++) {
    sum += 1 / (k + 1) ** s;
    cdf[k] = sum;
  }
  for (let k = 0; k < n; k++) cdf[k] /= sum;
  return cdf;
}

function drawRank(cdf: Float64Array, u: number): number {
  let lo = 0;
  let hi = cdf.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (cdf[mid] > u) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/**
 * Agentic / tool-use traffic: sessions of an agent type start with its long system prompt and a task; each further
 * turn appends the model's answer (a tool call) and the tool's result, so turn k+1 extends turn k's prompt block for
 * block. Now and then an agent rewrites its context after the system prompt (compaction), which breaks the chain
 * there. Sessions start as a Poisson process; a turn arrives after the previous answer's decode time and the tool's
 * latency. Every request carries its session id and, with `tenants` > 0, its tenant.
 */
export function generateAgentic(opts: Partial<AgenticOptions> = {}): TraceRequest[] {
  const o = { ...AGENTIC_DEFAULTS, ...opts };
  if (!Number.isInteger(o.agentTypes) || o.agentTypes < 1) throw new RangeError(`agentic: agent types must be >= 1, got ${o.agentTypes}`);
  if (!(o.meanTurns >= 1)) throw new RangeError(`agentic: mean turns must be >= 1, got ${o.meanTurns}`);
  if (!(o.rate > 0 && Number.isFinite(o.rate))) throw new RangeError(`agentic: rate must be positive and finite, got ${o.rate}`);
  if (!(o.contextReset >= 0 && o.contextReset <= 1))
    throw new RangeError(`agentic: context reset must be in [0, 1], got ${o.contextReset}`);
  const ids = new IdAllocator();
  // System prompts are drawn from their own stream, so the agent population does not depend on the traffic's length.
  const agentRng = new Sfc32(o.seed, 5);
  const agents = Array.from({ length: o.agentTypes }, () => {
    const c = new Context(ids);
    c.append(Math.min(24_576, Math.max(512, agentRng.logNormal(o.systemPromptLen, 0.6))));
    return c.snapshot();
  });
  const popularity = zipfCdf(o.agentTypes, o.agentSkew);
  let horizon = ((1.5 * o.requests) / o.rate) * 1000;
  for (;;) {
    const rng = new Sfc32(o.seed, 4);
    const out: TraceRequest[] = [];
    let sessions = 0;
    const meanGap = (1000 * o.meanTurns) / o.rate;
    for (let start = rng.exp(meanGap); start < horizon; start += rng.exp(meanGap)) {
      const type = drawRank(popularity, rng.next());
      const session = `agent-${type}/s${sessions++}`;
      const tenant = o.tenants > 0 ? `tenant-${type % o.tenants}` : undefined;
      let ctx = new Context(ids, agents[type]);
      ctx.append(Math.min(o.maxContext / 4, rng.logNormal(o.taskLen, 1.0)));
      let t = start;
      for (;;) {
        const output = Math.max(1, Math.round(rng.logNormal(o.outputLen, 0.9)));
        const r = request(t, ctx, output);
        out.push({ ...r, sessionId: session, ...(tenant !== undefined ? { tenant } : {}) });
        if (t >= horizon || rng.chance(1 / o.meanTurns)) break;
        if (rng.chance(o.contextReset)) {
          // Compaction: the system prompt stays, a summary of about the task's size replaces the history.
          ctx = new Context(ids, agents[type]);
          ctx.append(Math.min(o.maxContext / 4, rng.logNormal(o.taskLen, 1.0)));
        }
        ctx.append(output + rng.logNormal(o.toolOutputLen, 1.1));
        if (ctx.tokens > o.maxContext) break;
        t += output * o.tpotMs + rng.logNormal(o.toolTimeS * 1000, 1.0);
      }
    }
    if (out.length >= o.requests || horizon > 1e12) {
      sortByTimestamp(out);
      return out.slice(0, o.requests);
    }
    horizon *= 1.5;
  }
}
