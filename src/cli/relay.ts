/**
 * `kvroute relay`: one engine's KV events (ZMQ, or TensorRT-LLM's HTTP event endpoint) -> the JetStream event stream
 * that router replicas consume.
 */
import type { Command } from 'commander';
import pino, { type Logger } from 'pino';
import type { z } from 'zod';
import { K8S_SETTINGS } from '../config/k8s.ts';
import { relaySchema } from '../config/relay.ts';
import { addServeOptions, serveSettingsFrom } from '../config/serve.ts';
import { addSettingsOptions, FLAGS_ONLY, settingsFrom } from '../config/settings.ts';
import { DEFAULT_ENGINE, ENGINE_NAMES, engineAdapter } from '../engines/index.ts';
import { NatsRelay } from '../transport/nats/relay.ts';
import { checkWorkerId } from '../transport/nats/protocol.ts';
import type { LogSink } from '../log.ts';

/** The relay's settings, from the family (src/config/relay.ts), with the engine names of the registry. */
export const RELAY = relaySchema(ENGINE_NAMES, DEFAULT_ENGINE);

/** Resolved: --nats is required, so present. */
type RelayCliOptions = z.output<typeof RELAY> & { nats: string };

const sink = (log: Logger): LogSink => ({
  info: (o: object, m: string) => log.info(o, m),
  warn: (o: object, m: string) => log.warn(o, m),
  error: (o: object, m: string) => log.error(o, m),
});

/** Handlers first: a SIGTERM during start-up (waiting for NATS, priming) still stops cleanly. */
function stopSignal(): Promise<void> {
  return new Promise<void>((resolve) => {
    process.once('SIGINT', () => resolve());
    process.once('SIGTERM', () => resolve());
  });
}

/** `--k8s-selector` / `--k8s-pool`: one relay per discovered pod (worker id = pod name), added and removed with the pods. */
async function relayDiscovered(opts: RelayCliOptions, settings: ReturnType<typeof k8sSettingsOf>): Promise<void> {
  const log = pino({ level: opts.logLevel, base: undefined });
  const { FleetRelay } = await import('../transport/nats/fleet-relay.ts');
  const { discoveryFromSettings } = await import('../discovery/k8s/index.ts');
  const fleet = new FleetRelay(
    opts.nats.split(','),
    {
      blockSize: opts.blockSize,
      topic: opts.topic,
      heartbeatMs: opts.heartbeatMs,
      limits: { maxAgeMs: opts.maxAgeS * 1000, maxBytes: opts.maxBytes, replicas: opts.replicas },
      model: opts.model ?? null,
    },
    sink(log),
  );
  // Credentials first: a relay that cannot reach the API says so in one line before it connects anywhere.
  const discovery = discoveryFromSettings(settings, fleet, sink(log));
  const stopped = stopSignal();
  log.info(
    { nats: opts.nats, pool: settings.k8sPool ?? null, selector: settings.k8sSelector ?? null },
    'relay starting: connecting to NATS',
  );
  try {
    await Promise.race([fleet.start(), stopped]);
  } catch (err) {
    log.error({ err: String(err) }, 'relay could not connect to NATS');
    process.exitCode = 1;
    return;
  }
  void discovery.start().then(() => log.info({ workers: fleet.size }, 'kubernetes discovery synced: relaying the ready pods'));
  const stats = setInterval(() => log.info({ workers: fleet.stats() }, 'relay counters'), opts.statsEveryS * 1000);
  await stopped;
  clearInterval(stats);
  await discovery.stop();
  await fleet.close(2000);
  log.info('relay stopped');
  await new Promise<void>((resolve) => log.flush(() => resolve()));
  process.exit(process.exitCode ?? 0);
}

function k8sSettingsOf(cmd: Command) {
  return serveSettingsFrom(cmd, K8S_SETTINGS, { env: process.env });
}

export function registerRelay(program: Command): void {
  const relay = program
    .command('relay')
    .summary("publish one engine's KV events to NATS JetStream for router replicas")
    .description(
      "Subscribes to one engine's KV events over ZMQ (or polls TensorRT-LLM's POST /kv_cache_events) with the router's own " +
        'decoding, gap replay and restart detection, ' +
        'and publishes the normalised events to the JetStream stream KVROUTE_EVENTS (subject kvroute.events.<worker>.<dp>), ' +
        'keeping a registry entry for the worker (URL, model, block size, dp ranks, heartbeat) in the KV bucket ' +
        'kvroute-workers. Router replicas (kvroute serve --nats URL) discover workers there and consume the stream. ' +
        'A restarted relay resumes after the last published engine seq when the engine can replay it, and otherwise ' +
        "resets the worker's blocks on the replicas. With --k8s-selector or --k8s-pool instead of --worker and --events, " +
        'relays every Ready pod it discovers (worker id = pod name, ports and role from the pod: docs/kubernetes.md) and ' +
        'deregisters pods that leave.',
    )
    .addHelpText(
      'after',
      "\nThe relay's own options are flags only (KVROUTE_* variables configure the router); its Kubernetes discovery reads " +
        'KVROUTE_K8S_* as serve does.',
    );
  // The relay's settings, the block size and log level among them as serve defines them; discovery as serve's.
  addSettingsOptions(relay, RELAY, undefined, { ...FLAGS_ONLY, required: ['nats'], group: false });
  addServeOptions(relay, K8S_SETTINGS, { file: false });
  relay
    .addHelpText(
      'after',
      '\nExamples:\n  kvroute relay --nats nats://nats:4222 --worker vllm-0 --events tcp://vllm-0:5557 --replay tcp://vllm-0:5558 \\\n' +
        '    --model Qwen/Qwen3-8B --url http://vllm-0:8000\n' +
        '  kvroute relay --nats nats://nats:4222 --k8s-selector app=vllm   # every Ready pod of the namespace',
    )
    .action(async (_opts: unknown, cmd: Command) => {
      // Checked here, not while commander parses: a bad value is one line naming the flag (exit 2, src/cli/main.ts).
      const opts = settingsFrom(cmd, RELAY, Object.keys(RELAY.shape) as Array<keyof RelayCliOptions & string>).config as RelayCliOptions;
      const settings = k8sSettingsOf(cmd);
      const discovering = settings.k8sPool !== undefined || settings.k8sSelector !== undefined;
      const usage = (msg: string) => {
        process.stderr.write(`kvroute relay: ${msg}\n`);
        process.exitCode = 2;
      };
      if (settings.k8sPool !== undefined && settings.k8sSelector !== undefined) {
        return usage('--k8s-pool and --k8s-selector exclude each other: a pool brings its own selector');
      }
      if (discovering) {
        if (opts.worker !== undefined || opts.events !== undefined) {
          return usage('--worker and --events name one engine: with --k8s-selector or --k8s-pool the pods give them');
        }
        return relayDiscovered(opts, settings);
      }
      const polled = opts.events === undefined && engineAdapter(opts.flavor).events.httpPoll;
      if (polled && opts.url === undefined) {
        return usage(`--flavor ${opts.flavor} without --events polls the engine's HTTP event endpoint: --url is required`);
      }
      if (opts.worker === undefined || (opts.events === undefined && !polled)) {
        return usage('--worker and --events are required (or --k8s-selector / --k8s-pool to relay every discovered pod)');
      }
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
      const stopped = stopSignal();
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
