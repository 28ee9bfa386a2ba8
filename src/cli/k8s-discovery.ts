/**
 * Kubernetes discovery for the commands that route (`serve`, `epp`): with --k8s-pool or --k8s-selector, Ready pods join
 * the router's worker table through the admin API's path and leave it when they go; the watch's metrics join the
 * router's registry. One place, so both commands discover alike.
 */
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { ServeConfig } from '../config/serve.ts';
import type { K8sDiscovery } from '../discovery/k8s/index.ts';
import type { WorkerSpec } from '../config/worker-spec.ts';

/** True when the settings ask for Kubernetes discovery. */
export function wantsK8s(config: ServeConfig): boolean {
  return config.k8sPool !== undefined || config.k8sSelector !== undefined;
}

/** The worker table discovery feeds (the server's or the endpoint picker's). */
export interface DiscoveredWorkers {
  add(spec: WorkerSpec): Promise<unknown>;
  remove(id: string): Promise<unknown>;
}

/** Starts the watch (its first list completes in the background: `synced` turns true then); null without --k8s-*. */
export async function startK8sDiscovery(
  config: ServeConfig,
  workers: DiscoveredWorkers,
  registry: Registry,
  log: Logger,
): Promise<K8sDiscovery | null> {
  if (!wantsK8s(config)) return null;
  const { discoveryFromSettings, registerDiscoveryMetrics } = await import('../discovery/k8s/index.ts');
  const discovery = discoveryFromSettings(
    config,
    {
      // The admin API's path: the worker joins the dispatcher's table, its events are subscribed.
      add: async (spec) => void (await workers.add(spec)),
      remove: async (id) => void (await workers.remove(id)),
    },
    {
      info: (o: object, m: string) => log.info(o, m),
      warn: (o: object, m: string) => log.warn(o, m),
      error: (o: object, m: string) => log.error(o, m),
    },
  );
  registerDiscoveryMetrics(discovery, registry, config.metricsPrefix);
  log.info(
    { pool: config.k8sPool ?? null, selector: config.k8sSelector ?? null, namespace: config.k8sNamespace ?? null },
    'watching Kubernetes for workers',
  );
  void discovery.start().then(() => log.info({ workers: discovery.stats().workers }, 'kubernetes discovery synced'));
  return discovery;
}
