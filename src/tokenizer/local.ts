/**
 * The router's local tokenizer: a model's tokenizer.json + tokenizer_config.json, with a segment cache so each turn of
 * a long conversation only tokenizes what is new.
 *
 * Why segments: BPE is not prefix-stable at arbitrary cut points (a cut inside a word changes the merges on both
 * sides), but HF tokenizers extract added tokens (<|im_start|>, <|im_end|>, <think>, ...) before normalising and
 * pre-tokenizing, and tokenize the text between them independently. Splitting at exactly those tokens therefore gives
 * the ids of a whole-text encode, and the text between two added tokens (a message body, a role header) is the unit
 * cached. Tokenizers whose added tokens strip neighbouring whitespace or match after normalisation would break that
 * independence; for them the cache is switched off and every prompt is encoded whole.
 */
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Tokenizer } from '@huggingface/tokenizers';
import { createTokenizer, regularVocabSize } from './bpe-tables.ts';
import { ChatTemplate, type ChatPromptInput } from './chat.ts';
import { type LruInfo, ownKey, WeightedLru } from './lru.ts';
import type { MmItem } from '../core/types.ts';
import { chatMediaParts, MEDIA_MARKER, withMediaMarkers } from './multimodal.ts';

interface AddedTokenSpec {
  id: number;
  content: string;
  single_word?: boolean;
  lstrip?: boolean;
  rstrip?: boolean;
  normalized?: boolean;
  special?: boolean;
}

export interface LocalTokenizerOptions {
  /** Use a native renderer when the chat template is a known one (verified against Jinja on a sample). Default true. */
  readonly fastTemplates?: boolean;
  /**
   * Segment cache budget in bytes, as estimated by `segmentBytes` (the key's characters, the ids, and a measured
   * per-entry overhead). Default 64 MiB. 0 turns the cache off.
   */
  readonly cacheBytes?: number;
  /**
   * Segments shorter than this are encoded without the cache. Default 1 (cache all): even a role header costs the
   * tokenizer ~10 µs per call, and a long conversation has hundreds of them.
   */
  readonly minCachedChars?: number;
}

/** The segment cache's state: `bytes` is the estimate its budget (`maxBytes`) bounds. */
export type TokenizerCacheInfo = LruInfo;

export interface TokenizeStats {
  readonly segments: number;
  readonly cachedSegments: number;
  readonly encodedChars: number;
}

const EMPTY = new Uint32Array(0);

/** The default segment cache budget, bytes. */
export const DEFAULT_TOKENIZER_CACHE_BYTES = 64 * 1024 * 1024;

/**
 * Heap bytes one cached segment costs beyond its key's characters and its ids: the Map slot, the entry record, the
 * Uint32Array and its ArrayBuffer (with the backing store's own bookkeeping). Measured with `npm run bench:memory`
 * (heap + array buffers freed by clearing a filled cache, less the characters and ids), see docs/operations.md.
 */
export const SEGMENT_OVERHEAD_BYTES = 400;

