import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KvRouter } from '../../src/core/router.ts';
import type { KvEvent } from '../../src/core/types.ts';
import { dashboardHandler } from '../../src/metrics/dashboard.ts';
import { RouterMetrics } from '../../src/metrics/registry.ts';
import { EngineMirror } from '../../src/metrics/scrape.ts';
import { ensureChromium } from '../fixtures/test-binaries.ts';

const BS = 16;

// What page.evaluate callbacks see in the page. The test's tsconfig has no DOM types, hence these minimal shapes.
/** `window.__kvrouteDashboard`, the debug object web/dashboard.js exposes for tests. */
interface DashboardDebug {
  polls: number;
  pointsDrawn: Record<string, number>;
}
interface PageGlobals {
  __kvrouteDashboard?: DashboardDebug;
  document: {
    getElementById(id: string): {
      width: number;
      height: number;
      getContext(kind: '2d'): { getImageData(x: number, y: number, w: number, h: number): { data: Uint8ClampedArray } };
    };
  };
}
const ARTIFACTS = fileURLToPath(new URL('../../test-artifacts/', import.meta.url));

async function body(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

/**
 * A small router shell for the test: POST /v1/completions with token ids routes through a real KvRouter and the
 * metrics; the "engine" caches what it computed (Stored events back into the router, as vLLM would publish) and
 * reports cached tokens in usage. GET /metrics, GET /dashboard*.
 */
function startRouter() {
  let t = 0;
  const router = new KvRouter({ blockSize: BS, clock: () => performance.now() });
  for (const w of ['w0', 'w1', 'w2']) router.addSource({ workerId: w, dpRank: 0 }, { mode: 'events', capacityBlocks: 10_000 });
  const metrics = new RouterMetrics({ router, eventLoopWindowMs: 200 });
  // The engines' own counters, as the mirror would scrape them: tokens queried and hit per worker.
  const engineCounters = new Map<string, { q: number; h: number }>();
  const mirror = new EngineMirror({ registry: metrics.registry, targets: () => [] });
  metrics.attachMirror(mirror);
  const cachedOn = new Map<string, Set<string>>(); // worker -> seq hashes it holds
  let nextEngineId = 1n;

  const server = createServer(async (req, res) => {
    if (dashboardHandler(req, res, () => metrics.dashboardState())) return;
    if (req.url === '/metrics') {
      res.writeHead(200, { 'content-type': metrics.contentType }).end(await metrics.render());
      return;
    }
    if (req.method === 'POST' && req.url === '/v1/completions') {
      const { prompt } = (await body(req)) as { prompt: number[] };
      const t0 = performance.now();
      const id = `r${t++}`;
      const tokenizeS = (performance.now() - t0) / 1000;
      const d = router.route({ requestId: id, tokens: prompt }, Date.now());
      if (d.kind !== 'routed') {
        metrics.refused(d.reason);
        metrics.outcome('refused');
        res.writeHead(503).end();
        return;
      }
      metrics.routed(d, { tokenize: tokenizeS });
      // The engine: hits on the leading blocks it holds (never the last token), then stores the rest.
      const held = cachedOn.get(d.sourceKey) ?? new Set<string>();
      cachedOn.set(d.sourceKey, held);
      let hitBlocks = 0;
      while (hitBlocks < d.seqHashes.length && held.has(d.seqHashes[hitBlocks].toString())) hitBlocks++;
      const cachedTokens = Math.min(hitBlocks, Math.floor((prompt.length - 1) / BS)) * BS;
      const newBlocks = d.seqHashes.length - hitBlocks;
      if (newBlocks > 0) {
        const ev: KvEvent = {
          kind: 'stored',
          parent: null,
          engineIds: [],
          tokens: null,
          blockSize: BS,
          seqHashes: d.seqHashes.slice(0, d.seqHashes.length),
        };
        // announce the whole chain with fresh engine ids; blocks already held are duplicates and are rejected
        const ids = Array.from({ length: d.seqHashes.length }, () => nextEngineId++);
        const res2 = router.applyEvents(d.sourceKey, [{ ...ev, engineIds: ids } as KvEvent]);
        metrics.eventsApplied(d.sourceKey, res2, 'stored');
        for (const h of d.seqHashes) held.add(h.toString());
      }
      const c = engineCounters.get(d.sourceKey) ?? { q: 0, h: 0 };
      c.q += prompt.length;
      c.h += cachedTokens;
      engineCounters.set(d.sourceKey, c);
      mirror.ingest(d.sourceKey, [
        { name: 'vllm:prefix_cache_queries_total', labels: { engine: '0' }, value: c.q },
        { name: 'vllm:prefix_cache_hits_total', labels: { engine: '0' }, value: c.h },
      ]);
      metrics.firstToken(d.sourceKey, 0.02 + Math.random() * 0.01);
      for (let i = 0; i < 4; i++) metrics.token(d.sourceKey, 0.01);
      // Long prompts stay in flight for a while, so the load charts have something to show.
      if (prompt.length > 8 * BS) await new Promise((r) => setTimeout(r, 400));
      const f = router.finish(id, { cachedTokens, outcome: 'ok' }, Date.now())!;
      metrics.finished(f, { outputTokens: 5 });
      metrics.outcome('ok');
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ usage: { prompt_tokens: prompt.length, prompt_tokens_details: { cached_tokens: cachedTokens } } }));
      return;
    }
    res.writeHead(404).end();
  });
  // Baseline for the mirror (first sight of each worker is not traffic).
  for (const w of ['w0', 'w1', 'w2']) {
    mirror.ingest(w, [
      { name: 'vllm:prefix_cache_queries_total', labels: { engine: '0' }, value: 0 },
      { name: 'vllm:prefix_cache_hits_total', labels: { engine: '0' }, value: 0 },
    ]);
  }
  return { router, metrics, server };
}

