import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { dispatchOptionsFrom, ROUTING_DEFAULTS } from '../../src/config/routing.ts';
import { Dispatcher } from '../../src/core/dispatch/dispatcher.ts';
import { KvRouter } from '../../src/core/router.ts';
import { registerTableGauges } from '../../src/metrics/memory.ts';

const value = (text: string, name: string, table: string) =>
  Number(new RegExp(`^${name}\\{table="${table}"\\} (\\S+)$`, 'm').exec(text)?.[1]);

describe('router_table_bytes', () => {
  it("reports approximate mode's table and its budget beside the sessions and pins", async () => {
    const router = new KvRouter({ blockSize: 4, approxTableBytes: 2 ** 20 });
    router.addSource({ workerId: 'w0', dpRank: 0 }, { mode: 'approx' });
    const registry = new Registry();
    registerTableGauges(registry, '', new Dispatcher(router, dispatchOptionsFrom(ROUTING_DEFAULTS)));
    const before = await registry.metrics();
    expect(value(before, 'router_table_limit_bytes', 'approximate')).toBe(2 ** 20);
    const empty = value(before, 'router_table_bytes', 'approximate');
    expect(empty).toBeGreaterThan(0); // the preallocated arrays
    expect(empty).toBeLessThanOrEqual(2 ** 20);
    // Routing to an approximate-mode worker records its blocks: the table grows past its first size, within its budget.
    const tokens = Array.from({ length: 4 * 3000 }, (_, i) => i);
    router.route({ requestId: 'a', tokens }, 0);
    const after = await registry.metrics();
    expect(value(after, 'router_table_bytes', 'approximate')).toBeGreaterThan(empty);
    expect(value(after, 'router_table_bytes', 'approximate')).toBeLessThanOrEqual(2 ** 20);
    expect(value(after, 'router_table_bytes', 'sessions')).toBe(0);
  });
});
