/** `kvroute serve`: the OpenAI-compatible KV-aware router. */
import { type Command, Option } from 'commander';
import pino from 'pino';
import { addServeOptions, CONFIG_OPTION, serveConfigFromCommand } from '../config/serve.ts';
import type { RunningServer } from '../server/app.ts';
import type { RunningCluster } from '../server/cluster/primary.ts';
import { SettingError } from '../config/settings.ts';
import { LOG_REDACT_PATHS } from '../runtime/security/index.ts';
import type { EmbeddedFleet } from '../mocker/embedded.ts';
import { wantsK8s } from './k8s-discovery.ts';

// The server, the embedded fleet, the shells and discovery are loaded when the action runs, not when the command is
// registered: `--help` and a refused flag do not pay for them.

export function registerServe(program: Command): void {
  const serve = program
    .command('serve')
    .summary('run the OpenAI-compatible KV-cache-aware router')
    .description(
      'Serve POST /v1/chat/completions and /v1/completions (streaming and not), routing each request to the worker ' +
        "that already holds its prompt prefix (KV events when a worker publishes them, the router's own decisions " +
        'otherwise). Also GET /v1/models, /health, /metrics, /debug/state, and POST/DELETE /admin/workers with ' +
        '--admin-token. Without workers, starts an embedded fleet of mock engines so the endpoint works at once.\n\n' +
        'Every setting is a flag, a KVROUTE_* environment variable (empty counts as unset) and a --config file key, ' +
        'each shown with its option as "env:" and "config:". Precedence: flag > ' +
        'environment > --config file > default; a list (workers, API keys) is taken whole from the first source that ' +
        'gives it. A bad value from any source stops start-up with exit status 2 and one line naming the setting.',
    )
    .addOption(
      new Option(
        CONFIG_OPTION.flag,
        `YAML or JSON config file with the same settings (camelCase keys, "workers" list) (env: ${CONFIG_OPTION.env})`,
      ),
    );
  addServeOptions(serve);
  serve
    .addHelpText(
      'after',
      '\nExamples:\n' +
        '  kvroute serve                                   # 4 embedded mock engines with KV events, port 8080\n' +
        '  kvroute serve -w http://gpu1:8000,events=tcp://gpu1:5557 -w http://gpu2:8000,events=tcp://gpu2:5557 \\\n' +
        '                --tokenizer /models/Qwen3-8B --block-size 16\n' +
        '  KVROUTE_WORKERS="http://a:8000 http://b:8000" KVROUTE_ADMIN_TOKEN=s3cret kvroute serve\n',
    )
    .action(async (_opts: unknown, cmd: Command) => {
      // Flags, KVROUTE_* and the config file, each value checked (a bad one throws a one-line SettingError: exit 2).
      const { config, unknownEnv } = await serveConfigFromCommand(cmd, process.env);

      const log = pino({ level: config.logLevel, base: undefined, redact: LOG_REDACT_PATHS });
      for (const name of unknownEnv) log.warn(`ignoring environment variable ${name}: no setting has that name (typo?)`);
      let fleet: EmbeddedFleet | null = null;
      const mockCount = config.mockWorkers;
      const natsUrls = config.nats ?? [];
      const k8s = wantsK8s(config);
      if (config.workers.length === 0 && mockCount > 0 && natsUrls.length === 0 && !k8s) {
        const { bundledTokenizerDir, startEmbeddedFleet } = await import('../mocker/embedded.ts');
        config.tokenizerDir ??= bundledTokenizerDir();
        log.info(`no --worker given: starting an embedded fleet of ${mockCount} mock engines (a few seconds)`);
        fleet = await startEmbeddedFleet({
          count: mockCount,
          model: config.mockModel,
          blockSize: config.blockSize,
          tokenizerDir: config.tokenizerDir,
        });
        config.workers = fleet.workers;
        log.info(
          { workers: fleet.workers.map((w) => ({ url: w.url, events: w.events })), tokenizer: config.tokenizerDir ?? null },
          `embedded fleet up: ${mockCount} mock engines serving "${config.mockModel}" with KV events over ZMQ`,
        );
      }
      if (config.processes > 1 && config.rateLimit) {
        // Each shell would keep its own buckets: N times the limit.
        throw new SettingError('--processes > 1 cannot be combined with --rate-limit (each process would allow the whole rate)');
      }
      // With --nats, /health says 503 until the snapshot is loaded and the event stream caught up.
      let natsReady = natsUrls.length === 0;
      // With --k8s-*, /health says 503 until the pods have been listed once.
      let discovery: import('../discovery/k8s/index.ts').K8sDiscovery | null = null;
      let server: RunningServer;
      // --processes: the router itself listens on an internal loopback port; the HTTP shells take the public one.
      const multi = config.processes > 1;
      try {
        const { startServer } = await import('../server/app.ts');
        server = await startServer(multi ? { ...config, host: '127.0.0.1', port: 0 } : config, {
          logger: log,
          readiness: () => natsReady && (discovery?.synced ?? true),
        });
      } catch (err) {
        await fleet?.close();
        throw err;
      }
      if (k8s) {
        try {
          const { startK8sDiscovery } = await import('./k8s-discovery.ts');
          discovery = await startK8sDiscovery(config, server.workers, server.metrics.registry, log);
        } catch (err) {
          await server.close(0);
          throw err;
        }
      }
      let shells: RunningCluster | null = null;
      if (multi) {
        try {
          const { startCluster } = await import('../server/cluster/primary.ts');
          shells = await startCluster(config, server, log);
        } catch (err) {
          await server.close(0);
          await fleet?.close();
          throw err;
        }
      }
      const publicUrl = shells?.url ?? server.url;
      let replica: { close(): Promise<void> } | null = null;
      if (natsUrls.length > 0) {
        const { attachToServer } = await import('../runtime/nats.ts');
        log.info({ nats: natsUrls }, 'joining the replicas on NATS: loading the index snapshot and catching up');
        replica = await attachToServer(server, {
          servers: natsUrls,
          replicaId: config.replicaId,
          snapshotIntervalMs: config.snapshotIntervalMs,
          log: {
            info: (o: object, m: string) => log.info(o, m),
            warn: (o: object, m: string) => log.warn(o, m),
            error: (o: object, m: string) => log.error(o, m),
          },
        });
        natsReady = true;
        log.info('replica ready: snapshot loaded and stream caught up');
      }
      log.info(
        { url: publicUrl, workers: config.workers.length, policy: config.policy, blockSize: config.blockSize, processes: config.processes },
        `kvroute listening on ${publicUrl} (OpenAI API at ${publicUrl}/v1)` +
          (server.metricsUrl ? `; metrics and dashboard on ${server.metricsUrl}` : ''),
      );
      let stopping = false;
      const stop = (signal: string) => {
        if (stopping) {
          log.warn('second signal: exiting now');
          process.exit(1);
        }
        stopping = true;
        log.info({ signal, inFlight: server.inFlight(), graceMs: config.shutdownGraceMs }, 'shutting down');
        void Promise.all([replica?.close(), discovery?.stop()])
          .then(() => shells?.close(config.shutdownGraceMs))
          .then(() => server.close())
          .then(() => fleet?.close())
          .then(() => process.exit(0));
      };
      process.on('SIGTERM', () => stop('SIGTERM'));
      process.on('SIGINT', () => stop('SIGINT'));
    });
}
