/**
 * The endpoint picker's own metrics (beside RouterMetrics, on the same registry; the routing, load and hit-rate metrics
 * are RouterMetrics', counted exactly as `kvroute serve` counts them):
 *
 *   epp_requests_total{result}        ext_proc streams by how the request phase ended: routed (an endpoint picked by
 *                                      the dispatcher), passthrough (a path that is not routed: fewest in flight),
 *                                      refused (an immediate response with the refusal's status), timed_out (no
 *                                      decision within --decision-timeout-ms: 503), bad_request (400, 413), cancelled
 *                                      (the stream ended before an answer), protocol_error
 *   epp_immediate_responses_total{status}  immediate responses sent, by HTTP status
 *   epp_served_elsewhere_total{outcome}  the proxy reported another endpoint than the pick (its fallback): moved (the
 *                                      request re-counted there), untracked (that worker could not take it in the
 *                                      router's view), unknown (an endpoint that is not a worker)
 *   epp_streams_active                 ext_proc streams open now
 */
import { Counter, Gauge, type Registry } from 'prom-client';

export type EppResult = 'routed' | 'passthrough' | 'refused' | 'timed_out' | 'bad_request' | 'cancelled' | 'protocol_error';
export type ServedElsewhere = 'moved' | 'untracked' | 'unknown';

export class EppMetrics {
  private readonly requests: Counter<'result'>;
  private readonly immediate: Counter<'status'>;
  private readonly elsewhere: Counter<'outcome'>;
  private readonly active: Gauge;

  constructor(registry: Registry, prefix: string) {
    const registers = [registry];
    this.requests = new Counter({
      name: `${prefix}epp_requests_total`,
      help: 'ext_proc streams by how their request phase ended: routed, passthrough, refused, timed_out, bad_request, cancelled, protocol_error.',
      labelNames: ['result'],
      registers,
    });
    this.immediate = new Counter({
      name: `${prefix}epp_immediate_responses_total`,
      help: 'Immediate responses the endpoint picker answered instead of an endpoint, by HTTP status.',
      labelNames: ['status'],
      registers,
    });
    this.elsewhere = new Counter({
      name: `${prefix}epp_served_elsewhere_total`,
      help:
        'Requests the proxy served on another endpoint than the pick (x-gateway-destination-endpoint-served): moved (counted ' +
        'where they ran), untracked (that worker could not take them in the router view), unknown (not a worker).',
      labelNames: ['outcome'],
      registers,
    });
    this.active = new Gauge({ name: `${prefix}epp_streams_active`, help: 'ext_proc streams open now.', registers });
    for (const r of ['routed', 'passthrough', 'refused', 'timed_out', 'bad_request', 'cancelled', 'protocol_error'] as const)
      this.requests.inc({ result: r }, 0);
  }

  request(result: EppResult): void {
    this.requests.inc({ result });
  }

  immediateResponse(status: number): void {
    this.immediate.inc({ status: String(status) });
  }

  servedElsewhere(outcome: ServedElsewhere): void {
    this.elsewhere.inc({ outcome });
  }

  streamOpened(): void {
    this.active.inc();
  }

  streamClosed(): void {
    this.active.dec();
  }
}
