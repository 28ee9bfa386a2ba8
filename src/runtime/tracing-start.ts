/**
 * Starts tracing: loads the OpenTelemetry SDK (tracing-otel.ts) only when tracing is on, so a router without tracing
 * never loads it. Its own file so tracing.ts (the types and the no-op trace) and tracing-otel.ts do not import each
 * other.
 */
import type { RequestTracer, TracingConfig } from './tracing.ts';

/** Loads the OpenTelemetry SDK and starts the exporter (only when tracing is on). */
export async function startTracing(config: TracingConfig): Promise<RequestTracer> {
  const { OtelTracing } = await import('./tracing-otel.ts');
  return new OtelTracing(config);
}
