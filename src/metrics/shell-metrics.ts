/**
 * The request metrics an HTTP shell of `kvroute serve --processes N` records itself, in its own registry: requests by
 * API and outcome, refusals, routing overhead, TTFT, inter-token latency, prompt lengths, the predicted reuse at routing
 * time (reuse.ts's routed half) and the P/D leg durations. The primary's /metrics sums them with its own registry at
 * scrape time (RouterMetrics.addRemote, prom-client's AggregatorRegistry.aggregate), so the series and values are the
 * ones one process shows; nothing of them crosses the IPC per request.
 */
import { Registry } from 'prom-client';
import type { RouteDecision } from '../core/types.ts';
import { WorkerLabels } from './bound.ts';
import { PdLegs, type PdLeg } from './disagg.ts';
import type { RequestMetrics } from './registry.ts';
import { RequestSeries, type RequestTotalsJson } from './requests.ts';
import { ReuseSeries } from './reuse.ts';

/** What a shell reports: its registry (prom-client JSON, as a string: the primary parses it only when it needs it) and the dashboard's totals. */
export interface ShellMetricsSnapshot {
  readonly json: string;
  readonly totals: RequestTotalsJson;
}

export class ShellMetrics implements RequestMetrics {
  readonly registry = new Registry();
  private readonly requests: RequestSeries;
  private readonly reuse: ReuseSeries;
  private readonly legs: PdLegs;
  private readonly workers: WorkerLabels;

  /**
   * `maxWorkerLabels` as RouterMetrics (the first workers seen get their own label, the rest `_other`); `changed`
   * is called after every record (the shell reports its registry some time after a change).
   */
  constructor(
    prefix: string,
    private readonly changed: () => void = () => {},
    maxWorkers = 256,
  ) {
    this.requests = new RequestSeries(this.registry, prefix);
    this.reuse = new ReuseSeries(this.registry, prefix, () => {});
    this.legs = new PdLegs(this.registry, prefix);
    // As RouterMetrics: a worker's reuse series exist at 0 from its first request.
    this.workers = new WorkerLabels(maxWorkers, (labels) => this.reuse.zero(labels));
  }

  private workerLabelsOf(sourceKey: string): { worker: string } {
    return this.workers.of(sourceKey);
  }

  routed(decision: RouteDecision, timingsS: { tokenize: number }): void {
    const worker = this.workerLabelsOf(decision.sourceKey);
    this.reuse.routed(worker, decision);
    this.requests.routed(worker, decision, timingsS);
    this.changed();
  }

  refused(reason: string): void {
    this.requests.refused(reason);
    this.changed();
  }

  firstToken(sourceKey: string, ttftS: number): void {
    this.requests.firstToken(this.workerLabelsOf(sourceKey), ttftS);
    this.changed();
  }

  token(sourceKey: string, interTokenS: number): void {
    this.requests.token(this.workerLabelsOf(sourceKey), interTokenS);
    this.changed();
  }

  outcome(outcome: string): void {
    this.requests.outcome(outcome);
    this.changed();
  }

  apiRequest(api: string): void {
    this.requests.apiRequest(api);
    this.changed();
  }

  legDuration(leg: PdLeg, seconds: number): void {
    this.legs.legDuration(leg, seconds);
    this.changed();
  }

  async snapshot(): Promise<ShellMetricsSnapshot> {
    return { json: JSON.stringify(await this.registry.getMetricsAsJSON()), totals: this.requests.totalsJson() };
  }
}
