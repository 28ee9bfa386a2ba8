import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { KvRouter } from '../../src/core/router.ts';
import { RouterMetrics } from '../../src/metrics/registry.ts';
import { EngineMirror } from '../../src/metrics/scrape.ts';
import { MrcBook } from '../../src/core/mrc.ts';
import { registerMrcGauges } from '../../src/metrics/mrc.ts';

interface Target {
  expr: string;
  legendFormat?: string;
}
interface Panel {
  type: string;
  title: string;
  targets?: Target[];
  panels?: Panel[];
}

const dashboard = JSON.parse(readFileSync(new URL('../../deploy/grafana/kvroute-hitrate.json', import.meta.url), 'utf8')) as {
  panels: Panel[];
  templating: { list: Array<{ name: string; query: unknown; definition?: string }> };
};

function targets(panels: Panel[]): Array<Target & { panel: string }> {
  return panels.flatMap((p) => [...(p.targets ?? []).map((t) => ({ ...t, panel: p.title })), ...targets(p.panels ?? [])]);
}

/** Every series name the router exports (histograms expand to _bucket/_sum/_count). */
function exportedNames(): Set<string> {
  const router = new KvRouter({ blockSize: 16 });
  const metrics = new RouterMetrics({ router });
  new EngineMirror({ registry: metrics.registry, targets: () => [] });
  // The miss-ratio gauges are registered by the composition (src/runtime/compose.ts) next to these.
  registerMrcGauges(metrics.registry, '', { report: () => new MrcBook().report(() => undefined) }, 0.1, 8192);
  const names = new Set<string>();
  for (const m of metrics.registry.getMetricsAsArray()) {
    const { name, type } = m as unknown as { name: string; type: string };
    if (type === 'histogram') for (const s of ['_bucket', '_sum', '_count']) names.add(name + s);
    else names.add(name);
  }
  return names;
}

/** Grafana's variables, interpolated the way Grafana would with an empty prefix and all workers. */
const interpolate = (expr: string) =>
  expr
    .replaceAll(/\$\{prefix\}/g, '')
    .replaceAll('$__rate_interval', '1m')
    .replaceAll('$worker', '.*');

/** Metric names in a PromQL expression: identifiers that are not functions, keywords, labels or label values. */
function metricNames(expr: string): string[] {
  const noStrings = expr.replace(/"(?:[^"\\]|\\.)*"/g, '""');
  const noLabels = noStrings
    .replace(/\{[^}]*\}/g, '{}')
    .replace(/\[[^\]]*\]/g, '')
    .replace(/\b(?:by|without)\s*\([^)]*\)/g, '');
  const names: string[] = [];
  for (const m of noLabels.matchAll(/[a-zA-Z_:][a-zA-Z0-9_:]*/g)) {
    const after = noLabels.slice(m.index! + m[0].length).trimStart();
    if (after.startsWith('(')) continue; // a function
    if (/^\d/.test(m[0]) || ['by', 'without', 'on', 'ignoring', 'and', 'or', 'unless', 'offset', 'bool'].includes(m[0])) continue;
    names.push(m[0]);
  }
  return names;
}

describe('deploy/grafana dashboard', () => {
  const all = targets(dashboard.panels);
  const exported = exportedNames();

  it('every expression names only metrics the router exports, with balanced brackets', () => {
    expect(all.length).toBeGreaterThan(20);
    for (const t of all) {
      const expr = interpolate(t.expr);
      const names = metricNames(expr);
      expect(names.length, `${t.panel}: ${t.expr}`).toBeGreaterThan(0);
      for (const n of names) expect(exported.has(n), `${t.panel}: unknown metric ${n} in ${t.expr}`).toBe(true);
      for (const [open, close] of [
        ['(', ')'],
        ['{', '}'],
        ['[', ']'],
      ]) {
        expect(expr.split(open).length, `${t.panel}: unbalanced ${open} in ${expr}`).toBe(expr.split(close).length);
      }
    }
    // the metric-name parser itself: a bad name would be caught
    expect(metricNames('sum(rate(router_kv_typo_total{worker=~".*"}[1m]))')).toEqual(['router_kv_typo_total']);
    // the worker variable queries an exported metric
    const workerVar = dashboard.templating.list.find((v) => v.name === 'worker')!;
    expect(exported.has(metricNames(interpolate(workerVar.definition!))[0])).toBe(true);
  });

  it('block-weighted is rate(overlap)/rate(isl), request-weighted is rate(_sum)/rate(_count), each labelled as such', () => {
    const squash = (s: string) => interpolate(s).replace(/\s+/g, '');
    const block = all.filter((t) =>
      /^sum\(rate\(router_kv_overlap_blocks_total\{[^}]*\}\[1m\]\)\)\/sum\(rate\(router_kv_isl_blocks_total\{[^}]*\}\[1m\]\)\)$/.test(
        squash(t.expr),
      ),
    );
    expect(block.length).toBeGreaterThanOrEqual(2);
    for (const t of block) expect(t.legendFormat).toMatch(/block-weighted/);
    const req = all.filter((t) =>
      /^sum\(rate\(router_kv_hit_rate_sum\{[^}]*\}\[1m\]\)\)\/sum\(rate\(router_kv_hit_rate_count\{[^}]*\}\[1m\]\)\)$/.test(squash(t.expr)),
    );
    expect(req.length).toBeGreaterThanOrEqual(1);
    for (const t of req) expect(t.legendFormat).toMatch(/request-weighted.*mean of ratios.*NOT comparable/);
    const engine = all.filter((t) =>
      /^sum\(rate\(router_engine_prefix_cache_hits_total\{[^}]*\}\[1m\]\)\)\/sum\(rate\(router_engine_prefix_cache_queries_total\{[^}]*\}\[1m\]\)\)$/.test(
        squash(t.expr),
      ),
    );
    expect(engine.length).toBeGreaterThanOrEqual(2);
    for (const t of engine) expect(t.legendFormat).toMatch(/ratio of sums|rate\(hits\)\/rate\(queries\)/);
    // the histogram's mean is never divided into engine counters or vice versa
    for (const t of all) {
      const e = squash(t.expr);
      if (e.includes('router_kv_hit_rate_sum')) expect(e).not.toMatch(/prefix_cache|isl_blocks/);
    }
  });
});
