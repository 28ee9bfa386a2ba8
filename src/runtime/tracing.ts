/**
 * OpenTelemetry traces of the router, off by default. On when an OTLP endpoint is given (`--otlp-endpoint`, or the
 * standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT) and not switched off (OTEL_SDK_DISABLED,
 * OTEL_TRACES_EXPORTER=none). One span per request (SERVER, continuing the client's W3C `traceparent`), with children:
 *
 *   tokenize          routing tokens (mode, prompt tokens)
 *   queue             time spent waiting for a worker, when the request waited
 *   route             the decision: worker, overlap blocks, isl blocks, policy, attempt
 *   upstream          each attempt on a worker (CLIENT); its context goes to the engine as `traceparent`
 *   first_token       the instant the first token reached the router
 *
 * The provider is the server's own (never the global one), so several servers in one process trace apart. The SDK
 * (tracing-otel.ts) is loaded only when tracing is on (tracing-start.ts).
 */
import type { Attributes } from '@opentelemetry/api';
import type { IncomingHttpHeaders } from 'node:http';
import { OTLP_PROTOCOLS, type OtlpProtocol, TRACE_SAMPLERS, type TraceSamplerName } from '../config/tracing.ts';

/** What the serve settings say (each overrides its OTEL_* variable). */
export interface TracingSettings {
  readonly otlpEndpoint?: string;
  readonly otlpProtocol?: OtlpProtocol;
  readonly otelServiceName?: string;
  readonly otelTracesSampler?: TraceSamplerName;
  readonly otelTracesSamplerArg?: number;
}

export interface TracingConfig {
  /** The traces URL the exporter posts to. */
  readonly url: string;
  readonly protocol: OtlpProtocol;
  readonly serviceName: string;
  readonly sampler: TraceSamplerName;
  readonly samplerArg: number;
}

type Env = Readonly<Record<string, string | undefined>>;

/** Settings over OTEL_* variables; null when tracing is off. Throws a one-line Error on a bad OTEL_* value. */
export function tracingConfig(s: TracingSettings, env: Env): TracingConfig | null {
  const v = (k: string) => {
    const x = env[k]?.trim();
    return x ? x : undefined;
  };
  if (v('OTEL_SDK_DISABLED')?.toLowerCase() === 'true') return null;
  if (!s.otlpEndpoint && v('OTEL_TRACES_EXPORTER')?.toLowerCase() === 'none') return null;
  // The signal-specific variable is the whole URL; the general one (like the flag) is a base that gets /v1/traces.
  const base = s.otlpEndpoint ?? v('OTEL_EXPORTER_OTLP_ENDPOINT');
  const url = s.otlpEndpoint
    ? withTracesPath(s.otlpEndpoint)
    : (v('OTEL_EXPORTER_OTLP_TRACES_ENDPOINT') ?? (base ? withTracesPath(base) : undefined));
  if (!url) return null;
  const protocol = s.otlpProtocol ?? v('OTEL_EXPORTER_OTLP_TRACES_PROTOCOL') ?? v('OTEL_EXPORTER_OTLP_PROTOCOL') ?? 'http/protobuf';
  if (!(OTLP_PROTOCOLS as readonly string[]).includes(protocol)) {
    throw new Error(`OTEL_EXPORTER_OTLP_PROTOCOL must be one of ${OTLP_PROTOCOLS.join(', ')} (grpc is not supported), got "${protocol}"`);
  }
  const sampler = s.otelTracesSampler ?? v('OTEL_TRACES_SAMPLER') ?? 'parentbased_always_on';
  if (!(TRACE_SAMPLERS as readonly string[]).includes(sampler)) {
    throw new Error(`OTEL_TRACES_SAMPLER must be one of ${TRACE_SAMPLERS.join(', ')}, got "${sampler}"`);
  }
  const argText = v('OTEL_TRACES_SAMPLER_ARG');
  const samplerArg = s.otelTracesSamplerArg ?? (argText !== undefined ? Number(argText) : 1);
  if (!(samplerArg >= 0 && samplerArg <= 1)) throw new Error(`OTEL_TRACES_SAMPLER_ARG must be a number in [0, 1], got "${argText}"`);
  try {
    new URL(url);
  } catch {
    throw new Error(`the OTLP endpoint must be a URL, got "${url}"`);
  }
  return {
    url,
    protocol: protocol as OtlpProtocol,
    serviceName: s.otelServiceName ?? v('OTEL_SERVICE_NAME') ?? 'kvroute',
    sampler: sampler as TraceSamplerName,
    samplerArg,
  };
}

function withTracesPath(base: string): string {
  return base.endsWith('/v1/traces') ? base : `${base.replace(/\/+$/, '')}/v1/traces`;
}

/** The trace of one request; every method is a no-op when tracing is off. */
export interface RequestTrace {
  readonly enabled: boolean;
  /** A finished child span over [startMs, endMs] (epoch ms). */
  span(name: string, startMs: number, endMs: number, attributes?: Attributes): void;
  /** Starts an upstream attempt span; writes its `traceparent` into `headers`. */
  attempt(attributes: Attributes, headers: Record<string, string>): AttemptTrace;
  /** Attributes of the request span. */
  set(attributes: Attributes): void;
  /** Ends the request span with the HTTP status. */
  end(status: number, error?: string): void;
}

export interface AttemptTrace {
  set(attributes: Attributes): void;
  end(error?: string): void;
}

export const NOOP_ATTEMPT: AttemptTrace = { set() {}, end() {} };
export const NO_TRACE: RequestTrace = {
  enabled: false,
  span() {},
  attempt: () => NOOP_ATTEMPT,
  set() {},
  end() {},
};

/** The tracer of a server: one RequestTrace per request. */
export interface RequestTracer {
  request(name: string, headers: IncomingHttpHeaders, attributes: Attributes): RequestTrace;
  close(): Promise<void>;
}
