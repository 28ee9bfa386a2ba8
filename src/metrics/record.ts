/**
 * The traffic recorder's family (`--record FILE`, src/runtime/recorder.ts): requests written, requests not recorded
 * (by reason), bytes on disk and rotations. A drop never delays a request: it is counted here instead.
 */
import { Counter, type Registry } from 'prom-client';

/** Why a request was not recorded. */
export type RecordDropReason = 'buffer_full' | 'write_error' | 'too_large' | 'pending_overflow';
export const RECORD_DROP_REASONS: readonly RecordDropReason[] = ['buffer_full', 'write_error', 'too_large', 'pending_overflow'];

export class RecordMetrics {
  private readonly written: Counter;
  private readonly dropped: Counter<'reason'>;
  private readonly bytes: Counter;
  private readonly rotations: Counter;

  constructor(registry: Registry, prefix: string) {
    const registers = [registry];
    this.written = new Counter({
      name: `${prefix}router_record_requests_total`,
      help: 'Requests written to the --record file (one line each, no text: hashes, lengths, tenant, priority, session, model).',
      registers,
    });
    this.dropped = new Counter({
      name: `${prefix}router_record_dropped_total`,
      help:
        'Finished requests not recorded, by reason: buffer_full (--record-buffer-bytes of lines were waiting for the disk), ' +
        'write_error (the file could not be written), too_large (one line larger than --record-max-bytes), pending_overflow ' +
        '(more requests in flight than the recorder tracks).',
      labelNames: ['reason'] as const,
      registers,
    });
    for (const reason of RECORD_DROP_REASONS) this.dropped.inc({ reason }, 0);
    this.bytes = new Counter({
      name: `${prefix}router_record_bytes_total`,
      help: 'Bytes written to the --record files (after gzip when the name ends in .gz), headers included.',
      registers,
    });
    this.rotations = new Counter({
      name: `${prefix}router_record_rotations_total`,
      help: 'Rotations of the --record file (at --record-max-bytes, and at start when FILE already existed).',
      registers,
    });
  }

  recorded(n: number): void {
    this.written.inc(n);
  }

  drop(reason: RecordDropReason, n = 1): void {
    this.dropped.inc({ reason }, n);
  }

  wrote(bytes: number): void {
    this.bytes.inc(bytes);
  }

  rotated(): void {
    this.rotations.inc();
  }
}
