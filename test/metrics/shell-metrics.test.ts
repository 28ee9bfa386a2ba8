/**
 * The request metrics of `serve --processes` recorded in the shells' own registries (ShellMetrics) and summed into the
 * primary's /metrics and dashboard (RouterMetrics.addRemote): the same series and values as one registry shows.
 */
import { describe, expect, it } from 'vitest';
import { KvRouter } from '../../src/core/router.ts';
import type { KvEvent } from '../../src/core/types.ts';
import { RouterMetrics } from '../../src/metrics/registry.ts';
import { type ShellMetricsSnapshot, ShellMetrics } from '../../src/metrics/shell-metrics.ts';
import { routed, storedEvent, toks } from '../fixtures/routing.ts';

const BS = 16;
const stored = (tokens: number[], blocks: number, base: bigint): KvEvent => storedEvent(tokens, blocks, base, BS);

function setup() {
  let t = 0;
  const router = new KvRouter({ blockSize: BS, clock: () => (t += 0.01) });
  router.addSource({ workerId: 'w0', dpRank: 0 });
  router.addSource({ workerId: 'w1', dpRank: 0 });
  const metrics = new RouterMetrics({ router });
  const long = toks(100 * BS, 1_000);
  metrics.eventsApplied('w1', router.applyEvents('w1', [stored(long, 99, 1n)]), 'stored');
  return { router, metrics, long };
}

type Recorder = Pick<ShellMetrics, 'routed' | 'firstToken' | 'token' | 'refused' | 'outcome' | 'apiRequest'>;

/** Three requests, each recorded by `by(i)`: routed, first token, tokens, outcome; and a refusal. */
function traffic(router: KvRouter, long: number[], by: (i: number) => Recorder): void {
  const prompts = [toks(BS, 900_000), long, toks(3 * BS, 800_000)];
  for (const [i, tokens] of prompts.entries()) {
    const m = by(i);
    m.apiRequest(i === 2 ? 'chat' : 'completions');
    const d = routed(router.route({ requestId: `r${i}`, tokens }, i));
    m.routed(d, { tokenize: 0.001 * (i + 1) });
    m.firstToken(d.sourceKey, 0.05 * (i + 1));
    m.token(d.sourceKey, 0.01);
    m.token(d.sourceKey, 0.02);
    m.outcome('success');
  }
  by(0).refused('all_busy');
}

/** router_* series with their values (the processes' own series left out). */
function series(text: string): [string, number][] {
  return text
    .split('\n')
    .filter((l) => l.startsWith('router_'))
    .map((l) => [l.slice(0, l.lastIndexOf(' ')), Number(l.slice(l.lastIndexOf(' ') + 1))] as [string, number])
    .sort(([a], [b]) => (a < b ? -1 : 1));
}

describe('ShellMetrics summed into RouterMetrics', () => {
  it('two shell registries and the primary show what one registry shows, on /metrics and the dashboard', async () => {
    const one = setup();
    traffic(one.router, one.long, () => one.metrics);

    const primary = setup();
    const shells = [new ShellMetrics(''), new ShellMetrics('')];
    traffic(primary.router, primary.long, (i) => shells[i % 2]);
    const snapshots: ShellMetricsSnapshot[] = [];
    primary.metrics.addRemote({
      metrics: async () => {
        snapshots.splice(0, snapshots.length, ...(await Promise.all(shells.map((s) => s.snapshot()))));
        return snapshots.map((s) => JSON.parse(s.json));
      },
      totals: () => snapshots.map((s) => s.totals),
    });

    const expected = series(await one.metrics.render());
    expect(expected.find(([k]) => k === 'router_api_requests_total{api="completions"}')?.[1]).toBe(2);
    expect(expected.find(([k]) => k === 'router_kv_overlap_blocks_total{worker="w1"}')?.[1]).toBe(99);
    expect(series(await primary.metrics.render())).toEqual(expected);

    // The dashboard's request totals (as of the shells' last report).
    const pick = (m: RouterMetrics) => {
      const { overhead, ttft, itl, outcomes, refusals } = m.dashboardState(0);
      return { overhead, ttft, itl, outcomes, refusals };
    };
    expect(pick(primary.metrics)).toEqual(pick(one.metrics));
    expect(pick(one.metrics).ttft.count).toBe(3);
  });

  it('a shell that sees more workers than the label limit puts the rest under _other, as RouterMetrics does', async () => {
    const shell = new ShellMetrics('', () => {}, 1);
    shell.firstToken('a', 0.1);
    shell.firstToken('b', 0.2);
    const text = (await shell.registry.metrics()).split('\n');
    expect(text).toContain('router_time_to_first_token_seconds_count{worker="a"} 1');
    expect(text).toContain('router_time_to_first_token_seconds_count{worker="_other"} 1');
  });

  it('tells its owner of every change (the shell reports its registry a second later)', () => {
    let changes = 0;
    const shell = new ShellMetrics('kv_', () => changes++);
    shell.apiRequest('chat');
    shell.outcome('success');
    shell.legDuration('prefill', 0.2);
    expect(changes).toBe(3);
  });
});
