/**
 * TensorRT-LLM's KV cache events. The held-out publisher writes its JSON by hand from TensorRT-LLM's documented
 * format (KVCacheEventSerializer: event_id, data {type ...}, window_size, attention_dp_rank), not with kvroute's
 * encoder, and drives the router through the same poll, decoder and ingest as a live worker; the overlaps the router
 * predicts must be what the engine holds after every event. Per-block cache_salt as newer releases send it (Dynamo's
 * tests of its forwarder, ai-dynamo/dynamo, index copy: `test_dispatch_kv_events_forwards_per_block_cache_salt`);
 * mm_keys as Dynamo's publisher reads them (components/src/dynamo/trtllm/publisher.py @0d38568995b5) with TensorRT-LLM's
 * start_offset (cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp `generateBlockHashExtraKeys`: how far into the item
 * the block starts).
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { KvRouter } from '../../src/core/router.ts';
import type { RouteRequest } from '../../src/core/types.ts';
import {
  encodeTrtllmEvents,
  parseJsonLossless,
  parseTrtllmEvents,
  TrtllmDecoder,
  type TrtllmEvent,
} from '../../src/engines/trtllm/events.ts';
import { SourceIngest } from '../../src/ingest/source-ingest.ts';
import { quietLog } from '../../src/log.ts';
import { TrtllmPoll } from '../../src/transport/trtllm-poll.ts';

const BS = 4;

/** A router with sources w0 and w0#1 fed through a TrtllmPoll's delivery path (no HTTP: bodies are handed in). */
function fleet(opts: { ranks?: number; storeOnlyTtlMs?: number } = {}) {
  const router = new KvRouter({ blockSize: BS, overlay: false, storeOnlyTtlMs: opts.storeOnlyTtlMs });
  const ranks = opts.ranks ?? 1;
  const ingests = new Map<number, SourceIngest>();
  const resets: string[] = [];
  for (let r = 0; r < ranks; r++) {
    const key = router.addSource({ workerId: 'w0', dpRank: r });
    ingests.set(
      r,
      new SourceIngest({
        source: { workerId: 'w0', dpRank: r },
        routerBlockSize: BS,
        sink: (k, events) => router.applyEvents(k, events),
        onReset: (k, reason) => {
          resets.push(`${k}:${reason}`);
          router.resetSource(k);
        },
        replay: null,
        log: quietLog,
      }),
    );
    expect(key).toBe(r === 0 ? 'w0' : `w0#${r}`);
  }
  const poll = new TrtllmPoll({ url: 'http://unused', ingests, routerBlockSize: BS, log: quietLog });
  let n = 0;
  const overlap = (tokens: number[], source = 'w0', extra: Partial<RouteRequest> = {}) => {
    const d = router.route({ requestId: `q${n++}`, tokens, ...extra }, 0);
    if (d.kind !== 'routed') throw new Error('refused');
    router.finish(d.requestId, { outcome: 'cancelled' }, 0);
    return d.candidates.find((c) => c.source === source)?.overlapBlocks ?? 0;
  };
  return { router, poll, ingests, resets, overlap };
}

const toks = (ids: number[]) => ids.map((t) => `{"type":"unique_token","token_id":${t},"token_extra_id":0}`).join(',');
const block = (hash: string, ids: number[], level = 0) =>
  `{"type":"stored_block","block_hash":${hash},"tokens":[${toks(ids)}],"cache_level":${level},"priority":35}`;

// Hashes as TensorRT-LLM writes them: unsigned 64-bit, most above 2^53 (a plain JSON.parse would round them).
const H = ['18446744073709551557', '18446744073709551533', '12345678901234567891', '9223372036854775837', '17', '18446744073709551615'];
const P = '13835058055282163729'; // the partial block

