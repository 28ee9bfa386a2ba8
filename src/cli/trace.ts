/** `kvroute trace gen|stats`: synthetic traces in the Mooncake JSONL format, and the shape of any trace. */
import { createWriteStream } from 'node:fs';
import type { Command } from 'commander';
import { choiceArg, intArg, numberArg } from '../config/parsers.ts';
import { formatTraceLine, type TraceRequest } from '../sim/traces/format.ts';
import {
  AGENTIC_DEFAULTS,
  generateAgentic,
  generateMultiTurn,
  generateNoisyNeighbour,
  NOISY_NEIGHBOUR_DEFAULTS,
  generateSharedPrefix,
  generateSkewed,
  MULTI_TURN_DEFAULTS,
  SHARED_PREFIX_DEFAULTS,
  SKEWED_DEFAULTS,
  TRACE_KINDS,
  type TraceKind,
} from '../sim/traces/generate.ts';
import { loadTrace } from '../sim/traces/reader.ts';
import { formatTraceStats, traceStats } from '../sim/traces/stats.ts';

interface GenOptions {
  kind: string;
  requests?: number;
  seed: number;
  out?: string;
  rate?: number;
  groups?: number;
  promptsPerGroup?: number;
  systemPromptLen?: number;
  questionLen?: number;
  outputLen?: number;
  meanTurns?: number;
  sessions?: boolean;
  steadyTenants?: number;
  noisyFactor?: number;
  noisyPriority?: number;
  agentTypes?: number;
  tenants?: number;
}

export function generateTrace(o: GenOptions): TraceRequest[] {
  const kind = o.kind as TraceKind;
  switch (kind) {
    case 'skewed':
      return generateSkewed({
        seed: o.seed,
        ...(o.requests !== undefined && { requests: o.requests }),
        ...(o.rate !== undefined && { rate: o.rate }),
        ...(o.meanTurns !== undefined && { meanTurns: o.meanTurns }),
      });
    case 'shared-prefix':
      return generateSharedPrefix({
        seed: o.seed,
        ...(o.requests !== undefined && { requests: o.requests }),
        ...(o.rate !== undefined && { rate: o.rate }),
        ...(o.groups !== undefined && { groups: o.groups }),
        ...(o.promptsPerGroup !== undefined && { promptsPerGroup: o.promptsPerGroup }),
        ...(o.systemPromptLen !== undefined && { systemPromptLen: o.systemPromptLen }),
        ...(o.questionLen !== undefined && { questionLen: o.questionLen }),
        ...(o.outputLen !== undefined && { outputLen: o.outputLen }),
      });
    case 'multi-turn':
      return generateMultiTurn({
        seed: o.seed,
        ...(o.requests !== undefined && { requests: o.requests }),
        ...(o.rate !== undefined && { rate: o.rate }),
        ...(o.meanTurns !== undefined && { meanTurns: o.meanTurns }),
        ...(o.systemPromptLen !== undefined && { systemPromptLen: o.systemPromptLen }),
        ...(o.sessions && { sessionPrefix: 'c' }),
      });
    case 'noisy-neighbour':
      return generateNoisyNeighbour({
        seed: o.seed,
        ...(o.requests !== undefined && { requests: o.requests }),
        ...(o.rate !== undefined && { rate: o.rate }),
        ...(o.steadyTenants !== undefined && { steadyTenants: o.steadyTenants }),
        ...(o.noisyFactor !== undefined && { noisyFactor: o.noisyFactor }),
        ...(o.noisyPriority !== undefined && { noisyPriority: o.noisyPriority }),
      });
    case 'agentic':
      return generateAgentic({
        seed: o.seed,
        ...(o.requests !== undefined && { requests: o.requests }),
        ...(o.rate !== undefined && { rate: o.rate }),
        ...(o.meanTurns !== undefined && { meanTurns: o.meanTurns }),
        ...(o.systemPromptLen !== undefined && { systemPromptLen: o.systemPromptLen }),
        ...(o.agentTypes !== undefined && { agentTypes: o.agentTypes }),
        ...(o.tenants !== undefined && { tenants: o.tenants }),
      });
    default:
      throw new Error(`unknown trace kind "${o.kind}"; known: ${TRACE_KINDS.join(', ')}`);
  }
}

