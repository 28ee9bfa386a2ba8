/**
 * The choices of the tracing settings (`--otlp-protocol`, `--otel-traces-sampler`), as the OpenTelemetry SDK
 * environment variables name them; src/runtime/tracing.ts applies them.
 */
export const OTLP_PROTOCOLS = ['http/protobuf', 'http/json'] as const;
export type OtlpProtocol = (typeof OTLP_PROTOCOLS)[number];
export const TRACE_SAMPLERS = [
  'always_on',
  'always_off',
  'traceidratio',
  'parentbased_always_on',
  'parentbased_always_off',
  'parentbased_traceidratio',
] as const;
export type TraceSamplerName = (typeof TRACE_SAMPLERS)[number];
