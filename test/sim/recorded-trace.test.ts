/**
 * Recorded traces (`kvroute serve --record`, src/core/traffic-record.ts) read by the trace reader and replayed by the
 * simulator on their own hashes: a recording of a generated trace replays exactly as the trace itself does.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { computeSeqHashes } from '../../src/core/hashing.ts';
import { formatRecordLine, parseRecordLine } from '../../src/core/traffic-record.ts';
import { runFleet } from '../../src/sim/run-fleet.ts';
import { RecordedPrompts } from '../../src/sim/traces/expand.ts';
import { recordingHeader, recordingOf } from '../fixtures/recordings.ts';
import { loadTrace } from '../../src/sim/traces/reader.ts';
import { generateFromSpec } from '../../src/sim/traces/spec.ts';

const header = recordingHeader;

function file(name: string, text: string | Buffer): string {
  const path = join(mkdtempSync(join(tmpdir(), 'kvroute-recorded-')), name);
  writeFileSync(path, text);
  return path;
}

describe('recorded trace format', () => {
  it('round-trips a line: 64-bit hashes as 16 hex digits, the fields as written', () => {
    const hashes = computeSeqHashes(
      Array.from({ length: 40 }, (_, i) => i),
      16,
    );
    const line = formatRecordLine({
      timestamp: 12.3456,
      inputLength: 40,
      outputLength: 7,
      blockHashes: hashes,
      model: 'qwen',
      tenant: 'acme',
      priority: -1,
      sessionId: 's-1',
      outcome: 'cancelled',
    });
    expect(JSON.parse(line).block_hashes).toEqual([...hashes].map((h) => h.toString(16).padStart(16, '0')));
    const back = parseRecordLine(line);
    expect(back).toMatchObject({
      timestamp: 12.346,
      inputLength: 40,
      outputLength: 7,
      model: 'qwen',
      tenant: 'acme',
      priority: -1,
      sessionId: 's-1',
      outcome: 'cancelled',
    });
    expect([...(back as { blockHashes: BigUint64Array }).blockHashes]).toEqual([...hashes]);
    // A hash of the wrong width or a number in place of the string is a bad field, not a wrong hash.
    expect(parseRecordLine(line.replace(/"[0-9a-f]{16}"/, '"abc"'))).toBe('bad_field');
    expect(parseRecordLine(line.replace(/"[0-9a-f]{16}"/, '123'))).toBe('bad_field');
  });
});

describe('reading a recording', () => {
  it('is told by its header; bad lines are skipped and counted; a repeated header (cat of rotated files) is skipped', async () => {
    const reqs = generateFromSpec('agentic:requests=20', 3);
    const lines = recordingOf(reqs, 16);
    const tooMany = JSON.parse(lines[0]);
    tooMany.input_length = 16; // 1 full block, more hashes than that
    const path = file(
      'r.jsonl',
      [header(16), ...lines.slice(0, 10), '{"timestamp": 1}', 'not json', JSON.stringify(tooMany), '', header(16), ...lines.slice(10)].join(
        '\n',
      ),
    );
    const { requests, stats } = await loadTrace(path);
    expect(stats.recording).toMatchObject({ blockSize: 16, source: 'serve' });
    expect(requests).toHaveLength(20);
    expect(stats.badLines).toBe(3);
    expect(Object.fromEntries(stats.bad)).toEqual({ bad_field: 1, invalid_json: 1, hash_ids_length: 1 });
    expect(stats.blankLines).toBe(1);
    expect(requests.every((r) => r.blockHashes !== undefined && r.hashIds.length === 0)).toBe(true);
    // Sorted by arrival, as any trace.
    for (let i = 1; i < requests.length; i++) expect(requests[i].timestamp).toBeGreaterThanOrEqual(requests[i - 1].timestamp);
  });

  it('reads gzip; refuses another format version, a foreign hash seed, and headers that disagree on the block size', async () => {
    const lines = recordingOf(generateFromSpec('agentic:requests=5', 1), 32);
    const gz = await loadTrace(file('r.jsonl.gz', gzipSync(`${[header(32), ...lines].join('\n')}\n`)));
    expect(gz.stats.recording?.blockSize).toBe(32);
    expect(gz.requests).toHaveLength(5);
    const v2 = header(16).replace('"kvroute_record":1', '"kvroute_record":2');
    await expect(loadTrace(file('a.jsonl', `${v2}\n${lines[0]}\n`))).rejects.toThrow('recording format version 2');
    const seed = header(16).replace('"hash_seed":1337', '"hash_seed":1');
    await expect(loadTrace(file('b.jsonl', `${seed}\n`))).rejects.toThrow('hash_seed 1');
    await expect(loadTrace(file('c.jsonl', `${header(32)}\n${lines[0]}\n${header(16)}\n`))).rejects.toThrow(
      'recording headers disagree on the block size: 32 then 16',
    );
  });
});

describe('replaying a recording', () => {
  it('routes on the recorded hashes and replays exactly as the trace it recorded (hits, per-request picks)', async () => {
    const reqs = generateFromSpec('agentic:requests=400', 5);
    const path = file('agentic.jsonl', `${[header(16), ...recordingOf(reqs, 16)].join('\n')}\n`);
    const { requests: recorded } = await loadTrace(path);
    const fleet = { workers: 4, blockSize: 16, gpuBlocks: 2048, policy: 'kv-pressure', seed: 1, keepRequests: true };
    const original = runFleet(reqs, fleet);
    const replay = runFleet(recorded, fleet);
    expect(replay.hit.predicted_block_weighted).toBeGreaterThan(0.3);
    expect(replay.hit.predicted_block_weighted).toBe(original.hit.predicted_block_weighted);
    expect(replay.hit.available_block_weighted).toBe(original.hit.available_block_weighted);
    expect(replay.hit.engine_token_weighted).toBeCloseTo(original.hit.engine_token_weighted, 2);
    expect(replay.perRequest!.map((r) => [r.index, r.worker])).toEqual(original.perRequest!.map((r) => [r.index, r.worker]));
    // Other fleets and policies take it as any trace.
    const rr = runFleet(recorded, { ...fleet, policy: 'round-robin', workers: 8, rateScale: 2 });
    expect(rr.hit.predicted_block_weighted).toBeLessThan(replay.hit.predicted_block_weighted);
  });

  it('gives the engines pseudo-tokens that share exactly the recorded blocks', () => {
    const a = computeSeqHashes(
      Array.from({ length: 64 }, (_, i) => i),
      16,
    );
    const b = computeSeqHashes([...Array.from({ length: 32 }, (_, i) => i), ...Array.from({ length: 40 }, (_, i) => 500 + i)], 16);
    const p = new RecordedPrompts(16);
    const ta = p.tokens({ timestamp: 0, inputLength: 64, outputLength: 1, hashIds: [], blockHashes: a }, 0);
    const tb = p.tokens({ timestamp: 0, inputLength: 72, outputLength: 1, hashIds: [], blockHashes: b }, 1);
    expect(ta.slice(0, 32)).toEqual(tb.slice(0, 32));
    expect(ta.slice(32, 48)).not.toEqual(tb.slice(32, 48));
    expect(tb).toHaveLength(72);
    // The engine's hash of each pseudo block maps back to the recorded hash.
    const pa = computeSeqHashes(ta, 16);
    expect([...pa].map((h) => p.recorded(h))).toEqual([...a]);
    const pb = computeSeqHashes(tb.slice(0, 64), 16);
    expect([...pb].map((h) => p.recorded(h))).toEqual([...b]);
  });
});
