/**
 * Calibration: kvroute's simulator (src/sim/run-fleet.ts: the real router and dispatcher, mock engines) against figures
 * that peers published from their own simulators or clusters on the Mooncake FAST'25 traces. docs/calibration.md
 * states each setup, the differences and the results.
 *
 *   npm run bench:calibration -- --experiment mooncake-lru
 *   npm run bench:calibration -- --experiment mooncake-local
 *   npm run bench:calibration -- --experiment dynamo --trace /path/to/toolagent_trace.jsonl
 *   npm run bench:calibration -- --experiment dynamo --trace agentic --concurrency 64   # a generated stand-in
 *
 * Experiments:
 *   dynamo          Dynamo's digital-twin KV-router experiment (ai-dynamo/dynamo @4ae0540f,
 *                   docs/blogs/digital-twin-simulation/scripts/kv_router_exp/{README.md,data.csv}): the full Mooncake
 *                   tool&agent trace, 8 workers, closed-loop concurrency 64/128/256/512, round-robin against the KV
 *                   router; engine prefix reuse (Σ reused tokens / Σ input tokens). The trace is not shipped (see
 *                   docs/calibration.md for where to get it); a generated trace name (`agentic`) runs the same setup
 *                   on a stand-in, which is not a reproduction.
 *   mooncake-lru    Mooncake FAST'25 paper, Fig. 9: hit rate of one LRU prefix cache against its capacity, requests in
 *                   sequence (one engine, one request in flight), on the committed conversation and synthetic traces.
 *   mooncake-local  Mooncake FAST'25 paper, Fig. 10 "local cache": 10 prefill nodes of 3M tokens each, a scheduler that
 *                   prefers the node with the longer prefix match, outputs of 1 token, replay at the trace's timestamps.
 *
 * Hit rates are the engines' own counters, token-weighted (what Dynamo and Mooncake report); nothing here is timed
 * except the simulator's CPU cost, printed with the load average.
 */
import { usage } from '../scripts/usage.ts';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { POLICY_NAMES } from '../src/core/scheduling/registry.ts';
import { type FleetOptions, type FleetResult, runFleet } from '../src/sim/run-fleet.ts';
import { computeOracle } from '../src/sim/oracle.ts';
import { TraceHasher } from '../src/sim/traces/expand.ts';
import type { TraceRequest } from '../src/sim/traces/format.ts';
import { loadTrace } from '../src/sim/traces/reader.ts';
import { generateFromSpec, isTraceSpec } from '../src/sim/traces/spec.ts';

usage(import.meta.url);

const EXPERIMENTS = ['dynamo', 'mooncake-lru', 'mooncake-local'] as const;
type Experiment = (typeof EXPERIMENTS)[number];

const { values } = parseArgs({
  options: {
    experiment: { type: 'string', default: 'mooncake-lru' },
    trace: { type: 'string' },
    concurrency: { type: 'string' },
    policies: { type: 'string' },
    'capacity-tokens': { type: 'string' },
    'block-size': { type: 'string' },
    limit: { type: 'string' },
    seed: { type: 'string', default: '1' },
    json: { type: 'string' },
    help: { type: 'boolean', short: 'h', default: false },
  },
});

if (values.help) {
  console.log(`usage: npm run bench:calibration -- [options]
  --experiment NAME      ${EXPERIMENTS.join(' | ')} (default mooncake-lru)
  --trace FILE|NAME      dynamo: Mooncake's toolagent_trace.jsonl (required), or a generated stand-in such as agentic;
                         mooncake-*: one trace instead of the committed conversation and synthetic ones
  --concurrency LIST     dynamo: closed-loop concurrencies (default 64,128,256,512, as published)
  --policies LIST        dynamo, mooncake-local: kvroute policies (default round-robin,kv and dynamo when it exists)
  --capacity-tokens N    dynamo: KV per worker in tokens (default 1048576 = Dynamo replay's fallback 16,384 x 64)
  --block-size N         engine and router block size (default: dynamo 64, mooncake-* 512)
  --limit N              replay only the first N requests (quick looks; published figures use whole traces)
  --seed N               router tie-break and generated-trace seed (default 1)
  --json FILE            write every row as JSON`);
  process.exit(0);
}

