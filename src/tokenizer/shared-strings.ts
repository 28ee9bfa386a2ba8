/**
 * Long message contents sent to the tokenizer thread once, then by reference. A warm chat repeats its system prompt
 * (tens of kB) in every request, and posting it to the thread copied it twice per request (serialised here,
 * deserialised there): about as much of the server thread's CPU as parsing the request body. The server side remembers
 * the contents it sent (by value: a Map keyed by the string) and sends a number in their place; the thread keeps the
 * same table. Both tables change only by what the server sends, in order (definitions with the call that introduces
 * them, removals with the call during which they were evicted), so they agree.
 */
import type { ChatPromptInput } from './chat.ts';

/** Contents shorter than this are sent as they are (a reference saves nothing on them). */
export const SHARED_MIN_CHARS = 2048;
/** Characters the tables hold at most (each side; oldest unused first out). */
export const SHARED_MAX_CHARS = 4 * 1024 * 1024;

/** A content sent by reference. Never a valid content (parseChatInput allows a string, a list, or null). */
interface SharedRef {
  readonly kvrouteShared: number;
}

/** What a chat input travels as: the input with long contents replaced, and the table changes that come with it. */
export interface PackedChat {
  readonly input: ChatPromptInput;
  readonly defs?: [number, string][];
  readonly drops?: number[];
}

/** The server side's table. */
export class SentStrings {
  private readonly ids = new Map<string, { id: number; stamp: number }>();
  private chars = 0;
  private nextId = 1;
  private stamp = 0;

  pack(input: ChatPromptInput): PackedChat {
    const stamp = ++this.stamp;
    let messages: unknown[] | null = null;
    const defs: [number, string][] = [];
    const src = input.messages;
    for (let i = 0; i < src.length; i++) {
      const m = src[i] as { content?: unknown } | null;
      const c = m !== null && typeof m === 'object' ? m.content : undefined;
      if (typeof c !== 'string' || c.length < SHARED_MIN_CHARS || c.length > SHARED_MAX_CHARS / 4) continue;
      let e = this.ids.get(c);
      if (e === undefined) {
        e = { id: this.nextId++, stamp };
        defs.push([e.id, c]);
        this.chars += c.length;
      } else {
        this.ids.delete(c); // re-inserted below: the Map's order is the recency order
        e.stamp = stamp;
      }
      this.ids.set(c, e);
      messages ??= src.slice();
      messages[i] = { ...m, content: { kvrouteShared: e.id } satisfies SharedRef };
    }
    if (messages === null) return { input };
    const drops: number[] = [];
    while (this.chars > SHARED_MAX_CHARS) {
      const oldest = this.ids.entries().next().value;
      if (oldest === undefined || oldest[1].stamp === stamp) break; // never what this call refers to
      this.ids.delete(oldest[0]);
      this.chars -= oldest[0].length;
      drops.push(oldest[1].id);
    }
    return { input: { ...input, messages }, ...(defs.length > 0 ? { defs } : {}), ...(drops.length > 0 ? { drops } : {}) };
  }
}

/** The thread's table: the same contents under the same numbers. */
export class KnownStrings {
  private readonly strings = new Map<number, string>();

  /** The input as the server had it; the table updated (definitions before, removals after this call's references). */
  unpack(p: PackedChat): ChatPromptInput {
    if (p.defs) for (const [id, s] of p.defs) this.strings.set(id, s);
    let input = p.input;
    let messages: unknown[] | null = null;
    const src = input.messages;
    // The removals apply even when a reference fails: the server side has dropped those strings either way.
    try {
      for (let i = 0; i < src.length; i++) {
        const m = src[i] as { content?: unknown } | null;
        const c = m !== null && typeof m === 'object' ? (m.content as Partial<SharedRef> | null | undefined) : undefined;
        if (c === null || typeof c !== 'object' || Array.isArray(c) || typeof c.kvrouteShared !== 'number') continue;
        const s = this.strings.get(c.kvrouteShared);
        if (s === undefined) throw new Error(`tokenizer thread: shared string ${c.kvrouteShared} unknown`);
        messages ??= src.slice();
        messages[i] = { ...m, content: s };
      }
    } finally {
      if (p.drops) for (const id of p.drops) this.strings.delete(id);
    }
    if (messages !== null) input = { ...input, messages };
    return input;
  }

  get size(): number {
    return this.strings.size;
  }
}
