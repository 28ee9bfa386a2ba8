/**
 * Kubernetes discovery: ready pods of an InferencePool (`--k8s-pool`) or of a label selector (`--k8s-selector`) become
 * workers, unready, deleted or relabelled ones leave. The shell watches (list-watch.ts), the pure functions of pods.ts
 * say what each object means, and the difference reaches the worker table through a `WorkerSink`: for `serve` the
 * same WorkerSet add/remove the admin API calls (in-flight requests of a leaving worker finish; the index drops its
 * blocks). A pod is one worker per target port of the pool. Malformed objects are counted by reason and logged once
 * per object and cause; they never stop the watch. Well-formed pods that are no routing target (llm-d's encode-only
 * role) are counted (a gauge, by reason) and logged once.
 */
import { CoreV1Api, CustomObjectsApi, KubeConfig, Watch } from '@kubernetes/client-node';
import { existsSync, readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import type { WorkerSpec } from '../../config/worker-spec.ts';
import type { LogSink } from '../../log.ts';
import { type LabelSelector, POOL_GROUPS, type PoolGroup } from '../../config/k8s.ts';
import { ListWatch, type ListWatchStats } from './list-watch.ts';
import {
  BadObject,
  type BadObjectReason,
  diffWorkers,
  type PodDefaults,
  type PoolTarget,
  podName,
  podVerdict,
  poolTarget,
  specKey,
} from './pods.ts';

/** Where discovered workers go: for `serve`, the WorkerSet behind POST/DELETE /admin/workers. */
export interface WorkerSink {
  add(spec: WorkerSpec): Promise<void>;
  remove(id: string): Promise<void>;
}

export interface K8sDiscoveryOptions {
  readonly kubeConfig: KubeConfig;
  readonly namespace: string;
  /** Exactly one of pool and selector. */
  readonly pool?: { readonly name: string; readonly group: PoolGroup };
  readonly selector?: LabelSelector;
  readonly defaults: PodDefaults;
  readonly sink: WorkerSink;
  readonly log: LogSink;
  readonly backoff?: { readonly initialMs: number; readonly maxMs: number };
  readonly timeoutSeconds?: number;
}

export interface K8sDiscoveryStats {
  readonly workers: number;
  readonly pods: ListWatchStats | null;
  readonly pool: ListWatchStats | null;
  readonly badObjects: Readonly<Record<BadObjectReason, number>>;
  /** Pods that are well-formed but no routing target (llm-d's encode-only role), by reason: as of now, not a total. */
  readonly notRouted: Readonly<Record<NotRoutedReason, number>>;
  readonly added: number;
  readonly removed: number;
  readonly sinkErrors: number;
}

/** Why a selected, ready pod is no worker. */
export type NotRoutedReason = 'encode_only';

const SA_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';

/** The kubeconfig: a file (--kubeconfig), else $KUBECONFIG, ~/.kube/config or the pod's service account. */
export function loadKubeConfig(file?: string): KubeConfig {
  const kc = new KubeConfig();
  if (file) kc.loadFromFile(file);
  else {
    // client-node falls back to an unauthenticated http://localhost:8080 when it finds nothing: refuse that instead.
    const found = Boolean(process.env.KUBECONFIG) || existsSync(join(homedir(), '.kube', 'config')) || existsSync(SA_TOKEN);
    if (!found) {
      throw new Error('no Kubernetes credentials: set --kubeconfig, $KUBECONFIG, ~/.kube/config, or run in a pod with a service account');
    }
    kc.loadFromDefault();
  }
  if (!kc.getCurrentCluster()) {
    throw new Error(
      file
        ? `kubeconfig ${file} names no current cluster`
        : 'no Kubernetes credentials: set --kubeconfig, $KUBECONFIG, ~/.kube/config, or run in a pod with a service account',
    );
  }
  return kc;
}

const SA_NAMESPACE = '/var/run/secrets/kubernetes.io/serviceaccount/namespace';

/** The namespace watched: the setting, else the kubeconfig context's, else the pod's own, else "default". */
export function defaultNamespace(kc: KubeConfig): string {
  const fromContext = kc.getContextObject(kc.getCurrentContext())?.namespace;
  if (fromContext) return fromContext;
  try {
    const ns = readFileSync(SA_NAMESPACE, 'utf8').trim();
    if (ns) return ns;
  } catch {
    // not in a pod
  }
  return 'default';
}

function sumStats(a: ListWatchStats, b: ListWatchStats | undefined): ListWatchStats {
  const out = { ...a };
  if (b) for (const k of Object.keys(out) as (keyof ListWatchStats)[]) out[k] += b[k];
  return out;
}

const BAD_REASONS: readonly BadObjectReason[] = ['not_an_object', 'no_name', 'bad_annotation', 'bad_label', 'bad_pool_spec'];

export class K8sDiscovery {
  private readonly watch: Watch;
  private readonly core: CoreV1Api;
  private readonly custom: CustomObjectsApi;
  private readonly pods = new Map<string, unknown>();
  /** Workers this discovery added, by id: their spec key. */
  private readonly applied = new Map<string, string>();
  private target: PoolTarget | null = null;
  private podWatch: ListWatch | null = null;
  private poolWatch: ListWatch | null = null;
  private chain: Promise<void> = Promise.resolve();
  private targetChain: Promise<void> = Promise.resolve();
  private stopped = false;
  private readonly logged = new Set<string>();
  private readonly bad: Record<BadObjectReason, number> = Object.fromEntries(BAD_REASONS.map((r) => [r, 0])) as Record<
    BadObjectReason,
    number
  >;
  /** Selected, ready pods that are no routing target, by reason (as of the last reconcile). */
  private notRouted: Record<NotRoutedReason, number> = { encode_only: 0 };
  private added = 0;
  private removed = 0;
  private sinkErrors = 0;
  private podsSynced = false;
  /** Counters of pod watches replaced by a new pool selector, so the series never go down. */
  private readonly retired: ListWatchStats = { lists: 0, relists: 0, watches: 0, events: 0, bookmarks: 0, errors: 0, badEvents: 0 };

  constructor(private readonly opts: K8sDiscoveryOptions) {
    if (Boolean(opts.pool) === Boolean(opts.selector)) throw new Error('K8sDiscovery needs exactly one of pool and selector');
    this.watch = new Watch(opts.kubeConfig);
    this.core = opts.kubeConfig.makeApiClient(CoreV1Api);
    this.custom = opts.kubeConfig.makeApiClient(CustomObjectsApi);
  }

  /**
   * True once the pods have been listed (and, with a pool, the pool found) and the workers of that first list are in
   * the worker table: readiness must not say SERVING while the sink is still adding them (a gateway would get 503s).
   */
  get synced(): boolean {
    return this.podsSynced;
  }

  /** Starts watching; resolves once the first pod list is applied (with a pool: once the pool exists and its pods are listed). */
  async start(): Promise<void> {
    if (this.opts.selector) {
      this.target = { selector: this.opts.selector, ports: this.opts.defaults.ports };
      await this.watchPods();
    } else {
      await this.watchPool();
    }
    await this.chain;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all([this.podWatch?.stop(), this.poolWatch?.stop()]);
    await this.chain;
  }

  stats(): K8sDiscoveryStats {
    return {
      workers: this.applied.size,
      pods: this.podWatch || this.retired.lists > 0 ? sumStats(this.retired, this.podWatch?.stats) : null,
      pool: this.poolWatch ? { ...this.poolWatch.stats } : null,
      badObjects: { ...this.bad },
      notRouted: { ...this.notRouted },
      added: this.added,
      removed: this.removed,
      sinkErrors: this.sinkErrors,
    };
  }

  private countBad(err: BadObject, subject: string): void {
    this.bad[err.reason]++;
    const key = `${subject}\u0000${err.message}`;
    if (this.logged.has(key)) return;
    if (this.logged.size > 10_000) this.logged.clear();
    this.logged.add(key);
    this.opts.log.warn({ object: subject, reason: err.reason }, `kubernetes object ignored: ${err.message}`);
  }

  // --- the InferencePool ---------------------------------------------------------------------------------------

  private async watchPool(): Promise<void> {
    const { name, group } = this.opts.pool!;
    const version = POOL_GROUPS[group].version;
    const ns = this.opts.namespace;
    const fieldSelector = `metadata.name=${name}`;
    let poolSeen: () => void = () => {};
    const found = new Promise<void>((r) => {
      poolSeen = r;
    });
    const apply = (obj: unknown | null) => {
      let next: PoolTarget | null = null;
      if (obj !== null) {
        try {
          next = poolTarget(obj, group);
        } catch (err) {
          if (!(err instanceof BadObject)) throw err;
          this.countBad(err, `InferencePool ${ns}/${name}`);
          next = null; // a pool we cannot read selects nothing
        }
      }
      // Serialised: a pool event arriving while the pod watch restarts waits for it.
      this.targetChain = this.targetChain
        .then(() => this.setTarget(next))
        .then(poolSeen, (err: unknown) => {
          this.opts.log.error({ err: String(err) }, 'kubernetes discovery: applying the pool failed');
        });
    };
    this.poolWatch = new ListWatch({
      watch: this.watch,
      path: `/apis/${group}/${version}/namespaces/${encodeURIComponent(ns)}/inferencepools`,
      query: { fieldSelector },
      list: async () => {
        const list = (await this.custom.listNamespacedCustomObject({
          group,
          version,
          namespace: ns,
          plural: 'inferencepools',
          fieldSelector,
        })) as { items?: unknown[]; metadata?: { resourceVersion?: string } };
        return { items: Array.isArray(list?.items) ? list.items : [], resourceVersion: list?.metadata?.resourceVersion ?? '' };
      },
      onSync: (items) => {
        const pool = items.find((p) => (p as { metadata?: { name?: unknown } })?.metadata?.name === name);
        if (!pool) this.opts.log.warn({ pool: name, namespace: ns, group }, 'InferencePool not found: no workers until it exists');
        apply(pool ?? null);
      },
      onEvent: (type, obj) => {
        if ((obj as { metadata?: { name?: unknown } }).metadata?.name !== name) return;
        apply(type === 'DELETED' ? null : obj);
      },
      onError: (err, attempt, wait) => this.watchError('InferencePool', err, attempt, wait),
      backoff: this.opts.backoff,
      timeoutSeconds: this.opts.timeoutSeconds,
    });
    await this.poolWatch.start();
    await found;
  }

  /** A new pool target: restarts the pod watch when the selector changed, re-derives every worker otherwise. */
  private async setTarget(next: PoolTarget | null): Promise<void> {
    const prev = this.target;
    this.target = next;
    if (!next) {
      await this.retirePodWatch();
      this.pods.clear();
      await this.reconcile();
      this.podsSynced = true;
      return;
    }
    if (!this.podWatch || prev?.selector.text !== next.selector.text) {
      await this.retirePodWatch();
      if (this.stopped) return;
      await this.watchPods();
    } else this.reconcile();
    await this.chain;
  }

  private async retirePodWatch(): Promise<void> {
    const w = this.podWatch;
    if (!w) return;
    this.podWatch = null;
    await w.stop();
    Object.assign(this.retired, sumStats(this.retired, w.stats));
  }

  // --- the pods --------------------------------------------------------------------------------------------------

  private async watchPods(): Promise<void> {
    const ns = this.opts.namespace;
    const labelSelector = this.target!.selector.text;
    const watch = new ListWatch({
      watch: this.watch,
      path: `/api/v1/namespaces/${encodeURIComponent(ns)}/pods`,
      query: labelSelector ? { labelSelector } : {},
      list: async () => {
        const list = await this.core.listNamespacedPod({ namespace: ns, ...(labelSelector ? { labelSelector } : {}) });
        return { items: list.items ?? [], resourceVersion: list.metadata?.resourceVersion ?? '' };
      },
      onSync: (items) => {
        this.pods.clear();
        for (const obj of items) this.remember('ADDED', obj);
        // Synced once this list's workers are applied, not when it arrives (the sink's add is asynchronous).
        const applied = this.reconcile();
        if (!this.podsSynced)
          void applied.then(() => {
            this.podsSynced = true;
          });
      },
      onEvent: (type, obj) => {
        this.remember(type, obj);
        this.reconcile();
      },
      onError: (err, attempt, wait) => this.watchError('pods', err, attempt, wait),
      backoff: this.opts.backoff,
      timeoutSeconds: this.opts.timeoutSeconds,
    });
    this.podWatch = watch;
    await watch.start();
  }

  private remember(type: 'ADDED' | 'MODIFIED' | 'DELETED', obj: unknown): void {
    let name: string;
    try {
      name = podName(obj);
    } catch (err) {
      if (err instanceof BadObject) this.countBad(err, 'pod');
      return;
    }
    if (type === 'DELETED') this.pods.delete(name);
    else this.pods.set(name, obj);
  }

  private watchError(what: string, err: Error, attempt: number, waitMs: number): void {
    const status = (err as { statusCode?: number; code?: number }).statusCode ?? (err as { code?: number }).code;
    const msg = `kubernetes ${what} watch failed (${status ?? err.message}): retrying in ${waitMs} ms`;
    if (attempt <= 3 || attempt % 10 === 0) this.opts.log.warn({ attempt, error: err.message }, msg);
  }

  /** The desired worker set from the pods known now, applied as a difference (serialised: add/remove are async). */
  private reconcile(): Promise<void> {
    const desired = new Map<string, WorkerSpec>();
    const target = this.target;
    const notRouted: Record<NotRoutedReason, number> = { encode_only: 0 };
    if (target) {
      for (const [name, obj] of this.pods) {
        try {
          const v = podVerdict(obj, target.selector, this.opts.defaults, this.opts.pool ? target : undefined);
          if (v.kind === 'worker') {
            for (const spec of v.specs) desired.set(spec.id!, spec);
            if (v.warning) this.logOnce(`ports\u0000${name}`, { pod: name }, `pod ${this.opts.namespace}/${name}: ${v.warning}`, 'warn');
          } else if (v.reason === 'encode_only') {
            notRouted.encode_only++;
            this.logOnce(
              `encode\u0000${name}`,
              { pod: name, reason: v.reason },
              `pod ${this.opts.namespace}/${name} is an encode-only worker (llm-d.ai/role): not a routing target`,
            );
          }
        } catch (err) {
          if (!(err instanceof BadObject)) throw err;
          this.countBad(err, `pod ${this.opts.namespace}/${name}`);
        }
      }
    }
    this.notRouted = notRouted;
    this.chain = this.chain.then(() => this.apply(desired));
    return this.chain;
  }

  /** Logs once per key (bounded, like countBad's). */
  private logOnce(key: string, fields: object, message: string, level: 'info' | 'warn' = 'info'): void {
    if (this.logged.has(key)) return;
    if (this.logged.size > 10_000) this.logged.clear();
    this.logged.add(key);
    this.opts.log[level](fields, message);
  }

  private async apply(desired: ReadonlyMap<string, WorkerSpec>): Promise<void> {
    const { remove, add } = diffWorkers(this.applied, desired);
    for (const id of remove) {
      this.applied.delete(id);
      try {
        await this.opts.sink.remove(id);
        this.removed++;
        this.opts.log.info({ worker: id }, 'worker left (pod deleted, unready or no longer selected)');
      } catch (err) {
        this.sinkErrors++;
        this.opts.log.warn({ worker: id, error: (err as Error).message }, 'could not remove a discovered worker');
      }
    }
    for (const spec of add) {
      try {
        await this.opts.sink.add(spec);
        this.applied.set(spec.id!, specKey(spec));
        this.added++;
        this.opts.log.info(
          { worker: spec.id, url: spec.url, events: spec.events ?? null, role: spec.role ?? null },
          'worker joined (pod ready)',
        );
      } catch (err) {
        this.sinkErrors++;
        this.opts.log.warn({ worker: spec.id, error: (err as Error).message }, 'could not add a discovered worker');
      }
    }
  }
}
