/** The OpenTelemetry SDK behind RequestTracer: a BasicTracerProvider of the server's own, OTLP/HTTP export. */
import {
  type Context,
  defaultTextMapGetter,
  defaultTextMapSetter,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  trace,
} from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter as OtlpJsonExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPTraceExporter as OtlpProtoExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BasicTracerProvider,
  BatchSpanProcessor,
  ParentBasedSampler,
  type Sampler,
  TraceIdRatioBasedSampler,
} from '@opentelemetry/sdk-trace-base';
import type { Attributes } from '@opentelemetry/api';
import type { IncomingHttpHeaders } from 'node:http';
import type { TraceSamplerName } from '../config/tracing.ts';
import type { RequestTrace, RequestTracer, TracingConfig } from './tracing.ts';

function buildSampler(name: TraceSamplerName, arg: number): Sampler {
  const ratio = new TraceIdRatioBasedSampler(arg);
  switch (name) {
    case 'always_on':
      return new AlwaysOnSampler();
    case 'always_off':
      return new AlwaysOffSampler();
    case 'traceidratio':
      return ratio;
    case 'parentbased_always_off':
      return new ParentBasedSampler({ root: new AlwaysOffSampler() });
    case 'parentbased_traceidratio':
      return new ParentBasedSampler({ root: ratio });
    default:
      return new ParentBasedSampler({ root: new AlwaysOnSampler() });
  }
}

const propagator = new W3CTraceContextPropagator();

export class OtelTracing implements RequestTracer {
  private readonly provider: BasicTracerProvider;
  private readonly tracer: Tracer;

  constructor(readonly config: TracingConfig) {
    const exporter =
      config.protocol === 'http/json' ? new OtlpJsonExporter({ url: config.url }) : new OtlpProtoExporter({ url: config.url });
    this.provider = new BasicTracerProvider({
      resource: resourceFromAttributes({ 'service.name': config.serviceName }),
      sampler: buildSampler(config.sampler, config.samplerArg),
      spanProcessors: [new BatchSpanProcessor(exporter)],
    });
    this.tracer = this.provider.getTracer('kvroute');
  }

  /** The span of one incoming request, continuing the client's `traceparent` when it sent one. */
  request(name: string, headers: IncomingHttpHeaders, attributes: Attributes): RequestTrace {
    const parent = propagator.extract(ROOT_CONTEXT, headers, defaultTextMapGetter);
    const root = this.tracer.startSpan(name, { kind: SpanKind.SERVER, attributes }, parent);
    const ctx: Context = trace.setSpan(parent, root);
    const tracer = this.tracer;
    let ended = false;
    return {
      enabled: true,
      span(childName, startMs, endMs, attrs) {
        tracer.startSpan(childName, { startTime: startMs, attributes: attrs }, ctx).end(endMs);
      },
      attempt(attrs, out) {
        const span: Span = tracer.startSpan('upstream', { kind: SpanKind.CLIENT, attributes: attrs }, ctx);
        propagator.inject(trace.setSpan(ctx, span), out, defaultTextMapSetter);
        let done = false;
        return {
          set: (a) => span.setAttributes(a),
          end(error) {
            if (done) return;
            done = true;
            if (error) span.setStatus({ code: SpanStatusCode.ERROR, message: error });
            span.end();
          },
        };
      },
      set: (a) => root.setAttributes(a),
      end(status, error) {
        if (ended) return;
        ended = true;
        root.setAttribute('http.response.status_code', status);
        if (status >= 500 || error) root.setStatus({ code: SpanStatusCode.ERROR, message: error ?? `status ${status}` });
        root.end();
      },
    };
  }

  /** Exports what is buffered and stops. */
  async close(): Promise<void> {
    await this.provider.shutdown().catch(() => undefined);
  }
}
