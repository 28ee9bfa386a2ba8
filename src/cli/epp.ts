/** `kvroute epp`: the Gateway API Inference Extension endpoint picker (Envoy ext_proc over gRPC). */
import { type Command, Option } from 'commander';
import pino from 'pino';
import { addServeOptions, CONFIG_OPTION, serveConfigFromCommand } from '../config/serve.ts';
import type { RunningEpp } from '../epp/server.ts';
import { bundledTokenizerDir, type EmbeddedFleet, startEmbeddedFleet } from '../mocker/embedded.ts';
import { LOG_REDACT_PATHS } from '../server/security/index.ts';
import { startK8sDiscovery, wantsK8s } from './k8s-discovery.ts';

export function registerEpp(program: Command): void {
  const epp = program
    .command('epp')
    .summary('run the endpoint picker for Envoy-based gateways (Gateway API Inference Extension, ext_proc gRPC)')
    .description(
      'Serve envoy.service.ext_proc.v3.ExternalProcessor/Process on --port (gRPC, plaintext) as the Gateway API ' +
        "Inference Extension's Endpoint Picker: for each request the proxy streams its headers and body " +
        '(FULL_DUPLEX_STREAMED), the picker parses the OpenAI body, tokenizes and routes it with the same core and the ' +
        'same settings as `kvroute serve`, and answers with the x-gateway-destination-endpoint header and the envoy.lb ' +
        'metadata (the pick, then fallbacks), the body streamed back; the response is watched for the first token and ' +
        'the usage. gRPC health (grpc.health.v1) answers for liveness, readiness and the ext_proc service; /metrics and ' +
        '/health are on --metrics-port (HTTP; none without it). Without workers, starts an embedded fleet of mock ' +
        'engines. Protocol, headers, metadata and metrics: docs/endpoint-picker.md.\n\n' +
        'Every setting is a flag, a KVROUTE_* environment variable and a --config file key, exactly as for `kvroute ' +
        'serve` (shown with each option as "env:" and "config:"); settings of the HTTP front end (API keys, rate limit, ' +
        'client timeouts, the admin API) have no effect here: the gateway owns the client connection.',
    )
    .addOption(
      new Option(
        CONFIG_OPTION.flag,
        `YAML or JSON config file with the same settings (camelCase keys, "workers" list) (env: ${CONFIG_OPTION.env})`,
      ),
    );
  addServeOptions(epp);
  epp
    .addHelpText(
      'after',
      '\nExamples:\n' +
        '  kvroute epp --port 9002 --metrics-port 9090          # embedded mock fleet, gRPC on 9002\n' +
        '  kvroute epp --port 9002 --metrics-port 9090 --host 0.0.0.0 \\\n' +
        '              -w http://10.0.0.7:8000,events=tcp://10.0.0.7:5557 -w http://10.0.0.8:8000,events=tcp://10.0.0.8:5557\n' +
        '  kvroute epp --port 9002 --metrics-port 9090 --nats nats://nats:4222   # a replica sharing state over NATS\n' +
        "  kvroute epp --port 9002 --metrics-port 9090 --k8s-pool vllm-pool      # workers: the InferencePool's Ready pods\n",
    )
    .action(async (_opts: unknown, cmd: Command) => {
      const { config, unknownEnv } = await serveConfigFromCommand(cmd, process.env);
      const log = pino({ level: config.logLevel, base: undefined, redact: LOG_REDACT_PATHS });
      for (const name of unknownEnv) log.warn(`ignoring environment variable ${name}: no setting has that name (typo?)`);
      let fleet: EmbeddedFleet | null = null;
      const natsUrls = config.nats ?? [];
      const k8s = wantsK8s(config);
      if (config.workers.length === 0 && config.mockWorkers > 0 && natsUrls.length === 0 && !k8s) {
        config.tokenizerDir ??= bundledTokenizerDir();
        log.info(`no --worker given: starting an embedded fleet of ${config.mockWorkers} mock engines (a few seconds)`);
        fleet = await startEmbeddedFleet({
          count: config.mockWorkers,
          model: config.mockModel,
          blockSize: config.blockSize,
          tokenizerDir: config.tokenizerDir,
        });
        config.workers = fleet.workers;
        log.info(
          { workers: fleet.workers.map((w) => ({ url: w.url, events: w.events })) },
          `embedded fleet up: ${config.mockWorkers} mock engines serving "${config.mockModel}"`,
        );
      }
      let natsReady = natsUrls.length === 0;
      // With --k8s-*, readiness is NOT_SERVING until the pods have been listed once.
      let discovery: Awaited<ReturnType<typeof startK8sDiscovery>> = null;
      const { startEpp } = await import('../epp/server.ts');
      let epp: RunningEpp;
      try {
        epp = await startEpp(config, { logger: log, readiness: () => natsReady && (discovery?.synced ?? true) });
      } catch (err) {
        await fleet?.close();
        throw err;
      }
      if (k8s) {
        try {
          discovery = await startK8sDiscovery(config, epp.core.workers, epp.core.metrics.registry, log);
        } catch (err) {
          await epp.close(0);
          throw err;
        }
      }
      let replica: { close(): Promise<void> } | null = null;
      if (natsUrls.length > 0) {
        const { attachToServer } = await import('../server/nats.ts');
        log.info({ nats: natsUrls }, 'joining the replicas on NATS: loading the index snapshot and catching up');
        try {
          replica = await attachToServer(epp.core, {
            servers: natsUrls,
            replicaId: config.replicaId,
            snapshotIntervalMs: config.snapshotIntervalMs,
            log: {
              info: (o: object, m: string) => log.info(o, m),
              warn: (o: object, m: string) => log.warn(o, m),
              error: (o: object, m: string) => log.error(o, m),
            },
          });
        } catch (err) {
          await epp.close(0);
          await fleet?.close();
          throw err;
        }
        natsReady = true;
        log.info('replica ready: snapshot loaded and stream caught up');
      }
      log.info(
        { address: epp.address, workers: config.workers.length, policy: config.policy, blockSize: config.blockSize },
        `kvroute epp listening on grpc://${epp.address} (ext_proc)${epp.metricsUrl ? `; metrics on ${epp.metricsUrl}` : ''}`,
      );
      let stopping = false;
      const stop = (signal: string) => {
        if (stopping) {
          log.warn('second signal: exiting now');
          process.exit(1);
        }
        stopping = true;
        log.info({ signal, streams: epp.streams(), graceMs: config.shutdownGraceMs }, 'shutting down');
        void Promise.all([replica?.close(), discovery?.stop()])
          .then(() => epp.close())
          .then(() => fleet?.close())
          .then(() => process.exit(0));
      };
      process.on('SIGTERM', () => stop('SIGTERM'));
      process.on('SIGINT', () => stop('SIGINT'));
    });
}
