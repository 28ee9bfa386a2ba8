/**
 * Prometheus series of a replica's NATS event plane, read from its counters at scrape time (no hot-path cost).
 * Register on the server's registry: `registerReplicaMetrics(replica, running.metrics.registry)`.
 */
import { Counter, Gauge, type Registry } from 'prom-client';
import type { NatsReplica, ReplicaStats } from './replica.ts';

type CounterKey = { [K in keyof ReplicaStats]: ReplicaStats[K] extends number ? K : never }[keyof ReplicaStats];

const COUNTERS: ReadonlyArray<readonly [string, CounterKey, string]> = [
  ['router_nats_messages_total', 'messages', 'Event stream messages applied (each carries one source\u2019s engine batches and resets).'],
  ['router_nats_bad_messages_total', 'badMessages', 'Event stream messages dropped: undecodable or on a subject that names no source.'],
  ['router_nats_bad_events_total', 'badEvents', 'Events dropped from otherwise valid messages because they could not be decoded.'],
  ['router_nats_blocks_applied_total', 'blocksApplied', 'Blocks applied to the index from the event stream (stored and removed).'],
  [
    'router_nats_blocks_rejected_total',
    'blocksRejected',
    'Blocks from the event stream the index rejected (unknown parent, duplicate, ...).',
  ],
  [
    'router_nats_resets_total',
    'resets',
    'Reset markers applied: a source\u2019s blocks cleared because its relay lost track of the engine.',
  ],
  [
    'router_nats_stream_gaps_total',
    'streamGaps',
    'Times stream messages this replica needed were gone (retention or purge): resynchronised.',
  ],
  [
    'router_nats_stream_discontinuities_total',
    'streamDiscontinuities',
    'Times the stream went back (messages this replica applied lost or their sequences reused, e.g. nats-server killed before it flushed): consumed again from the last message both agree on.',
  ],
  [
    'router_nats_resync_requests_total',
    'resyncRequests',
    'Rebuilds asked of relays for workers whose index here is incomplete (degraded).',
  ],
  ['router_nats_disconnects_total', 'disconnects', 'Times the replica lost NATS and routed on its current view (degraded).'],
  [
    'router_nats_lifecycle_published_total',
    'lifecyclePublished',
    'Messages published to peer replicas on the load subject: frames of lifecycle steps, single steps, heartbeats.',
  ],
  [
    'router_nats_lifecycle_frames_total',
    'lifecycleFrames',
    'Frames published to peer replicas (one message carrying a turn\u2019s lifecycle steps).',
  ],
  [
    'router_nats_lifecycle_steps_total',
    'lifecycleSteps',
    'Request lifecycle steps (routed, first token, finished, session pin) published to peer replicas, in frames or alone.',
  ],
  [
    'router_nats_lifecycle_dropped_total',
    'lifecycleDropped',
    'Load messages or frames from peer replicas that could not be decoded (dropped).',
  ],
  ['router_nats_lifecycle_publish_errors_total', 'lifecyclePublishErrors', 'Lifecycle messages that could not be published.'],
  ['router_nats_remote_requests_total', 'remoteAdded', 'Requests routed by peer replicas folded into this replica\u2019s active load.'],
  ['router_nats_remote_expired_total', 'remoteExpired', 'Peer requests freed because their replica went silent or left.'],
  ['router_nats_snapshots_written_total', 'snapshotsWritten', 'Index snapshots this replica wrote while holding the lease.'],
  ['router_nats_purged_messages_total', 'purged', 'Stream messages purged after a snapshot covered them.'],
  [
    'router_nats_snapshot_errors_total',
    'snapshotErrors',
    'Stored snapshots refused (unreadable, another format version, truncated, corrupt, another block size): the stream was replayed instead.',
  ],
  [
    'router_nats_workers_removed_total',
    'workersRemoved',
    'Workers removed because their registry entry was deleted or its heartbeat expired.',
  ],
];

export function registerReplicaMetrics(replica: NatsReplica, registry: Registry, prefix = ''): void {
  for (const [name, key, help] of COUNTERS) {
    let last = 0;
    new Counter({
      name: prefix + name,
      help,
      registers: [registry],
      collect() {
        const v = replica.stats()[key];
        if (v > last) this.inc(v - last);
        last = v;
      },
    });
  }
  const gauge = (name: string, help: string, read: (s: ReplicaStats) => number) =>
    new Gauge({
      name: prefix + name,
      help,
      registers: [registry],
      collect() {
        this.set(read(replica.stats()));
      },
    });
  gauge('router_nats_ready', '1 once the replica loaded the snapshot and caught up with the event stream.', (s) => (s.ready ? 1 : 0));
  gauge('router_nats_degraded', '1 while NATS is unreachable and the replica routes on its current view.', (s) => (s.degraded ? 1 : 0));
  gauge('router_nats_applied_stream_seq', 'Last event stream sequence applied to the index.', (s) => s.appliedSeq);
  gauge('router_nats_snapshot_stream_seq', 'Stream sequence covered by the last snapshot loaded or written here.', (s) => s.snapshotSeq);
  gauge('router_nats_peers', 'Peer replicas heard from and not yet expired.', (s) => s.peers);
  gauge(
    'router_nats_snapshot_write_seconds',
    'Duration of the last snapshot write (index copy, export in steps, upload, purge).',
    (s) => s.snapshotWriteMs / 1000,
  );
  gauge(
    'router_nats_snapshot_longest_step_seconds',
    'Longest synchronous piece of the last snapshot write (the index copy, or one export step): routing waited at most this long.',
    (s) => s.snapshotLongestStepMs / 1000,
  );
  gauge('router_nats_snapshot_load_seconds', 'Duration of the snapshot load at start.', (s) => s.snapshotLoadMs / 1000);
}
