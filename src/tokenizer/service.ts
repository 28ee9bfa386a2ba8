/**
 * The server's tokenizer behind one async interface: inline (same thread; tests, tiny deployments) or in a worker
 * thread (default for `kvroute serve`), so tokenizing a long cold prompt does not block the event loop that relays
 * every other stream.
 */
import { Worker } from 'node:worker_threads';
import type { ChatPromptInput } from './chat.ts';
import type { LocalTokenizer, LocalTokenizerOptions } from './local.ts';
import { SentStrings } from './shared-strings.ts';
import type { ThreadReply, ThreadRequest } from './thread.ts';
import type { MmItem } from '../core/types.ts';

/** Ids of a chat with media parts and where each part's placeholders sit. */
export interface ChatMediaIds {
  readonly ids: Uint32Array;
  readonly items: MmItem[];
}

export interface TokenizerService {
  readonly kind: 'inline' | 'thread';
  encodeChat(input: ChatPromptInput): Promise<Uint32Array>;
  encodePrompt(text: string): Promise<ArrayLike<number>>;
  /** A chat with media parts, each as `placeholderTokens` placeholders (LocalTokenizer.encodeChatMedia); null: no media. */
  encodeChatMedia(input: ChatPromptInput, placeholderTokens: number, placeholderId?: number): Promise<ChatMediaIds | null>;
  info(): Promise<Record<string, unknown>>;
  close(): Promise<void>;
}

export function inlineTokenizer(tok: LocalTokenizer): TokenizerService {
  return {
    kind: 'inline',
    encodeChat: async (input) => tok.encodeChat(input),
    encodePrompt: async (text) => tok.encodePrompt(text),
    encodeChatMedia: async (input, n, id) => tok.encodeChatMedia(input, n, id),
    info: async () => ({
      segmentCaching: tok.segmentCaching,
      cache: tok.cacheInfo,
      fastTemplate: tok.chat.fastPath,
      fastTemplateVerified: tok.chat.fastVerified,
      fastTemplateMismatch: tok.chat.fastMismatch,
    }),
    close: async () => undefined,
  };
}

// Compiled (dist/, what ships) the thread body is plain JavaScript; run from the TypeScript sources (tests, tsx) the
// thread needs tsx's loader registered in it first, which thread-entry.mjs does.
const THREAD_ENTRY = import.meta.url.endsWith('.ts')
  ? new URL('./thread-entry.mjs', import.meta.url)
  : new URL('./thread.js', import.meta.url);

/** The tokenizer thread's young generation, MiB. */
export const THREAD_YOUNG_GENERATION_MB = 8;

interface PendingCall {
  resolve: (r: ThreadReply) => void;
  reject: (e: Error) => void;
}

