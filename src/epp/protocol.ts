/**
 * The wire side of the endpoint picker: Envoy's ext_proc messages (the subset in proto/, loaded with
 * @grpc/proto-loader) as TypeScript shapes, and the helpers that read and build them: header maps, google.protobuf.Struct,
 * the Endpoint Picker Protocol's header and metadata names (Gateway API Inference Extension, proposal 004).
 *
 * Field names are the proto's (keepCase); oneofs are read through the `request` / `response` discriminator
 * proto-loader adds; bytes are Buffers.
 */
import { fileURLToPath } from 'node:url';
import type { GrpcObject, ServiceClientConstructor } from '@grpc/grpc-js';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

/** The header the proxy routes on: `ip:port` of the pick, then fallbacks, comma separated. */
export const DESTINATION_HEADER = 'x-gateway-destination-endpoint';
/** The metadata namespace of the pick (dynamic_metadata) and of the endpoint that served (metadata_context). */
export const LB_NAMESPACE = 'envoy.lb';
/** The metadata namespace of the proxy's subset hint, and its key. */
export const SUBSET_NAMESPACE = 'envoy.lb.subset_hint';
export const SUBSET_KEY = 'x-gateway-destination-endpoint-subset';
/** The key under `envoy.lb` in metadata_context naming the endpoint that really served (after the proxy's fallbacks). */
export const SERVED_KEY = 'x-gateway-destination-endpoint-served';
export const EXT_PROC_SERVICE = 'envoy.service.ext_proc.v3.ExternalProcessor';

/** The proto files, shipped in the package (`proto/`, beside `dist/` and `src/`). */
export const PROTO_DIR = fileURLToPath(new URL('../../proto', import.meta.url));

export const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: true,
  longs: String,
  enums: Number,
  defaults: false,
  oneofs: true,
  includeDirs: [PROTO_DIR],
};

export interface Protocols {
  readonly ExternalProcessor: ServiceClientConstructor;
  readonly Health: ServiceClientConstructor;
}

let loaded: Protocols | null = null;

/** Loads the ext_proc and health services once. */
export function protocols(): Protocols {
  if (loaded) return loaded;
  const def = protoLoader.loadSync(['envoy/service/ext_proc/v3/external_processor.proto', 'grpc/health/v1/health.proto'], LOADER_OPTIONS);
  const root = grpc.loadPackageDefinition(def) as unknown as {
    envoy: { service: { ext_proc: { v3: GrpcObject } } };
    grpc: { health: { v1: GrpcObject } };
  };
  loaded = {
    ExternalProcessor: root.envoy.service.ext_proc.v3.ExternalProcessor as ServiceClientConstructor,
    Health: root.grpc.health.v1.Health as ServiceClientConstructor,
  };
  return loaded;
}

// ------------------------------------------------------------------------------------------ messages

export interface HeaderValue {
  key?: string;
  value?: string;
  raw_value?: Buffer;
}
export interface HeaderMap {
  headers?: HeaderValue[];
}
export interface HttpHeaders {
  headers?: HeaderMap;
  end_of_stream?: boolean;
}
export interface HttpBody {
  body?: Buffer;
  end_of_stream?: boolean;
}
export interface Metadata {
  filter_metadata?: Record<string, Struct>;
}
export interface Struct {
  fields?: Record<string, Value>;
}
/**
 * google.protobuf.Value as protobufjs bundles the well-known types (their field names camelCase, whatever keepCase
 * says; the wire format is the published one).
 */
export interface Value {
  kind?: 'nullValue' | 'numberValue' | 'stringValue' | 'boolValue' | 'structValue' | 'listValue';
  nullValue?: number;
  numberValue?: number;
  stringValue?: string;
  boolValue?: boolean;
  structValue?: Struct;
  listValue?: { values?: Value[] };
}

export interface ProcessingRequest {
  request?: 'request_headers' | 'response_headers' | 'request_body' | 'response_body' | 'request_trailers' | 'response_trailers';
  request_headers?: HttpHeaders;
  response_headers?: HttpHeaders;
  request_body?: HttpBody;
  response_body?: HttpBody;
  request_trailers?: { trailers?: HeaderMap };
  response_trailers?: { trailers?: HeaderMap };
  metadata_context?: Metadata;
  observability_mode?: boolean;
}

export interface HeaderValueOption {
  header: { key: string; raw_value: Buffer };
  /** OVERWRITE_IF_EXISTS_OR_ADD */
  append_action?: number;
}
export interface HeaderMutation {
  set_headers?: HeaderValueOption[];
  remove_headers?: string[];
}
export interface CommonResponse {
  status?: number;
  header_mutation?: HeaderMutation;
  body_mutation?: { streamed_response?: { body: Buffer; end_of_stream: boolean }; body?: Buffer };
  clear_route_cache?: boolean;
}
export interface ImmediateResponse {
  status: { code: number };
  headers?: HeaderMutation;
  body?: Buffer;
  details?: string;
}
export interface ProcessingResponse {
  request_headers?: { response?: CommonResponse };
  response_headers?: { response?: CommonResponse };
  request_body?: { response?: CommonResponse };
  response_body?: { response?: CommonResponse };
  request_trailers?: Record<string, never>;
  response_trailers?: Record<string, never>;
  immediate_response?: ImmediateResponse;
  dynamic_metadata?: Struct;
}

// ------------------------------------------------------------------------------------------ helpers

const OVERWRITE_IF_EXISTS_OR_ADD = 2;

/** A header map as lower-case name → value (Envoy sends `raw_value`; older proxies `value`). The first value wins. */
export function readHeaders(map: HeaderMap | undefined): Map<string, string> {
  const out = new Map<string, string>();
  for (const h of map?.headers ?? []) {
    if (typeof h?.key !== 'string') continue;
    const key = h.key.toLowerCase();
    if (out.has(key)) continue;
    const value = h.raw_value && h.raw_value.length > 0 ? h.raw_value.toString('utf8') : (h.value ?? '');
    out.set(key, value);
  }
  return out;
}

/** Headers to set, each overwriting what the request had. */
export function setHeaders(headers: Readonly<Record<string, string>>): HeaderMutation {
  return {
    set_headers: Object.entries(headers).map(([key, value]) => ({
      header: { key, raw_value: Buffer.from(value, 'utf8') },
      append_action: OVERWRITE_IF_EXISTS_OR_ADD,
    })),
  };
}

export function stringValue(s: string): Value {
  return { stringValue: s };
}

/** A Struct of string fields under one namespace: `{ [ns]: { [k]: v } }`. */
export function namespacedStrings(ns: string, fields: Readonly<Record<string, string>>): Struct {
  const inner: Record<string, Value> = {};
  for (const [k, v] of Object.entries(fields)) inner[k] = stringValue(v);
  return { fields: { [ns]: { structValue: { fields: inner } } } };
}

/** The strings of a Value: a string (comma separated), or a list of strings; anything else is none. */
export function valueStrings(v: Value | undefined): string[] | undefined {
  if (!v) return undefined;
  if (typeof v.stringValue === 'string') {
    return v.stringValue
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean);
  }
  if (v.listValue) return (v.listValue.values ?? []).flatMap((x) => (typeof x.stringValue === 'string' ? [x.stringValue.trim()] : []));
  return undefined;
}

/** A field of a namespace of the metadata context, if present. */
export function metadataField(md: Metadata | undefined, ns: string, key: string): Value | undefined {
  return md?.filter_metadata?.[ns]?.fields?.[key];
}
