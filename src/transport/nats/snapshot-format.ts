/**
 * The index snapshot as bytes (the object `index` in `kvroute-snapshots`), format 2:
 *
 *   "KVRS" u16le(version = 2)
 *   frame*      frame = u32le(length) msgpack(body)
 *     ['h', streamSeq, routerBlockSize, takenAt, replica, sourceCount]       header, first
 *     ['s', key, engineBlockSize, blocks, degraded?]                           a source; its blocks follow in
 *     ['d', engineIds u64le bytes, seqHashes u64le bytes, parents i32le bytes]  data frames of <= FRAME_BLOCKS
 *     ['e', totalBlocks, crc32]                                                trailer: CRC-32 of every byte before it
 *
 * `degraded` is [since ms, reason, losses] for a source whose events were lost when the snapshot was taken (absent
 * otherwise; such a source is listed even with no blocks); a decoder that predates it ignores it.
 *
 * Encoding and decoding are generators of bounded work (one frame per step) so a shell spreads them over event-loop
 * turns. A decoder refuses, with a reason code, anything that is not a whole format-2 snapshot: another version,
 * bytes that are not a snapshot, a truncated object (no trailer) or a corrupt one (checksum or structure); it never
 * throws.
 */
import { crc32 } from 'node:zlib';
import { Packr, Unpackr } from 'msgpackr';
import type { RouterSnapshotData, SourceSnapshot } from '../../core/index/snapshot.ts';

export const SNAPSHOT_FORMAT = 2;
const MAGIC = [0x4b, 0x56, 0x52, 0x53]; // "KVRS"
const PREAMBLE = 6;
/** Blocks per data frame: ~0.5-1 MiB of arrays, well under a millisecond to pack or copy. */
export const FRAME_BLOCKS = 32_768;

const packr = new Packr({ useRecords: false });
const unpackr = new Unpackr({ useRecords: false });

/** What a snapshot says besides its blocks. */
export interface SnapshotHeader {
  /** Last stream sequence applied to the index the snapshot was taken from. */
  readonly streamSeq: number;
  readonly routerBlockSize: number;
  /** Wall-clock ms when it was taken. */
  readonly takenAt: number;
  readonly replica: string;
}

export interface DecodedSnapshot extends SnapshotHeader {
  readonly data: RouterSnapshotData;
  readonly blocks: number;
}

/** Why a snapshot was refused. */
export type SnapshotRefusal = 'not_snapshot' | 'version' | 'truncated' | 'corrupt';

export class SnapshotFormatError extends Error {
  constructor(
    readonly code: SnapshotRefusal,
    message: string,
  ) {
    super(message);
    this.name = 'SnapshotFormatError';
  }
}

export type SnapshotDecodeResult =
  | { readonly ok: true; readonly snapshot: DecodedSnapshot }
  | { readonly ok: false; readonly error: SnapshotFormatError };

function frame(body: unknown[]): Uint8Array {
  const payload = packr.pack(body);
  const out = new Uint8Array(4 + payload.byteLength);
  new DataView(out.buffer).setUint32(0, payload.byteLength, true);
  out.set(payload, 4);
  return out;
}

const bytesOf = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

/**
 * Builds a snapshot's bytes: the header at construction, `addSource` per source (a generator yielding after each
 * data frame), `finish` for the trailer. The chunks' concatenation is the object (the object store takes them as a
 * stream, so they are never joined into one buffer).
 */
export class SnapshotEncoder {
  readonly chunks: Uint8Array[] = [];
  private crc = 0;
  private bytes = 0;
  private blocks = 0;
  private written = 0;

  constructor(
    header: SnapshotHeader,
    private readonly sourceCount: number,
  ) {
    const pre = new Uint8Array(PREAMBLE);
    pre.set(MAGIC);
    new DataView(pre.buffer).setUint16(4, SNAPSHOT_FORMAT, true);
    this.push(pre);
    this.push(frame(['h', header.streamSeq, header.routerBlockSize, header.takenAt, header.replica, sourceCount]));
  }

  private push(c: Uint8Array): void {
    this.chunks.push(c);
    this.crc = crc32(c, this.crc);
    this.bytes += c.byteLength;
  }