describe('lossless JSON', () => {
  it('keeps 64-bit integers exact, leaves strings, floats and small numbers alone', () => {
    const v = parseJsonLossless(
      '{"h":18446744073709551557,"n":-9223372036854775808,"s":"12345678901234567891","f":1.5e300,"g":12345678901234567.5,"x":42,"e":"\\"99999999999999999\\""}',
    ) as Record<string, unknown>;
    expect(v).toEqual({
      h: '18446744073709551557',
      n: '-9223372036854775808',
      s: '12345678901234567891',
      f: 1.5e300,
      g: Number('12345678901234567.5'), // a float: left to JSON.parse, never quoted
      x: 42,
      e: '"99999999999999999"',
    });
    expect(() => parseJsonLossless('{"a":')).toThrow(SyntaxError);
  });

  it('agrees with JSON.parse on any JSON of safe numbers (property)', () => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 4 }), (value) => {
        const text = JSON.stringify(value);
        const safe = JSON.stringify(value, (_k, x) => (typeof x === 'number' && Math.abs(x) >= 1e15 ? 0 : x));
        expect(parseJsonLossless(safe)).toEqual(JSON.parse(safe));
        expect(() => parseJsonLossless(text)).not.toThrow();
      }),
      { numRuns: 300 },
    );
  });
});

