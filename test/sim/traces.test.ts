import { describe, expect, it } from 'vitest';
import { writeFileSync, mkdtempSync } from 'node:fs';
import { gzipSync } from 'node:zlib';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { computeSeqHashes } from '../../src/core/hashing.ts';
import { parseTraceText, formatTraceLine, type TraceRequest } from '../../src/sim/traces/format.ts';
import { loadTrace } from '../../src/sim/traces/reader.ts';
import { expandTokens, expandTokensArray, TraceHasher } from '../../src/sim/traces/expand.ts';
import { generateMultiTurn, generateSharedPrefix, generateSkewed } from '../../src/sim/traces/generate.ts';
import { traceStats } from '../../src/sim/traces/stats.ts';
import { computeOracle } from '../../src/sim/oracle.ts';

// The Mooncake traces committed with the repository (data/traces/README.md).
const DATA = join(import.meta.dirname, '../../data/traces');

describe('Mooncake reader', () => {
  it('counts bad lines by reason instead of throwing', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvroute-trace-'));
    const file = join(dir, 't.jsonl');
    writeFileSync(
      file,
      [
        '{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}',
        '{"timestamp": 1, "input_length": 10, "output_length": 3, "hash_ids": [7]}',
        'not json',
        '[1,2]',
        '{"timestamp": 1, "input_length": 600, "output_length": 3, "hash_ids": [1]}',
        '{"timestamp": -1, "input_length": 10, "output_length": 3, "hash_ids": [1]}',
        '',
        '{"timestamp": 2, "input_length": 10, "output_length": 3, "hash_ids": ["a"]}',
      ].join('\n'),
    );
    const { requests, stats } = await loadTrace(file);
    expect(requests.map((r) => r.timestamp)).toEqual([1, 5]); // sorted by timestamp
    expect(stats.requests).toBe(2);
    expect(stats.badLines).toBe(5);
    expect(Object.fromEntries(stats.bad)).toEqual({ invalid_json: 1, not_an_object: 1, hash_ids_length: 1, bad_field: 2 });
    expect(stats.firstBadLine.get('invalid_json')).toBe(3);
    expect(stats.blankLines).toBe(1);
  });

  it('reads gzip traces like plain ones, by content (with or without .gz), stopping early without leaking', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvroute-trace-'));
    const lines = [0, 1, 2, 3].map((t) => `{"timestamp": ${t}, "input_length": 600, "output_length": 3, "hash_ids": [1, ${t + 2}]}`);
    const text = `${lines.join('\n')}\nnot json\n`;
    writeFileSync(join(dir, 'plain.jsonl'), text);
    writeFileSync(join(dir, 't.jsonl.gz'), gzipSync(text));
    writeFileSync(join(dir, 'misnamed.jsonl'), gzipSync(text));
    const plain = await loadTrace(join(dir, 'plain.jsonl'));
    expect(plain.requests).toHaveLength(4);
    for (const name of ['t.jsonl.gz', 'misnamed.jsonl']) {
      const gz = await loadTrace(join(dir, name));
      expect(gz.requests).toEqual(plain.requests);
      expect(Object.fromEntries(gz.stats.bad)).toEqual({ invalid_json: 1 });
    }
    expect((await loadTrace(join(dir, 't.jsonl.gz'), { limit: 2 })).requests.map((r) => r.timestamp)).toEqual([0, 1]);
  });

  it('rejects a corrupt gzip trace and a missing file with the cause', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvroute-trace-'));
    const whole = gzipSync('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}\n'.repeat(2000));
    writeFileSync(join(dir, 'cut.jsonl.gz'), whole.subarray(0, whole.length - 20));
    writeFileSync(join(dir, 'bad.jsonl.gz'), Buffer.from([0x1f, 0x8b, 0, 0, 0, 0]));
    await expect(loadTrace(join(dir, 'cut.jsonl.gz'))).rejects.toThrow(/unexpected end of file/);
    await expect(loadTrace(join(dir, 'bad.jsonl.gz'))).rejects.toThrow(/unknown compression method/);
    await expect(loadTrace(join(dir, 'absent.jsonl.gz'))).rejects.toThrow(/ENOENT/);
  });

  it('round-trips the format', () => {
    const r: TraceRequest = { timestamp: 12, inputLength: 1030, outputLength: 9, hashIds: [0, 5, 9] };
    expect(parseTraceText(`${formatTraceLine(r)}\n`)).toEqual([r]);
  });
});

