/**
 * `kvroute epp`: the Gateway API Inference Extension endpoint picker (Envoy ext_proc over gRPC). Its command line is
 * kvroute's settings plus the reference picker's own, as its Helm chart passes them (epp/reference.ts), and its plugin
 * configuration (--config-file, epp/picker-config.ts).
 */
import { readFile } from 'node:fs/promises';
import { type Command, Option } from 'commander';
import pino from 'pino';
import { POLICY_NAMES } from '../core/scheduling/registry.ts';
import { addEppOptions, CONFIG_OPTION, eppConfigFromCommand } from '../config/serve.ts';
import { mapPickerConfig } from '../epp/picker-config.ts';
import { translateReferenceArgs, type TranslatedArgs } from '../epp/reference.ts';
import type { RunningEpp } from '../epp/server.ts';
import { bundledTokenizerDir, type EmbeddedFleet, startEmbeddedFleet } from '../mocker/embedded.ts';
import { LOG_REDACT_PATHS } from '../runtime/security/index.ts';
import { startK8sDiscovery, wantsK8s } from './k8s-discovery.ts';

export function registerEpp(program: Command): void {
  const epp = program
    .command('epp')
    .summary('run the endpoint picker for Envoy-based gateways (Gateway API Inference Extension, ext_proc gRPC)')
    .description(
      'Serve envoy.service.ext_proc.v3.ExternalProcessor/Process on --port (gRPC over TLS; --no-secure-serving: plaintext) as the Gateway API ' +
        "Inference Extension's Endpoint Picker: for each request the proxy streams its headers and body " +
        '(FULL_DUPLEX_STREAMED), the picker parses the OpenAI body, tokenizes and routes it with the same core and the ' +
        'same settings as `kvroute serve`, and answers with the x-gateway-destination-endpoint header and the envoy.lb ' +
        'metadata (the pick, then fallbacks), the body streamed back; the response is watched for the first token and ' +
        'the usage. gRPC health (grpc.health.v1) answers for liveness, readiness, inference-extension and the ext_proc ' +
        'service, on --port and in plaintext on --grpc-health-port; /metrics and /health are on --metrics-port. Without ' +
        'workers, starts an embedded fleet of mock engines. Protocol, headers, metadata and metrics: ' +
        'docs/endpoint-picker.md.\n\n' +
        "The reference picker's command line, as its Helm chart renders it, is accepted too (docs/kubernetes.md): " +
        '--pool-name, --pool-namespace (or $NAMESPACE), --pool-group, --endpoint-selector, --endpoint-target-ports, ' +
        '--grpc-port, --grpc-health-port, --metrics-port, --secure-serving[=false], --cert-path, ' +
        '--metrics-endpoint-auth[=false], --metrics-cert-dir, --metrics-client-ca-file, --config-file, --config-text, ' +
        '--zap-encoder, --zap-log-level, -v; any other --flag [value] is logged once and ignored.\n\n' +
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
  addEppOptions(epp);
  // The reference picker's flags become kvroute's before commander reads them (unknown ones are set aside, not fatal).
  let translated: TranslatedArgs = { argv: [], ignored: [], notes: [] };
  const parseOptions = epp.parseOptions.bind(epp);
  epp.parseOptions = (argv: string[]) => {
    translated = translateReferenceArgs(
      argv,
      {
        takesValue: (flag) => {
          const o =
            epp.options.find((x) => x.long === flag || x.short === flag) ??
            (flag === '-h' || flag === '--help' ? { required: false, optional: false } : undefined);
          return o === undefined ? undefined : Boolean(o.required || o.optional);
        },
      },
      process.env,
    );
    return parseOptions(translated.argv);
  };
  epp
    .addHelpText(
      'after',
      '\nExamples:\n' +
        '  kvroute epp --port 9002 --metrics-port 9090          # embedded mock fleet, ext_proc (TLS) on 9002\n' +
        '  kvroute epp --port 9002 --metrics-port 9090 --host 0.0.0.0 \\\n' +
        '              -w http://10.0.0.7:8000,events=tcp://10.0.0.7:5557 -w http://10.0.0.8:8000,events=tcp://10.0.0.8:5557\n' +
        '  kvroute epp --port 9002 --metrics-port 9090 --nats nats://nats:4222   # a replica sharing state over NATS\n' +
        "  kvroute epp --port 9002 --metrics-port 9090 --k8s-pool vllm-pool      # workers: the InferencePool's Ready pods\n" +
        '  kvroute epp --pool-name vllm-pool --pool-namespace default --zap-encoder json --config-file /config/default-plugins.yaml\n' +
        "                                                       # the reference picker's command line (its Helm chart's)\n",
    )
    .action(async (_opts: unknown, cmd: Command) => {
      const { config, unknownEnv, sources } = await eppConfigFromCommand(cmd, process.env);
      const log = pino({ level: config.logLevel, base: undefined, redact: LOG_REDACT_PATHS });
      for (const name of unknownEnv) log.warn(`ignoring environment variable ${name}: no setting has that name (typo?)`);
      if (translated.ignored.length > 0) {
        log.warn(
          { ignored: translated.ignored },
          `ignoring ${translated.ignored.length} flag(s) kvroute has no setting for: ${translated.ignored.join(' ')}`,
        );
      }
      for (const note of translated.notes) log.info(note);
      const pickerConfig =
        config.pickerConfigFile === undefined ? translated.configText : await readPickerConfig(config.pickerConfigFile, log);
      if (pickerConfig !== undefined) {
        const mapped = mapPickerConfig(pickerConfig, POLICY_NAMES);
        const explicit = sources.policy !== 'default';
        if (mapped.policy !== undefined && !explicit) config.policy = mapped.policy as typeof config.policy;
        log.info(
          { policy: config.policy, matched: mapped.matched, ignored: mapped.ignored },
          `plugin configuration: ${mapped.matched} -> policy ${config.policy}${explicit && mapped.policy !== undefined ? ' (--policy given: kept)' : ''}` +
            (mapped.ignored.length > 0 ? `; ignored: ${mapped.ignored.join('; ')}` : ''),
        );
      }
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
        const { attachToServer } = await import('../runtime/nats.ts');
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
        { address: epp.address, tls: epp.tls, workers: config.workers.length, policy: config.policy, blockSize: config.blockSize },
        `kvroute epp listening on grpc://${epp.address} (ext_proc) over ${epp.tls}; health on grpc://${epp.healthAddress} (plaintext); ` +
          `metrics on ${epp.metricsUrl}`,
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

/** The plugin configuration's text; a file that cannot be read is logged, not fatal (the picker runs on its settings). */
async function readPickerConfig(path: string, log: pino.Logger): Promise<string | undefined> {
  try {
    return await readFile(path, 'utf8');
  } catch (err) {
    log.warn(
      { path, error: (err as NodeJS.ErrnoException).code ?? (err as Error).message },
      'cannot read --config-file: running on the settings alone',
    );
    return undefined;
  }
}