describe('held-out TensorRT-LLM publisher', () => {
  it('created, stored (full and partial blocks), other windows, removed, level moves and priorities: predicted = held', () => {
    const { router, poll, overlap, ingests } = fleet();
    const A = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];
    const prompt = [...A, 99];
    // The engine starts: one created event per attention window (a sliding-window layer group at 512).
    poll.deliver(
      '[{"event_id":0,"data":{"type":"created","num_blocks_per_cache_level":[1024,256]},"window_size":4096},' +
        '{"event_id":1,"data":{"type":"created","num_blocks_per_cache_level":[1024,256]},"window_size":512}]',
    );
    expect(overlap(prompt)).toBe(0);
    // A prompt of 14 tokens: three full blocks and the partial last one.
    poll.deliver(
      `[{"event_id":2,"data":{"type":"stored","parent_hash":null,"blocks":[${block(H[0], A.slice(0, 4))},${block(H[1], A.slice(4, 8))},` +
        `${block(H[2], A.slice(8, 12))},${block(P, A.slice(12, 14))}]},"window_size":4096},` +
        // The sliding-window layers announce the same tokens under their own ids: not the prefix the engine reuses.
        `{"event_id":3,"data":{"type":"stored","parent_hash":null,"blocks":[${block('5', A.slice(0, 4))}]},"window_size":512}]`,
    );
    expect(overlap(prompt)).toBe(3);
    // Decoding filled the block: a new full block, and the partial one is freed (never indexed: not unknown either).
    poll.deliver(
      `[{"event_id":4,"data":{"type":"stored","parent_hash":${H[2]},"blocks":[${block(H[3], A.slice(12, 16))}]},"window_size":4096},` +
        `{"event_id":5,"data":{"type":"removed","block_hashes":[${P}]},"window_size":4096},` +
        `{"event_id":6,"data":{"type":"removed","block_hashes":[5]},"window_size":512}]`,
    );
    expect(overlap(prompt)).toBe(4);
    expect(router.index.stats().blocks).toBe(4);
    // The last block moves to host memory (secondary pool), a priority changes: GPU holds three, host one.
    poll.deliver(
      `[{"event_id":7,"data":{"type":"updated","block_hash":${H[3]},"cache_level":{"type":"event_diff","new_value":1,"old_value":0},"priority":null},"window_size":4096},` +
        `{"event_id":8,"data":{"type":"updated","block_hash":${H[0]},"cache_level":null,"priority":{"type":"event_diff","new_value":90,"old_value":35}},"window_size":4096}]`,
    );
    expect(overlap(prompt)).toBe(3);
    const seq = router.route({ requestId: 'tier', tokens: prompt }, 0);
    if (seq.kind !== 'routed') throw new Error('refused');
    expect(router.tiers.overlap(0, seq.seqHashes, 3)).toEqual({ host: 1, disk: 0, remote: 0 });
    router.finish('tier', { outcome: 'cancelled' }, 0);
    // Evictions: the GPU's third block, then the host copy.
    poll.deliver(`[{"event_id":9,"data":{"type":"removed","block_hashes":[${H[2]}]},"window_size":4096}]`);
    expect(overlap(prompt)).toBe(2);
    poll.deliver(`[{"event_id":10,"data":{"type":"removed","block_hashes":[${H[3]}]},"window_size":4096}]`);
    expect(router.tiers.blocks(0)).toBe(0);
    const h = ingests.get(0)!.health();
    expect(h.resets).toBe(0);
    expect(h.malformedEvents).toBe(0);
    expect(h.decodeErrors).toBe(0);
  });

  it('token_extra_id: not hashable from tokens alone (skipped, counted); mm_keys: a multimodal block, no plain-token match; lora: isolated by adapter', () => {
    const { poll, overlap, ingests } = fleet();
    const A = [1, 2, 3, 4, 5, 6, 7, 8];
    const extra = `{"type":"stored_block","block_hash":${H[1]},"tokens":[${A.slice(4, 8)
      .map((t, i) => `{"type":"unique_token","token_id":${t},"token_extra_id":${i === 0 ? 77 : 0}}`)
      .join(',')}],"cache_level":0,"priority":35}`;
    poll.deliver(`[{"event_id":0,"data":{"type":"stored","parent_hash":null,"blocks":[${block(H[0], A.slice(0, 4))},${extra}]}}]`);
    // Without window_size (older releases) every event counts; the block with an extra token id and its children do not.
    expect(overlap([...A, 9])).toBe(1);
    const mm = `{"type":"stored_block","block_hash":${H[2]},"tokens":[${toks([20, 21, 22, 23])}],"cache_level":0,"priority":35,"mm_keys":[{"type":"mm_key","hash":"ab12","start_offset":0}]}`;
    poll.deliver(`[{"event_id":1,"data":{"type":"stored","parent_hash":null,"blocks":[${mm}]}}]`);
    expect(overlap([20, 21, 22, 23, 24])).toBe(0);
    expect(ingests.get(0)!.health().multimodalBlocks).toBe(2);
    // A LoRA block: under the adapter's seed, not the base model's.
    poll.deliver(
      `[{"event_id":2,"data":{"type":"stored","parent_hash":null,"lora_name":"sql","blocks":[${block(H[3], [30, 31, 32, 33]).replace('"cache_level"', '"lora_id":3,"cache_level"')}]}}]`,
    );
    expect(overlap([30, 31, 32, 33, 34])).toBe(0);
  });

  it('attention-DP ranks go to their own source; a lost event (buffer overflow) and a restart reset only that rank', () => {
    const { poll, overlap, resets } = fleet({ ranks: 2 });
    const A = [1, 2, 3, 4, 5, 6, 7, 8];
    const ev = (id: number, rank: number, hash: string, parent: string, ids: number[]) =>
      `{"event_id":${id},"attention_dp_rank":${rank},"data":{"type":"stored","parent_hash":${parent},"blocks":[${block(hash, ids)}]},"window_size":4096}`;
    poll.deliver(
      `[${ev(0, 0, H[0], 'null', A.slice(0, 4))},${ev(0, 1, H[1], 'null', A.slice(0, 4))},${ev(1, 1, H[2], H[1], A.slice(4, 8))}]`,
    );
    expect(overlap([...A, 9], 'w0')).toBe(1);
    expect(overlap([...A, 9], 'w0#1')).toBe(2);
    // Rank 1's events 2..4 were dropped by the engine's full buffer: its index is stale, so it is reset.
    poll.deliver(`[${ev(5, 1, H[3], 'null', [40, 41, 42, 43])}]`);
    expect(resets).toEqual(['w0#1:gap_without_replay']);
    expect(overlap([...A, 9], 'w0#1')).toBe(0);
    expect(overlap([40, 41, 42, 43, 44], 'w0#1')).toBe(1);
    expect(overlap([...A, 9], 'w0')).toBe(1);
    // Rank 0 restarts: its ids begin at 0 again.
    poll.deliver(`[${ev(0, 0, H[4], 'null', [50, 51, 52, 53])}]`);
    expect(resets).toEqual(['w0#1:gap_without_replay', 'w0:restart']);
    expect(overlap([...A, 9], 'w0')).toBe(0);
    expect(overlap([50, 51, 52, 53, 54], 'w0')).toBe(1);
    // A rank the worker does not have is counted, not crashed.
    poll.deliver(`[${ev(9, 7, H[5], 'null', A.slice(0, 4))}]`);
    expect(poll.counters.unknownRankEvents).toBe(1);
  });

  it('the encoder the mock engine uses writes what the hand-built frames say', () => {
    const events: TrtllmEvent[] = [
      { eventId: 0, windowSize: 4096, data: { type: 'created', numBlocksPerCacheLevel: [10, 0] } },
      {
        eventId: 1,
        windowSize: 4096,
        data: {
          type: 'stored',
          parentHash: null,
          blocks: [{ blockHash: BigInt(H[0]), tokens: [1, 2, 3, 4], cacheLevel: 0, priority: 35 }],
        },
      },
      { eventId: 2, windowSize: 4096, data: { type: 'removed', blockHashes: [BigInt(H[0])] } },
    ];
    const text = encodeTrtllmEvents(events);
    expect(text).toContain(`"block_hash":${H[0]},`);
    expect(text).toContain(`"block_hashes":[${H[0]}]`);
    const parsed = parseTrtllmEvents(text);
    if (!parsed.ok) throw new Error(parsed.error);
    const d = new TrtllmDecoder({ blockSize: BS });
    const out = parsed.events.map((e) => d.decode(e).events);
    expect(out[1]).toEqual([
      {
        kind: 'stored',
        parent: null,
        engineIds: [BigInt(H[0])],
        tokens: [1, 2, 3, 4],
        blockSize: 4,
        loraName: null,
        cacheSalt: null,
        groupIdx: 0,
      },
    ]);
    expect(out[2]).toEqual([{ kind: 'removed', engineIds: [BigInt(H[0])], groupIdx: 0 }]);
  });
});

