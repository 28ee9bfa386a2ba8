/**
 * Glue between a NatsReplica and the shells that drive a KvRouter, without changing them:
 *
 * - `shareLifecycle(router, replica)` observes the router's request lifecycle so every local request is announced to
 *   the peer replicas (remote requests, tracked under `<peer>/<id>`, are never re-announced);
 * - `attachToServer(running, options)` makes a running `kvroute serve` or `kvroute epp` (their shared composition) a replica: lifecycle sharing, one session
 *   table (session pins announced to and learned from the peers), and workers from
 *   the NATS registry added to / removed from its WorkerSet (their sources kept in events mode: their events come
 *   from the stream, not from a ZMQ subscription of the server).
 */
import type { KvRouter } from '../core/router.ts';
import type { RouterCore } from './compose.ts';
import { registerReplicaMetrics } from '../transport/nats/metrics.ts';
import { NatsReplica, type ReplicaOptions } from '../transport/nats/replica.ts';
import type { WorkerEntry } from '../transport/nats/protocol.ts';

export function shareLifecycle(router: KvRouter, replica: NatsReplica): () => void {
  // The replica announces only requests it routed itself (peers' requests are tracked under `<peer>/<id>`).
  return router.observe({
    routed: (d) => replica.routed(d),
    firstToken: (id) => replica.firstToken(id),
    finished: (f) => replica.finished(f.requestId),
  });
}

/** What a replica attaches to: the composition `kvroute serve` and `kvroute epp` share (compose.ts). */
export type Attachable = Pick<RouterCore, 'router' | 'workers' | 'dispatcher' | 'lifecycle' | 'metrics'>;

/** Starts a replica for a running server; resolves when it is ready (snapshot loaded, stream caught up). */
export async function attachToServer(running: Attachable, options: ReplicaOptions): Promise<NatsReplica> {
  const { router, workers } = running;
  let chain = Promise.resolve();
  const apply = async (id: string, entry: WorkerEntry | null) => {
    if (!entry) {
      await workers.remove(id);
      return;
    }
    if (!entry.url) return; // no HTTP endpoint to proxy to: its blocks are indexed, requests cannot go there
    if (workers.get(id)) await workers.remove(id); // URL, model or ranks changed
    // Events mode: these workers' KV events come from the stream, not from a ZMQ subscription of this server.
    await workers.add(
      {
        id,
        url: entry.url,
        dp: entry.dpRanks.length,
        models: entry.model ? [entry.model] : undefined,
        role: entry.role,
        engine: entry.engine,
        bootstrap: entry.bootstrapPort,
      },
      { mode: 'events' },
    );
  };
  const replica = new NatsReplica({
    ...options,
    onWorker: (id, entry) => {
      // Serialised: WorkerSet.add/remove are async and must not interleave for one worker.
      chain = chain.then(() => apply(id, entry)).catch(() => {});
      options.onWorker?.(id, entry);
    },
    // One session table across replicas: a peer's pin is honoured here, ours are announced to the peers.
    onSession: (sessionId, sourceKey, expiresAt) => {
      running.dispatcher.rememberSession(sessionId, { sourceKey, expiresAt });
      options.onSession?.(sessionId, sourceKey, expiresAt);
    },
  });
  running.lifecycle.onDispatch((a) => {
    if (a.session) replica.publishSession(a.session.id, a.session.entry.sourceKey, a.session.entry.expiresAt);
  });
  shareLifecycle(router, replica);
  registerReplicaMetrics(replica, running.metrics.registry, running.metrics.prefix);
  await replica.start(router);
  await chain;
  return replica;
}
