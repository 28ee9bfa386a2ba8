/**
 * Predicted vs delivered reuse on hybrid-attention and multimodal workloads (issue 18): a fleet of mock engines in
 * hybrid mode (src/mocker/engine/hybrid.ts) or taking multimodal prompts, their KV events going through the whole
 * ingest path (vLLM wire encode -> decodeVllmBatch -> SourceAnnotator -> KvRouter.applyEvents), a router routing
 * every request. Per request: predicted = the overlap the router chose (blocks), delivered = the engine's
 * cached_tokens / block size. Printed block-weighted (sums over requests / sum of prompt blocks), with what a router
 * ignoring the groups (full attention only) or the images (text only) would have predicted.
 *
 *   npm run bench:hybrid
 *   npm run bench:hybrid -- --requests 3000 --engines 4 --blocks 1200 --seed 7
 *   options: --workload gpt-oss|mamba|mixed|multimodal|all (default all)  --json  --help
 *
 * Time is virtual (one tick = one engine step on every engine); nothing here is timed.
 */
import { parseArgs } from 'node:util';
import { computeSeqHashes, hashSeed } from '../src/core/hashing.ts';
import { KvIndex } from '../src/core/index/kv-index.ts';
import { createRng, type Rng } from '../src/core/rng.ts';
import { KvRouter } from '../src/core/router.ts';
import type { KvEvent, MmItem } from '../src/core/types.ts';
import { decodeVllmBatch, encodeVllmBatch } from '../src/engines/vllm/events.ts';
import { SourceAnnotator } from '../src/ingest/annotate.ts';
import { MockEngine } from '../src/mocker/engine/index.ts';
import { HYBRID_PRESETS } from '../src/mocker/engine/hybrid.ts';
import { toWireEvents } from '../src/mocker/events.ts';

const { values } = parseArgs({
  options: {
    workload: { type: 'string', default: 'all' },
    requests: { type: 'string', default: '2000' },
    engines: { type: 'string', default: '4' },
    blocks: { type: 'string', default: '1200' },
    seed: { type: 'string', default: '1' },
    json: { type: 'boolean', default: false },
    help: { type: 'boolean', short: 'h', default: false },
  },
});
if (values.help) {
  console.log(`usage: npm run bench:hybrid -- [options]
  --workload NAME   gpt-oss | mamba | mixed (hybrid cache groups) | multimodal | all (default all)
  --requests N      requests per workload (default 2000)
  --engines N       mock engines (default 4)
  --blocks N        KV blocks per engine (default 1200; small, so groups evict)
  --seed N          workload seed (default 1)
  --json            one JSON line per workload`);
  process.exit(0);
}
const REQUESTS = Number(values.requests);
const ENGINES = Number(values.engines);
const BLOCKS = Number(values.blocks);
const SEED = Number(values.seed);
const BS = 16;
const IMAGE_TOKEN = 151655;
const IMAGE_TOKENS = 80;

interface Req {
  id: string;
  tokens: number[];
  mmItems?: MmItem[];
  maxTokens: number;
}