function fail(message: string): never {
  process.stderr.write(`bench:calibration: ${message}\n`);
  process.exit(2);
}

function positiveInt(name: string, text: string | undefined, fallback: number): number {
  if (text === undefined) return fallback;
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) fail(`--${name} must be a positive integer, got "${text}"`);
  return n;
}

const experiment = values.experiment as Experiment;
if (!EXPERIMENTS.includes(experiment)) fail(`unknown experiment "${values.experiment}"; known: ${EXPERIMENTS.join(', ')}`);
const seed = positiveInt('seed', values.seed, 1);
const limit = values.limit === undefined ? undefined : positiveInt('limit', values.limit, 1);
// The strict Dynamo policy joins by itself once the pipeline has it (issue 26).
const defaultPolicies = ['round-robin', 'kv', ...((POLICY_NAMES as readonly string[]).includes('dynamo') ? ['dynamo'] : [])];
const policies = values.policies ? values.policies.split(',').map((p) => p.trim()) : defaultPolicies;
for (const p of policies) {
  if (!(POLICY_NAMES as readonly string[]).includes(p)) fail(`unknown policy "${p}"; known: ${POLICY_NAMES.join(', ')}`);
}

const DATA = join(import.meta.dirname, '../data/traces');

async function readTrace(path: string): Promise<TraceRequest[]> {
  let requests: TraceRequest[];
  if (isTraceSpec(path)) {
    requests = generateFromSpec(path, seed);
  } else {
    try {
      const loaded = await loadTrace(path);
      requests = loaded.requests;
      if (loaded.stats.badLines > 0) process.stderr.write(`skipped ${loaded.stats.badLines} bad lines of ${path}\n`);
    } catch (err) {
      fail(`cannot read trace ${path}: ${(err as Error).message}`);
    }
  }
  // Peers' routers see no session ids (Mooncake's traces have none): kvroute's session affinity stays out of it.
  const out = requests.map(({ sessionId: _s, ...r }) => r);
  return limit === undefined ? out : out.slice(0, limit);
}

interface Row {
  readonly experiment: Experiment;
  readonly trace: string;
  readonly setup: string;
  readonly policy: string;
  /** Engine prefix reuse, token-weighted (Σ cached / Σ prompt tokens over the engines' counters). */
  readonly reuse: number;
  /** The published figure for the same setup, when there is one. */
  readonly published?: number;
  readonly ttft_p50_ms: number;
  readonly cpu_s: number;
  readonly load_avg_1m: number;
}

const rows: Row[] = [];
const f3 = (x: number | undefined) => (x === undefined || Number.isNaN(x) ? '-' : x.toFixed(3));

function record(row: Row): void {
  rows.push(row);
  const vs =
    row.published === undefined
      ? ''
      : `  published ${f3(row.published)}  (kvroute ${row.reuse >= row.published ? '+' : ''}${(row.reuse - row.published).toFixed(3)})`;
  console.log(
    `${row.trace.padEnd(14)} ${row.setup.padEnd(24)} ${row.policy.padEnd(12)} reuse ${f3(row.reuse)}${vs}   [cpu ${row.cpu_s.toFixed(1)} s, load ${row.load_avg_1m.toFixed(1)}]`,
  );
}

function run(requests: readonly TraceRequest[], opts: FleetOptions): FleetResult {
  return runFleet(requests, opts);
}

/**
 * Dynamo's published data.csv (@4ae0540f), prefix_cache_reused_ratio by router mode and concurrency.
 * kv_router rows are compared with kvroute's `kv` (and `dynamo`), round_robin rows with `round-robin`.
 */
const DYNAMO_PUBLISHED: Record<string, Record<number, number>> = {
  round_robin: { 64: 0.37836, 128: 0.37934, 256: 0.37915, 512: 0.37847 },
  kv_router: { 64: 0.44118, 128: 0.44022, 256: 0.44454, 512: 0.45128 },
};