async function writeTrace(path: string, requests: readonly TraceRequest[]): Promise<void> {
  const out = createWriteStream(path, { encoding: 'utf8' });
  await new Promise<void>((resolve, reject) => {
    out.on('error', reject);
    let i = 0;
    const pump = () => {
      while (i < requests.length) {
        if (!out.write(`${formatTraceLine(requests[i++])}\n`)) {
          out.once('drain', pump);
          return;
        }
      }
      out.end(resolve);
    };
    pump();
  });
}

export function registerTrace(program: Command): void {
  const trace = program
    .command('trace')
    .summary('generate synthetic request traces, or describe a trace file')
    .description(
      'Request traces in the Mooncake JSONL format ({"timestamp", "input_length", "output_length", "hash_ids"}: one ' +
        'prefix id per 512-token block), for `kvroute sim` and benchmarks.',
    );

  trace
    .command('gen')
    .description(
      'Generate a synthetic trace and print its shape. Kinds:\n' +
        `  skewed         production shape of the hit-rate trap: ~44% under 1,800 tokens (mostly cold), mean ~14k, tail past 130k,\n` +
        `                 long requests are agentic sessions whose context grows turn by turn (defaults: ${SKEWED_DEFAULTS.requests} requests, ${SKEWED_DEFAULTS.rate} req/s)\n` +
        `  shared-prefix  SGLang's generated-shared-prefix benchmark: groups x prompts per group, each a shared system prompt plus\n` +
        `                 a unique question, shuffled (defaults: ${SHARED_PREFIX_DEFAULTS.groups} x ${SHARED_PREFIX_DEFAULTS.promptsPerGroup}, system ${SHARED_PREFIX_DEFAULTS.systemPromptLen}, question ${SHARED_PREFIX_DEFAULTS.questionLen}, output ${SHARED_PREFIX_DEFAULTS.outputLen})\n` +
        `  multi-turn     plain chat sessions over a shared system prompt (defaults: ${MULTI_TURN_DEFAULTS.requests} requests, ${MULTI_TURN_DEFAULTS.meanTurns} turns on average;\n` +
        `                 --sessions tags each conversation with a session_id)\n` +
        `  noisy-neighbour  flow control: ${NOISY_NEIGHBOUR_DEFAULTS.steadyTenants} steady tenants of multi-turn chat (tenant-0, ...) and one "noisy" tenant that\n` +
        `                 sends ${NOISY_NEIGHBOUR_DEFAULTS.noisyFactor}x a steady tenant's rate from ${NOISY_NEIGHBOUR_DEFAULTS.burstFrom * 100}% to ${NOISY_NEIGHBOUR_DEFAULTS.burstTo * 100}% of the run; every request carries tenant,\n` +
        '                 session_id (and priority with --noisy-priority)\n' +
        `  agentic        tool-use agents: ${AGENTIC_DEFAULTS.agentTypes} agent types with long shared system prompts (median ${AGENTIC_DEFAULTS.systemPromptLen} tokens, Zipf\n` +
        `                 popularity), multi-turn sessions (${AGENTIC_DEFAULTS.meanTurns} turns on average) whose turns append the answer and a tool result;\n` +
        `                 defaults fitted to the Mooncake FAST'25 tool&agent trace (${AGENTIC_DEFAULTS.requests} requests over an hour, mean input ~8.6k,\n` +
        '                 output ~182); every request carries session_id and tenant (docs/calibration.md)\n' +
        'Anywhere a trace file is read by `kvroute sim --trace`, a generated trace can be named instead: KIND[:key=value,...],\n' +
        'e.g. agentic:requests=5000,mean-turns=4 (keys are the generator options in kebab case).',
    )
    .requiredOption('--kind <kind>', `one of ${TRACE_KINDS.join(', ')}`, choiceArg('--kind', TRACE_KINDS))
    .option('--requests <n>', 'number of requests (noisy-neighbour: about that many)', intArg('--requests', { min: 1 }))
    .option('--seed <n>', 'generator seed', intArg('--seed', { min: 0 }), 1)
    .option('--out <file>', 'write the trace here (JSONL); without it only the stats are printed')
    .option(
      '--rate <rps>',
      'mean arrival rate in requests per second ("inf" sends all at once: shared-prefix only)',
      numberArg('--rate', { min: 0, minExclusive: true }, { infinity: true }),
    )
    .option('--groups <n>', 'shared-prefix: number of groups', intArg('--groups', { min: 1 }))
    .option('--prompts-per-group <n>', 'shared-prefix: prompts per group', intArg('--prompts-per-group', { min: 1 }))
    .option(
      '--system-prompt-len <n>',
      'shared-prefix, multi-turn: system prompt tokens; agentic: median per agent type',
      intArg('--system-prompt-len', { min: 0 }),
    )
    .option('--question-len <n>', 'shared-prefix: question tokens', intArg('--question-len', { min: 1 }))
    .option('--output-len <n>', 'shared-prefix: output tokens', intArg('--output-len', { min: 1 }))
    .option(
      '--mean-turns <n>',
      'skewed, multi-turn, agentic: mean turns per session',
      numberArg('--mean-turns', { min: 0, minExclusive: true }),
    )
    .option('--sessions', 'multi-turn: tag every conversation with a session_id')
    .option('--steady-tenants <n>', 'noisy-neighbour: steady tenants', intArg('--steady-tenants', { min: 1, max: 14 }))
    .option(
      '--noisy-factor <x>',
      "noisy-neighbour: the noisy tenant's rate over a steady tenant's",
      numberArg('--noisy-factor', { min: 0, minExclusive: true }),
    )
    .option('--agent-types <n>', 'agentic: agent types (one system prompt each)', intArg('--agent-types', { min: 1 }))
    .option('--tenants <n>', 'agentic: tenants the agent types belong to (0: no tenant field)', intArg('--tenants', { min: 0 }))
    .option('--noisy-priority <n>', "noisy-neighbour: the noisy tenant's priority (lower runs first)", intArg('--noisy-priority'))
    .addHelpText('after', '\nExample:\n  kvroute trace gen --kind skewed --requests 5000 --seed 7 --out /tmp/skewed.jsonl')
    .action(async (o: GenOptions) => {
      let requests: TraceRequest[];
      try {
        requests = generateTrace(o);
      } catch (err) {
        process.stderr.write(`kvroute trace gen: ${(err as Error).message}\n`);
        process.exitCode = 2;
        return;
      }
      if (o.out) {
        try {
          await writeTrace(o.out, requests);
        } catch (err) {
          process.stderr.write(`kvroute trace gen: cannot write ${o.out}: ${(err as Error).message}\n`);
          process.exitCode = 1;
          return;
        }
      }
      process.stdout.write(`${o.kind} trace, seed ${o.seed}${o.out ? ` -> ${o.out}` : ''}\n${formatTraceStats(traceStats(requests))}\n`);
    });

  trace
    .command('stats <file>')
    .description('Print the shape of a trace file: lengths, rate, bad lines, and the oracle (infinite shared cache) hit rates.')
    .action(async (file: string) => {
      try {
        const { requests, stats } = await loadTrace(file);
        process.stdout.write(`${formatTraceStats(traceStats(requests))}\n`);
        if (stats.badLines > 0) {
          const reasons = [...stats.bad].map(([k, v]) => `${k} ${v} (first at line ${stats.firstBadLine.get(k)})`).join(', ');
          process.stdout.write(`bad lines skipped: ${stats.badLines}: ${reasons}\n`);
        }
      } catch (err) {
        process.stderr.write(`kvroute trace stats: cannot read ${file}: ${(err as Error).message}\n`);
        process.exitCode = 1;
      }
    });
}