/** Multi-turn conversations over shared system prompts: each turn extends the last prompt (prefix reuse). */
function conversations(rng: Rng, n: number, multimodal: boolean): Req[] {
  const systems = Array.from({ length: 6 }, (_, s) => Array.from({ length: 300 + 120 * s }, (_, i) => 1000 + s * 5000 + i));
  const images = Array.from({ length: 12 }, (_, k) => `sha256:image-${k}`);
  const live: { tokens: number[]; items: MmItem[] }[] = [];
  const out: Req[] = [];
  let next = 0;
  for (let i = 0; i < n; i++) {
    let conv: { tokens: number[]; items: MmItem[] };
    if (live.length < 24 || rng() < 0.25) {
      const sys = systems[Math.floor(rng() * systems.length)];
      conv = { tokens: sys.slice(), items: [] };
      live.push(conv);
      if (live.length > 64) live.shift();
    } else {
      conv = live[Math.floor(rng() * live.length)];
    }
    if (multimodal && rng() < 0.6) {
      // An image: placeholder tokens the processor expanded, then the same question text for every image.
      const id = images[Math.floor(rng() * images.length)];
      conv.items.push({ identifier: id, offset: conv.tokens.length, length: IMAGE_TOKENS });
      for (let t = 0; t < IMAGE_TOKENS; t++) conv.tokens.push(IMAGE_TOKEN);
      for (let t = 0; t < 24; t++) conv.tokens.push(90_000 + t);
    }
    const turn = 40 + Math.floor(rng() * 200);
    for (let t = 0; t < turn; t++) conv.tokens.push(20_000 + Math.floor(rng() * 30_000));
    if (conv.tokens.length > 6000) {
      live.splice(live.indexOf(conv), 1);
      conv.tokens.length = 6000;
      conv.items = conv.items.filter((it) => it.offset + it.length <= 6000);
    }
    out.push({ id: `r${next++}`, tokens: conv.tokens.slice(), mmItems: conv.items.slice(), maxTokens: 8 + Math.floor(rng() * 24) });
    // The next turn carries this answer (the engine's output is not known here: a fixed stand-in keeps the prefix).
    for (let t = 0; t < 16; t++) conv.tokens.push(60_000 + t);
  }
  return out;
}

interface Figures {
  workload: string;
  requests: number;
  promptBlocks: number;
  predicted: number;
  delivered: number;
  difference: number;
  /** What a router indexing full attention only / text only would have predicted for the same routings. */
  naivePredicted: number;
  eventsRejected: number;
  decodeDrops: number;
}

function run(workload: string): Figures {
  const groups = workload === 'multimodal' ? undefined : HYBRID_PRESETS[workload];
  const multimodal = workload === 'multimodal';
  const router = new KvRouter({ blockSize: BS, seed: SEED });
  const naive = new KvIndex({ blockSize: BS });
  const engines = Array.from({ length: ENGINES }, (_, e) => {
    const key = router.addSource({ workerId: `e${e}`, dpRank: 0 });
    naive.addSource(e);
    return {
      key,
      engine: new MockEngine({ blockSize: BS, numGpuBlocks: BLOCKS, maxNumBatchedTokens: 4096, seed: e, cacheGroups: groups }),
      annotator: new SourceAnnotator(BS),
      seq: 0,
    };
  });
  const primary = groups ? groups.findIndex((g) => g.kind === 'full_attention') : 0;
  const reqs = conversations(createRng(SEED), REQUESTS, multimodal);
  const pending = new Map<string, { predicted: number; naive: number; promptBlocks: number }>();
  let predicted = 0;
  let delivered = 0;
  let naivePredicted = 0;
  let promptBlocks = 0;
  let rejected = 0;
  let drops = 0;
  let done = 0;
  let at = 0;
  let now = 0;
  const inFlight = () => pending.size;
  while (done < reqs.length) {
    // Arrivals: keep ~3 requests per engine in flight.
    while (at < reqs.length && inFlight() < 3 * ENGINES) {
      const r = reqs[at++];
      const d = router.route({ requestId: r.id, tokens: r.tokens, mmItems: r.mmItems }, now);
      if (d.kind !== 'routed') throw new Error(`refused: ${d.reason}`);
      const e = engines.findIndex((x) => x.key === d.sourceKey);
      // The naive reading: the full-attention group's (or text-only) prefix, at the engine's cap.
      const textOnly = multimodal ? computeSeqHashes(r.tokens, BS, hashSeed(null, null)) : d.seqHashes;
      const cap = Math.floor((r.tokens.length - 1) / BS);
      const naiveBlocks = Math.min(cap, naive.findMatches(textOnly)[e] ?? 0);
      pending.set(r.id, { predicted: Math.min(d.overlapBlocks, cap), naive: naiveBlocks, promptBlocks: cap });
      engines[e].engine.addRequest({ requestId: r.id, promptTokens: r.tokens, maxTokens: r.maxTokens, mmItems: r.mmItems }, now);
    }
    now += 10;
    for (const x of engines) {
      const step = x.engine.step(now);
      if (step.events.length > 0) {
        // The whole ingest path: wire bytes, decode, per-source annotation, the router.
        const payload = encodeVllmBatch(
          { ts: now / 1000, events: toWireEvents(step.events, 'u64'), dataParallelRank: null },
          { format: 'map', hashType: 'u64' },
        );
        const batch = decodeVllmBatch(payload);
        drops += batch.counts.malformedEvents + batch.counts.badGroupFields + batch.counts.badExtraKeys;
        const events = x.annotator.process(batch);
        const res = router.applyEvents(x.key, events);
        rejected += res.rejected;
        const e = engines.indexOf(x);
        for (const ev of events) if (ev.kind === 'cleared' || (ev.groupIdx ?? 0) === primary) naive.apply(e, stripMm(ev));
      }
      for (const out of step.outputs) {
        if (out.firstToken) router.firstToken(out.requestId, now);
        if (!out.finished) continue;
        const p = pending.get(out.requestId)!;
        pending.delete(out.requestId);
        router.finish(out.requestId, { cachedTokens: out.cachedTokens, outcome: 'ok' }, now);
        predicted += p.predicted;
        naivePredicted += p.naive;
        delivered += Math.floor(out.cachedTokens / BS);
        promptBlocks += p.promptBlocks;
        done++;
      }
    }
  }
  const pr = predicted / promptBlocks;
  const de = delivered / promptBlocks;
  return {
    workload,
    requests: done,
    promptBlocks,
    predicted: pr,
    delivered: de,
    difference: pr - de,
    naivePredicted: naivePredicted / promptBlocks,
    eventsRejected: rejected,
    decodeDrops: drops,
  };
}

