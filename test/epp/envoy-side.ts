/**
 * Envoy's side of the ext_proc conversation, as the Gateway API Inference Extension configures it
 * (FULL_DUPLEX_STREAMED request and response bodies, trailer mode SEND): request headers, the body in chunks (and
 * trailers), then, playing the proxy, the request sent over HTTP to the endpoint the picker named (what Envoy's
 * original-destination cluster does) with the header mutations applied and the body the picker streamed back, and the
 * upstream's response headers and body chunks reported back to the picker, the client getting what the picker streams
 * back. Written against the proto files the package ships, with @grpc/grpc-js, over TLS (without verifying the
 * picker, as gateways do: Istio's insecureSkipVerify) or plaintext.
 *
 * As strict as Envoy on what it checks (envoyproxy/data-plane-api @84e84367, processing_mode.proto and
 * external_processor.proto): a streamed body chunk back may be at most 64 KiB, a body that was streamed must be
 * answered until a chunk with end_of_stream (or, with trailers, a trailers answer), and nothing may claim
 * end_of_stream when trailers follow.
 */
import * as grpc from '@grpc/grpc-js';
import {
  DESTINATION_HEADER,
  type ProcessingResponse,
  protocols,
  SERVED_KEY,
  type Struct,
  SUBSET_KEY,
  SUBSET_NAMESPACE,
} from '../../src/epp/protocol.ts';

const FULL_DUPLEX_STREAMED = 4;
/** Envoy's recommended (and in some builds enforced) largest streamed chunk (processing_mode.proto). */
export const ENVOY_CHUNK_LIMIT = 64 * 1024;

export interface Picked {
  /** The headers response: every header set. */
  readonly headers: Record<string, string>;
  /** dynamic_metadata envoy.lb x-gateway-destination-endpoint. */
  readonly metadata: string | undefined;
  readonly clearRouteCache: boolean;
  /** The body the picker streamed back (concatenated), and how many chunks, and the largest. */
  readonly body: Buffer;
  readonly bodyChunks: number;
  readonly largestChunk: number;
  /** The picker answered the request trailers. */
  readonly trailersAnswered: boolean;
}

export interface Immediate {
  readonly status: number;
  readonly headers: Record<string, string>;
  readonly body: string;
  readonly details: string;
}

function headerMap(h: Record<string, string>) {
  return { headers: Object.entries(h).map(([key, v]) => ({ key, raw_value: Buffer.from(v) })) };
}

function struct(ns: string, key: string, value: unknown): Struct {
  const v = Array.isArray(value)
    ? { listValue: { values: value.map((s) => ({ stringValue: String(s) })) } }
    : { stringValue: String(value) };
  return { fields: { [ns]: { structValue: { fields: { [key]: v } } } } } as Struct;
}

function mutations(r: ProcessingResponse['request_headers']): Record<string, string> {
  const out: Record<string, string> = {};
  for (const o of r?.response?.header_mutation?.set_headers ?? []) {
    const h = o.header as { key: string; raw_value?: Buffer; value?: string };
    out[h.key] = h.raw_value && h.raw_value.length > 0 ? h.raw_value.toString() : (h.value ?? '');
  }
  return out;
}

/** One ext_proc stream: one HTTP request through the proxy. */
export class EnvoyStream {
  private readonly call: grpc.ClientDuplexStream<unknown, ProcessingResponse>;
  private readonly inbox: ProcessingResponse[] = [];
  private waiting: ((m: ProcessingResponse | null) => void) | null = null;
  private ended = false;
  /** The gRPC status the stream ended with. */
  readonly status: Promise<grpc.StatusObject>;

  constructor(client: grpc.Client) {
    this.call = (client as unknown as { Process(): grpc.ClientDuplexStream<unknown, ProcessingResponse> }).Process();
    this.call.on('data', (m: ProcessingResponse) => {
      if (this.waiting) {
        const w = this.waiting;
        this.waiting = null;
        w(m);
      } else this.inbox.push(m);
    });
    this.status = new Promise((resolve) => this.call.on('status', resolve));
    this.call.on('error', () => {}); // the status says it
    const end = () => {
      this.ended = true;
      if (this.waiting) {
        const w = this.waiting;
        this.waiting = null;
        w(null);
      }
    };
    this.call.on('end', end);
    this.call.on('close', end);
    void this.status.then(end);
  }

