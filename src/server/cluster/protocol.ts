/**
 * The IPC between the primary (the routing core: KvRouter, Dispatcher, workers, events, metrics) and its HTTP shells
 * under `kvroute serve --processes N`. Messages go over node:cluster's channel with the 'advanced' serialization
 * (structured clone: typed arrays, Sets and bigints arrive as sent). A shell asks, the primary decides and answers:
 * every routing decision is the one dispatcher's, in the order the primary receives the submissions. Per request a shell
 * sends kvr.submit and kvr.finish (a streamed answer's first token as kvr.firstToken between them) and receives
 * kvr.step; the primary notes the decisions it dispatches itself (/debug/state, the blindness accounting).
 */
import type { FinishReport, PrefillReport, Submission } from '../../core/dispatch/dispatcher.ts';
import type { ServeConfig } from '../../config/serve.ts';
import type { RouteDecision } from '../../core/types.ts';
import type { TokenizerCacheGauges } from '../../metrics/memory.ts';
import type { ShellMetricsSnapshot } from '../../metrics/shell-metrics.ts';
import type { NextStep } from '../../runtime/lifecycle.ts';

/** Where a shell sends an attempt: what it needs of a worker to open its own connection pool. */
export interface ShellWorkerInfo {
  readonly id: string;
  readonly url: string;
  readonly sourceKeys: readonly string[];
  readonly bootstrapPort: number;
  /** h2c: the engine speaks HTTP/2 with prior knowledge. */
  readonly appProtocol?: 'h2c';
  /** TensorRT-LLM's optional handoff fields as the worker's spec sets them (by wire field name). */
  readonly handoffSettings?: Readonly<Record<string, 'auto' | 'on' | 'off'>>;
}

/** A routing decision as a step carries it to a shell: without its hashes and candidates (the shell reads neither). */
export type WireDecision = Omit<RouteDecision, 'seqHashes' | 'candidates'>;

/** Shell → primary. Each carries the router's request id. */
export type ShellMessage =
  /**
   * A request to route. The shell hashes the prompt's blocks (`sub.seqHashes` and `sub.promptTokens`, no token ids):
   * `lora` names the adapter it seeded them with (null: none), which the primary checks against the one routing would
   * use (a model becomes an adapter when a worker lists it): a mismatch is answered with kvr.rehash, not routed.
   * Token ids instead of hashes (the primary hashes) when the shell could not hash them, or after a second kvr.rehash.
   * `api` names the API the request came in on (what /debug/state's recent decisions show; the primary notes each
   * attempt it dispatches there itself, and in the event-stream blindness accounting).
   */
  | {
      readonly k: 'kvr.submit';
      readonly id: string;
      readonly api: string;
      readonly sub: Submission;
      readonly lora?: string | null;
    }
  | { readonly k: 'kvr.failed'; readonly id: string; readonly error: string }
  | { readonly k: 'kvr.prefillFailed'; readonly id: string; readonly error: string }
  | { readonly k: 'kvr.cancel'; readonly id: string }
  /** Which worker tokenizes for `model` (remote and render tokenizer modes); answered with kvr.target. */
  | { readonly k: 'kvr.target'; readonly id: string; readonly model: string }
  | { readonly k: 'kvr.prefillDone'; readonly id: string; readonly report: PrefillReport }
  /** A streamed answer's first token (a whole answer's comes with its kvr.finish: `firstToken`). */
  | { readonly k: 'kvr.firstToken'; readonly id: string }
  /**
   * The request ended. `firstToken`: its first token came just before (a whole answer, whose first token is not
   * observable apart from its end): the primary applies it first, as it would a kvr.firstToken sent before this.
   */
  | {
      readonly k: 'kvr.finish';
      readonly id: string;
      readonly report: FinishReport;
      readonly outputTokens?: number;
      readonly firstToken?: true;
    }
  /**
   * Asked at scrape time: the shell's tokenizer cache (router_tokenizer_cache_*; null: the shell has none) and its
   * request metrics (the registry the shell records them in, summed into the primary's /metrics).
   */
  | {
      readonly k: 'kvr.cacheInfo';
      readonly id: number;
      readonly cache: TokenizerCacheGauges | null;
      readonly metrics: ShellMetricsSnapshot;
    }
  /** Unasked: the shell's request metrics, sent a second after they change and when it stops (what the primary keeps of a shell that dies). */
  | { readonly k: 'kvr.snapshot'; readonly metrics: ShellMetricsSnapshot }
  | { readonly k: 'kvr.listening'; readonly url: string }
  /** The shell's message handler is in place: send kvr.start (a message sent earlier would be lost). */
  | { readonly k: 'kvr.ready' }
  /** The shell could not start (its listener, its tokenizer): the primary fails start-up with this message. */
  | { readonly k: 'kvr.startFailed'; readonly message: string }
  /** Messages of one event-loop turn, in order: one IPC write instead of several. */
  | { readonly k: 'kvr.batch'; readonly msgs: readonly ShellMessage[] };

/** Primary → shell. */
export type PrimaryMessage =
  | { readonly k: 'kvr.start'; readonly config: ServeConfig; readonly primaryUrl: string }
  | { readonly k: 'kvr.step'; readonly id: string; readonly step: NextStep; readonly workers: readonly ShellWorkerInfo[] }
  | { readonly k: 'kvr.target'; readonly id: string; readonly worker: ShellWorkerInfo | null }
  /** The submission's hashes were seeded with another adapter than routing uses (`lora`): submit it again. */
  | { readonly k: 'kvr.rehash'; readonly id: string; readonly lora: string | null }
  | { readonly k: 'kvr.close'; readonly graceMs: number }
  | { readonly k: 'kvr.cacheInfo'; readonly id: number }
  | { readonly k: 'kvr.batch'; readonly msgs: readonly PrimaryMessage[] };

