/**
 * The filter stage on its own: the first filter that leaves nothing names the refusal (worker level and source level),
 * and a worker passes with the ranks the subset keeps.
 */
import { describe, expect, it } from 'vitest';
import {
  BUSY_FILTER,
  eligibility,
  type FilterableWorker,
  SOURCE_FILTERS,
  WORKER_FILTERS,
  type WorkerRole,
} from '../../src/core/scheduling/filters.ts';

function worker(
  id: string,
  o: { role?: WorkerRole; healthy?: boolean; open?: boolean; models?: string[]; ranks?: number } = {},
): FilterableWorker {
  const models = new Set(o.models ?? ['m']);
  return {
    id,
    role: o.role ?? 'both',
    engine: 'vllm',
    sourceKeys: Array.from({ length: o.ranks ?? 1 }, (_, r) => `${id}#${r}`),
    healthy: o.healthy ?? true,
    adapters: new Set(),
    breaker: { admits: () => !o.open },
    serves: (m) => models.has(m),
  };
}

describe('worker-level filters', () => {
  it('run in the documented order', () => {
    expect(WORKER_FILTERS.map((f) => f.name)).toEqual(['pin', 'model', 'role', 'health', 'breaker', 'subset']);
    expect(SOURCE_FILTERS.map((f) => f.name)).toEqual(['allow', 'exclude', 'busy']);
  });

  it('name the refusal by the first filter that leaves nothing', () => {
    const reason = (ws: FilterableWorker[], q: Parameters<typeof eligibility>[1]) => {
      const r = eligibility(ws, q, 0);
      return r.kind === 'ineligible' ? r.reason : 'eligible';
    };
    expect(reason([], { model: 'm' })).toBe('no_workers');
    expect(reason([worker('a')], { model: 'x' })).toBe('model_not_found');
    expect(reason([worker('a')], { model: 'm', pinned: 'gone' })).toBe('model_not_found');
    expect(reason([worker('a', { role: 'prefill' })], { model: 'm' })).toBe('no_workers_for_role');
    expect(reason([worker('a', { healthy: false }), worker('b', { open: true })], { model: 'm' })).toBe('no_healthy_workers');
    expect(reason([worker('a', { open: true })], { model: 'm' })).toBe('no_healthy_workers');
    expect(reason([worker('a')], { model: 'm', subset: new Set(['z#0']) })).toBe('subset_unavailable');
    // A pinned worker that is down: the health filter names it, not the pin.
    expect(reason([worker('a', { healthy: false }), worker('b')], { model: 'm', pinned: 'a' })).toBe('no_healthy_workers');
  });

  it('keeps only the ranks in the subset, and the workers they belong to', () => {
    const r = eligibility([worker('a', { ranks: 2 }), worker('b')], { model: 'm', subset: new Set(['a#1']) }, 0);
    expect(r.kind).toBe('eligible');
    if (r.kind !== 'eligible') return;
    expect([...r.allow]).toEqual(['a#1']);
    expect([...r.workers.keys()]).toEqual(['a']);
  });
});

describe('source-level busy filter', () => {
  it('keeps a source within both thresholds and drops one beyond either', () => {
    const q = { busy: { activeBlockFraction: 0.5, activePrefillTokens: 100 } };
    const s = { key: 'w', capacityBlocks: 10, activeBlocks: 5, activePrefillTokens: 100 };
    expect(BUSY_FILTER.admits(s, q)).toBe(true);
    expect(BUSY_FILTER.admits({ ...s, activeBlocks: 6 }, q)).toBe(false);
    expect(BUSY_FILTER.admits({ ...s, activePrefillTokens: 101 }, q)).toBe(false);
    // Without a known capacity the fraction cannot apply.
    expect(BUSY_FILTER.admits({ ...s, capacityBlocks: undefined, activeBlocks: 1e6 }, q)).toBe(true);
  });
});
