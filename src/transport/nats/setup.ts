/**
 * Idempotent creation of kvroute's JetStream resources (every relay and replica calls it; the first one creates).
 */
import type { NatsConnection } from '@nats-io/transport-node';
import { DiscardPolicy, jetstreamManager, RetentionPolicy, StorageType, type JetStreamManager } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import { Objm, type ObjectStore } from '@nats-io/obj';
import { LEASE_BUCKET, REGISTRY_BUCKET, SNAPSHOT_BUCKET, STREAM, SUBJECT_PREFIX } from './protocol.ts';

export interface StreamLimits {
  /** Events older than this are dropped by the server even if no snapshot covers them. Default 1 h. */
  readonly maxAgeMs?: number;
  /** Cap on the stream's stored bytes (oldest dropped first). Default 1 GiB. */
  readonly maxBytes?: number;
  /** Window in which a retried message id is recognised as a duplicate. Default 2 min. */
  readonly duplicateWindowMs?: number;
  /** JetStream replicas of the stream and buckets (3 on a NATS cluster). Default 1. */
  readonly replicas?: number;
}

export interface EventPlane {
  readonly jsm: JetStreamManager;
  readonly registry: KV;
  readonly lease: KV;
  readonly snapshots: ObjectStore;
}

const ms = (v: number) => Math.round(v * 1e6); // JetStream durations are nanoseconds

export async function ensureEventPlane(nc: NatsConnection, limits: StreamLimits = {}): Promise<EventPlane> {
  const jsm = await jetstreamManager(nc);
  const config = {
    name: STREAM,
    subjects: [`${SUBJECT_PREFIX}.>`],
    retention: RetentionPolicy.Limits,
    storage: StorageType.File,
    discard: DiscardPolicy.Old,
    max_age: ms(limits.maxAgeMs ?? 3_600_000),
    max_bytes: limits.maxBytes ?? 1024 ** 3,
    duplicate_window: ms(limits.duplicateWindowMs ?? 120_000),
    num_replicas: limits.replicas ?? 1,
  };
  try {
    await jsm.streams.info(STREAM);
  } catch {
    try {
      await jsm.streams.add(config);
    } catch (err) {
      // Another process created it between our info and add.
      await jsm.streams.info(STREAM).catch(() => {
        throw err;
      });
    }
  }
  const kvm = new Kvm(nc);
  const replicas = limits.replicas ?? 1;
  const registry = await kvm.create(REGISTRY_BUCKET, { history: 1, replicas });
  const lease = await kvm.create(LEASE_BUCKET, { history: 1, replicas });
  const snapshots = await new Objm(nc).create(SNAPSHOT_BUCKET, { replicas });
  return { jsm, registry, lease, snapshots };
}
