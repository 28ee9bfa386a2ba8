/**
 * Mock vLLM engine model: pure, synchronous, clock-injected. The live mocker (src/mocker/server.ts) and the fleet
 * simulator drive the same class.
 *
 * Usage:
 *   const engine = new MockEngine({ blockSize: 16, numGpuBlocks: 4096, maxNumSeqs: 256, maxNumBatchedTokens: 8192,
 *                                   maxModelLen: 32768, timing: DEFAULT_POLYNOMIAL, vocabSize: 32000, seed: 0 });
 *   engine.addRequest({ requestId, promptTokens, maxTokens, loraName?, cacheSalt?, seed? }, nowMs); // throws EngineInputError
 *   let t = 0;
 *   while (engine.hasWork()) {
 *     const r = engine.step(t);      // one scheduler step that starts at t (engine-clock ms)
 *     // r.outputs / r.events become visible at t + r.durationMs; call the next step then.
 *     t += r.durationMs;
 *   }
 *
 * step(now) -> { durationMs, events, outputs, scheduledRequests, scheduledTokens, preempted }
 * - outputs: per request that produced a token this step: newTokens (one token), firstToken, finished
 *   (finishReason 'length' after maxTokens), promptTokens, completionTokens, cachedTokens (prefix hit at first
 *   scheduling, vLLM's num_cached_tokens), arrivalMs, firstTokenMs (= end of the step that produced it).
 * - events: EngineStoredEvent / EngineRemovedEvent in order. Stored events are structurally core `StoredEvent`s
 *   (kind, parent, engineIds, tokens, blockSize, loraName, cacheSalt, medium) and can be fed to KvIndex.apply as they are;
 *   they also carry vLLM's extraKeys/loraId, and routerSeqHashes for tests.
 *   toWireEvents in ../events.ts is the shell's mapping to vLLM's wire events.
 * - Engine block ids come from their own chain (engineBlockId: xxh3 over parent id, tokens, extra keys, another seed):
 *   they are NOT the router's hash, so a router must map engine id -> own hash as with real vLLM. engineIdBytes(id) is
 *   the 32-byte form announced with hash type "bytes" (its low 64 bits are the id).
 *
 * Model (vLLM v1): paged KV blocks with refcounts; freed blocks stay cached in an LRU free queue and are evicted only when
 * a new block is needed; a request's prefix hit is its longest cached prefix of full blocks, at most floor((n-1)/bs)
 * blocks (the last prompt token is always computed). Scheduler: running requests first (decode = 1 token, prefill
 * chunks up to the token budget), then waiting ones FCFS up to maxNumSeqs / maxNumBatchedTokens; when blocks run out the
 * last running request is preempted (recompute: its blocks are freed, it goes back to the front of the queue). Blocks
 * are cached as they fill, including with generated tokens (the KV of the last sampled token is computed next step).
 * Output tokens are a stateless hash of (seed, index): deterministic per request (expectedOutputTokens predicts them).
 *
 * Counters (engine.counters): prefixCacheQueries / prefixCacheHits in tokens (first scheduling only, recomputes after
 * preemption excluded, so they equal the sums of promptTokens / cachedTokens reported per request), promptTokens,
 * generationTokens, preemptions, requestsFinished, ... ; gauges numRunning, numWaiting, kvUsage, cachedBlocks.
 * dump() lists every cached block with engineId, parentEngineId, router seqHash, lora/salt, refCount (its tokens are in
 * its BlockStored event); cachedSeqHashes() is the set of router hashes cached. abort(id) frees a request; reset() is a
 * silent restart (no AllBlocksCleared). checkInvariants() throws on broken refcounts (tests).
 * Host tier (config.hostBlocks > 0, host-tier.ts): an exclusive LRU level of N blocks behind the GPU cache; evicted GPU
 * blocks move there (announced Stored on medium "CPU" before the GPU Removed), a prefix look-up continues there and the
 * run found is loaded back (Removed on "CPU"); loaded tokens count in cachedTokens and counters.hostHitTokens, not in
 * prefixCacheHits (vLLM counts connector loads apart). Loads cost no step time.
 * Simplification vs vLLM: one physical block per hash (a block computed twice concurrently is shared, not announced
 * twice); blocks freed without a hash are reused first. Prefix-cache stats only with prefix caching on.
 */
export {
  MockEngine,
  HOST_MEDIUM,
  EngineInputError,
  DEFAULT_ENGINE_CONFIG,
  expectedOutputTokens,
  outputToken,
  engineBlockId,
  engineIdBytes,
  type EngineConfig,
  type EngineRequest,
  type EngineEvent,
  type EngineStoredEvent,
  type EngineRemovedEvent,
  type RequestOutput,
  type StepResult,
  type EngineCounters,
  type DumpBlock,
} from './engine.ts';
export { BlockPool, type BlockIdentity } from './cache.ts';
export {
  DEFAULT_POLYNOMIAL,
  DEFAULT_FIRST_PRINCIPLES,
  stepDurationMs,
  type TimingModel,
  type PolynomialTiming,
  type FirstPrinciplesTiming,
  type StepWork,
} from './timing.ts';