describe('per-block cache_salt and mm_keys', () => {
  const salted = (hash: string, ids: number[], salt: string) =>
    block(hash, ids).replace('"cache_level"', `"cache_salt":"${salt}","cache_level"`);

  it('a per-block cache_salt starts a salted chain: unsalted requests with the same prefix are not credited', () => {
    const { poll, overlap, ingests } = fleet();
    const A = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
    poll.deliver(
      `[{"event_id":0,"data":{"type":"stored","parent_hash":null,"blocks":[${salted(H[0], A.slice(0, 4), 'tenant-a')},${salted(H[1], A.slice(4, 8), 'tenant-a')}]}}]`,
    );
    expect(overlap([...A, 99])).toBe(0);
    expect(overlap([...A, 99], 'w0', { cacheSalt: 'tenant-b' })).toBe(0);
    expect(overlap([...A, 99], 'w0', { cacheSalt: 'tenant-a' })).toBe(2);
    // A later event of the same sequence (its parent salted) continues the salted chain, salted or not on the wire.
    poll.deliver(`[{"event_id":1,"data":{"type":"stored","parent_hash":${H[1]},"blocks":[${block(H[2], A.slice(8, 12))}]}}]`);
    expect(overlap([...A, 99], 'w0', { cacheSalt: 'tenant-a' })).toBe(3);
    expect(overlap([...A, 99])).toBe(0);
    // A salt that changes mid-event cannot be on this chain: cut there, counted.
    poll.deliver(
      `[{"event_id":2,"data":{"type":"stored","parent_hash":null,"blocks":[${block(H[3], [40, 41, 42, 43])},${salted(H[4], [44, 45, 46, 47], 'x')}]}}]`,
    );
    expect(overlap([40, 41, 42, 43, 44, 45, 46, 47, 48])).toBe(1);
    expect(ingests.get(0)!.health().resets).toBe(0);
  });

  it('mm_keys become the multimodal block keys: the same image matches, another image or none does not', () => {
    const { poll, overlap, ingests } = fleet();
    const hex = 'ab'.repeat(32);
    // Text 0-1, an image in positions 2-7 (6 placeholder tokens), text 8-11: the image starts inside block 0.
    const tokens = [1, 2, 9, 9, 9, 9, 9, 9, 3, 4, 5, 6];
    const mmBlock = (hash: string, ids: number[], start: number) =>
      block(hash, ids).replace('"cache_level"', `"mm_keys":[{"type":"mm_key","hash":"${hex}","start_offset":${start}}],"cache_level"`);
    poll.deliver(
      `[{"event_id":0,"data":{"type":"stored","parent_hash":null,"blocks":[${mmBlock(H[0], tokens.slice(0, 4), 0)},${mmBlock(H[1], tokens.slice(4, 8), 2)},` +
        `${block(H[2], tokens.slice(8, 12))}]}}]`,
    );
    const item = (identifier: string) => ({ mmItems: [{ identifier, offset: 2, length: 6 }] });
    expect(overlap([...tokens, 7], 'w0', item(`sha256:${hex}`))).toBe(3);
    expect(overlap([...tokens, 7], 'w0', item(`sha256:${'cd'.repeat(32)}`))).toBe(0);
    expect(overlap([...tokens, 7])).toBe(0);
    // The same image one token later in the block is another key (its place in the block is part of the identity).
    expect(
      overlap([1, 2, 3, ...tokens.slice(2, 8), 4, 5, 6, 7], 'w0', { mmItems: [{ identifier: `sha256:${hex}`, offset: 3, length: 6 }] }),
    ).toBe(0);
    expect(ingests.get(0)!.health().multimodalBlocks).toBe(0);
  });

  it('an item that starts in a block the event does not continue gives no place: that block and the rest are skipped, counted', () => {
    const { poll, overlap, ingests } = fleet();
    const mm = block(H[1], [9, 9, 9, 9]).replace(
      '"cache_level"',
      '"mm_keys":[{"type":"mm_key","hash":"ab","start_offset":0}],"cache_level"',
    );
    poll.deliver(`[{"event_id":0,"data":{"type":"stored","parent_hash":null,"blocks":[${block(H[0], [1, 2, 3, 4])},${mm}]}}]`);
    expect(overlap([1, 2, 3, 4, 9, 9, 9, 9, 5])).toBe(1);
    expect(ingests.get(0)!.health().multimodalBlocks).toBe(1);
    // A malformed key (no hex hash) drops the event, counted as a bad extra key.
    const bad = block(H[2], [5, 6, 7, 8]).replace('"cache_level"', '"mm_keys":[{"type":"mm_key","hash":7}],"cache_level"');
    poll.deliver(`[{"event_id":1,"data":{"type":"stored","parent_hash":null,"blocks":[${bad}]}}]`);
    expect(overlap([5, 6, 7, 8, 9])).toBe(0);
    expect(ingests.get(0)!.health().badExtraKeys).toBe(1);
  });
});

