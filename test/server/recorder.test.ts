/**
 * The traffic recorder (src/runtime/recorder.ts) in-process, on a real file system: lines from the lifecycle's three
 * taps, the byte bound and rotation, the bounded queue (drops counted, never waited on), gzip, a previous file kept.
 */
import { mkdtempSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gunzipSync } from 'node:zlib';
import pino from 'pino';
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import type { DispatchAttempt } from '../../src/core/dispatch/dispatcher.ts';
import { computeSeqHashes } from '../../src/core/hashing.ts';
import { parseRecordLine } from '../../src/core/traffic-record.ts';
import { RecordMetrics } from '../../src/metrics/record.ts';
import { TrafficRecorder } from '../../src/runtime/recorder.ts';

const log = pino({ level: 'silent' });

function recorder(path: string, opts: Partial<{ maxBytes: number; files: number; bufferBytes: number }> = {}) {
  const registry = new Registry();
  let clock = 1_000_000;
  const rec = new TrafficRecorder(
    {
      path,
      maxBytes: opts.maxBytes ?? 1 << 20,
      files: opts.files ?? 3,
      bufferBytes: opts.bufferBytes ?? 1 << 20,
      blockSize: 16,
      source: 'serve',
      now: () => clock,
    },
    new RecordMetrics(registry, ''),
    log,
  );
  const counter = async (name: string, reason?: string) => {
    const m = await registry.getSingleMetric(name)!.get();
    return m.values.filter((v) => reason === undefined || v.labels.reason === reason).reduce((s, v) => s + v.value, 0);
  };
  /** One request through the three taps: submitted at `at` ms, routed with `tokens`, finished with `out` tokens. */
  const request = (id: string, tokens: number[], at: number, out = 5) => {
    clock = 1_000_000 + at;
    rec.submitted({ requestId: id, model: 'm', tenant: 't', priority: 2, sessionId: 's' }, clock);
    rec.dispatched({
      kind: 'dispatch',
      requestId: id,
      attempt: 0,
      decision: { seqHashes: computeSeqHashes(tokens, 16), promptTokens: tokens.length },
    } as unknown as DispatchAttempt);
    rec.finished(id, { outcome: 'ok' }, out);
  };
  return { rec, request, counter };
}

const tokens = (seed: number, n = 160) => Array.from({ length: n }, (_, i) => 1000 + ((seed * 7919 + i * 13) % 50_000));
const dir = () => mkdtempSync(join(tmpdir(), 'kvroute-recorder-'));

describe('TrafficRecorder', () => {
  it('writes the header, then one line per finished request with arrival time, hashes and usage', async () => {
    const path = join(dir(), 't.jsonl');
    const { rec, request, counter } = recorder(path);
    request('a', tokens(1), 0);
    request('b', tokens(2), 250, 9);
    // Refused before routing: no hashes, nothing written; a queued request that left is forgotten.
    rec.submitted({ requestId: 'c', model: 'm' }, 1_000_300);
    rec.refused({ requestId: 'c' } as never);
    await rec.close();
    const lines = readFileSync(path, 'utf8').trim().split('\n');
    expect(JSON.parse(lines[0])).toMatchObject({ kvroute_record: 1, block_size: 16, started_at: new Date(1_000_000).toISOString() });
    expect(lines).toHaveLength(3);
    const b = parseRecordLine(lines[2]) as Exclude<ReturnType<typeof parseRecordLine>, string | null>;
    expect(b).toMatchObject({ timestamp: 250, inputLength: 160, outputLength: 9, model: 'm', tenant: 't', priority: 2, sessionId: 's' });
    expect([...b.blockHashes]).toEqual([...computeSeqHashes(tokens(2), 16)]);
    expect(await counter('router_record_requests_total')).toBe(2);
  });

  it('never lets a file pass --record-max-bytes: rotates, keeps --record-files, each file with its header', async () => {
    const d = dir();
    const path = join(d, 't.jsonl');
    writeFileSync(path, 'an earlier recording\n');
    const { rec, request, counter } = recorder(path, { maxBytes: 4096, files: 3 });
    for (let i = 0; i < 60; i++) request(`r${i}`, tokens(i), i);
    await rec.close();
    expect(readdirSync(d).sort()).toEqual(['t.jsonl', 't.jsonl.1', 't.jsonl.2']);
    let lines = 0;
    for (const f of readdirSync(d)) {
      const text = readFileSync(join(d, f), 'utf8');
      expect(statSync(join(d, f)).size).toBeLessThanOrEqual(4096);
      expect(text.split('\n')[0]).toContain('"kvroute_record":1');
      lines += text.trim().split('\n').length - 1;
    }
    // The earlier file was rotated away first, then pushed out by the newer ones; the last three files hold the newest lines.
    expect(readFileSync(path, 'utf8')).toContain('"timestamp":59');
    expect(await counter('router_record_rotations_total')).toBeGreaterThanOrEqual(3);
    expect(lines).toBeLessThan(60);
    expect(await counter('router_record_dropped_total')).toBe(0);
  });

  it('drops and counts what does not fit the queue instead of waiting; a line bigger than a file is too_large', async () => {
    const path = join(dir(), 't.jsonl');
    const { rec, request, counter } = recorder(path, { bufferBytes: 4000, maxBytes: 4096 });
    // Synchronously, so nothing is written in between: the queue fills at ~4,000 bytes (about 3 lines of 10 hashes).
    for (let i = 0; i < 10; i++) request(`r${i}`, tokens(i, 1600), i);
    expect(await counter('router_record_dropped_total', 'buffer_full')).toBeGreaterThan(0);
    await rec.close();
    const big = recorder(join(dir(), 'u.jsonl'), { maxBytes: 4096 });
    big.request('huge', tokens(1, 16 * 400), 0);
    await big.rec.close();
    expect(await big.counter('router_record_dropped_total', 'too_large')).toBe(1);
  });

  it('writes gzip when the name ends in .gz, bounded by bytes on disk', async () => {
    const d = dir();
    const path = join(d, 't.jsonl.gz');
    const { rec, request } = recorder(path, { maxBytes: 4096, files: 2 });
    for (let i = 0; i < 40; i++) request(`r${i}`, tokens(i % 4), i);
    await rec.close();
    for (const f of readdirSync(d)) {
      expect(statSync(join(d, f)).size).toBeLessThanOrEqual(4096);
      const text = gunzipSync(readFileSync(join(d, f))).toString('utf8');
      expect(text.split('\n')[0]).toContain('"kvroute_record":1');
    }
  });
});