  *addSource(s: SourceSnapshot): Generator<void, void, void> {
    this.written++;
    const n = s.engineIds.length;
    const split = n === 0 ? 1 : s.seqHashes.length / n;
    // A degraded source carries [since, reason, losses] as a fifth element (decoders before it ignore it).
    const d = s.degraded;
    this.push(frame(d ? ['s', s.key, s.blockSize, n, [d.since, d.reason, d.losses]] : ['s', s.key, s.blockSize, n]));
    for (let at = 0; at < n; at += FRAME_BLOCKS) {
      const end = Math.min(n, at + FRAME_BLOCKS);
      const parents = s.parents ? s.parents.subarray(at, end) : new Int32Array(end - at).fill(-1);
      this.push(
        frame(['d', bytesOf(s.engineIds.subarray(at, end)), bytesOf(s.seqHashes.subarray(at * split, end * split)), bytesOf(parents)]),
      );
      yield;
    }
    this.blocks += n;
  }

  finish(): { chunks: Uint8Array[]; bytes: number; blocks: number } {
    if (this.written !== this.sourceCount) throw new RangeError(`snapshot: ${this.written} sources written, ${this.sourceCount} announced`);
    this.push(frame(['e', this.blocks, this.crc >>> 0]));
    return { chunks: this.chunks, bytes: this.bytes, blocks: this.blocks };
  }
}

/** A whole snapshot in one synchronous piece (tests, tools). */
export function encodeSnapshot(header: SnapshotHeader, sources: readonly SourceSnapshot[]): Uint8Array {
  const enc = new SnapshotEncoder(header, sources.length);
  for (const s of sources) for (const _ of enc.addSource(s));
  const { chunks, bytes } = enc.finish();
  const out = new Uint8Array(bytes);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
}

/** Copies (frame payloads are not 8-byte aligned) into a fresh typed array; null when the length does not fit. */
function copyInto<T extends BigUint64Array | Int32Array>(b: unknown, make: (n: number) => T, width: number): T | null {
  if (!(b instanceof Uint8Array) || b.byteLength % width !== 0) return null;
  const out = make(b.byteLength / width);
  new Uint8Array(out.buffer).set(b);
  return out;
}

const isCount = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

/**
 * Reads a snapshot, one frame per step; the return value says what was read or why it was refused. The checksum is
 * verified before any frame is parsed, so a refused snapshot costs one pass and nothing of it is used.
 */
