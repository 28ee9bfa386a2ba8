/**
 * Body of the tokenizer worker thread: one LocalTokenizer (with its segment cache) answering encode requests, so a
 * cold 100k-token prompt (100+ ms of BPE) never stalls the streams on the server's event loop.
 */
import { getHeapStatistics } from 'node:v8';
import { parentPort, workerData } from 'node:worker_threads';
import { LocalTokenizer, type LocalTokenizerOptions } from './local.ts';
import { KnownStrings, type PackedChat, SHARED_MIN_CHARS } from './shared-strings.ts';
import type { MmItem } from '../core/types.ts';

/** A chat's input travels packed (shared-strings.ts): long contents by reference. */
export type ThreadRequest =
  | ({ id: number; kind: 'chat' } & PackedChat)
  | { id: number; kind: 'prompt'; text: string }
  | ({ id: number; kind: 'chatMedia'; placeholderTokens: number; placeholderId?: number } & PackedChat)
  | { id: number; kind: 'info' };

export type ThreadReply =
  | { id: number; ok: true; ids: Uint32Array }
  | { id: number; ok: true; media: { ids: Uint32Array; items: MmItem[] } | null }
  | { id: number; ok: true; info: Record<string, unknown> }
  | { id: number; ok: false; error: string };

const { dir, options } = workerData as { dir: string; options?: LocalTokenizerOptions };

const tok = await LocalTokenizer.load(dir, options);
const port = parentPort!;
const known = new KnownStrings();

/** One request's reply and the buffers it hands over (its ids: transferred, not copied). */
function answer(req: ThreadRequest, transfer: ArrayBuffer[]): ThreadReply {
  try {
    if (req.kind === 'info') {
      return {
        id: req.id,
        ok: true,
        info: {
          segmentCaching: tok.segmentCaching,
          cache: tok.cacheInfo,
          fastTemplate: tok.chat.fastPath,
          fastTemplateVerified: tok.chat.fastVerified,
          fastTemplateMismatch: tok.chat.fastMismatch,
          // This thread's own V8 heap (the segment cache lives here, outside the main thread's heap metrics).
          heapUsedBytes: getHeapStatistics().used_heap_size,
          heapTotalBytes: getHeapStatistics().total_heap_size,
        },
      };
    }
    if (req.kind === 'chatMedia') {
      const media = tok.encodeChatMedia(known.unpack(req), req.placeholderTokens, req.placeholderId);
      if (media) transfer.push(media.ids.buffer as ArrayBuffer);
      return { id: req.id, ok: true, media };
    }
    const ids = req.kind === 'chat' ? tok.encodeChat(known.unpack(req)) : Uint32Array.from(tok.encodePrompt(req.text));
    transfer.push(ids.buffer as ArrayBuffer);
    return { id: req.id, ok: true, ids };
  } catch (err) {
    return { id: req.id, ok: false, error: (err as Error).message };
  }
}

/** A request that may take long: text the thread has not seen (a plain prompt, or a chat bringing new long contents). */
function mayBeSlow(req: ThreadRequest): boolean {
  if (req.kind === 'prompt') return req.text.length >= SHARED_MIN_CHARS;
  return req.kind !== 'info' && req.defs !== undefined;
}

/** Posts replies; one that cannot be posted (not cloneable) is answered as a failed call instead of ending the thread. */
function post(replies: ThreadReply[], transfer: ArrayBuffer[]): void {
  try {
    port.postMessage(replies.length === 1 ? replies[0] : replies, transfer);
  } catch (err) {
    const error = `tokenizer thread: reply not sent (${(err as Error).message})`;
    port.postMessage(replies.map((r) => ({ id: r.id, ok: false, error }) satisfies ThreadReply));
  }
}

// A batch (the requests the server's event loop made in one turn) is answered with one message: a message each way
// per turn instead of per request. Replies gathered before a request that may take long (a cold prompt: 100+ ms of
// BPE) go first, so a warm chat that came in the same turn does not wait for it.
port.on('message', (msg: ThreadRequest | ThreadRequest[]) => {
  const batch = Array.isArray(msg) ? msg : [msg];
  let replies: ThreadReply[] = [];
  let transfer: ArrayBuffer[] = [];
  for (const req of batch) {
    if (replies.length > 0 && mayBeSlow(req)) {
      post(replies, transfer);
      replies = [];
      transfer = [];
    }
    replies.push(answer(req, transfer));
  }
  post(replies, transfer);
});
port.postMessage({ id: 0, ok: true, info: { ready: true } } satisfies ThreadReply);
