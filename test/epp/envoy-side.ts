/**
 * Envoy's side of the ext_proc conversation, as the Gateway API Inference Extension configures it
 * (FULL_DUPLEX_STREAMED request and response bodies): request headers, the body in chunks, then, playing the proxy,
 * the request sent over HTTP to the endpoint the picker named (what Envoy's original-destination cluster does) with
 * the header mutations applied and the body the picker streamed back, and the upstream's response headers and body
 * chunks reported back to the picker. Written against the proto files the package ships, with @grpc/grpc-js.
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

export interface Picked {
  /** The headers response: every header set. */
  readonly headers: Record<string, string>;
  /** dynamic_metadata envoy.lb x-gateway-destination-endpoint. */
  readonly metadata: string | undefined;
  readonly clearRouteCache: boolean;
  /** The body the picker streamed back (concatenated), and how many chunks. */
  readonly body: Buffer;
  readonly bodyChunks: number;
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
    this.write({
      request_headers: { headers: headerMap(headers), end_of_stream: !body },
      ...(opts.subset !== undefined ? { metadata_context: { filter_metadata: toFilter(SUBSET_NAMESPACE, SUBSET_KEY, opts.subset) } } : {}),
      protocol_config: { request_body_mode: FULL_DUPLEX_STREAMED, response_body_mode: FULL_DUPLEX_STREAMED },
    });
    if (body) {
      const n = Math.max(1, opts.chunks ?? 3);
      const size = Math.ceil(body.length / n);
      for (let i = 0; i < n; i++) {
        this.write({ request_body: { body: body.subarray(i * size, (i + 1) * size), end_of_stream: i === n - 1 } });
      }
    }
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
    if (body) {
      for (;;) {
        const m = await this.next();
        const s = m?.request_body?.response?.body_mutation?.streamed_response;
        if (!s) throw new Error(`expected a streamed request body, got ${JSON.stringify(m)}`);
        parts.push(Buffer.from(s.body ?? ''));
        bodyChunks++;
        if (s.end_of_stream) break;
      }
    }
    return {
      picked: {
        headers: mutations(first.request_headers),
        metadata: lb,
        clearRouteCache: first.request_headers.response?.clear_route_cache ?? false,
        body: Buffer.concat(parts),
        bodyChunks,
      },
    };
  }

  /**
   * The response phase, playing the proxy: `fetch` the picked endpoint with the picked headers and body, report the
   * response headers and each body chunk to the picker (with the endpoint that served, when `served` is given) and
   * check what comes back is the same bytes. Resolves with the client's view of the response.
   */
  async proxy(
    picked: Picked,
    opts: { path?: string; served?: string; stopAfterChunks?: number; endpoint?: string } = {},
  ): Promise<{ status: number; body: string; echoed: string }> {
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
    this.write({ response_headers: { headers: headerMap(rh), end_of_stream: false }, ...md });
    const ack = await this.next();
    if (!ack?.response_headers) throw new Error(`expected a response headers answer, got ${JSON.stringify(ack)}`);
    const reader = res.body!.getReader();
    let body = '';
    let echoed = '';
    let n = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        this.write({ response_body: { body: Buffer.alloc(0), end_of_stream: true } });
        const m = await this.next();
        echoed += Buffer.from(m?.response_body?.response?.body_mutation?.streamed_response?.body ?? '').toString();
        break;
      }
      body += Buffer.from(value).toString();
      this.write({ response_body: { body: Buffer.from(value), end_of_stream: false } });
      const m = await this.next();
      echoed += Buffer.from(m?.response_body?.response?.body_mutation?.streamed_response?.body ?? '').toString();
      if (opts.stopAfterChunks !== undefined && ++n >= opts.stopAfterChunks) {
        await reader.cancel();
        break;
      }
    }
    return { status: res.status, body, echoed };
  }
}

function toFilter(ns: string, key: string, value: unknown): Record<string, Struct> {
  const s = struct(ns, key, value);
  return { [ns]: s.fields![ns].structValue! };
}

/** A client of one picker: streams (one per request) and gRPC health. */
export class EnvoySide {
  readonly client: grpc.Client;
  readonly health: grpc.Client;

  constructor(address: string) {
    const { ExternalProcessor, Health } = protocols();
    this.client = new ExternalProcessor(address, grpc.credentials.createInsecure());
    this.health = new Health(address, grpc.credentials.createInsecure());
  }

  stream(): EnvoyStream {
    return new EnvoyStream(this.client);
  }

  /** One whole request through the picker and the picked engine; the stream is closed at the end like Envoy does. */
  async roundTrip(
    opts: Parameters<EnvoyStream['request']>[0] & { served?: string; endpoint?: string },
  ): Promise<{ immediate: Immediate } | { picked: Picked; response: { status: number; body: string; echoed: string } }> {
    const s = this.stream();
    const r = await s.request(opts);
    if ('immediate' in r) {
      await s.status;
      return { immediate: r.immediate };
    }
    const response = await s.proxy(r.picked, { path: opts.path, served: opts.served, endpoint: opts.endpoint });
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