/** Starts a worker thread holding the tokenizer of `dir`; resolves once it has loaded (or rejects with why not). */
export async function threadTokenizer(dir: string, options?: LocalTokenizerOptions): Promise<TokenizerService> {
  // The young generation is capped (V8's default lets it grow to 3 x 16 MiB semi-spaces): tokenizing makes short-lived
  // garbage only, so a small nursery costs more scavenges of almost nothing, and saves ~60 MB of resident memory
  // (bench/RESULTS.md "Memory: bytes, not characters"). The old generation is not capped: a cap turns a spike (one
  // huge prompt) into ERR_WORKER_OUT_OF_MEMORY, which ends the thread and every tokenization after it; the segment
  // cache's byte budget is the bound instead.
  const worker = new Worker(THREAD_ENTRY, {
    workerData: { dir, options },
    resourceLimits: { maxYoungGenerationSizeMb: THREAD_YOUNG_GENERATION_MB },
  });
  const pending = new Map<number, PendingCall>();
  let nextId = 1;
  let dead: Error | null = null;
  await new Promise<void>((resolve, reject) => {
    const onError = (err: Error) => reject(new Error(`tokenizer thread failed to start: ${err.message}`));
    worker.once('error', onError);
    worker.once('message', () => {
      worker.off('error', onError);
      resolve();
    });
  });
  // An idle thread must not keep the process alive (so a server can exit once its sockets close), but a thread with a
  // call in flight must: when the caller awaits it with nothing else on the loop (start-up asks info() before any
  // socket is open), an unref'd worker lets Node exit with 13, "unsettled top-level await", and no output.
  const settle = (id: number): PendingCall | undefined => {
    const p = pending.get(id);
    if (!p) return undefined;
    pending.delete(id);
    if (pending.size === 0) worker.unref();
    return p;
  };
  worker.on('message', (reply: ThreadReply | ThreadReply[]) => {
    if (!Array.isArray(reply)) settle(reply.id)?.resolve(reply);
    else for (const r of reply) settle(r.id)?.resolve(r);
  });
  const fail = (err: Error) => {
    dead ??= err; // the first cause (a failed post, then the exit it leads to)
    for (const p of pending.values()) p.reject(err);
    pending.clear();
  };
  worker.on('error', fail);
  worker.on('exit', (code) => fail(new Error(`tokenizer thread exited (code ${code})`)));
  worker.unref();

  // Calls made in one turn of the event loop (the requests whose bodies came in together) go to the thread as one
  // message, posted once this turn's I/O callbacks have run: a message and a wake-up of the thread cost about as much
  // as a warm chat's whole tokenization (bench/RESULTS.md, "CPU per request: warm chat").
  let queued: ThreadRequest[] = [];
  // Long message contents go once, then by reference (shared-strings.ts). Packed when the call is queued: calls reach
  // the thread in the order they are queued, so both tables see the same changes in the same order.
  const sent = new SentStrings();
  /** Calls and the messages that carried them (/debug/state: calls per message is the batching). */
  let calls = 0;
  let messages = 0;
  const flush = () => {
    const batch = queued;
    queued = [];
    if (dead) return;
    calls += batch.length;
    messages++;
    try {
      worker.postMessage(batch.length === 1 ? batch[0] : batch);
    } catch (err) {
      // Not cloneable (inputs come from JSON, so not expected). The batch carried table changes the thread now lacks
      // (shared-strings.ts), so the two tables would disagree: the tokenizer fails as if its thread had died (every
      // call, now and later, rejects with this error) rather than answer from a table out of step.
      fail(new Error(`tokenizer thread: a batch could not be posted (${(err as Error).message})`));
      void worker.terminate();
    }
  };
  const call = (req: Omit<ThreadRequest, 'id'>): Promise<ThreadReply> => {
    if (dead) return Promise.reject(dead);
    const id = nextId++;
    return new Promise((resolve, reject) => {
      if (pending.size === 0) worker.ref();
      pending.set(id, { resolve, reject });
      if (queued.length === 0) setImmediate(flush);
      queued.push({ ...req, id } as ThreadRequest);
    });
  };
  const ids = async (req: Omit<ThreadRequest, 'id'>): Promise<Uint32Array> => {
    const r = await call(req);
    if (!r.ok) throw new Error(r.error);
    if (!('ids' in r)) throw new Error('tokenizer thread answered without ids');
    return r.ids;
  };
  return {
    kind: 'thread',
    encodeChat: (input) => ids({ kind: 'chat', ...sent.pack(input) } as Omit<ThreadRequest, 'id'>),
    encodePrompt: (text) => ids({ kind: 'prompt', text } as Omit<ThreadRequest, 'id'>),
    encodeChatMedia: async (input, placeholderTokens, placeholderId) => {
      const r = await call({ kind: 'chatMedia', ...sent.pack(input), placeholderTokens, placeholderId } as Omit<ThreadRequest, 'id'>);
      if (!r.ok) throw new Error(r.error);
      if (!('media' in r)) throw new Error('tokenizer thread answered without media ids');
      return r.media;
    },
    info: async () => {
      const r = await call({ kind: 'info' } as Omit<ThreadRequest, 'id'>);
      const posted = { calls, messages };
      return r.ok && 'info' in r ? { thread: true, ...posted, ...r.info } : { thread: true, ...posted };
    },
    close: async () => {
      await worker.terminate();
    },
  };
}
