/**
 * Kubernetes discovery from the shared settings (`K8S` of src/config/k8s.ts), for any command that keeps a
 * worker table (serve; relay keeps one relay per pod), and its Prometheus series. Loaded lazily: a router without
 * --k8s-* never loads @kubernetes/client-node.
 */
import { Counter, Gauge, type Registry } from 'prom-client';
import { type K8sSettings, parseLabelSelector } from '../../config/k8s.ts';
import type { LogSink } from '../../log.ts';
import { defaultNamespace, K8sDiscovery, loadKubeConfig, type WorkerSink } from './discovery.ts';

export { K8sDiscovery, type WorkerSink } from './discovery.ts';

export type { K8sSettings } from '../../config/k8s.ts';

export const k8sEnabled = (s: Partial<K8sSettings>): boolean => s.k8sPool !== undefined || s.k8sSelector !== undefined;

/** Builds (does not start) the discovery the settings describe; throws a one-line Error when no credentials load. */
export function discoveryFromSettings(settings: K8sSettings, sink: WorkerSink, log: LogSink): K8sDiscovery {
  const kubeConfig = loadKubeConfig(settings.kubeconfig);
  return new K8sDiscovery({
    kubeConfig,
    namespace: settings.k8sNamespace ?? defaultNamespace(kubeConfig),
    ...(settings.k8sPool !== undefined
      ? { pool: { name: settings.k8sPool, group: settings.k8sPoolGroup } }
      : { selector: parseLabelSelector(settings.k8sSelector ?? '') }),
    defaults: { ports: settings.k8sPort, eventsPort: settings.k8sEventsPort, replayPort: settings.k8sReplayPort },
    sink,
    log,
  });
}

/** router_k8s_* series, read from the discovery's counters at scrape time. */
export function registerDiscoveryMetrics(discovery: K8sDiscovery, registry: Registry, prefix = ''): void {
  new Gauge({
    name: `${prefix}router_k8s_workers`,
    help: 'Workers currently discovered from Kubernetes (ready, selected pods).',
    registers: [registry],
    collect() {
      this.set(discovery.stats().workers);
    },
  });
  new Counter({
    name: `${prefix}router_k8s_bad_objects_total`,
    help: 'Kubernetes objects (pods, the InferencePool) ignored because they were malformed, by reason.',
    labelNames: ['reason'],
    registers: [registry],
    collect() {
      this.reset();
      for (const [reason, n] of Object.entries(discovery.stats().badObjects)) this.inc({ reason }, n);
    },
  });
  new Gauge({
    name: `${prefix}router_k8s_pods_not_routed`,
    help: 'Selected, ready pods that are no routing target, by reason (encode_only: llm-d.ai/role encode; they embed media, serve no generation).',
    labelNames: ['reason'],
    registers: [registry],
    collect() {
      for (const [reason, n] of Object.entries(discovery.stats().notRouted)) this.set({ reason }, n);
    },
  });
  const watchCounter = (name: string, key: 'relists' | 'errors' | 'bookmarks' | 'events' | 'badEvents', help: string) =>
    new Counter({
      name: `${prefix}${name}`,
      help,
      labelNames: ['resource'],
      registers: [registry],
      collect() {
        this.reset();
        const s = discovery.stats();
        if (s.pods) this.inc({ resource: 'pods' }, s.pods[key]);
        if (s.pool) this.inc({ resource: 'inferencepools' }, s.pool[key]);
      },
    });
  watchCounter('router_k8s_watch_events_total', 'events', 'Watch events applied (ADDED, MODIFIED, DELETED).');
  watchCounter('router_k8s_watch_bookmarks_total', 'bookmarks', 'Watch bookmarks received (resource version moved on).');
  watchCounter('router_k8s_relists_total', 'relists', 'Full relists after 410 Gone (the watched resource version was compacted).');
  watchCounter('router_k8s_watch_errors_total', 'errors', 'List or watch failures (retried with backoff).');
  watchCounter('router_k8s_bad_watch_events_total', 'badEvents', 'Watch lines without an event type and object (dropped).');
}