  /** The next message from the picker, or null when the stream ended. */
  next(ms = 20_000): Promise<ProcessingResponse | null> {
    const m = this.inbox.shift();
    if (m) return Promise.resolve(m);
    if (this.ended) return Promise.resolve(null);
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error('no message from the picker in time')), ms);
      this.waiting = (x) => {
        clearTimeout(t);
        resolve(x);
      };
    });
  }

  write(msg: unknown): void {
    this.call.write(msg);
  }

  /** Envoy's half-close (the HTTP exchange is over). */
  end(): void {
    this.call.end();
  }

  cancel(): void {
    this.call.cancel();
  }

  /**
   * The request phase: headers (+ subset hint), then the body in `chunks` pieces; resolves with the pick (the headers
   * response and the streamed body) or the immediate response.
   */
  async request(opts: {
    path?: string;
    method?: string;
    headers?: Record<string, string>;
    body?: string | Buffer;
    chunks?: number;
    subset?: string[] | string;
    /** Send the body in chunks of this many bytes (instead of `chunks` pieces). */
    chunkBytes?: number;
    /** The body is streamed even when empty: headers without end_of_stream, then one empty chunk that ends it. */
    streamEmpty?: boolean;
    /** The request ends with trailers (no body chunk has end_of_stream). */
    trailers?: Record<string, string>;
  }): Promise<{ picked: Picked } | { immediate: Immediate }> {
    const body = opts.body === undefined ? undefined : Buffer.from(opts.body);
    const headers = {
      ':method': opts.method ?? 'POST',
      ':path': opts.path ?? '/v1/completions',
      ':authority': 'gateway.local',
      'content-type': 'application/json',
      ...(body ? { 'content-length': String(body.length) } : {}),
      ...opts.headers,
    };
    const streamed = body !== undefined || opts.streamEmpty === true || opts.trailers !== undefined;
    this.write({
      request_headers: { headers: headerMap(headers), end_of_stream: !streamed },
      ...(opts.subset !== undefined ? { metadata_context: { filter_metadata: toFilter(SUBSET_NAMESPACE, SUBSET_KEY, opts.subset) } } : {}),
      protocol_config: { request_body_mode: FULL_DUPLEX_STREAMED, response_body_mode: FULL_DUPLEX_STREAMED },
    });
    const ends = opts.trailers === undefined;
    if (body && body.length > 0) {
      const size = opts.chunkBytes ?? Math.ceil(body.length / Math.max(1, opts.chunks ?? 3));
      for (let off = 0; off < body.length; off += size) {
        this.write({ request_body: { body: body.subarray(off, off + size), end_of_stream: ends && off + size >= body.length } });
      }
    } else if (streamed && ends) this.write({ request_body: { body: Buffer.alloc(0), end_of_stream: true } });
    if (opts.trailers) this.write({ request_trailers: { trailers: headerMap(opts.trailers) } });
    const first = await this.next();
    if (!first) throw new Error('the picker ended the stream without an answer');
    if (first.immediate_response) {
      const ir = first.immediate_response;
      const h: Record<string, string> = {};
      for (const o of ir.headers?.set_headers ?? []) h[o.header.key] = Buffer.from(o.header.raw_value ?? '').toString();
      return {
        immediate: {
          status: ir.status.code,
          headers: h,
          body: Buffer.from(ir.body ?? '').toString(),
          details: ir.details ?? '',
        },
      };
    }
    if (!first.request_headers) throw new Error(`unexpected first answer: ${JSON.stringify(first)}`);
    const lb = first.dynamic_metadata?.fields?.['envoy.lb']?.structValue?.fields?.[DESTINATION_HEADER]?.stringValue;
    const parts: Buffer[] = [];
    let bodyChunks = 0;
    let largestChunk = 0;
    let trailersAnswered = false;
    // Envoy waits for the body it streamed until a chunk ends it, or (trailers sent) for the trailers answer.
    if (streamed) {
      for (;;) {
        const m = await this.next();
        if (m?.request_trailers) {
          if (ends) throw new Error('a trailers answer to a request without trailers');
          trailersAnswered = true;
          break;
        }
        const s = m?.request_body?.response?.body_mutation?.streamed_response;
        if (!s) throw new Error(`expected a streamed request body, got ${JSON.stringify(m)}`);
        const chunk = Buffer.from(s.body ?? '');
        if (chunk.length > ENVOY_CHUNK_LIMIT) throw new Error(`a streamed chunk of ${chunk.length} bytes (Envoy: at most 64 KiB)`);
        parts.push(chunk);
        bodyChunks++;
        largestChunk = Math.max(largestChunk, chunk.length);
        if (s.end_of_stream) {
          if (!ends) throw new Error('end_of_stream on a body whose trailers follow');
          break;
        }
      }
    }
    return {
      picked: {
        headers: mutations(first.request_headers),
        metadata: lb,
        clearRouteCache: first.request_headers.response?.clear_route_cache ?? false,
        body: Buffer.concat(parts),
        bodyChunks,
        largestChunk,
        trailersAnswered,
      },
    };
  }

  /**
   * The response phase, playing the proxy: `fetch` the picked endpoint with the picked headers and body, report the
   * response headers and each body chunk to the picker (with the endpoint that served, when `served` is given), ending
   * with trailers when `trailers` is given, and collect what the picker streams back: that is what the client gets.
   * Resolves with the engine's bytes (`body`), the client's (`echoed`), and the header mutations of the response.
   */
  async proxy(
    picked: Picked,
    opts: { path?: string; served?: string; stopAfterChunks?: number; endpoint?: string; trailers?: Record<string, string> } = {},
  ): Promise<{ status: number; body: string; echoed: string; responseHeaders: ResponseHeaderAnswer }> {
    const endpoint = opts.endpoint ?? picked.headers[DESTINATION_HEADER].split(',')[0];
    const upstreamHeaders: Record<string, string> = { 'content-type': 'application/json' };
    for (const [k, v] of Object.entries(picked.headers)) {
      if (!k.startsWith(':') && k !== DESTINATION_HEADER && k !== 'content-length') upstreamHeaders[k] = v;
    }
    const res = await fetch(`http://${endpoint}${opts.path ?? '/v1/completions'}`, {
      method: 'POST',
      headers: upstreamHeaders,
      body: picked.body,
    });
    const md = opts.served ? { metadata_context: { filter_metadata: toFilter('envoy.lb', SERVED_KEY, opts.served) } } : {};
    const rh: Record<string, string> = { ':status': String(res.status) };
    res.headers.forEach((v, k) => {
      rh[k] = v;
    });
    // What the picker sends back, in order, until the response's end (a chunk with end_of_stream, or the trailers
    // answer): Envoy forwards it to the client as it comes.
    let responseHeaders: ResponseHeaderAnswer | undefined;
    const echoedParts: Buffer[] = [];
    const collected = (async () => {
      for (;;) {
        const m = await this.next();
        if (!m) throw new Error('the picker ended the stream before the end of the response');
        if (m.response_headers) {
          if (responseHeaders) throw new Error('two response headers answers');
          const hm = m.response_headers.response?.header_mutation;
          const set: Record<string, string> = {};
          for (const o of hm?.set_headers ?? []) set[o.header.key] = Buffer.from(o.header.raw_value ?? '').toString();
          responseHeaders = { set, removed: hm?.remove_headers ?? [] };
          continue;
        }
        if (m.response_trailers) {
          if (!opts.trailers) throw new Error('a trailers answer to a response without trailers');
          return;
        }
        const s = m.response_body?.response?.body_mutation?.streamed_response;
        if (!s) throw new Error(`expected a response body answer, got ${JSON.stringify(m)}`);
        if (!responseHeaders) throw new Error('a response body answer before the response headers answer');
        const chunk = Buffer.from(s.body ?? '');
        if (chunk.length > ENVOY_CHUNK_LIMIT) throw new Error(`a streamed chunk of ${chunk.length} bytes (Envoy: at most 64 KiB)`);
        echoedParts.push(chunk);
        if (s.end_of_stream) {
          if (opts.trailers) throw new Error('end_of_stream on a response whose trailers follow');
          return;
        }
      }
    })();
    collected.catch(() => {}); // awaited below
    this.write({ response_headers: { headers: headerMap(rh), end_of_stream: false }, ...md });
    const reader = res.body!.getReader();
    let body = '';
    let n = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        if (opts.trailers) this.write({ response_trailers: { trailers: headerMap(opts.trailers) } });
        else this.write({ response_body: { body: Buffer.alloc(0), end_of_stream: true } });
        break;
      }
      body += Buffer.from(value).toString();
      this.write({ response_body: { body: Buffer.from(value), end_of_stream: false } });
      if (opts.stopAfterChunks !== undefined && ++n >= opts.stopAfterChunks) {
        await reader.cancel();
        // Let the picker answer what it has seen, then the proxy gives up (the caller cancels the stream).
        await new Promise((r) => setTimeout(r, 100));
        return {
          status: res.status,
          body,
          echoed: Buffer.concat(echoedParts).toString(),
          responseHeaders: responseHeaders ?? { set: {}, removed: [] },
        };
      }
    }
    await collected;
    return { status: res.status, body, echoed: Buffer.concat(echoedParts).toString(), responseHeaders: responseHeaders! };
  }
}