async function dynamo(): Promise<void> {
  if (!values.trace) {
    fail(
      "--experiment dynamo needs --trace: Mooncake's FAST25-release/traces/toolagent_trace.jsonl (not shipped; docs/calibration.md says where to get it), or a generated stand-in such as agentic",
    );
  }
  const trace = values.trace;
  const requests = await readTrace(trace);
  const standIn = isTraceSpec(trace);
  const bs = positiveInt('block-size', values['block-size'], 64);
  const capacity = positiveInt('capacity-tokens', values['capacity-tokens'], 16_384 * 64);
  const levels = values.concurrency
    ? values.concurrency.split(',').map((c) => positiveInt('concurrency', c.trim(), 1))
    : [64, 128, 256, 512];
  const oracle = computeOracle(requests);
  console.log(
    `dynamo kv_router_exp: ${requests.length} requests of ${standIn ? `generated ${trace} (a stand-in: published figures do not apply)` : trace}; oracle block-weighted ${f3(oracle.blockWeighted)}; 8 workers x ${capacity.toLocaleString('en-US')} tokens, block ${bs}, max_num_batched_tokens 2048, closed loop`,
  );
  const hasher = new TraceHasher(bs);
  for (const c of levels) {
    for (const policy of policies) {
      const cpu0 = process.cpuUsage();
      const r = run(requests, {
        workers: 8,
        policy,
        blockSize: bs,
        gpuBlocks: Math.floor(capacity / bs),
        seed,
        concurrency: c,
        hasher,
        engine: { maxNumBatchedTokens: 2048 },
        // A closed loop of C never queues more than C: admission as in Dynamo's replay (no busy thresholds, no queue cap).
        dispatch: { queueLimit: 100_000, queueTimeoutMs: 1e12 },
      });
      const mode = policy === 'round-robin' ? 'round_robin' : policy === 'kv' || policy === 'dynamo' ? 'kv_router' : undefined;
      const cpu = process.cpuUsage(cpu0);
      record({
        experiment: 'dynamo',
        trace: standIn ? trace : 'toolagent',
        setup: `C=${c}`,
        policy,
        reuse: r.hit.engine_token_weighted,
        ...(!standIn && mode ? { published: DYNAMO_PUBLISHED[mode][c] } : {}),
        ttft_p50_ms: r.ttft_ms.p50,
        cpu_s: (cpu.user + cpu.system) / 1e6,
        load_avg_1m: loadavg()[0],
      });
    }
  }
}

/**
 * Mooncake FAST'25 Fig. 9, read off the published figure: the hit rate at 3M tokens as a fraction of each trace's
 * maximum (the figure's annotations, exact) and the maxima (the curves' plateaus, read to ±0.01).
 */
const MOONCAKE_FIG9 = {
  conversation: { max: 0.4, fractionAt3M: 0.41 },
  synthetic: { max: 0.66, fractionAt3M: 0.46 },
  toolagent: { max: 0.6, fractionAt3M: 0.75 },
} as const;

/** Mooncake FAST'25 Fig. 10, local cache: global-cache bars read to ±1 point, divided by the printed ratios. */
const MOONCAKE_FIG10_LOCAL = { conversation: 0.38 / 2.22, toolagent: 0.58 / 1.38, synthetic: 0.62 / 2.36 } as const;

async function mooncakeTraces(): Promise<Array<{ name: keyof typeof MOONCAKE_FIG9 | string; requests: TraceRequest[] }>> {
  if (values.trace) {
    const base = values.trace.split('/').pop() ?? values.trace;
    const name = /toolagent/.test(base)
      ? 'toolagent'
      : /conversation/.test(base)
        ? 'conversation'
        : /synthetic/.test(base)
          ? 'synthetic'
          : base;
    return [{ name, requests: await readTrace(values.trace) }];
  }
  return [
    { name: 'conversation', requests: await readTrace(join(DATA, 'mooncake_conversation_trace.jsonl.gz')) },
    { name: 'synthetic', requests: await readTrace(join(DATA, 'mooncake_synthetic_trace.jsonl.gz')) },
  ];
}

/** Every request's output cut to one token: the paper's cache experiments isolate the prefill stage. */
const oneToken = (rs: readonly TraceRequest[]) => rs.map((r) => ({ ...r, outputLength: 1 }));

