/**
 * A held-out publisher: msgpack frames built by hand (msgpack-hand.ts, not msgpackr) from vLLM's documented event
 * format, with hybrid cache groups (group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window) and multimodal
 * extra keys ((identifier, offset) pairs), drive the decoder, the per-source annotator and the router. The overlaps the
 * router predicts must be the hits vLLM's hybrid coordinator would deliver for what was published (worked out in the
 * comments from SlidingWindowManager / MambaManager / _gen_mm_extra_hash_keys).
 */
import { describe, expect, it } from 'vitest';
import { KvRouter } from '../../src/core/router.ts';
import type { MmItem } from '../../src/core/types.ts';
import { decodeVllmBatch } from '../../src/engines/vllm/events.ts';
import { SourceAnnotator } from '../../src/ingest/annotate.ts';
import { type HandValue, hand } from './msgpack-hand.ts';

const BS = 16;
const prompt = (blocks: number, extra: number, base = 100) => Array.from({ length: blocks * BS + extra }, (_, i) => base + i);
const id = (g: string, b: number) => BigInt(`0x${g}${b.toString(16).padStart(4, '0')}`) + (1n << 63n); // >= 2^63: uint64 on the wire

function harness() {
  const router = new KvRouter({ blockSize: BS, overlay: false });
  router.addSource({ workerId: 'vllm', dpRank: 0 });
  const annotator = new SourceAnnotator(BS);
  let n = 0;
  return {
    router,
    annotator,
    publish(batch: HandValue) {
      const d = decodeVllmBatch(hand(batch));
      expect(d.ok).toBe(true);
      const r = router.applyEvents('vllm', annotator.process(d));
      expect(r.rejected).toBe(0);
      return d;
    },
    overlap(tokens: number[], mmItems?: MmItem[]) {
      const req = `q${n++}`;
      const d = router.route({ requestId: req, tokens, mmItems }, 0);
      if (d.kind !== 'routed') throw new Error(d.reason);
      router.finish(req, {}, 0);
      return d.overlapBlocks;
    },
  };
}

/** A positional BlockStored: [tag, hashes, parent, tokens, block_size, lora_id, medium, lora_name, extra_keys, group_idx, kind, window]. */
function storedArray(p: number[], from: number, to: number, g: number, kind: string, window: number | null, prefix = 'a'): HandValue {
  const hashes = Array.from({ length: to - from }, (_, k) => id(prefix, from + k));
  return [
    'BlockStored',
    hashes,
    from === 0 ? null : id(prefix, from - 1),
    p.slice(from * BS, to * BS),
    BS,
    null,
    'GPU',
    null,
    null,
    g,
    kind,
    window,
  ];
}

