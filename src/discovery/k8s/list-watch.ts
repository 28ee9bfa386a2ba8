/**
 * Informer-style list + watch of one Kubernetes collection through @kubernetes/client-node: list (the full set and
 * its resourceVersion), then watch from that version with bookmarks; every event and bookmark moves the version on,
 * so a dropped stream resumes where it stopped. 410 Gone (an HTTP 410, or an ERROR event with code 410: the version
 * was compacted away) relists, and the full set replaces the old one (objects gone meanwhile are reported deleted).
 * Other failures back off exponentially (with jitter) and retry; nothing here throws past `start()`.
 *
 * client-node's own ListWatch stops at the first error and asks for no bookmarks, hence this loop around its Watch.
 */
import type { Watch } from '@kubernetes/client-node';

export interface KubeObject {
  metadata?: { name?: unknown; resourceVersion?: unknown } & Record<string, unknown>;
  [k: string]: unknown;
}

export interface ListResult {
  readonly items: readonly unknown[];
  readonly resourceVersion: string;
}

export interface ListWatchStats {
  lists: number;
  relists: number;
  watches: number;
  events: number;
  bookmarks: number;
  errors: number;
  /** Watch lines that were not an event with an object (dropped). */
  badEvents: number;
}

export interface ListWatchOptions {
  readonly watch: Watch;
  /** The collection's API path, e.g. /api/v1/namespaces/ns/pods. */
  readonly path: string;
  readonly list: () => Promise<ListResult>;
  /** Extra query parameters of the watch (labelSelector, fieldSelector), the same the list uses. */
  readonly query?: Readonly<Record<string, string>>;
  /** The full set after a (re)list: replaces everything known. */
  readonly onSync: (items: readonly unknown[]) => void;
  readonly onEvent: (type: 'ADDED' | 'MODIFIED' | 'DELETED', obj: unknown) => void;
  readonly onError?: (err: Error, attempt: number, retryInMs: number) => void;
  /** Server-side watch timeout: the server ends the stream after it and the watch resumes (default 300 s). */
  readonly timeoutSeconds?: number;
  readonly backoff?: { readonly initialMs: number; readonly maxMs: number };
}

class Gone extends Error {}

export class ListWatch {
  readonly stats: ListWatchStats = { lists: 0, relists: 0, watches: 0, events: 0, bookmarks: 0, errors: 0, badEvents: 0 };
  private resourceVersion = '';
  private stopped = false;
  private controller: AbortController | null = null;
  private wake: (() => void) | null = null;
  private loop: Promise<void> | null = null;
  private syncedOnce = false;
  /** Whether the last watch got its 200 (the stream was established) before it ended. */
  private connected = false;
  private readonly synced: Promise<void>;
  private resolveSynced!: () => void;

  constructor(private readonly opts: ListWatchOptions) {
    this.synced = new Promise((r) => {
      this.resolveSynced = r;
    });
  }

  /** Starts the loop; resolves after the first successful list. */
  start(): Promise<void> {
    this.loop ??= this.run();
    return this.synced;
  }

  get hasSynced(): boolean {
    return this.syncedOnce;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.controller?.abort();
    this.wake?.();
    await this.loop;
  }

  private async run(): Promise<void> {
    let failures = 0;
    while (!this.stopped) {
      try {
        if (!this.resourceVersion) await this.relist();
        const received = await this.watchOnce();
        // A stream the server ended cleanly resumes at once; one that ended without a single line backs off, so a
        // server closing every watch at once is not hammered.
        failures = received > 0 ? 0 : failures + 1;
        if (failures > 0) await this.sleep(this.delay(failures));
      } catch (err) {
        if (this.stopped) break;
        // A stream that was established and then broke starts the backoff over: only failures in a row grow it.
        if (this.connected) failures = 0;
        if (err instanceof Gone || (err as { statusCode?: number }).statusCode === 410) {
          this.resourceVersion = '';
          this.stats.relists++;
          continue;
        }
        failures++;
        this.stats.errors++;
        const wait = this.delay(failures);
        this.opts.onError?.(err as Error, failures, wait);
        await this.sleep(wait);
      }
    }
  }

  private async relist(): Promise<void> {
    const list = await this.opts.list();
    this.stats.lists++;
    this.resourceVersion = list.resourceVersion;
    this.opts.onSync(list.items);
    if (!this.syncedOnce) {
      this.syncedOnce = true;
      this.resolveSynced();
    }
  }

  /** One watch stream; resolves with the number of lines received when it ends cleanly. */
  private watchOnce(): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      let lines = 0;
      let gone = false;
      let failed: Error | null = null;
      const query = {
        ...this.opts.query,
        resourceVersion: this.resourceVersion,
        allowWatchBookmarks: 'true',
        timeoutSeconds: String(this.opts.timeoutSeconds ?? 300),
      };
      this.stats.watches++;
      const onLine = (type: unknown, obj: unknown) => {
        lines++;
        const o = obj as KubeObject | undefined;
        if (typeof type !== 'string' || typeof o !== 'object' || o === null) {
          this.stats.badEvents++;
          return;
        }
        if (type === 'ERROR') {
          const code = (o as { code?: unknown }).code;
          if (code === 410) gone = true;
          else failed = new Error(`watch ERROR event: ${String((o as { message?: unknown }).message ?? code)}`);
          this.controller?.abort(); // the server closes the stream after an ERROR; do not wait for it
          return;
        }
        const rv = o.metadata?.resourceVersion;
        if (type === 'BOOKMARK') {
          this.stats.bookmarks++;
          if (typeof rv === 'string' && rv) this.resourceVersion = rv;
          return;
        }
        if (type !== 'ADDED' && type !== 'MODIFIED' && type !== 'DELETED') {
          this.stats.badEvents++;
          return;
        }
        this.stats.events++;
        this.opts.onEvent(type, o);
        if (typeof rv === 'string' && rv) this.resourceVersion = rv;
      };
      let ended = false;
      this.connected = false;
      const done = (err: unknown) => {
        ended = true;
        this.controller = null;
        if (gone) reject(new Gone('resource version expired'));
        else if (failed) reject(failed);
        else if (err && !this.stopped && (err as Error).name !== 'AbortError') reject(err as Error);
        else resolve(lines);
      };
      this.opts.watch
        .watch(this.opts.path, query, onLine, done)
        .then((controller) => {
          // client-node resolves after the response head; a request that failed has called done() by then.
          if (ended) return;
          this.connected = true;
          this.controller = controller;
          if (this.stopped) controller.abort();
        })
        .catch(done);
    });
  }

  /** 2^n backoff from initialMs up to maxMs, with up to 20% jitter so replicas do not retry in step. */
  private delay(failures: number): number {
    const { initialMs, maxMs } = this.opts.backoff ?? { initialMs: 250, maxMs: 30_000 };
    const base = Math.min(maxMs, initialMs * 2 ** Math.min(failures - 1, 20));
    return Math.round(base * (1 - Math.random() * 0.2));
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.wake = null;
        resolve();
      }, ms);
      this.wake = () => {
        clearTimeout(timer);
        this.wake = null;
        resolve();
      };
    });
  }
}
