/**
 * `kvroute relay`: one engine's KV events (ZMQ) -> the JetStream event stream that router replicas consume.
 */
import type { Command } from 'commander';
import pino from 'pino';
import { bytesArg, choiceArg, intArg, LOG_LEVELS, zmqEndpointArg } from '../config/parsers.ts';
import { NatsRelay } from '../transport/nats/relay.ts';
import { checkWorkerId } from '../transport/nats/protocol.ts';

interface RelayCliOptions {
  nats: string;
  worker: string;
  events: string;
  replay?: string;
  dp: number;
  model?: string;
  url?: string;
  blockSize: number;
  flavor: 'vllm' | 'sglang';
  role?: 'prefill' | 'decode' | 'both';
  bootstrapPort?: number;
  topic: string;
  heartbeatMs: number;
  maxAgeS: number;
  maxBytes: number;
  replicas: number;
  statsEveryS: number;
  logLevel: string;
}

export function registerRelay(program: Command): void {
  program
    .command('relay')
    .summary("publish one engine's KV events to NATS JetStream for router replicas")
    .description(
      "Subscribes to one engine's KV events over ZMQ with the router's own decoding, gap replay and restart detection, " +
        'and publishes the normalised events to the JetStream stream KVROUTE_EVENTS (subject kvroute.events.<worker>.<dp>), ' +
        'keeping a registry entry for the worker (URL, model, block size, dp ranks, heartbeat) in the KV bucket ' +
        'kvroute-workers. Router replicas (kvroute serve --nats URL) discover workers there and consume the stream. ' +
        'A restarted relay resumes after the last published engine seq when the engine can replay it, and otherwise ' +
        "resets the worker's blocks on the replicas.",
    )
    .requiredOption('--nats <url>', 'NATS server URL(s), comma-separated (nats://host:4222)')
    .requiredOption('--worker <id>', 'worker id, as the router names it ([A-Za-z0-9_-], no dots)')
    .requiredOption(
      '--events <endpoint>',
      "rank 0's KV event endpoint (vLLM kv-events-config endpoint, connectable form)",
      zmqEndpointArg('--events', { connectable: true }),
    )
    .option(
      '--replay <endpoint>',
      "rank 0's replay endpoint (vLLM replay_endpoint); without it gaps reset the worker",
      zmqEndpointArg('--replay', { connectable: true }),
    )
    .option('--dp <n>', 'data-parallel ranks (rank r uses the ports + r)', intArg('--dp', { min: 1 }), 1)
    .option('--model <name>', 'served model name, published in the registry')
    .option('--url <url>', "the engine's OpenAI base URL (http://host:8000), published for the router's proxy")
    .option(
      '--block-size <n>',
      "the router's block size in tokens (the engine's must be a multiple)",
      intArg('--block-size', { min: 1 }),
      16,
    )
    .option('--flavor <name>', 'event wire flavour: vllm or sglang', choiceArg('--flavor', ['vllm', 'sglang'] as const), 'vllm')
    .option(
      '--role <role>',
      'disaggregated serving: the worker role published in the registry (prefill, decode or both)',
      choiceArg('--role', ['prefill', 'decode', 'both'] as const),
    )
    .option(
      '--bootstrap-port <n>',
      'SGLang prefill workers: the bootstrap port, published in the registry',
      intArg('--bootstrap-port', { min: 1, max: 65535 }),
    )
    .option('--topic <topic>', 'ZMQ topic prefix to subscribe to', '')
    .option('--heartbeat-ms <n>', 'registry heartbeat period', intArg('--heartbeat-ms', { min: 1 }), 2000)
    .option('--max-age-s <n>', 'stream retention by age (when the stream is created)', intArg('--max-age-s', { min: 1 }), 3600)
    .option('--max-bytes <n>', 'stream retention by size, e.g. 1gb (when the stream is created)', bytesArg('--max-bytes'), 1024 ** 3)
    .option('--replicas <n>', 'JetStream replicas of the stream and buckets (when created)', intArg('--replicas', { min: 1 }), 1)
    .option('--stats-every-s <n>', 'log publishing counters this often', intArg('--stats-every-s', { min: 1 }), 60)
    .option('--log-level <level>', 'pino log level', choiceArg('--log-level', LOG_LEVELS), 'info')
    .addHelpText(
      'after',
      '\nExample:\n  kvroute relay --nats nats://nats:4222 --worker vllm-0 --events tcp://vllm-0:5557 --replay tcp://vllm-0:5558 \\\n' +
        '    --model Qwen/Qwen3-8B --url http://vllm-0:8000',
    )
    .action(async (opts: RelayCliOptions) => {
      const bad = checkWorkerId(opts.worker);
      if (bad) {
        process.stderr.write(`kvroute relay: ${bad}\n`);
        process.exitCode = 2;
        return;
      }
      const log = pino({ level: opts.logLevel, base: undefined });
      const relay = new NatsRelay({
        servers: opts.nats.split(','),
        workerId: opts.worker,
        events: opts.events,
        replay: opts.replay ?? null,
        dpRanks: opts.dp,
        model: opts.model ?? null,
        url: opts.url ?? null,
        blockSize: opts.blockSize,
        flavor: opts.flavor,
        role: opts.role,
        bootstrapPort: opts.bootstrapPort,
        topic: opts.topic,
        heartbeatMs: opts.heartbeatMs,
        limits: { maxAgeMs: opts.maxAgeS * 1000, maxBytes: opts.maxBytes, replicas: opts.replicas },
        log,
      });
      // Handlers first: a SIGTERM during start-up (waiting for NATS, priming) still stops cleanly.
      const stopped = new Promise<void>((resolve) => {
        process.once('SIGINT', () => resolve());
        process.once('SIGTERM', () => resolve());
      });
      log.info({ nats: opts.nats, worker: opts.worker }, 'relay starting: connecting to NATS and the engine');
      try {
        await Promise.race([relay.start(), stopped]);
      } catch (err) {
        log.error({ err: String(err) }, 'relay could not start');
        process.exitCode = 1;
        await relay.close().catch(() => {});
        return;
      }
      const stats = setInterval(() => log.info({ ranks: relay.stats() }, 'relay counters'), opts.statsEveryS * 1000);
      await stopped;
      clearInterval(stats);
      // Publish what is queued (briefly), keep the registry entry: a restarted relay resumes without a reset.
      await relay.close({ drainMs: 2000 });
      log.info({ ranks: relay.stats() }, 'relay stopped');
      // A stop during start-up may leave the start sequence's sockets behind: end the process explicitly.
      await new Promise<void>((resolve) => log.flush(() => resolve()));
      process.exit(process.exitCode ?? 0);
    });
}