describe('held-out publisher: hybrid groups and multimodal keys from hand-built vLLM frames', () => {
  it('gpt-oss layout (group 0 sliding window 128 tokens, group 1 full attention), array layout', () => {
    const h = harness();
    const p = prompt(20, 5);
    h.publish([
      1.0,
      [
        storedArray(p, 0, 10, 1, 'full_attention', null),
        storedArray(p, 0, 10, 0, 'sliding_window', 128),
        storedArray(p, 10, 20, 1, 'full_attention', null),
        storedArray(p, 10, 20, 0, 'sliding_window', 128),
      ],
      0,
    ]);
    // The sliding-window group freed blocks 0..9 (outside the window) and they were evicted.
    h.publish([2.0, [['BlockRemoved', Array.from({ length: 10 }, (_, b) => id('a', b)), 'GPU', 0]], 0]);
    // Same prompt: cap floor(324 / 16) = 20; full attention holds 20; the window (cdiv(127, 16) = 8 blocks) [12, 20)
    // is held: vLLM reuses 20 blocks.
    expect(h.overlap(p)).toBe(20);
    // 15 shared blocks: full attention 15; the sliding group holds 10..14 only, never 8 in a row, and not block 0:
    // SlidingWindowManager finds no window and no leading run: 0.
    expect(h.overlap([...p.slice(0, 15 * BS), ...prompt(2, 3, 90_000)])).toBe(0);
    // A model with one group would have predicted 15 there: that is the over-prediction this avoids.
    expect(h.router.index.findMatches(h.router.hashRequest(p.slice(0, 15 * BS)))[0]).toBe(15);
  });

  it('mamba state only where it was saved; a parent the state group never stored resolves through group 0 (map layout)', () => {
    const h = harness();
    const p = prompt(20, 1);
    const ev = (from: number, to: number, g: number, kind: string): HandValue => ({
      type: 'BlockStored',
      block_hashes: Array.from({ length: to - from }, (_, k) => id('b', from + k)),
      parent_block_hash: from === 0 ? null : id('b', from - 1),
      token_ids: p.slice(from * BS, to * BS),
      block_size: BS,
      lora_id: null,
      medium: 'GPU',
      lora_name: null,
      extra_keys: null,
      group_idx: g,
      kv_cache_spec_kind: kind,
      kv_cache_spec_sliding_window: null,
      locality: 'LOCAL',
      session_id: 'sess-1',
    });
    h.publish({ ts: 1, events: [ev(0, 20, 0, 'full_attention'), ev(9, 10, 1, 'mamba'), ev(19, 20, 1, 'mamba')], data_parallel_rank: 0 });
    expect(h.router.groups.groupsOf(0).groups).toEqual([{ group: 1, kind: 'mamba' }]);
    expect(h.overlap(p)).toBe(20); // state at 20 (block 19), cap floor(320 / 16) = 20
    expect(h.overlap(p.slice(0, 15 * BS + 1))).toBe(10); // full 15; MambaManager: last state at or before 15 is at 10
    expect(h.overlap(p.slice(0, 9 * BS + 1))).toBe(0); // no state at or before 9
    h.publish([3, [['BlockRemoved', [id('b', 9)], 'GPU', 1]]]);
    expect(h.overlap(p.slice(0, 15 * BS + 1))).toBe(0);
  });

  it('multimodal extra keys: the same image matches, another image with the same tokens never does', () => {
    const h = harness();
    // A 20-token image at offset 21: block 1 [16, 32) carries (img, 5), block 2 [32, 48) carries (img, -11).
    const p = prompt(4, 1);
    for (let t = 21; t < 41; t++) p[t] = 151655; // the processor's placeholder tokens
    const keys = (img: string): HandValue => [null, [[img, 5]], [[img, -11]], null];
    h.publish([
      1,
      [
        [
          'BlockStored',
          [id('c', 0), id('c', 1), id('c', 2), id('c', 3)],
          null,
          p.slice(0, 4 * BS),
          BS,
          null,
          'GPU',
          null,
          keys('sha256:aaaa'),
        ],
      ],
    ]);
    const item = (identifier: string): MmItem[] => [{ identifier, offset: 21, length: 20 }];
    expect(h.overlap(p, item('sha256:aaaa'))).toBe(4);
    expect(h.overlap(p, item('sha256:bbbb'))).toBe(1); // the text block before the image only
    expect(h.overlap(p)).toBe(1); // no image identity at all: never the image blocks
    // The same image one token later is another prompt (offsets differ), as in vLLM.
    expect(h.overlap(p, [{ identifier: 'sha256:aaaa', offset: 22, length: 19 }])).toBe(1);
  });

  it('unusable group fields and multimodal pairs are counted by cause, never thrown', () => {
    const p = prompt(1, 0);
    const d = decodeVllmBatch(
      hand([
        1,
        [
          ['BlockStored', [1n], null, p, BS, null, 'GPU', null, null, -1],
          ['BlockStored', [2n], null, p, BS, null, 'GPU', null, null, 1, 42],
          ['BlockStored', [3n], null, p, BS, null, 'GPU', null, null, 1, 'sliding_window', 'wide'],
          ['BlockStored', [4n], null, p, BS, null, 'GPU', null, [[['img', 'not-an-offset']]]],
          ['BlockStored', [5n], null, p, BS, null, 'GPU', null, [[['img', 0]]], 0, 'chunked_local_attention'],
        ],
      ]),
    );
    expect(d.counts.badGroupFields).toBe(3);
    expect(d.counts.badExtraKeys).toBe(1);
    expect(d.events).toHaveLength(1);
    expect(d.events[0]).toMatchObject({ groupKind: 'unknown', mmKeys: [[['img', 0]]] });
  });
});
