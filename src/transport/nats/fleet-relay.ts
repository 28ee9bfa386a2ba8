/**
 * `kvroute relay --k8s-*`: one NatsRelay per discovered worker, over one NATS connection. Discovery (src/discovery/k8s)
 * calls `add` when a pod becomes a worker and `remove` when it leaves; a worker that leaves is deregistered, so router
 * replicas drop it at once. At shutdown the relays stop without deregistering (a restarted relay resumes them).
 */
import { connect, type NatsConnection } from '@nats-io/transport-node';
import type { WorkerSpec } from '../../config/worker-spec.ts';
import { DEFAULT_ENGINE, engineAdapter } from '../../engines/index.ts';
import type { LogSink } from '../../log.ts';
import { NatsRelay, type RelayOptions } from './relay.ts';
import { checkWorkerId } from './protocol.ts';

export type FleetRelayDefaults = Pick<RelayOptions, 'blockSize' | 'topic' | 'heartbeatMs' | 'limits'> & {
  /** Model published for workers whose pod names none. */
  readonly model?: string | null;
};

interface Entry {
  readonly relay: NatsRelay;
  readonly started: Promise<void>;
}

export class FleetRelay {
  private nc: NatsConnection | null = null;
  private readonly relays = new Map<string, Entry>();

  constructor(
    private readonly servers: string[],
    private readonly defaults: FleetRelayDefaults,
    private readonly log: LogSink,
  ) {}

  async start(): Promise<void> {
    this.nc = await connect({
      servers: this.servers,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 250,
      waitOnFirstConnect: true,
      name: 'kvroute-relay-fleet',
    });
  }

  get size(): number {
    return this.relays.size;
  }

  stats(): Record<string, ReturnType<NatsRelay['stats']>> {
    return Object.fromEntries([...this.relays].map(([id, e]) => [id, e.relay.stats()]));
  }

  /** Starts relaying a discovered worker (its start runs in the background: an engine still starting must not block the others). */
  async add(spec: WorkerSpec): Promise<void> {
    const id = spec.id ?? new URL(spec.url).host;
    const bad = checkWorkerId(id);
    if (bad) throw new Error(`cannot relay pod ${id}: ${bad}`);
    const polled = !spec.events && engineAdapter(spec.engine).events.httpPoll;
    if (!spec.events && !polled) throw new Error(`cannot relay pod ${id}: it publishes no KV events (kvroute.io/events-port is 0)`);
    if (this.relays.has(id)) throw new Error(`worker "${id}" is already relayed`);
    const relay = new NatsRelay({
      nc: this.nc!,
      workerId: id,
      // An engine polled over HTTP (TensorRT-LLM) without a ZMQ publisher: the relay polls its URL.
      events: spec.events,
      replay: spec.replay ?? null,
      dpRanks: spec.dp ?? 1,
      model: spec.models?.[0] ?? this.defaults.model ?? null,
      url: spec.url,
      blockSize: this.defaults.blockSize,
      flavor: spec.engine ?? DEFAULT_ENGINE,
      role: spec.role,
      bootstrapPort: spec.bootstrap,
      topic: this.defaults.topic,
      heartbeatMs: this.defaults.heartbeatMs,
      limits: this.defaults.limits,
      log: this.log,
    });
    const started = relay.start().catch((err: unknown) => {
      this.log.error({ worker: id, err: String(err) }, 'relay of a discovered worker could not start');
    });
    this.relays.set(id, { relay, started });
  }

  /** Stops relaying a worker that left and deregisters it (replicas drop it). */
  async remove(id: string): Promise<void> {
    const entry = this.relays.get(id);
    if (!entry) return;
    this.relays.delete(id);
    await entry.started;
    await entry.relay.close({ deregister: true });
  }

  /** Stops every relay, keeping their registry entries (a restarted relay resumes), then the connection. */
  async close(drainMs = 2000): Promise<void> {
    const all = [...this.relays.values()];
    this.relays.clear();
    await Promise.all(
      all.map(async (e) => {
        await e.started;
        await e.relay.close({ drainMs });
      }),
    );
    await this.nc?.close().catch(() => {});
  }
}