let shell: ReturnType<typeof startRouter>;
let base: string;
beforeAll(async () => {
  shell = startRouter();
  await new Promise<void>((r) => shell.server.listen(0, '127.0.0.1', r));
  base = `http://127.0.0.1:${(shell.server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await new Promise((r) => shell.server.close(r));
});

/** Skewed traffic: a few long prompts sharing a 64-block system prompt, many short cold ones. */
async function traffic(round: number) {
  const system = Array.from({ length: 64 * BS }, (_, i) => 50_000 + i);
  const jobs: Promise<Response>[] = [];
  for (let i = 0; i < 12; i++) {
    const long = i % 4 === 0;
    const prompt = long
      ? [...system, ...Array.from({ length: 3 * BS }, (_, k) => 1_000_000 + round * 10_000 + i * 100 + k)]
      : Array.from({ length: BS + 3 }, (_, k) => 2_000_000 + round * 10_000 + i * 100 + k);
    jobs.push(fetch(`${base}/v1/completions`, { method: 'POST', body: JSON.stringify({ prompt }) }));
  }
  for (const r of await Promise.all(jobs)) expect(r.status).toBe(200);
}

describe('dashboardHandler', () => {
  it('serves the page and assets, JSON state, and answers errors; returns false for other paths', async () => {
    const page = await fetch(`${base}/dashboard`);
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toMatch(/^text\/html/);
    expect(page.headers.get('content-security-policy')).toContain("default-src 'self'");
    const html = await page.text();
    expect(html).toContain('/dashboard/dashboard.js');
    expect(html).not.toMatch(/https?:\/\//); // no CDN
    expect((await fetch(`${base}/dashboard/dashboard.js`)).headers.get('content-type')).toMatch(/javascript/);
    expect((await fetch(`${base}/dashboard/dashboard.css`)).status).toBe(200);
    expect((await fetch(`${base}/dashboard/nope.js`)).status).toBe(404);
    expect((await fetch(`${base}/dashboard/data.json`, { method: 'POST' })).status).toBe(405);
    const data = (await (await fetch(`${base}/dashboard/data.json`)).json()) as { workers: Record<string, unknown> };
    expect(Object.keys(data.workers).sort()).toEqual(['w0', 'w1', 'w2']);
    expect((await fetch(`${base}/elsewhere`)).status).toBe(404); // fell through to the shell

    const broken = createServer((req, res) => {
      if (
        !dashboardHandler(req, res, () => {
          throw new Error('state exploded');
        })
      )
        res.writeHead(418).end();
    });
    await new Promise<void>((r) => broken.listen(0, '127.0.0.1', r));
    const u = `http://127.0.0.1:${(broken.address() as AddressInfo).port}`;
    const r = await fetch(`${u}/dashboard/data.json`);
    expect(r.status).toBe(500);
    expect(await r.text()).toContain('state exploded');
    expect((await fetch(`${u}/other`)).status).toBe(418);
    await new Promise((res) => broken.close(res));
  });
});

