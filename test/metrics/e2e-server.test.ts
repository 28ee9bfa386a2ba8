/**
 * The whole chain on real parts: kvroute serve (src/server) in front of two mock engines publishing KV events over ZMQ,
 * skewed traffic (few long warm prompts, many short cold ones), then the hit-rate report on two scrapes of the router's
 * /metrics and of each engine's /metrics. The verdict must see through the trap: the histogram reads low, the router
 * is accurate.
 */
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdir, writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { buildReport, formatReport } from '../../src/metrics/hitrate-report.ts';
import { startServer, type RunningServer } from '../../src/server/app.ts';
import { DEFAULTS } from '../../src/config/serve.ts';
import { startEmbeddedFleet, type EmbeddedFleet } from '../../src/mocker/embedded.ts';

const BS = 16;
let fleet: EmbeddedFleet;
let server: RunningServer;

beforeAll(async () => {
  fleet = await startEmbeddedFleet({ count: 2, model: 'mock-model', blockSize: BS, speedup: 50 });
  server = await startServer(
    {
      ...DEFAULTS,
      port: 0,
      workers: fleet.workers,
      healthIntervalMs: 0,
      // The report reads the engines directly here (the mirror's own path is covered by scrape/mocker tests).
      engineMetricsIntervalMs: 0,
      remoteTokenize: false,
      shutdownGraceMs: 500,
      logLevel: 'silent',
      metricsPrefix: 'dynamo_component_',
    },
    { logger: pino({ level: 'silent' }) },
  );
});
afterAll(async () => {
  await server?.close(200);
  await fleet?.close();
});

const text = async (url: string) => (await fetch(url)).text();

async function complete(prompt: number[]): Promise<void> {
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock-model', prompt, max_tokens: 2, stream: true, stream_options: { include_usage: true } }),
  });
  expect(res.status).toBe(200);
  await res.text();
}

describe('hit-rate truth end to end (server + mock engines with KV events)', () => {
  it('the report finds the router accurate while its histogram reads far lower', async () => {
    const engines = () => Promise.all(fleet.mockers.map((m) => text(`${m.url}/metrics`)));
    const routerBefore = await text(`${server.url}/metrics`);
    const enginesBefore = await engines();

    const system = Array.from({ length: 64 * BS }, (_, i) => 10_000 + i);
    let uniq = 200_000;
    const fresh = (n: number) => Array.from({ length: n }, () => uniq++);
    for (let round = 0; round < 6; round++) {
      const jobs = [complete([...system, ...fresh(40)])];
      for (let i = 0; i < 5; i++) jobs.push(complete(fresh(20)));
      await Promise.all(jobs);
      await new Promise((r) => setTimeout(r, 30)); // let the Stored events of this round reach the index
    }

    const routerAfter = await text(`${server.url}/metrics`);
    const enginesAfter = await engines();
    const r = buildReport({
      from: routerBefore,
      to: routerAfter,
      windowS: 1,
      engines: fleet.workers.map((w, i) => ({ name: w.id!, from: enginesBefore[i], to: enginesAfter[i] })),
    });

    // Kept for reading (test-artifacts/ is gitignored).
    const artifacts = fileURLToPath(new URL('../../test-artifacts/', import.meta.url));
    await mkdir(artifacts, { recursive: true });
    await writeFile(`${artifacts}hitrate-e2e.txt`, formatReport(r));

    expect(r.prefix).toBe('dynamo_component_');
    expect(r.overall.requests).toBe(36);
    expect(r.engineSource).toBe('direct');
    const B = r.overall.predicted.blockWeighted;
    const H = r.overall.predicted.requestWeighted;
    const E = r.overall.engine.ratio;
    // 5 of 6 long prompts find their 64-block prefix; 30 short ones are cold
    expect(B).toBeGreaterThan(0.6);
    expect(B - H).toBeGreaterThan(0.4);
    expect(Math.abs(B - E)).toBeLessThan(0.05);
    // delivered (usage cached_tokens) covers every request here, and agrees with the engine's counters
    expect(r.overall.delivered.requests).toBe(36);
    expect(Math.abs(r.overall.delivered.tokenWeighted - E)).toBeLessThan(1e-9);
    expect(r.verdict).toMatch(
      /^router view accurate: block-weighted \d\.\d{3} vs engine \d\.\d{3}; the histogram's \d\.\d{3} is a mean of ratios pulled down by many short requests$/,
    );
  });
});