async function mooncakeLru(): Promise<void> {
  const bs = positiveInt('block-size', values['block-size'], 512);
  // From 3e5 up: below that the longest prompts (191k tokens) cannot fit in the engine at all.
  const capacities = [3e5, 1e6, 3e6, 1e7, 3e7, 1e8];
  for (const { name, requests } of await mooncakeTraces()) {
    const rs = oneToken(requests);
    const oracle = computeOracle(rs);
    const pub = MOONCAKE_FIG9[name as keyof typeof MOONCAKE_FIG9];
    console.log(
      `\nmooncake-lru ${name}: ${rs.length} requests; one engine, one request in flight, block ${bs}; oracle ${f3(oracle.blockWeighted)}`,
    );
    const hasher = new TraceHasher(bs);
    const byCapacity = new Map<number, number>();
    for (const cap of capacities) {
      const cpu0 = process.cpuUsage();
      const r = run(rs, {
        workers: 1,
        policy: 'round-robin',
        blockSize: bs,
        gpuBlocks: Math.max(1, Math.floor(cap / bs)),
        seed,
        concurrency: 1,
        hasher,
        // Whole prompts in one step: the timing is irrelevant here, the step count is the simulator's cost.
        engine: { maxNumBatchedTokens: 1 << 20, maxNumSeqs: 1 },
      });
      const cpu = process.cpuUsage(cpu0);
      byCapacity.set(cap, r.hit.engine_token_weighted);
      record({
        experiment: 'mooncake-lru',
        trace: name,
        setup: `LRU ${cap.toExponential(0)} tokens`,
        policy: '-',
        reuse: r.hit.engine_token_weighted,
        ...(pub && cap === 3e6 ? { published: pub.max * pub.fractionAt3M } : {}),
        ttft_p50_ms: r.ttft_ms.p50,
        cpu_s: (cpu.user + cpu.system) / 1e6,
        load_avg_1m: loadavg()[0],
      });
    }
    const max = byCapacity.get(1e8)!;
    const at3M = byCapacity.get(3e6)!;
    console.log(
      `  at 3M tokens: ${(100 * (at3M / max)).toFixed(0)}% of kvroute's maximum (1e8 tokens: ${f3(max)})${pub ? `; published ${(100 * pub.fractionAt3M).toFixed(0)}% of ${pub.max.toFixed(2)}` : ''}`,
    );
  }
}

async function mooncakeLocal(): Promise<void> {
  const bs = positiveInt('block-size', values['block-size'], 512);
  for (const { name, requests } of await mooncakeTraces()) {
    const rs = oneToken(requests);
    const pub = MOONCAKE_FIG10_LOCAL[name as keyof typeof MOONCAKE_FIG10_LOCAL];
    console.log(
      `\nmooncake-local ${name}: ${rs.length} requests at their timestamps; 10 nodes x 3M tokens, block ${bs}, outputs of 1 token`,
    );
    const hasher = new TraceHasher(bs);
    for (const policy of policies) {
      const cpu0 = process.cpuUsage();
      const r = run(rs, {
        workers: 10,
        policy,
        blockSize: bs,
        gpuBlocks: Math.floor(3e6 / bs),
        seed,
        hasher,
        dispatch: { queueLimit: 100_000, queueTimeoutMs: 1e12 },
      });
      const cpu = process.cpuUsage(cpu0);
      record({
        experiment: 'mooncake-local',
        trace: name,
        setup: '10 x 3M tokens',
        policy,
        reuse: r.hit.engine_token_weighted,
        ...(pub !== undefined && policy !== 'round-robin' && policy !== 'random' ? { published: pub } : {}),
        ttft_p50_ms: r.ttft_ms.p50,
        cpu_s: (cpu.user + cpu.system) / 1e6,
        load_avg_1m: loadavg()[0],
      });
    }
  }
}

console.log(
  `load average (1/5/15 min) at start: ${loadavg()
    .map((x) => x.toFixed(2))
    .join(' / ')}`,
);
if (experiment === 'dynamo') await dynamo();
else if (experiment === 'mooncake-lru') await mooncakeLru();
else await mooncakeLocal();
console.log(
  `load average (1/5/15 min) at end: ${loadavg()
    .map((x) => x.toFixed(2))
    .join(' / ')}`,
);
if (values.json) {
  const { writeFileSync } = await import('node:fs');
  writeFileSync(values.json, `${JSON.stringify(rows, null, 2)}\n`);
}
