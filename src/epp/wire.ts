/**
 * The endpoint picker's body and trailer answers on the wire, apart from any routing: a body streamed back in chunks
 * no larger than the reference picker's, and the end of a body (end_of_stream, or a trailers answer when the proxy sent
 * trailers). Checked against envoyproxy/data-plane-api @84e84367 (envoy/extensions/filters/http/ext_proc/v3/
 * processing_mode.proto, FULL_DUPLEX_STREAMED; envoy/service/ext_proc/v3/external_processor.proto, StreamedBodyResponse
 * and request_trailers) and llm-d/llm-d-inference-scheduler @520af478 (pkg/common/envoy/chunking.go).
 */
import type { ProcessingResponse } from './protocol.ts';

/**
 * Largest body chunk streamed back. Envoy recommends at most 64 KiB per chunk and some builds enforce it; the reference
 * picker sends 62,000 bytes (chunking.go BodyByteLimit).
 */
export const CHUNK = 62_000;

export type Direction = 'request' | 'response';

/**
 * A body as streamed body responses: chunks of at most CHUNK bytes, at least one (an empty body is one empty chunk, so
 * the proxy sees the body end). `endOfStream`: the last chunk ends the stream (false when trailers follow: Envoy says
 * the server sets end_of_stream only after a body message that had it).
 */
export function bodyResponses(direction: Direction, body: Buffer, endOfStream: boolean): ProcessingResponse[] {
  const out: ProcessingResponse[] = [];
  for (let off = 0; ; off += CHUNK) {
    const last = off + CHUNK >= body.length;
    const streamed_response = { body: body.subarray(off, off + CHUNK), end_of_stream: endOfStream && last };
    out.push(
      direction === 'request'
        ? { request_body: { response: { body_mutation: { streamed_response } } } }
        : { response_body: { response: { body_mutation: { streamed_response } } } },
    );
    if (last) return out;
  }
}

/** The answer to the proxy's trailers (Envoy waits for it, or for the stream to close). */
export function trailersResponse(direction: Direction): ProcessingResponse {
  return direction === 'request' ? { request_trailers: {} } : { response_trailers: {} };
}
