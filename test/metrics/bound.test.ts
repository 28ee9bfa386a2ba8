import { Counter, Histogram, Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { fastCounter, fastHistogram, labelObjects } from '../../src/metrics/bound.ts';

/** The same metrics twice: prom-client as it is, and with the fast paths. */
function pair() {
  const make = (fast: boolean) => {
    const registry = new Registry();
    const h = new Histogram({ name: 'h', help: 'h', buckets: [0.1, 1, 10], labelNames: ['worker'], registers: [registry] });
    const c = new Counter({ name: 'c', help: 'c', labelNames: ['worker'], registers: [registry] });
    return { registry, h: fast ? fastHistogram(h) : h, c: fast ? fastCounter(c) : c };
  };
  return { plain: make(false), fast: make(true) };
}

function both(p: ReturnType<typeof pair>, act: (m: ReturnType<typeof pair>['plain']) => void): void {
  let plainErr: unknown = null;
  let fastErr: unknown = null;
  try {
    act(p.plain);
  } catch (e) {
    plainErr = (e as Error).message;
  }
  try {
    act(p.fast);
  } catch (e) {
    fastErr = (e as Error).message;
  }
  expect(fastErr).toEqual(plainErr);
}

describe('prom-client fast paths for reused labels objects', () => {
  it('expose exactly what prom-client exposes, through resets, zeroes, bad values and bad labels', async () => {
    const p = pair();
    const a = { worker: 'a' };
    const b = { worker: 'b' };
    const values = [0, 0.05, 0.1, 0.5, 1, 3, 10, 11, 1e9, -2, Number.POSITIVE_INFINITY, Number.NaN];
    for (let round = 0; round < 3; round++) {
      for (const v of values) {
        both(p, (m) => m.h.observe(a, v));
        both(p, (m) => m.h.observe(b, v));
        both(p, (m) => m.h.observe({ worker: 'a' }, v)); // a fresh object: prom-client's own path
        both(p, (m) => m.c.inc(a, v));
        both(p, (m) => m.c.inc(b));
        both(p, (m) => m.c.inc({ worker: 'b' }, v));
      }
      both(p, (m) => m.h.observe({ nope: 'x' } as never, 1));
      both(p, (m) => m.c.inc({ nope: 'x' } as never, 1));
      if (round === 0) {
        both(p, (m) => m.h.zero(a));
        both(p, (m) => m.c.reset());
      }
      if (round === 1) both(p, (m) => m.h.reset());
      expect(await p.fast.registry.metrics()).toBe(await p.plain.registry.metrics());
    }
    expect(await p.fast.registry.metrics()).toContain('h_bucket{le="1",worker="a"}');
  });

  it('labelObjects gives one object per value', () => {
    const of = labelObjects('api');
    expect(of('chat')).toBe(of('chat'));
    expect(of('chat')).toEqual({ api: 'chat' });
    expect(of('completions')).not.toBe(of('chat'));
  });
});