describe('the poll against an older trtllm-serve', () => {
  it('a server that drains its queue then holds the reply ~2 s (get_kv_cache_events_async(2)) loses no drained batch', async () => {
    // As the handler does (NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_server.py @e7f7345e31e5 `get_kv_cache_events`,
    // get_kv_cache_events_async(2)): take what is queued, wait up to
    // 2 s, answer with it. A poll aborted at 2 s would drop the events the server had already taken.
    const queue: string[] = [];
    const server = createServer((req, res) => {
      req.resume();
      const drained = queue.splice(0);
      setTimeout(() => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(`[${drained.join(',')}]`);
      }, 2100);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    try {
      const { router, ingests, resets } = fleet();
      const poll = new TrtllmPoll({
        url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
        ingests,
        routerBlockSize: BS,
        log: quietLog,
      });
      const A = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
      queue.push(
        `{"event_id":0,"data":{"type":"stored","parent_hash":null,"blocks":[${block(H[0], A.slice(0, 4))},${block(H[1], A.slice(4, 8))}]}}`,
      );
      await poll.pollOnce();
      queue.push(`{"event_id":1,"data":{"type":"stored","parent_hash":${H[1]},"blocks":[${block(H[2], A.slice(8, 12))}]}}`);
      await poll.pollOnce();
      expect(poll.counters.pollFailures).toBe(0);
      expect(poll.counters.events).toBe(2);
      expect(resets).toEqual([]);
      expect(router.index.stats().blocks).toBe(3);
    } finally {
      await new Promise<void>((r) => server.close(() => r()));
    }
  }, 20_000);
});

describe('bad input: counted, never thrown', () => {
  it('bodies that are not a list of events, events without ids, fields of the wrong type', () => {
    const { poll, ingests } = fleet();
    poll.deliver('not json');
    poll.deliver('{"event_id":0}');
    poll.deliver('[1, {"event_id":"x","data":{}}, {"event_id":0}]');
    poll.deliver(
      '[{"event_id":0,"data":{"type":"stored","parent_hash":"zz","blocks":[]}},' +
        '{"event_id":1,"data":{"type":"stored","parent_hash":null,"blocks":[{"block_hash":1,"tokens":[{"token_id":-1}]}]}},' +
        '{"event_id":2,"data":{"type":"removed","block_hashes":[1.5]}},' +
        '{"event_id":3,"data":{"type":"updated","block_hash":1,"cache_level":{"old_value":"a"}}},' +
        '{"event_id":4,"data":{"type":"mystery"}},' +
        '{"event_id":5,"data":{"type":"stored","parent_hash":null,"blocks":[]},"window_size":"big"}]',
    );
    const h = ingests.get(0)!.health();
    expect(h.decodeErrorsByCause.undecodable).toBe(2 + 3);
    expect(h.decodeErrorsByCause.malformed_event).toBe(5);
    expect(h.decodeErrorsByCause.unknown_event_type).toBe(1);
  });

  it('random event lists and random damage never throw; every event is applied or counted (property)', () => {
    const hash = fc.oneof(fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }), fc.constant(-1n), fc.string({ maxLength: 3 }));
    const token = fc.oneof(
      fc.record({
        type: fc.constant('unique_token'),
        token_id: fc.integer({ min: 0, max: 1000 }),
        token_extra_id: fc.constantFrom(0, 0, 0, 5),
      }),
      fc.anything(),
    );
    const data = fc.oneof(
      fc.record({
        type: fc.constant('stored'),
        parent_hash: fc.oneof(fc.constant(null), hash),
        blocks: fc.array(
          fc.record({
            block_hash: hash,
            tokens: fc.array(token, { maxLength: 6 }),
            cache_level: fc.constantFrom(0, 1, 2, -1),
            lora_id: fc.constantFrom(null, 0, 2),
          }),
          { maxLength: 4 },
        ),
      }),
      fc.record({ type: fc.constant('removed'), block_hashes: fc.array(hash, { maxLength: 4 }) }),
      fc.record({
        type: fc.constant('updated'),
        block_hash: hash,
        cache_level: fc.oneof(
          fc.constant(null),
          fc.record({ old_value: fc.integer({ min: 0, max: 2 }), new_value: fc.integer({ min: 0, max: 2 }) }),
        ),
      }),
      fc.record({ type: fc.constantFrom('created', 'other'), window_size: fc.anything() }),
      fc.anything(),
    );
    const event = fc.record({
      event_id: fc.oneof(fc.nat({ max: 40 }), fc.anything()),
      data,
      window_size: fc.constantFrom(undefined, 4096, 512),
    });
    fc.assert(
      fc.property(fc.array(event, { maxLength: 12 }), fc.integer({ min: 0, max: 200 }), (events, cut) => {
        const { poll, ingests } = fleet();
        const text = JSON.stringify(events, (_k, v) => (typeof v === 'bigint' ? `\u0000${v}` : v)).replace(/"\\u0000(-?\d+)"/g, '$1');
        expect(() => poll.deliver(text)).not.toThrow();
        expect(() => poll.deliver(text.slice(0, cut))).not.toThrow();
        const h = ingests.get(0)!.health();
        expect(Number.isFinite(h.decodeErrors + h.malformedEvents + h.unknownEventTypes)).toBe(true);
      }),
      { numRuns: 300 },
    );
  });
});