export function* decodeSnapshotSteps(bytes: Uint8Array): Generator<void, SnapshotDecodeResult, void> {
  const refuse = (code: SnapshotRefusal, message: string): SnapshotDecodeResult => ({
    ok: false,
    error: new SnapshotFormatError(code, message),
  });
  if (bytes.byteLength < PREAMBLE || MAGIC.some((m, i) => bytes[i] !== m)) {
    // Format 1 (kvroute before the framed format) was one msgpack array [1, seq, ...].
    if (bytes[0] === 0x96 && bytes[1] === 0x01) return refuse('version', 'snapshot format 1, this replica reads format 2');
    return refuse('not_snapshot', `not a kvroute index snapshot (${bytes.byteLength} bytes, no "KVRS" preamble)`);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const version = view.getUint16(4, true);
  if (version !== SNAPSHOT_FORMAT) return refuse('version', `snapshot format ${version}, this replica reads format ${SNAPSHOT_FORMAT}`);

  // Frame boundaries first: the last frame must be the trailer, and the checksum must match.
  const frames: Array<[number, number]> = [];
  let at = PREAMBLE;
  while (at < bytes.byteLength) {
    if (at + 4 > bytes.byteLength) return refuse('truncated', `snapshot truncated inside a frame header at byte ${at}`);
    const len = view.getUint32(at, true);
    if (at + 4 + len > bytes.byteLength)
      return refuse('truncated', `snapshot truncated: a frame at byte ${at} runs past the end (${bytes.byteLength} bytes)`);
    frames.push([at + 4, at + 4 + len]);
    at += 4 + len;
  }
  const body = (i: number): unknown[] | null => {
    try {
      const v = unpackr.unpack(bytes.subarray(frames[i][0], frames[i][1]));
      return Array.isArray(v) ? v : null;
    } catch {
      return null;
    }
  };
  const last = frames.length > 1 ? body(frames.length - 1) : null;
  if (last?.[0] !== 'e') return refuse('truncated', 'snapshot truncated: no trailer');
  const trailerAt = frames[frames.length - 1][0] - 4;
  const crc = crc32(bytes.subarray(0, trailerAt)) >>> 0;
  if (last[2] !== crc) return refuse('corrupt', `snapshot checksum mismatch (stored ${String(last[2])}, computed ${crc})`);

  const h = body(0);
  if (h?.[0] !== 'h' || !isCount(h[1]) || !isCount(h[2]) || h[2] === 0 || !isCount(h[5])) {
    return refuse('corrupt', 'snapshot header unreadable');
  }
  const header: SnapshotHeader = {
    streamSeq: h[1],
    routerBlockSize: h[2],
    takenAt: typeof h[3] === 'number' ? h[3] : 0,
    replica: typeof h[4] === 'string' ? h[4] : '',
  };
  const sources: SourceSnapshot[] = [];
  let blocks = 0;
  let i = 1;
  const end = frames.length - 1;
  while (i < end) {
    const s = body(i++);
    if (s?.[0] !== 's' || typeof s[1] !== 'string' || !isCount(s[2]) || s[2] === 0 || !isCount(s[3])) {
      return refuse('corrupt', `snapshot frame ${i - 1}: expected a source`);
    }
    const n = s[3];
    const dg = s[4];
    let degraded: SourceSnapshot['degraded'];
    if (dg !== undefined && dg !== null) {
      if (!Array.isArray(dg) || typeof dg[0] !== 'number' || typeof dg[1] !== 'string' || !isCount(dg[2])) {
        return refuse('corrupt', `snapshot source ${s[1]}: unreadable degraded state`);
      }
      degraded = { since: dg[0], reason: dg[1], losses: dg[2] };
    }
    const engineIds = new BigUint64Array(n);
    let split = 0;
    let seqHashes = new BigUint64Array(0);
    const parents = new Int32Array(n);
    let got = 0;
    while (got < n) {
      const d = i < end ? body(i++) : null;
      const ids = d && d[0] === 'd' ? copyInto(d[1], (k) => new BigUint64Array(k), 8) : null;
      const hs = ids ? copyInto(d![2], (k) => new BigUint64Array(k), 8) : null;
      const ps = hs ? copyInto(d![3], (k) => new Int32Array(k), 4) : null;
      if (!ids || !hs || !ps || ids.length === 0 || ps.length !== ids.length || hs.length % ids.length !== 0 || got + ids.length > n) {
        return refuse('corrupt', `snapshot source ${s[1]}: bad data frame`);
      }
      if (split === 0) {
        split = hs.length / ids.length;
        seqHashes = new BigUint64Array(n * split);
      } else if (hs.length !== ids.length * split) return refuse('corrupt', `snapshot source ${s[1]}: inconsistent hashes per block`);
      engineIds.set(ids, got);
      seqHashes.set(hs, got * split);
      parents.set(ps, got);
      got += ids.length;
      yield;
    }
    sources.push(
      degraded
        ? { key: s[1], blockSize: s[2], engineIds, seqHashes, parents, degraded }
        : { key: s[1], blockSize: s[2], engineIds, seqHashes, parents },
    );
    blocks += n;
  }
  if (sources.length !== h[5] || last[1] !== blocks) {
    return refuse(
      'corrupt',
      `snapshot lists ${sources.length} sources / ${blocks} blocks, its header and trailer ${h[5]} / ${String(last[1])}`,
    );
  }
  return { ok: true, snapshot: { ...header, blocks, data: { blockSize: header.routerBlockSize, sources } } };
}

/** The same in one synchronous piece. */
export function decodeSnapshot(bytes: Uint8Array): SnapshotDecodeResult {
  const steps = decodeSnapshotSteps(bytes);
  let r = steps.next();
  while (!r.done) r = steps.next();
  return r.value;
}
