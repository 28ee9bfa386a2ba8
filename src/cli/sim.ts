/**
 * `kvroute sim`: replays a trace through N engine models behind the real router on a virtual clock, for several
 * policies side by side, and prints reuse (three kinds, both aggregations), TTFT, throughput and load balance.
 */
import { existsSync, writeFileSync } from 'node:fs';
import type { Command } from 'commander';
import cliProgress from 'cli-progress';
import { intArg, numberArg, numberListArg, splitList, UsageError } from '../config/parsers.ts';
import { type EngineCacheGroup, parseCacheGroups } from '../mocker/engine/hybrid.ts';
import { ADMISSION_SETTINGS, addServeOptions, serveSettingsFrom } from '../config/serve.ts';
import { POLICY_NAMES } from '../core/scheduling/policies.ts';
import { DEFAULTS } from '../config/serve.ts';
import { DEFAULT_TRANSFER, type FleetOptions, type FleetResult, runFleet, SIM_DISPATCH_DEFAULTS } from '../sim/fleet.ts';
import { formatPdTable } from '../sim/pd-report.ts';
import { computeOracle } from '../sim/oracle.ts';
import { buildReport, formatReport, renderSvg } from '../sim/report.ts';
import { type Scenario, scenario, SCENARIOS } from '../sim/scenarios.ts';
import { TraceHasher } from '../sim/traces/expand.ts';
import type { TraceRequest } from '../sim/traces/format.ts';
import { loadTrace } from '../sim/traces/reader.ts';
import { generateFromSpec, isTraceSpec } from '../sim/traces/spec.ts';
import { traceStats } from '../sim/traces/stats.ts';

/** Default KV capacity per worker, in tokens: 8,192 blocks of 512 (the README's reference fleets). */
export const DEFAULT_CAPACITY_TOKENS = 8192 * 512;

interface SimCliOptions {
  hybrid?: readonly EngineCacheGroup[];
  trace?: string;
  scenario?: string;
  limit?: number;
  workers?: number;
  policy?: string;
  blockSize?: number;
  gpuBlocks?: number;
  rateScale: number[];
  eventDelayMs: number;
  overlay: boolean;
  prefillLoadScale?: number;
  overlapCredit?: number;
  temperature?: number;
  overlayGraceMs?: number;
  seed: number;
  engineFailures?: number;
  queueOrders?: string;
  excludeTenant?: string[];
  prefillWorkers?: number;
  decodeWorkers?: number;
  disaggMinUncachedTokens?: number[];
  decodeOverlapCredit?: number;
  kvTransferBandwidth: number;
  kvBytesPerToken: number;
  json?: string;
  plot?: string;
  progress: boolean;
}

const KNOWN_POLICIES: readonly string[] = POLICY_NAMES;

export function parsePolicies(text: string): string[] | string {
  const names = splitList(text, /\s*,\s*/);
  for (const n of names) {
    if (!KNOWN_POLICIES.includes(n)) return `unknown policy "${n}"; known: ${KNOWN_POLICIES.join(', ')}`;
  }
  return names.length > 0 ? names : '--policy needs at least one name';
}

function fail(message: string, code = 2): void {
  process.stderr.write(`kvroute sim: ${message}\n`);
  process.exitCode = code;
}

/** The admission settings `kvroute sim` shares with `kvroute serve`: same flags, ranges, defaults (src/config/serve.ts). */
const SIM_ADMISSION = [
  ...ADMISSION_SETTINGS,
  'breakerThreshold',
  'breakerCooldownMs',
  'bands',
  'tenantWeights',
  'tenantTokenBudgets',
  'prefillTokensPerSecond',
  'sessionTtlMs',
  'sessionLoadFactor',
  'selection',
] as const;

