/**
 * Multimodal parts of chat messages (`image_url`, `input_audio`) and the identity an engine keys them by
 * (docs/engines.md "Multimodal block keys"). Pure.
 *
 * Identity, in the order vLLM prefers it: the part's `uuid` (vLLM's multi_modal_uuids) when the client sent one;
 * otherwise a content hash: sha256 of the bytes a `data:` URL or `input_audio.data` (base64) carries; for a remote URL,
 * the URL string itself (nothing here fetches it). The content hash is kvroute's, not vLLM's mm_hash (which hashes the
 * decoded media): it separates different media and matches the same bytes, which is what the mock engine keys by.
 */
import { createHash } from 'node:crypto';

export interface MediaPart {
  readonly kind: 'image' | 'audio';
  readonly identifier: string;
}

const sha256 = (bytes: Buffer) => `sha256:${createHash('sha256').update(bytes).digest('hex')}`;

function dataUrlBytes(url: string): Buffer | null {
  const m = /^data:[^,]*?(;base64)?,(.*)$/s.exec(url);
  if (!m) return null;
  return m[1] ? Buffer.from(m[2], 'base64') : Buffer.from(decodeURIComponent(m[2]), 'utf8');
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The media part a content part is, or null for text and anything else. */
function mediaOf(part: unknown): MediaPart | null {
  if (!isObject(part)) return null;
  const uuid = typeof part.uuid === 'string' && part.uuid.length > 0 ? part.uuid : null;
  if (part.type === 'image_url') {
    const ref = part.image_url;
    const url = typeof ref === 'string' ? ref : isObject(ref) && typeof ref.url === 'string' ? ref.url : null;
    if (url === null) return null;
    const bytes = dataUrlBytes(url);
    return { kind: 'image', identifier: uuid ?? (bytes ? sha256(bytes) : `url:${url}`) };
  }
  if (part.type === 'input_audio') {
    const audio = part.input_audio;
    if (!isObject(audio) || typeof audio.data !== 'string') return null;
    return { kind: 'audio', identifier: uuid ?? sha256(Buffer.from(audio.data, 'base64')) };
  }
  return null;
}

/** The media parts of chat messages, in prompt order; empty for a text-only conversation. */
export function chatMediaParts(messages: readonly unknown[]): MediaPart[] {
  const out: MediaPart[] = [];
  for (const m of messages) {
    if (!isObject(m) || !Array.isArray(m.content)) continue;
    for (const part of m.content) {
      const media = mediaOf(part);
      if (media) out.push(media);
    }
  }
  return out;
}

/** The text a media part is rendered as, to find where the chat template put it (split on it, then encode the pieces). */
export const MEDIA_MARKER = '\u0000kvroute-media\u0000';

/** The messages with every media part replaced by a text part `marker` (to find where the template put it). */
export function withMediaMarkers(messages: readonly unknown[], marker: string): unknown[] {
  return messages.map((m) => {
    if (!isObject(m) || !Array.isArray(m.content)) return m;
    return { ...m, content: m.content.map((part) => (mediaOf(part) ? { type: 'text', text: marker } : part)) };
  });
}
