/** Maps the engine model's events to vLLM's wire events (src/engines/vllm.ts encodes them). */
import type { HashType, WireEvent } from '../engines/vllm.ts';
import type { EngineEvent } from './engine/index.ts';

/** u64/i64 carry the engine id (the encoder signs it for i64); bytes carries the full 32-byte sha256 digest. */
export function toWireEvents(events: readonly EngineEvent[], hashType: HashType): WireEvent[] {
  const bytes = hashType === 'bytes';
  return events.map((e): WireEvent => {
    if (e.kind === 'removed') {
      return { type: 'BlockRemoved', blockHashes: bytes ? e.digests : e.engineIds, medium: e.medium, groupIdx: 0 };
    }
    return {
      type: 'BlockStored',
      blockHashes: bytes ? e.digests : e.engineIds,
      parentBlockHash: bytes ? e.parentDigest : e.parent,
      tokenIds: e.tokens,
      blockSize: e.blockSize,
      loraId: e.loraId,
      medium: e.medium,
      loraName: e.loraName,
      extraKeys: e.extraKeys,
      groupIdx: 0,
      kvCacheSpecKind: 'full_attention',
    };
  });
}