export function registerSim(program: Command): void {
  const sim = program
    .command('sim')
    .summary('replay a trace through simulated engines behind the real router and compare routing policies')
    .description(
      'Discrete-event fleet simulation on a virtual clock (no sleeps): each request of the trace is routed by the real ' +
        'KvRouter to one of N engine models (the mock engine: paged prefix cache with LRU eviction, continuous batching, ' +
        'step timing); KV events flow back to the router after --event-delay-ms, first-token and finish hooks fire at ' +
        'their simulated times. Per policy: predicted hit (request- and block-weighted), available hit, engine-delivered ' +
        'hit (token-weighted, engine counters), TTFT p50/p90/p99 overall and by prompt length, throughput, prefill-load ' +
        'imbalance (max/mean), preemptions; plus the oracle (infinite shared cache) on the same trace. Requests go ' +
        'through the same core dispatcher as `kvroute serve` (busy thresholds, queue, retries, breakers, with the ' +
        'same setting names): the report counts requests served, queued, refused (by reason) and retried.',
    )
    .option(
      '--trace <file>',
      'Mooncake-format JSONL trace (see `kvroute trace gen`), or a generated one by name: KIND[:key=value,...], e.g. agentic or agentic:requests=5000 (drawn with --seed)',
    )
    .option(
      '--scenario <name>',
      `a built-in scenario instead of --trace: ${SCENARIOS.join(', ')} (seed: the 0.32-vs-0.77 case); with --workers its arrival rate scales with the fleet`,
    )
    .option('--limit <n>', 'replay only the first N requests', intArg('--limit', { min: 1 }))
    .option('--workers <n>', 'engines in the fleet (default 8; scenario: its own)', intArg('--workers', { min: 1 }))
    .option('--policy <list>', `comma-separated policies: ${KNOWN_POLICIES.join(', ')} (default kv-pressure,kv,round-robin)`)
    .option(
      '--block-size <n>',
      'router and engine block size in tokens; must divide 512 for trace fidelity (default 16)',
      intArg('--block-size', { min: 1 }),
    )
    .option(
      '--gpu-blocks <n>',
      `KV blocks per engine (default ${DEFAULT_CAPACITY_TOKENS.toLocaleString('en-US')} tokens' worth)`,
      intArg('--gpu-blocks', { min: 1 }),
    )
    .option(
      '--rate-scale <list>',
      'arrival-rate multipliers, comma-separated: 2 = twice the trace load',
      numberListArg('--rate-scale', { min: 0, minExclusive: true }),
      [1],
    )
    .option(
      '--event-delay-ms <ms>',
      'delay from an engine step to the router applying its KV events',
      numberArg('--event-delay-ms', { min: 0 }),
      5,
    )
    .option('--no-overlay', "disable the router's predicted overlay (in-flight siblings credited before their KV events)")
    .option(
      '--overlay-grace-ms <ms>',
      'how long a finished request still counts in the overlay',
      numberArg('--overlay-grace-ms', { min: 0 }),
    )
    .option(
      '--prefill-load-scale <x>',
      'kv knob: weight of prefill load against decode load (default 1)',
      numberArg('--prefill-load-scale', { min: 0 }),
    )
    .option(
      '--overlap-credit <x>',
      'kv knob: prefill blocks saved per overlapping block (default 1)',
      numberArg('--overlap-credit', { min: 0 }),
    )
    .option(
      '--temperature <t>',
      'kv knob: 0 picks the minimum cost, > 0 samples a softmax (default 0)',
      numberArg('--temperature', { min: 0 }),
    )
    .option('--seed <n>', 'seed for the router and the engines (and the scenario generator)', intArg('--seed', { min: 0 }), 1)
    .option(
      '--engine-failures <fraction>',
      'fraction of attempts that fail before the engine answers (as a 500), seeded (default 0)',
      numberArg('--engine-failures', { min: 0 }),
    )
    .option(
      '--exclude-tenant <name>',
      "drop this tenant's requests from the trace (repeatable): the others on a quieter fleet",
      (v: string, prev: string[] = []) => [...prev, v],
    )
    .option(
      '--queue-orders <list>',
      'queue orders to compare, comma-separated: fair (bands, fair queuing across tenants) and/or fifo (default fair; scenario: its own)',
    )
    .option(
      '--prefill-workers <n>',
      'disaggregated prefill/decode: prefill workers (with --decode-workers; replaces --workers)',
      intArg('--prefill-workers', { min: 0 }),
    )
    .option('--decode-workers <n>', 'disaggregated prefill/decode: decode workers', intArg('--decode-workers', { min: 1 }))
    .option(
      '--disagg-min-uncached-tokens <list>',
      "P/D: conditional disaggregation thresholds to compare, comma-separated (as serve's setting; default 1024)",
      numberListArg('--disagg-min-uncached-tokens', { min: 0 }),
    )
    .option(
      '--decode-overlap-credit <x>',
      "P/D: the decode leg's overlap credit (as serve's setting; default 0)",
      numberArg('--decode-overlap-credit', { min: 0 }),
    )
    .option(
      '--kv-transfer-bandwidth <bytes/s>',
      'P/D: KV transfer bandwidth between a prefill and a decode worker',
      numberArg('--kv-transfer-bandwidth', { min: 1 }),
      DEFAULT_TRANSFER.bytesPerS,
    )
    .option(
      '--kv-bytes-per-token <n>',
      'P/D: KV bytes per token moved',
      numberArg('--kv-bytes-per-token', { min: 1 }),
      DEFAULT_TRANSFER.bytesPerToken,
    )
    .option('--json <file>', 'write the full results as JSON')
    .option('--plot <file>', 'write an SVG chart of hit rates and TTFT per policy')
    .option('--no-progress', 'no progress bar on stderr')
    .option(
      '--hybrid <layout>',
      'hybrid-attention engines (docs/engines.md, cache groups): a preset (gpt-oss, mamba, mixed) or groups in order, e.g. full,sliding:128,mamba',
      (text: string) => {
        try {
          return parseCacheGroups(text);
        } catch (err) {
          throw new UsageError(`--hybrid: ${(err as Error).message}`);
        }
      },
    );
  addServeOptions(sim, SIM_ADMISSION, true);
  sim
    .addHelpText(
      'after',
      '\nExamples:\n' +
        '  kvroute sim --trace data/traces/mooncake_conversation_trace.jsonl.gz --workers 8 --block-size 512 --gpu-blocks 8192 \\\n' +
        '      --policy kv,round-robin,random,least-loaded,prefix-hash --json out.json --plot out.svg\n' +
        '  kvroute sim --trace t.jsonl --policy kv,round-robin --rate-scale 0.5,1,2,4\n' +
        '  kvroute sim --scenario seed\n' +
        '  kvroute sim --scenario noisy-neighbour                       # FIFO vs fair queuing, per-tenant TTFT, fairness\n' +
        '  kvroute sim --scenario noisy-neighbour --exclude-tenant noisy  # the same tenants without the flood',
    )
    .action(async (o: SimCliOptions, cmd: Command) => {
      const given = (key: string) => cmd.getOptionValueSource(key) === 'cli';
      let admission: ReturnType<typeof serveSettingsFrom<(typeof SIM_ADMISSION)[number]>>;
      try {
        // Flags only: KVROUTE_* variables configure the router, not a simulation.
        admission = serveSettingsFrom(cmd, SIM_ADMISSION, { env: {} });
      } catch (err) {
        return fail((err as Error).message);
      }
      if (!o.trace === !o.scenario) return fail('give exactly one of --trace FILE or --scenario NAME');
      const rates = o.rateScale;
      let requests: TraceRequest[];
      let source: string;
      let base: Omit<FleetOptions, 'policy' | 'onProgress'>;
      let policies: string[] = ['kv-pressure', 'kv', 'round-robin'];
      let scenarioOrders: ReadonlyArray<'fair' | 'fifo'> | undefined;
      const chosen = o.policy === undefined ? undefined : parsePolicies(o.policy);
      if (typeof chosen === 'string') return fail(chosen);
      if (o.scenario) {
        let sc: Scenario;
        try {
          sc = scenario(o.scenario, o.seed, undefined, { workers: o.workers });
        } catch (err) {
          return fail((err as Error).message);
        }
        requests = sc.requests;
        source = `scenario ${sc.name} (${sc.description})`;
        base = sc.fleet;
        policies = sc.policies;
        scenarioOrders = sc.queueOrders;
      } else if (isTraceSpec(o.trace!) && !existsSync(o.trace!)) {
        // A generated trace by name (src/sim/traces/spec.ts): drawn with --seed unless the name sets its own.
        try {
          requests = generateFromSpec(o.trace!, o.seed);
        } catch (err) {
          return fail((err as Error).message);
        }
        source = `generated ${o.trace}`;
        const bs = o.blockSize ?? 16;
        base = { workers: 8, blockSize: bs, gpuBlocks: Math.max(1, Math.floor(DEFAULT_CAPACITY_TOKENS / bs)), seed: o.seed };
      } else {
        try {
          const loaded = await loadTrace(o.trace!, { limit: o.limit });
          requests = loaded.requests;
          if (loaded.stats.badLines > 0) {
            process.stderr.write(
              `kvroute sim: skipped ${loaded.stats.badLines} bad lines of ${o.trace}: ${[...loaded.stats.bad].map(([k, v]) => `${k} ${v}`).join(', ')}\n`,
            );
          }
        } catch (err) {
          return fail(`cannot read trace ${o.trace}: ${(err as Error).message}`, 1);
        }
        source = o.trace!;
        const bs = o.blockSize ?? 16;
        base = { workers: 8, blockSize: bs, gpuBlocks: Math.max(1, Math.floor(DEFAULT_CAPACITY_TOKENS / bs)), seed: o.seed };
      }
      if (chosen) policies = chosen;
      if (o.excludeTenant) requests = requests.filter((r) => !o.excludeTenant!.includes(r.tenant ?? 'default'));
      if (o.limit !== undefined) requests = requests.slice(0, o.limit);
      if (requests.length === 0) return fail('the trace has no valid requests', 1);
      const blockSize = o.blockSize ?? base.blockSize;
      const fleet: Omit<FleetOptions, 'policy' | 'onProgress'> = {
        ...base,
        workers: o.workers ?? base.workers,
        blockSize,
        gpuBlocks:
          o.gpuBlocks ??
          (o.blockSize !== undefined && o.scenario === undefined ? Math.floor(DEFAULT_CAPACITY_TOKENS / blockSize) : base.gpuBlocks),
        eventDelayMs: o.eventDelayMs,
        seed: o.seed,
        ...(o.hybrid && { engine: { ...(base.engine ?? {}), cacheGroups: o.hybrid } }),
        router: {
          ...(base.router ?? {}),
          overlay: o.overlay,
          knobs: {
            ...(base.router?.knobs ?? {}),
            ...(o.prefillLoadScale !== undefined && { prefillLoadScale: o.prefillLoadScale }),
            ...(o.overlapCredit !== undefined && { overlapCredit: o.overlapCredit }),
            ...(o.temperature !== undefined && { temperature: o.temperature }),
          },
          ...(o.overlayGraceMs !== undefined && { overlayGraceMs: o.overlayGraceMs }),
          selection: admission.selection,
          ...((admission.busyPrefillTokens !== undefined || admission.busyKvFraction !== undefined) && {
            busy: { activePrefillTokens: admission.busyPrefillTokens, activeBlockFraction: admission.busyKvFraction },
          }),
        },
        // A scenario's own admission, then the flags given on the command line.
        dispatch: {
          ...SIM_DISPATCH_DEFAULTS,
          ...(base.dispatch ?? {}),
          ...(given('queueLimit') && { queueLimit: admission.queueLimit }),
          ...(given('queueTimeoutMs') && { queueTimeoutMs: admission.queueTimeoutMs }),
          ...(given('retries') && { retries: admission.retries }),
          breaker: {
            threshold: given('breakerThreshold')
              ? admission.breakerThreshold
              : (base.dispatch?.breaker?.threshold ?? SIM_DISPATCH_DEFAULTS.breaker.threshold),
            cooldownMs: given('breakerCooldownMs')
              ? admission.breakerCooldownMs
              : (base.dispatch?.breaker?.cooldownMs ?? SIM_DISPATCH_DEFAULTS.breaker.cooldownMs),
          },
          flow: {
            ...(base.dispatch?.flow ?? {}),
            ...(admission.bands.length > 0 && { bands: admission.bands }),
            weights: admission.tenantWeights,
          },
          tokenBudgets: admission.tenantTokenBudgets,
          prefillTokensPerSecond: admission.prefillTokensPerSecond,
          sessions: { ttlMs: admission.sessionTtlMs, loadFactor: admission.sessionLoadFactor },
        },
        engineFailures: o.engineFailures,
        ...(o.prefillWorkers !== undefined || o.decodeWorkers !== undefined
          ? {
              prefillWorkers: o.prefillWorkers ?? 0,
              decodeWorkers: o.decodeWorkers ?? 1,
              transfer: { bytesPerS: o.kvTransferBandwidth, bytesPerToken: o.kvBytesPerToken },
            }
          : {}),
      };
      const withCredit: typeof fleet =
        o.decodeOverlapCredit === undefined
          ? fleet
          : { ...fleet, router: { ...fleet.router, knobs: { ...fleet.router?.knobs, decodeOverlapCredit: o.decodeOverlapCredit } } };
      const thresholds = o.disaggMinUncachedTokens ?? [DEFAULTS.disaggMinUncachedTokens];
      if (o.engineFailures !== undefined && o.engineFailures >= 1) return fail('--engine-failures must be below 1');
      if (512 % blockSize !== 0) {
        process.stderr.write(`kvroute sim: note: block size ${blockSize} does not divide 512; trace blocks straddle router blocks\n`);
      }

      const orderList = o.queueOrders ? splitList(o.queueOrders) : [...(scenarioOrders ?? ['fair'])];
      for (const q of orderList) if (q !== 'fair' && q !== 'fifo') return fail(`--queue-orders values must be fair or fifo, got "${q}"`);
      const queueOrders = orderList as Array<'fair' | 'fifo'>;
      const runs = policies.length * rates.length * queueOrders.length * thresholds.length;
      const bar =
        o.progress && process.stderr.isTTY
          ? new cliProgress.SingleBar(
              {
                format: 'sim [{bar}] {percentage}% | {run} | {value}/{total} requests | {duration_formatted}',
                stream: process.stderr,
                hideCursor: true,
              },
              cliProgress.Presets.shades_classic,
            )
          : null;
      bar?.start(requests.length * runs, 0, { run: '' });
      const hasher = new TraceHasher(blockSize);
      const results: FleetResult[] = [];
      let done = 0;
      for (const policy of policies) {
        for (const order of queueOrders) {
          for (const rateScale of rates) {
            for (const minUncached of thresholds) {
              const label = `${policy}${queueOrders.length > 1 ? ` ${order}` : ''} x${rateScale}${fleet.decodeWorkers ? ` N=${minUncached}` : ''}`;
              const r = runFleet(requests, {
                ...withCredit,
                dispatch: {
                  ...SIM_DISPATCH_DEFAULTS,
                  ...fleet.dispatch,
                  flow: { ...fleet.dispatch?.flow, order },
                  pd: { minUncachedTokens: minUncached },
                },
                policy,
                rateScale,
                hasher,
                onProgress: bar ? (k) => bar.update(done + k, { run: label }) : undefined,
              });
              done += requests.length;
              bar?.update(done, { run: label });
              results.push(r);
            }
          }
        }
      }
      bar?.stop();
      const stats = traceStats(requests);
      const report = buildReport(
        { ...stats, source },
        {
          workers: fleet.decodeWorkers !== undefined ? (fleet.prefillWorkers ?? 0) + fleet.decodeWorkers : fleet.workers,
          block_size: blockSize,
          gpu_blocks: fleet.gpuBlocks,
          event_delay_ms: fleet.eventDelayMs ?? 5,
          seed: o.seed,
        },
        computeOracle(requests),
        results,
      );
      process.stdout.write(`${formatReport(report)}\n`);
      process.stdout.write(`${formatPdTable(results)}\n`);
      if (o.scenario === 'seed') process.stdout.write(`${seedVerdict(results[0])}\n`);
      try {
        if (o.json) writeFileSync(o.json, `${JSON.stringify(report, null, 2)}\n`);
        if (o.plot) writeFileSync(o.plot, renderSvg(report));
      } catch (err) {
        return fail(`cannot write output: ${(err as Error).message}`, 1);
      }
    });
}

/** The one-paragraph reading of the seed scenario: the trap, reproduced. */
export function seedVerdict(r: FleetResult): string {
  const h = r.hit;
  return (
    `\nThe router's per-request view (a histogram's _sum/_count) reads ${h.predicted_request_weighted.toFixed(3)}, ` +
    `while its block-weighted view reads ${h.predicted_block_weighted.toFixed(3)} and the engines' counters deliver ` +
    `${h.engine_token_weighted.toFixed(3)} (gap ${(h.predicted_block_weighted - h.engine_token_weighted).toFixed(3)}): the router is accurate; ` +
    'the mean of ratios is pulled down by many short cold requests (production: 0.320 vs 0.790 router block-weighted vs 0.767 engine).'
  );
}