/**
 * Messages for one peer, sent together at the end of the event-loop turn (each IPC message is a write and a
 * deserialisation on the other side: batching them is most of the channel's cost under load).
 */
export class Outbox<M> {
  private queued: M[] = [];
  private scheduled = false;

  constructor(private readonly write: (m: M | { readonly k: 'kvr.batch'; readonly msgs: readonly M[] }) => void) {}

  push(m: M): void {
    this.queued.push(m);
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => this.flush());
  }

  /** The newest message queued and not yet sent (undefined: none). */
  last(): M | undefined {
    return this.queued[this.queued.length - 1];
  }

  /** `m` in place of the newest message queued (nothing queued: sent as a message of its own). */
  replaceLast(m: M): void {
    if (this.queued.length === 0) this.push(m);
    else this.queued[this.queued.length - 1] = m;
  }

  flush(): void {
    this.scheduled = false;
    const q = this.queued;
    if (q.length === 0) return;
    this.queued = [];
    this.write(q.length === 1 ? q[0] : { k: 'kvr.batch', msgs: q });
  }
}

/**
 * What is wrong with one message from a shell (after kvr.batch is unpacked), or null when the primary can act on it: the
 * fields each kind's handler reads, with their types. A message that fails is dropped and counted
 * (router_shell_messages_dropped_total); one that carries a request id is answered with a refusal, so its client gets
 * an error instead of waiting.
 */
export function shellMessageProblem(m: unknown, blockSize: number): string | null {
  if (typeof m !== 'object' || m === null) return 'not an object';
  const o = m as Record<string, unknown>;
  if (typeof o.k !== 'string' || !o.k.startsWith('kvr.')) return 'no kvr.* kind';
  const id = () => (typeof o.id === 'string' && o.id.length > 0 ? null : `${o.k} without a request id`);
  switch (o.k) {
    case 'kvr.submit': {
      const sub = o.sub as Record<string, unknown> | null | undefined;
      if (id()) return id();
      if (typeof sub !== 'object' || sub === null) return 'kvr.submit without a submission';
      if (sub.requestId !== o.id) return 'kvr.submit whose submission names another request';
      if (typeof sub.model !== 'string') return 'kvr.submit without a model';
      if (typeof o.api !== 'string') return 'kvr.submit without an api';
      if (sub.tokens !== undefined) {
        const tokensOk = sub.tokens instanceof Uint32Array || Array.isArray(sub.tokens);
        return tokensOk && sub.seqHashes === undefined ? null : 'kvr.submit without token ids';
      }
      if (sub.seqHashes === undefined) return 'kvr.submit without token ids';
      return hashesProblem(sub, o.lora, blockSize);
    }
    case 'kvr.failed':
    case 'kvr.prefillFailed':
      return id() ?? (typeof o.error === 'string' ? null : `${o.k} without an error`);
    case 'kvr.cancel':
    case 'kvr.firstToken':
      return id();
    case 'kvr.target':
      return id() ?? (typeof o.model === 'string' ? null : 'kvr.target without a model');
    case 'kvr.prefillDone':
      return id() ?? (typeof o.report === 'object' && o.report !== null ? null : `${o.k} without a report`);
    case 'kvr.finish':
      if (id()) return id();
      if (typeof o.report !== 'object' || o.report === null) return 'kvr.finish without a report';
      return o.firstToken === undefined || o.firstToken === true ? null : 'kvr.finish whose firstToken is not true';
    case 'kvr.cacheInfo':
      if (typeof o.id !== 'number') return 'kvr.cacheInfo without an id';
      return snapshotProblem(o.metrics);
    case 'kvr.snapshot':
      return snapshotProblem(o.metrics);
    case 'kvr.listening':
      return typeof o.url === 'string' ? null : 'kvr.listening without a url';
    case 'kvr.startFailed':
      return typeof o.message === 'string' ? null : 'kvr.startFailed without a message';
    case 'kvr.ready':
      return null;
    default:
      return `unknown kind ${o.k}`;
  }
}

/** A submission's block hashes as a shell computes them: one per full block of its prompt, and the adapter they name. */
function hashesProblem(sub: Record<string, unknown>, lora: unknown, blockSize: number): string | null {
  if (!(sub.seqHashes instanceof BigUint64Array)) return 'kvr.submit whose block hashes are not a BigUint64Array';
  const n = sub.promptTokens;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0) return 'kvr.submit with block hashes but no prompt length';
  const blocks = Math.floor(n / blockSize);
  if (sub.seqHashes.length !== blocks) {
    return `kvr.submit with ${sub.seqHashes.length} block hashes for ${n} tokens (${blocks} full blocks of ${blockSize})`;
  }
  if (lora !== null && typeof lora !== 'string') return 'kvr.submit with block hashes but no adapter they were seeded with';
  return null;
}

function snapshotProblem(m: unknown): string | null {
  const o = m as Record<string, unknown> | null | undefined;
  return typeof o === 'object' && o !== null && typeof o.json === 'string' && typeof o.totals === 'object' && o.totals !== null
    ? null
    : 'a shell metrics snapshot without its registry';
}

export function isShellMessage(m: unknown): m is ShellMessage {
  return typeof m === 'object' && m !== null && typeof (m as { k?: unknown }).k === 'string' && (m as { k: string }).k.startsWith('kvr.');
}