/** The estimated cost of one cached segment: what the cache's byte budget counts. */
export function segmentBytes(keyBytes: number, ids: Uint32Array): number {
  return SEGMENT_OVERHEAD_BYTES + keyBytes + ids.byteLength;
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

export class LocalTokenizer {
  readonly chat: ChatTemplate;
  /** Added token content -> id, for segments that are added tokens themselves. */
  private readonly addedIds = new Map<string, number>();
  private readonly splitter: RegExp | null;
  private readonly cache: WeightedLru<string, Uint32Array>;
  private readonly minCached: number;
  /** False when the tokenizer's added tokens make segment-wise encoding unsafe (see the file comment). */
  readonly segmentCaching: boolean;
  private lastStats: TokenizeStats = { segments: 0, cachedSegments: 0, encodedChars: 0 };
  private regularVocab: number | undefined;

  constructor(
    readonly tokenizer: Tokenizer,
    tokenizerJson: { added_tokens?: AddedTokenSpec[] },
    readonly config: Record<string, unknown>,
    options: LocalTokenizerOptions = {},
  ) {
    this.chat = new ChatTemplate(config, { fastPath: options.fastTemplates });
    this.cache = new WeightedLru(options.cacheBytes ?? DEFAULT_TOKENIZER_CACHE_BYTES);
    this.minCached = options.minCachedChars ?? 1;
    const added = tokenizerJson.added_tokens ?? [];
    let safe = added.length > 0;
    for (const t of added) {
      if (t.lstrip || t.rstrip || t.single_word || t.normalized) safe = false;
      this.addedIds.set(t.content, t.id);
    }
    this.segmentCaching = safe;
    this.splitter = safe
      ? new RegExp(
          `(${[...this.addedIds.keys()]
            .sort((a, b) => b.length - a.length) // longest first, as the tokenizer's trie does
            .map(escapeRegExp)
            .join('|')})`,
        )
      : null;
  }

  /** Loads `tokenizer.json` and `tokenizer_config.json` from a directory (a Hugging Face model snapshot). */
  static async load(dir: string, options?: LocalTokenizerOptions): Promise<LocalTokenizer> {
    const [tj, tc] = await Promise.all([
      readFile(join(dir, 'tokenizer.json'), 'utf8'),
      readFile(join(dir, 'tokenizer_config.json'), 'utf8').catch(() => '{}'),
    ]);
    const tokenizerJson = JSON.parse(tj);
    const config = JSON.parse(tc);
    return new LocalTokenizer(createTokenizer(tokenizerJson, config), tokenizerJson, config, options);
  }

  /** The vocabulary's size without its added tokens (`get_vocab(false).size`), counted once. */
  get regularVocabSize(): number {
    this.regularVocab ??= regularVocabSize(this.tokenizer);
    return this.regularVocab;
  }

  /** Encodes the whole text in one go: the reference the cached path must equal. */
  encodeCold(text: string, addSpecialTokens = false): number[] {
    return this.tokenizer.encode(text, { add_special_tokens: addSpecialTokens }).ids;
  }

  /**
   * Encodes text without special tokens, reusing cached segments. Equal to `encodeCold(text)`, as a Uint32Array: the
   * cached segments are typed arrays copied with one memcpy each, and the router hashes typed arrays fastest.
   */
  encode(text: string): Uint32Array {
    if (!this.splitter) {
      this.lastStats = { segments: 1, cachedSegments: 0, encodedChars: text.length };
      return Uint32Array.from(this.encodeCold(text));
    }
    const parts = text.split(this.splitter);
    // Two passes: look every segment up (or encode it), then copy into one preallocated array.
    const pieces: (Uint32Array | number)[] = new Array(parts.length);
    let total = 0;
    let cachedSegments = 0;
    let encodedChars = 0;
    // split() with one capture group alternates text, token, text, token, ...: odd indices are added tokens.
    for (let i = 0; i < parts.length; i++) {
      const part = parts[i];
      if (i & 1) {
        pieces[i] = this.addedIds.get(part)!;
        total++;
        continue;
      }
      if (part.length === 0) {
        pieces[i] = EMPTY;
        continue;
      }
      let ids: Uint32Array | undefined;
      if (part.length < this.minCached) ids = Uint32Array.from(this.encodeCold(part));
      else {
        ids = this.cache.get(part);
        if (ids) cachedSegments++;
        else {
          ids = Uint32Array.from(this.encodeCold(part));
          encodedChars += part.length;
          const { key, bytes } = ownKey(part);
          this.cache.set(key, ids, segmentBytes(bytes, ids));
        }
      }
      pieces[i] = ids;
      total += ids.length;
    }
    const out = new Uint32Array(total);
    let at = 0;
    for (let i = 0; i < pieces.length; i++) {
      const p = pieces[i];
      if (typeof p === 'number') out[at++] = p;
      else {
        out.set(p, at);
        at += p.length;
      }
    }
    this.lastStats = { segments: (parts.length + 1) >> 1, cachedSegments, encodedChars };
    return out;
  }

  /** Prompt of a completion request: vLLM encodes completion prompts with the tokenizer's special tokens. */
  encodePrompt(text: string): ArrayLike<number> {
    // Tokenizers whose post-processor adds nothing (Qwen) can take the cached path; others (a BOS) encode whole.
    this.addsSpecial ??= this.encodeCold('', true).length > 0;
    return this.addsSpecial ? this.encodeCold(text, true) : this.encode(text);
  }
  private addsSpecial: boolean | undefined;

  /** Renders a chat request with the model's template and encodes it without special tokens (as vLLM does). */
  encodeChat(input: ChatPromptInput): Uint32Array {
    return this.encode(this.chat.render(input));
  }

  /**
   * A chat request with image / audio parts as an engine's processor gives it to the model: the template renders each
   * part where it stands, the part becomes `placeholderTokens` copies of `placeholderId` (default: vocabulary size - 1,
   * the mock engine's), and each part is one multimodal item (its identity, offset and length) for the block keys.
   * Null when the messages carry no media part.
   */
  encodeChatMedia(input: ChatPromptInput, placeholderTokens: number, placeholderId?: number): { ids: Uint32Array; items: MmItem[] } | null {
    const media = chatMediaParts(input.messages);
    if (media.length === 0 || placeholderTokens <= 0) return null;
    const pieces = this.chat
      .render({ ...input, messages: withMediaMarkers(input.messages, MEDIA_MARKER) } as ChatPromptInput)
      .split(MEDIA_MARKER);
    // A template that drops a part (a text-only template ignoring non-text content) leaves nothing to key: text only.
    if (pieces.length !== media.length + 1) return null;
    const id = placeholderId ?? this.regularVocabSize - 1;
    const ids: number[] = [];
    const items: MmItem[] = [];
    pieces.forEach((piece, i) => {
      if (piece.length > 0) for (const t of Array.from(this.encode(piece))) ids.push(t);
      if (i < media.length) {
        items.push({ identifier: media[i].identifier, offset: ids.length, length: placeholderTokens });
        for (let k = 0; k < placeholderTokens; k++) ids.push(id);
      }
    });
    return { ids: Uint32Array.from(ids), items };
  }

  /** Segment statistics of the last encode() call, for benchmarks and tests. */
  get stats(): TokenizeStats {
    return this.lastStats;
  }

  /** Drops every cached segment (benchmarks measure cold tokenization with it). */
  clearCache(): void {
    this.cache.clear();
  }

  get cacheInfo(): TokenizerCacheInfo {
    return this.cache.info();
  }
}
