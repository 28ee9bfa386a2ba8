/** Maps the engine model's events to vLLM's wire events (src/engines/vllm.ts encodes them). */
import type { HashType, WireEvent } from '../engines/vllm/events.ts';
import { engineIdBytes, type EngineEvent } from './engine/index.ts';

/** u64/i64 carry the engine id (the encoder signs it for i64); bytes carries its 32-byte form (engineIdBytes). */
export function toWireEvents(events: readonly EngineEvent[], hashType: HashType): WireEvent[] {
  const bytes = hashType === 'bytes';
  const ids = (xs: readonly bigint[]) => (bytes ? xs.map(engineIdBytes) : xs.slice());
  return events.map((e): WireEvent => {
    if (e.kind === 'removed') {
      return { type: 'BlockRemoved', blockHashes: ids(e.engineIds), medium: e.medium, groupIdx: e.groupIdx ?? 0 };
    }
    return {
      type: 'BlockStored',
      blockHashes: ids(e.engineIds),
      parentBlockHash: e.parent === null ? null : bytes ? engineIdBytes(e.parent) : e.parent,
      tokenIds: e.tokens,
      blockSize: e.blockSize,
      loraId: e.loraId,
      medium: e.medium,
      loraName: e.loraName,
      extraKeys: e.extraKeys as unknown[],
      groupIdx: e.groupIdx ?? 0,
      kvCacheSpecKind: e.groupKind ?? 'full_attention',
      ...(e.slidingWindow !== undefined ? { kvCacheSpecSlidingWindow: e.slidingWindow } : {}),
    };
  });
}