describe('expansion into pseudo-tokens', () => {
  const a: TraceRequest = { timestamp: 0, inputLength: 1200, outputLength: 1, hashIds: [10, 11, 12] };
  const b: TraceRequest = { timestamp: 0, inputLength: 1100, outputLength: 1, hashIds: [10, 11, 13] };
  const c: TraceRequest = { timestamp: 0, inputLength: 700, outputLength: 1, hashIds: [10, 14] };

  it('is deterministic, cut to input_length, and shares exactly the shared ids', () => {
    const ta = expandTokens(a);
    expect(ta.length).toBe(1200);
    expect(expandTokens(a)).toEqual(ta);
    const tb = expandTokens(b);
    expect(tb.subarray(0, 1024)).toEqual(ta.subarray(0, 1024));
    // Block 2 differs from its first token on.
    expect(tb[1024]).not.toBe(ta[1024]);
    for (const bs of [16, 64, 512]) {
      const ha = computeSeqHashes(ta, bs);
      const hc = computeSeqHashes(expandTokens(c), bs);
      // c shares block 10 (512 tokens) with a and nothing after.
      let k = 0;
      while (k < hc.length && hc[k] === ha[k]) k++;
      expect(k).toBe(512 / bs);
    }
  });

  it('the plain-array expansion equals the typed one', () => {
    for (const r of [a, b, c]) expect(Uint32Array.from(expandTokensArray(r))).toEqual(expandTokens(r));
  });

  it('memoised hasher equals hashing the expanded prompt, at every block size', () => {
    const reqs = [...generateMultiTurn({ requests: 60, seed: 3 }), a, b, c, a];
    for (const bs of [16, 32, 128, 512, 48]) {
      const hasher = new TraceHasher(bs);
      for (const r of reqs) expect(hasher.seqHashes(r)).toEqual(computeSeqHashes(expandTokens(r), bs));
      if (bs === 16) expect(hasher.hits).toBeGreaterThan(0);
    }
  });
});

describe('oracle', () => {
  it('reproduces the published figures for both committed Mooncake traces (data/traces/README.md)', async () => {
    const conv = await loadTrace(join(DATA, 'mooncake_conversation_trace.jsonl.gz'));
    const o1 = computeOracle(conv.requests);
    expect(conv.requests.length).toBe(12_031);
    expect(o1.blockWeighted.toFixed(3)).toBe('0.366');
    expect(o1.requestWeighted.toFixed(3)).toBe('0.384');
    const syn = await loadTrace(join(DATA, 'mooncake_synthetic_trace.jsonl.gz'));
    const o2 = computeOracle(syn.requests);
    expect(syn.requests.length).toBe(3_993);
    expect(o2.blockWeighted.toFixed(3)).toBe('0.640');
    expect(o2.requestWeighted.toFixed(3)).toBe('0.423');
    // The README's ISL figures too (numpy-style percentiles).
    const s = traceStats(conv.requests);
    expect(Math.round(s.isl.mean)).toBe(12_035);
    expect(Math.round(s.isl.p50)).toBe(6_909);
    expect((100 * s.under_1800_fraction).toFixed(1)).toBe('21.2');
  });

  it('counts leading reuse only, divided by ceil(len/512)', () => {
    const o = computeOracle([
      { timestamp: 0, inputLength: 1500, outputLength: 1, hashIds: [1, 2, 3] },
      { timestamp: 1, inputLength: 1500, outputLength: 1, hashIds: [1, 2, 4] },
      { timestamp: 2, inputLength: 1000, outputLength: 1, hashIds: [5, 2] },
    ]);
    expect(o.reusedBlocks).toBe(2);
    expect(o.blockWeighted).toBeCloseTo(2 / 8);
    expect(o.requestWeighted).toBeCloseTo((0 + 2 / 3 + 0) / 3);
  });
});

describe('generators', () => {
  it('skewed has the production shape of docs/protocols.md §6', () => {
    const r = generateSkewed({ requests: 6000, seed: 1 });
    const s = traceStats(r);
    expect(s.requests).toBe(6000);
    expect(s.under_1800_fraction).toBeGreaterThan(0.4);
    expect(s.under_1800_fraction).toBeLessThan(0.48);
    expect(s.isl.mean).toBeGreaterThan(12_000);
    expect(s.isl.mean).toBeLessThan(17_000);
    expect(s.isl.max).toBeGreaterThan(130_000);
    // Many short cold requests, few long warm ones: ratio of sums far above mean of ratios.
    expect(s.oracle.block_weighted - s.oracle.request_weighted).toBeGreaterThan(0.35);
  });

  it('is deterministic per seed and different across seeds', () => {
    expect(generateSkewed({ requests: 300, seed: 7 })).toEqual(generateSkewed({ requests: 300, seed: 7 }));
    expect(generateSkewed({ requests: 300, seed: 7 })).not.toEqual(generateSkewed({ requests: 300, seed: 8 }));
    expect(generateMultiTurn({ requests: 300, seed: 7 })).toEqual(generateMultiTurn({ requests: 300, seed: 7 }));
  });

  it('shared-prefix follows SGLang gsp: groups share exactly the system prompt', () => {
    const r = generateSharedPrefix({ groups: 4, promptsPerGroup: 5, systemPromptLen: 1100, questionLen: 64, rate: Infinity });
    expect(r.length).toBe(20);
    for (const x of r) {
      expect(x.inputLength).toBe(1164);
      expect(x.hashIds.length).toBe(3);
      expect(x.timestamp).toBe(0);
    }
    // 1100 tokens = 2 full shared blocks; the third block mixes system prompt and question: unique.
    const firstTwo = new Set(r.map((x) => `${x.hashIds[0]},${x.hashIds[1]}`));
    expect(firstTwo.size).toBe(4);
    expect(new Set(r.map((x) => x.hashIds[2])).size).toBe(20);
    expect(computeOracle(r).reusedBlocks).toBe(4 * 4 * 2);
  });

  it('multi-turn sessions reuse their previous turn', () => {
    const r = generateMultiTurn({ requests: 2000, seed: 2 });
    const s = traceStats(r);
    expect(s.oracle.block_weighted).toBeGreaterThan(0.5);
    // A shared 600-token system prompt: every request starts with the same first block.
    expect(new Set(r.map((x) => x.hashIds[0])).size).toBe(1);
  });
});
