/**
 * `kvroute hitrate --what-if`: plain answers from the router's miss-ratio curves (GET /debug/mrc, src/core/mrc.ts).
 * Every figure is a block-weighted hit ratio (hit prompt blocks / prompt blocks); "today" is the curve at 1x, the
 * capacity the fleet has now, so the answers compare like with like.
 */
import type { MrcPoint, MrcReport } from '../core/mrc.ts';

const f2 = (x: number | null): string => (x === null ? 'n/a' : x.toFixed(2));
const factorText = (f: number): string => (f >= 1 ? `${f}x` : `1/${Math.round(1 / f)}x`);

function at(points: readonly MrcPoint[], factor: number): number | null {
  return points.find((p) => p.factor === factor)?.hit ?? null;
}

function answers(points: readonly MrcPoint[], what: string, indent: string): string[] {
  const today = at(points, 1);
  return points
    .filter((p) => p.factor !== 1)
    .map((p) => `${indent}${factorText(p.factor)} ${what}: block-weighted hit ${f2(today)} -> ${f2(p.hit)}`);
}

export function formatWhatIf(r: MrcReport): string {
  const lines: string[] = [];
  lines.push(
    `what more KV cache would buy, from ${r.requests} routed requests (${r.sampledRefs} sampled block references, sample rate ` +
      `${r.sampleRate.toPrecision(3)}, ${(r.memoryBytes / 1024).toFixed(0)} KiB)`,
  );
  if (r.fleetBlocks === null) {
    lines.push('  no engine has a known KV capacity yet (blocks= in the worker spec, or vLLM cache_config_info): no answers');
    return `${lines.join('\n')}\n`;
  }
  if (r.requests === 0 || at(r.fleet, 1) === null) {
    lines.push('  no traffic sampled yet: no answers');
    return `${lines.join('\n')}\n`;
  }
  lines.push(
    `fleet: ${r.fleetBlocks.toLocaleString('en-US')} KV blocks today; one shared LRU prefix cache of k x that (the bound for ideal prefix routing):`,
  );
  lines.push(...answers(r.fleet, 'KV capacity', '  '));
  lines.push(
    "scale up (every engine k x its own KV blocks; above 1x: the fleet curve x today's locality " +
      `${r.locality === null ? 'n/a' : r.locality.toFixed(2)}, as a cache-aware router keeps prefixes where they are cached):`,
  );
  lines.push(...answers(r.scaleUp, "engines' KV", '  '));
  const today = at(r.scaleUp, 1);
  if (r.scaleOut.length > 0) {
    lines.push("scale out (more engines of today's mean size; the fleet curve x today's locality):");
    for (const p of r.scaleOut) {
      lines.push(
        `  +${p.enginesAdded} engine${p.enginesAdded === 1 ? '' : 's'} (${p.engines} in all): block-weighted hit ${f2(today)} -> ${f2(p.hit)}`,
      );
    }
  }
  if (r.hostTier) {
    lines.push(
      `+host tier of ${r.hostTier.hostBlocksPerEngine.toLocaleString('en-US')} blocks per engine: block-weighted hit ` +
        `${f2(today)} -> ${f2(r.hostTier.hit)} (a router that credits the tier, --tier-credit; ${f2(r.hostTier.hitFixedRouting)} without)`,
    );
  }
  const models = Object.entries(r.models);
  if (models.length > 1) {
    for (const [model, points] of models) {
      lines.push(`model ${model} (alone in a cache of k x the fleet's blocks):`);
      lines.push(...answers(points, 'KV capacity', '  '));
    }
  }
  if (r.untrackedModelRequests > 0) lines.push(`(${r.untrackedModelRequests} requests of further models count fleet-wide only)`);
  return `${lines.join('\n')}\n`;
}
