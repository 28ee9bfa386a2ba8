/**
 * TensorRT-LLM's disagg_request_id, as the router mints it: an int64 the context and generation servers pair the
 * legs by, so it must be unique across router replicas. A Snowflake id, the idea of TensorRT-LLM's own global ids
 * (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/disagg_utils.py `get_global_disagg_request_id`, with another bit split): 41
 * bits of ms since 2023-01-01, 10 bits of machine id (one per replica: --disagg-machine-id), 12 bits of counter; 63
 * bits, positive, and above 2^40 (where TensorRT-LLM's local ids end) for any clock past 2023-01-01 00:04:23. The timestamp never
 * goes back (a clock step back reuses the last one) and a counter overflow borrows the next ms, so one replica never
 * repeats an id.
 */
import { randomBytes } from 'node:crypto';

export class DisaggRequestIds {
  static readonly EPOCH_MS = Date.UTC(2023, 0, 1);
  private lastMs = -1;
  private counter = 0;

  constructor(
    private readonly machineId: number,
    private readonly now: () => number = Date.now,
  ) {
    if (!Number.isInteger(machineId) || machineId < 0 || machineId > 1023)
      throw new RangeError(`machine id must be in [0, 1023], got ${machineId}`);
  }

  next(): bigint {
    let ms = Math.max(0, Math.floor(this.now() - DisaggRequestIds.EPOCH_MS));
    if (ms <= this.lastMs) {
      ms = this.lastMs;
      if (++this.counter > 4095) {
        ms++;
        this.counter = 0;
      }
    } else this.counter = 0;
    this.lastMs = ms;
    return (BigInt(ms) << 22n) | (BigInt(this.machineId) << 12n) | BigInt(this.counter);
  }
}

/** A replica's machine id from its --replica-id (FNV-1a, 10 bits), or a random one without it. */
export function disaggMachineIdOf(replicaId: string | undefined): number {
  if (replicaId === undefined) return randomBytes(2).readUInt16BE() & 1023;
  let h = 0x811c9dc5;
  for (let i = 0; i < replicaId.length; i++) h = Math.imul(h ^ replicaId.charCodeAt(i), 0x01000193);
  return (h >>> 0) & 1023;
}