/** The picker's answer to the response headers: the headers it sets and removes. */
export interface ResponseHeaderAnswer {
  readonly set: Record<string, string>;
  readonly removed: string[];
}

function toFilter(ns: string, key: string, value: unknown): Record<string, Struct> {
  const s = struct(ns, key, value);
  return { [ns]: s.fields![ns].structValue! };
}

/** A client of one picker: streams (one per request) and gRPC health. */
export class EnvoySide {
  readonly client: grpc.Client;
  readonly health: grpc.Client;

  /** `tls`: connect over TLS without verifying the picker's certificate (as gateways do), or trusting `ca` only. */
  constructor(address: string, options: { tls?: boolean; ca?: Buffer; serverName?: string } = {}) {
    const { ExternalProcessor, Health } = protocols();
    const creds = () =>
      options.tls || options.ca
        ? grpc.credentials.createSsl(options.ca ?? null, null, null, options.ca ? {} : { rejectUnauthorized: false })
        : grpc.credentials.createInsecure();
    // A channel of its own (no connection shared with another client): a test may change the picker's certificate.
    const channel = {
      'grpc.use_local_subchannel_pool': 1,
      // SNI is a host name (an IP address there is refused by RFC 6066): the picker's certificate names localhost.
      ...(options.tls || options.serverName ? { 'grpc.ssl_target_name_override': options.serverName ?? 'localhost' } : {}),
    };
    this.client = new ExternalProcessor(address, creds(), channel);
    this.health = new Health(address, creds(), channel);
  }