describe('live dashboard in headless chromium', () => {
  it('loads, draws non-empty charts after traffic, and saves a screenshot', async () => {
    const profile = await mkdtemp(join(tmpdir(), 'kvroute-chromium-'));
    const context = await chromium.launchPersistentContext(profile, {
      executablePath: await ensureChromium(), // shipped by a dev dependency: test/fixtures/test-binaries.ts
      headless: true,
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
      viewport: { width: 1400, height: 1300 },
    });
    try {
      const page = context.pages()[0] ?? (await context.newPage());
      const problems: string[] = [];
      page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
      page.on('console', (m) => {
        if (m.type() === 'error') problems.push(`console: ${m.text()}`);
      });
      page.on('requestfailed', (r) => problems.push(`requestfailed: ${r.url()}`));

      await page.goto(`${base}/dashboard?interval=200&window=5`);
      await page.waitForFunction(() => ((globalThis as unknown as PageGlobals).__kvrouteDashboard?.polls ?? 0) >= 1, null, {
        timeout: 5_000,
      });
      for (let round = 0; round < 4; round++) {
        await traffic(round);
        await page.waitForTimeout(100);
      }
      await page.waitForFunction(() => (globalThis as unknown as PageGlobals).__kvrouteDashboard!.polls >= 6, null, { timeout: 5_000 });

      await mkdir(ARTIFACTS, { recursive: true });
      await page.screenshot({ path: join(ARTIFACTS, 'dashboard.png'), fullPage: true });
      expect(existsSync(join(ARTIFACTS, 'dashboard.png'))).toBe(true);

      const points = await page.evaluate(() => (globalThis as unknown as PageGlobals).__kvrouteDashboard!.pointsDrawn);
      for (const chart of ['hitrate', 'prefill', 'active', 'cache', 'events', 'overhead', 'rps', 'eventloop']) {
        expect(points[chart], chart).toBeGreaterThan(0);
      }
      // The hit-rate chart really has a line in the first series' colour (#4fc3f7), not just axes.
      const lit = await page.evaluate(() => {
        // Runs in the page (see PageGlobals).
        const c = (globalThis as unknown as PageGlobals).document.getElementById('chart-hitrate');
        const px: Uint8ClampedArray = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < px.length; i += 4) {
          if (Math.abs(px[i] - 0x4f) < 12 && Math.abs(px[i + 1] - 0xc3) < 12 && Math.abs(px[i + 2] - 0xf7) < 12) n++;
        }
        return n;
      });
      expect(lit).toBeGreaterThan(20);

      // The tiles agree with the router's own ledger.
      const v = shell.router.ledger.view();
      // biome-ignore lint/performance/useDomNodeTextContent: Playwright Locator method, asserts the rendered text
      const tiles = await page.locator('#tiles').innerText();
      expect(tiles).toContain(v.predicted.blockWeighted.toFixed(3));
      expect(tiles).toContain(v.predicted.requestWeighted.toFixed(3));
      // The router's event-loop delay, from its own monitor (a finite figure once a window has closed).
      expect(tiles).toMatch(/event-loop lag p99\s+\d+\.\d ms/i);
      expect(v.predicted.blockWeighted - v.predicted.requestWeighted).toBeGreaterThan(0.2); // skewed traffic: the trap
      expect(await page.locator('#workers tbody tr').count()).toBe(3);
      // biome-ignore lint/performance/useDomNodeTextContent: Playwright Locator method, asserts the rendered text
      const legend = await page.locator('#legend-hitrate').innerText();
      expect(legend).toContain('engine hits/queries');

      expect(problems).toEqual([]);
    } finally {
      await context.close();
      await rm(profile, { recursive: true, force: true });
    }
  });
});
