/**
 * The miss-ratio-curve family (docs/cache-sizing.md): the block-weighted hit ratio an LRU prefix cache would give on
 * the traffic routed so far, at fixed multiples of the fleet's KV capacity, computed at scrape time from the curves of
 * src/runtime/mrc-feed.ts. Absent (no series) until some traffic was sampled and some engine's capacity is known.
 */
import { Gauge, type Registry } from 'prom-client';
import { MRC_METHOD, type MrcReport } from '../core/mrc.ts';

/** What the gauges read (src/runtime/mrc-feed.ts in the router). */
export interface MrcSource {
  report(): MrcReport;
}

/** The label of the fleet-wide curve (all models together). */
export const MRC_ALL_MODELS = '_all';

export function registerMrcGauges(registry: Registry, prefix: string, feed: MrcSource, sampleRate: number, maxSamples: number): void {
  const registers = [registry];
  new Gauge({
    name: `${prefix}router_kv_mrc_hit_ratio`,
    help:
      `Predicted block-weighted hit ratio of one LRU prefix cache of capacity_factor x the fleet's KV blocks on the traffic ` +
      `routed so far, per model (${MRC_ALL_MODELS}: all models together). Method: ${MRC_METHOD}. Sampling starts at rate ` +
      `${sampleRate} and falls to keep at most ${maxSamples} sampled blocks per curve (router_kv_mrc_sample_rate).`,
    labelNames: ['model', 'capacity_factor'] as const,
    registers,
    collect() {
      this.reset();
      const r = feed.report();
      const set = (model: string, points: typeof r.fleet) => {
        for (const p of points) if (p.hit !== null) this.set({ model, capacity_factor: String(p.factor) }, p.hit);
      };
      set(MRC_ALL_MODELS, r.fleet);
      for (const [model, points] of Object.entries(r.models)) set(model, points);
      scaleUp.reset();
      for (const p of r.scaleUp) if (p.hit !== null) scaleUp.set({ capacity_factor: String(p.factor) }, p.hit);
      scaleOut.reset();
      for (const p of r.scaleOut) if (p.hit !== null) scaleOut.set({ engines_added: String(p.enginesAdded) }, p.hit);
      rate.set(r.sampleRate);
      memory.set(r.memoryBytes);
      capacity.set(r.fleetBlocks ?? 0);
    },
  });
  const scaleUp = new Gauge({
    name: `${prefix}router_kv_mrc_scale_up_hit_ratio`,
    help:
      'Predicted block-weighted hit ratio if every engine had capacity_factor x its own KV blocks: up to 1x, each ' +
      "engine's own stream on its own curve (mean weighted by prompt blocks); above 1x, the fleet curve at that many blocks " +
      "times today's locality (engines' hit over the shared cache's at 1x). Method as router_kv_mrc_hit_ratio.",
    labelNames: ['capacity_factor'] as const,
    registers,
  });
  const scaleOut = new Gauge({
    name: `${prefix}router_kv_mrc_scale_out_hit_ratio`,
    help:
      "Predicted block-weighted hit ratio with engines_added more engines of today's mean KV size: the fleet curve at " +
      "(N + m) / N x the fleet's blocks times today's locality. Method as router_kv_mrc_hit_ratio.",
    labelNames: ['engines_added'] as const,
    registers,
  });
  const rate = new Gauge({
    name: `${prefix}router_kv_mrc_sample_rate`,
    help: "The fleet curve's current block sampling rate (starts at --mrc-sample-rate, falls at --mrc-max-samples).",
    registers,
  });
  const memory = new Gauge({
    name: `${prefix}router_kv_mrc_memory_bytes`,
    help: 'Approximate heap held by the miss-ratio curves (fleet, per model, per engine).',
    registers,
  });
  const capacity = new Gauge({
    name: `${prefix}router_kv_mrc_fleet_blocks`,
    help: "The fleet's KV capacity in blocks that capacity_factor multiplies (engines of known capacity; 0: none known).",
    registers,
  });
}
