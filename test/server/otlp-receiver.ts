/**
 * A real OTLP/HTTP trace receiver for tests: POST /v1/traces in JSON (http/json) or protobuf (http/protobuf), the
 * protobuf decoded by a small independent reader of the wire format (ExportTraceServiceRequest's span fields only).
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  kind: number;
  attributes: Record<string, string | number | boolean>;
  status: number;
  service: string;
}

// ------------------------------------------------------------------------------------------ protobuf wire format

function varint(b: Buffer, at: { i: number }): bigint {
  let out = 0n;
  let shift = 0n;
  for (;;) {
    const byte = b[at.i++];
    out |= BigInt(byte & 0x7f) << shift;
    if ((byte & 0x80) === 0) return out;
    shift += 7n;
  }
}

/** Fields of one message: number -> values (Buffer for length-delimited, bigint for varint and fixed). */
function fields(b: Buffer): Map<number, (Buffer | bigint)[]> {
  const out = new Map<number, (Buffer | bigint)[]>();
  const at = { i: 0 };
  while (at.i < b.length) {
    const key = Number(varint(b, at));
    const field = key >> 3;
    const wire = key & 7;
    let v: Buffer | bigint;
    if (wire === 0) v = varint(b, at);
    else if (wire === 1) {
      v = b.readBigUInt64LE(at.i);
      at.i += 8;
    } else if (wire === 2) {
      const len = Number(varint(b, at));
      v = b.subarray(at.i, at.i + len);
      at.i += len;
    } else if (wire === 5) {
      v = BigInt(b.readUInt32LE(at.i));
      at.i += 4;
    } else throw new Error(`unsupported wire type ${wire}`);
    const list = out.get(field) ?? [];
    list.push(v);
    out.set(field, list);
  }
  return out;
}

const bytes = (f: Map<number, (Buffer | bigint)[]>, n: number) => (f.get(n)?.[0] as Buffer | undefined) ?? Buffer.alloc(0);
const str = (f: Map<number, (Buffer | bigint)[]>, n: number) => bytes(f, n).toString('utf8');
const num = (f: Map<number, (Buffer | bigint)[]>, n: number) => Number((f.get(n)?.[0] as bigint | undefined) ?? 0n);

/** KeyValue {key 1, value 2: AnyValue {string 1, bool 2, int 3, double 4}}. */
function pbAttributes(list: (Buffer | bigint)[] | undefined): Record<string, string | number | boolean> {
  const out: Record<string, string | number | boolean> = {};
  for (const kv of list ?? []) {
    const f = fields(kv as Buffer);
    const v = fields(bytes(f, 2));
    if (v.has(1)) out[str(f, 1)] = str(v, 1);
    else if (v.has(2)) out[str(f, 1)] = num(v, 2) === 1;
    else if (v.has(3)) out[str(f, 1)] = Number(BigInt.asIntN(64, v.get(3)![0] as bigint));
    else if (v.has(4)) out[str(f, 1)] = Buffer.from((v.get(4)![0] as bigint).toString(16).padStart(16, '0'), 'hex').readDoubleBE(0);
  }
  return out;
}

export function decodeProtobuf(body: Buffer): ReceivedSpan[] {
  const spans: ReceivedSpan[] = [];
  for (const rs of fields(body).get(1) ?? []) {
    const r = fields(rs as Buffer);
    const resource = pbAttributes(fields(bytes(r, 1)).get(1));
    for (const ss of r.get(2) ?? []) {
      for (const sp of fields(ss as Buffer).get(2) ?? []) {
        const s = fields(sp as Buffer);
        spans.push({
          traceId: bytes(s, 1).toString('hex'),
          spanId: bytes(s, 2).toString('hex'),
          parentSpanId: bytes(s, 4).toString('hex'),
          name: str(s, 5),
          kind: num(s, 6),
          attributes: pbAttributes(s.get(9)),
          status: num(fields(bytes(s, 15)), 3),
          service: String(resource['service.name'] ?? ''),
        });
      }
    }
  }
  return spans;
}

// ------------------------------------------------------------------------------------------ JSON

interface JsonValue {
  stringValue?: string;
  intValue?: string | number;
  doubleValue?: number;
  boolValue?: boolean;
}
function jsonAttributes(list: { key: string; value: JsonValue }[] | undefined): Record<string, string | number | boolean> {
  const out: Record<string, string | number | boolean> = {};
  for (const { key, value } of list ?? []) out[key] = value.stringValue ?? value.boolValue ?? Number(value.intValue ?? value.doubleValue);
  return out;
}

export function decodeJson(body: Buffer): ReceivedSpan[] {
  // biome-ignore lint/suspicious/noExplicitAny: the OTLP JSON document, read field by field below
  const doc = JSON.parse(body.toString('utf8')) as any;
  const spans: ReceivedSpan[] = [];
  for (const rs of doc.resourceSpans ?? []) {
    const service = String(jsonAttributes(rs.resource?.attributes)['service.name'] ?? '');
    for (const ss of rs.scopeSpans ?? []) {
      for (const s of ss.spans ?? []) {
        spans.push({
          traceId: s.traceId,
          spanId: s.spanId,
          parentSpanId: s.parentSpanId ?? '',
          name: s.name,
          kind: s.kind,
          attributes: jsonAttributes(s.attributes),
          status: s.status?.code ?? 0,
          service,
        });
      }
    }
  }
  return spans;
}

export class OtlpReceiver {
  readonly spans: ReceivedSpan[] = [];
  readonly contentTypes: string[] = [];
  private server: Server | null = null;
  url = '';

  async start(): Promise<this> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks);
        const type = String(req.headers['content-type'] ?? '');
        this.contentTypes.push(type);
        if (req.url !== '/v1/traces') {
          res.writeHead(404).end();
          return;
        }
        this.spans.push(...(type.includes('json') ? decodeJson(body) : decodeProtobuf(body)));
        res.writeHead(200, { 'content-type': type.includes('json') ? 'application/json' : 'application/x-protobuf' });
        res.end(type.includes('json') ? '{}' : undefined);
      });
    });
    await new Promise<void>((r) => this.server!.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  async close(): Promise<void> {
    await new Promise<void>((r) => this.server?.close(() => r()));
  }
}