/** A text-only index sees the event as a router that ignores images would (no multimodal keys). */
function stripMm(ev: KvEvent): KvEvent {
  if (ev.kind !== 'stored' || !ev.mmKeys) return ev;
  const { mmKeys: _drop, ...rest } = ev;
  return rest;
}

const names = values.workload === 'all' ? ['gpt-oss', 'mamba', 'mixed', 'multimodal'] : [values.workload];
for (const n of names) {
  if (n !== 'multimodal' && !HYBRID_PRESETS[n]) {
    console.error(`unknown workload "${n}"; expected gpt-oss, mamba, mixed, multimodal or all`);
    process.exit(2);
  }
}
if (!values.json) {
  console.log(`${REQUESTS} requests per workload, ${ENGINES} engines x ${BLOCKS} blocks of ${BS} tokens, seed ${SEED}`);
  console.log(
    '| workload | predicted (block-weighted) | delivered | predicted - delivered | within ±0.03 | naive router predicted | events rejected |',
  );
  console.log('|---|---:|---:|---:|---|---:|---:|');
}
let worst = 0;
for (const n of names) {
  const f = run(n);
  worst = Math.max(worst, Math.abs(f.difference));
  if (values.json) console.log(JSON.stringify(f));
  else {
    const naive = n === 'multimodal' ? 'text only' : 'full attention only';
    console.log(
      `| ${n} | ${f.predicted.toFixed(4)} | ${f.delivered.toFixed(4)} | ${f.difference >= 0 ? '+' : ''}${f.difference.toFixed(4)} | ${Math.abs(f.difference) <= 0.03 ? 'yes' : 'NO'} | ${f.naivePredicted.toFixed(4)} (${naive}) | ${f.eventsRejected} |`,
    );
  }
}
if (!values.json) console.log(`largest |predicted - delivered|: ${worst.toFixed(4)}`);
