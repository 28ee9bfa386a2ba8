/**
 * Flow-control and session metrics (beside RouterMetrics, on the same registry):
 *
 *   router_flow_queued_requests{band,tenant}        gauge: waiting now
 *   router_flow_queue_wait_seconds{band}            histogram: time queued before dispatch (dispatched requests)
 *   router_flow_requests_total{band,tenant,outcome} dispatched | shed | expired | deadline | budget | refused
 *   router_flow_dispatched_tokens_total{tenant}     prompt tokens dispatched: each tenant's share of the fleet
 *                                                   (fairness share = rate of one tenant / rate of all)
 *   router_session_requests_total{outcome,reason}   new | kept | moved (reason: overloaded | unavailable)
 *
 * Tenant labels are bounded: the tenants named in configuration plus the first `maxTenants` seen; the rest are `_other`.
 */
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import type { DispatchAttempt, DispatchRefusal, RefusalCode } from '../core/dispatch/dispatcher.ts';
import type { FlowQueue } from '../core/dispatch/flow.ts';
import { fastCounter, fastHistogram } from './bound.ts';

const WAIT_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

const OUTCOME: Partial<Record<RefusalCode, string>> = {
  shed: 'shed',
  queue_timeout: 'expired',
  deadline_unmeetable: 'deadline',
  token_budget_exceeded: 'budget',
};

interface DispatchLabels {
  readonly requests: { band: string; tenant: string; outcome: string };
  readonly tokens: { tenant: string };
  readonly wait: { band: string };
}

export class FlowMetrics {
  private readonly tenants = new Set<string>();
  private readonly wait: Histogram<'band'>;
  private readonly requests: Counter<'band' | 'tenant' | 'outcome'>;
  private readonly tokens: Counter<'tenant'>;
  private readonly sessions: Counter<'outcome' | 'reason'>;
  /**
   * One set of labels objects per band and (bounded) tenant, reused for every dispatched request: the metrics' fast path
   * (bound.ts) finds their series by these objects instead of prom-client hashing a new labels object per call.
   */
  private readonly dispatchLabels = new Map<string, Map<string, DispatchLabels>>();
  /** Plain totals for the dashboard and /debug/state. */
  readonly totals = { sessions: { new: 0, kept: 0, moved: 0 } as Record<string, number>, byOutcome: new Map<string, number>() };

  constructor(
    registry: Registry,
    prefix: string,
    census: () => ReturnType<FlowQueue['census']>,
    knownTenants: readonly string[] = [],
    private readonly maxTenants = 32,
  ) {
    for (const t of knownTenants) this.tenants.add(t);
    const registers = [registry];
    const self = this;
    new Gauge({
      name: `${prefix}router_flow_queued_requests`,
      help: 'Requests waiting in the flow-control queue now, by priority band and tenant.',
      labelNames: ['band', 'tenant'],
      registers,
      collect() {
        this.reset();
        const sums = new Map<string, { band: string; tenant: string; n: number }>();
        for (const c of census()) {
          const tenant = self.tenant(c.tenant);
          const k = `${c.band}\u0000${tenant}`;
          const e = sums.get(k) ?? { band: c.band, tenant, n: 0 };
          e.n += c.waiting;
          sums.set(k, e);
        }
        for (const e of sums.values()) this.set({ band: e.band, tenant: e.tenant }, e.n);
      },
    });
    this.wait = fastHistogram(
      new Histogram({
        name: `${prefix}router_flow_queue_wait_seconds`,
        help: 'Time a dispatched request waited in the queue (0 when it never waited), by band.',
        labelNames: ['band'],
        buckets: WAIT_BUCKETS,
        registers,
      }),
    );
    this.requests = fastCounter(
      new Counter({
        name: `${prefix}router_flow_requests_total`,
        help: 'Requests by band, tenant and admission outcome: dispatched (first attempt), shed (sheddable band, saturated), expired (band TTL), deadline (TTFT objective unmeetable), budget (token budget), refused (any other refusal).',
        labelNames: ['band', 'tenant', 'outcome'],
        registers,
      }),
    );
    this.tokens = fastCounter(
      new Counter({
        name: `${prefix}router_flow_dispatched_tokens_total`,
        help: "Prompt tokens dispatched, by tenant: a tenant's share of the fleet's prefill work.",
        labelNames: ['tenant'],
        registers,
      }),
    );
    this.sessions = new Counter({
      name: `${prefix}router_session_requests_total`,
      help: 'Requests carrying a session id: new (no live session), kept (its worker again), moved (elsewhere; reason overloaded or unavailable).',
      labelNames: ['outcome', 'reason'],
      registers,
    });
  }

  private tenant(t: string): string {
    if (this.tenants.has(t)) return t;
    if (this.tenants.size < this.maxTenants) {
      this.tenants.add(t);
      return t;
    }
    return '_other';
  }

  private labelsOf(band: string, tenant: string): DispatchLabels {
    let byTenant = this.dispatchLabels.get(band);
    if (byTenant === undefined) {
      byTenant = new Map();
      this.dispatchLabels.set(band, byTenant);
    }
    let l = byTenant.get(tenant);
    if (l === undefined) {
      l = { requests: { band, tenant, outcome: 'dispatched' }, tokens: { tenant }, wait: { band } };
      byTenant.set(tenant, l);
    }
    return l;
  }

  dispatched(a: DispatchAttempt): void {
    if (a.attempt === 0) {
      const l = this.labelsOf(a.band, this.tenant(a.tenant));
      this.requests.inc(l.requests);
      this.tokens.inc(l.tokens, a.decision.promptTokens);
      this.wait.observe(l.wait, a.queuedMs / 1000);
      this.count('dispatched');
    }
    if (a.session) {
      this.sessions.inc({ outcome: a.session.outcome, reason: a.session.reason ?? '' });
      this.totals.sessions[a.session.outcome] = (this.totals.sessions[a.session.outcome] ?? 0) + 1;
    }
  }

  refused(r: DispatchRefusal): void {
    const outcome = OUTCOME[r.code] ?? 'refused';
    this.requests.inc({ band: r.band, tenant: this.tenant(r.tenant), outcome });
    this.count(outcome);
  }

  private count(outcome: string): void {
    this.totals.byOutcome.set(outcome, (this.totals.byOutcome.get(outcome) ?? 0) + 1);
  }
}