  stream(): EnvoyStream {
    return new EnvoyStream(this.client);
  }

  /** One whole request through the picker and the picked engine; the stream is closed at the end like Envoy does. */
  async roundTrip(
    opts: Parameters<EnvoyStream['request']>[0] & { served?: string; endpoint?: string; responseTrailers?: Record<string, string> },
  ): Promise<
    | { immediate: Immediate }
    | { picked: Picked; response: { status: number; body: string; echoed: string; responseHeaders: ResponseHeaderAnswer } }
  > {
    const s = this.stream();
    const r = await s.request(opts);
    if ('immediate' in r) {
      await s.status;
      return { immediate: r.immediate };
    }
    const response = await s.proxy(r.picked, {
      path: opts.path,
      served: opts.served,
      endpoint: opts.endpoint,
      trailers: opts.responseTrailers,
    });
    s.end();
    await s.status;
    return { picked: r.picked, response };
  }

  check(service: string): Promise<{ status?: number; error?: grpc.ServiceError }> {
    return new Promise((resolve) => {
      (this.health as unknown as { Check(r: unknown, cb: (e: grpc.ServiceError | null, r?: { status: number }) => void): void }).Check(
        { service },
        (error, r) => resolve(error ? { error } : { status: r?.status }),
      );
    });
  }

  close(): void {
    this.client.close();
    this.health.close();
  }
}
