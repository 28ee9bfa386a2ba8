/**
 * `--record FILE`: the live traffic written as a replayable trace that holds no text (the format: src/core/traffic-
 * record.ts). A request is taken from the lifecycle at three points: its submission (arrival time, model, tenant,
 * priority, session), its first dispatched attempt (the router's own hash chain and prompt length, as routed) and its
 * finish (output tokens from the engine's usage); the line is queued when it finishes.
 *
 * Nothing on the request path waits for the disk: lines go to a queue bounded by --record-buffer-bytes, written by
 * one asynchronous loop; a line that finds the queue full is dropped and counted (router_record_dropped_total). A file
 * never grows past --record-max-bytes (bytes on disk, after gzip): before a write would cross it, the file is rotated
 * (FILE -> FILE.1 -> ... -> FILE.<n-1>, the oldest deleted), so the recording holds at most --record-files x
 * --record-max-bytes on disk. Every file starts with the header, so each one replays on its own.
 */
import { type FileHandle, open, rename, rm, stat } from 'node:fs/promises';
import { promisify } from 'node:util';
import { gzip as gzipCb } from 'node:zlib';
import type { Logger } from 'pino';
import type { DispatchAttempt, DispatchRefusal, FinishReport, Submission } from '../core/dispatch/dispatcher.ts';
import { formatRecordHeader, formatRecordLine } from '../core/traffic-record.ts';
import type { RecordMetrics } from '../metrics/record.ts';
import type { Lifecycle } from './lifecycle.ts';

const gzip = promisify(gzipCb);

export interface RecorderOptions {
  readonly path: string;
  readonly maxBytes: number;
  readonly files: number;
  readonly bufferBytes: number;
  readonly blockSize: number;
  /** The front end recording: serve or epp. */
  readonly source: string;
  /** Requests tracked between submission and finish at most (older ones are forgotten and counted). */
  readonly maxPending?: number;
  readonly now?: () => number;
}

interface Pending {
  readonly arrivalMs: number;
  readonly model: string;
  readonly tenant: string;
  readonly priority: number;
  readonly sessionId?: string;
  seqHashes?: BigUint64Array;
  promptTokens?: number;
}

/** Room a gzip member may add over its input (header, trailer, stored-block overhead of short chunks). */
const GZIP_SLACK = 64;
/** Bytes of lines compressed or written in one go. */
const CHUNK_BYTES = 256 * 1024;

export class TrafficRecorder {
  private readonly pending = new Map<string, Pending>();
  private readonly queue: string[] = [];
  private queuedBytes = 0;
  private writing: Promise<void> | null = null;
  private file: FileHandle | null = null;
  private fileBytes = 0;
  private headerBytes = 0;
  private started = false;
  private closed = false;
  private readonly t0: number;
  private readonly startedAt: string;
  private readonly gz: boolean;
  private readonly now: () => number;
  private loggedError = false;

  constructor(
    private readonly options: RecorderOptions,
    private readonly metrics: RecordMetrics,
    private readonly log: Logger,
  ) {
    this.now = options.now ?? Date.now;
    this.t0 = this.now();
    this.startedAt = new Date(this.t0).toISOString();
    this.gz = options.path.endsWith('.gz');
  }

  /** Taps the lifecycle: submission, first attempt, refusal (forgotten), finish (queued). */
  attach(lifecycle: Lifecycle): void {
    lifecycle.onSubmit((sub, now) => this.submitted(sub, now));
    lifecycle.onDispatch((a) => this.dispatched(a));
    lifecycle.onRefuse((r) => this.refused(r));
    lifecycle.onFinish((id, report, outputTokens) => this.finished(id, report, outputTokens));
    // The file (and its header) exists from the start, traffic or not.
    this.kick();
  }

  submitted(sub: Submission, now: number): void {
    if (this.closed) return;
    this.pending.set(sub.requestId, {
      arrivalMs: Math.max(0, now - this.t0),
      model: sub.model,
      tenant: sub.tenant ?? 'default',
      priority: sub.priority ?? 0,
      ...(sub.sessionId ? { sessionId: sub.sessionId } : {}),
    });
    const max = this.options.maxPending ?? 65_536;
    if (this.pending.size > max) {
      // Requests that left while queued never finish: the oldest entry is the one to forget.
      const oldest = this.pending.keys().next().value as string;
      this.pending.delete(oldest);
      this.metrics.drop('pending_overflow');
    }
  }

  dispatched(a: DispatchAttempt): void {
    if (a.attempt !== 0) return;
    const p = this.pending.get(a.requestId);
    if (!p) return;
    // A copy: the router may reuse the decision's memory once the dispatcher's task ends (KvRouter.releaseHashes),
    // and a request that leaves without a finish keeps its entry here until the pending bound drops it.
    p.seqHashes = a.decision.seqHashes.slice();
    p.promptTokens = a.decision.promptTokens;
  }

  refused(r: DispatchRefusal): void {
    this.pending.delete(r.requestId);
  }

  finished(requestId: string, report: FinishReport, outputTokens: number | undefined): void {
    const p = this.pending.get(requestId);
    if (!p) return;
    this.pending.delete(requestId);
    if (!p.seqHashes || p.promptTokens === undefined || p.promptTokens < 1) return;
    const line = `${formatRecordLine({
      timestamp: p.arrivalMs,
      inputLength: p.promptTokens,
      outputLength: outputTokens ?? 0,
      blockHashes: p.seqHashes,
      model: p.model,
      tenant: p.tenant,
      priority: p.priority,
      ...(p.sessionId !== undefined ? { sessionId: p.sessionId } : {}),
      outcome: report.outcome,
    })}\n`;
    this.enqueue(line);
  }

  private enqueue(line: string): void {
    if (this.closed) return;
    if (this.queuedBytes + line.length > this.options.bufferBytes) {
      this.metrics.drop('buffer_full');
      return;
    }
    this.queue.push(line);
    this.queuedBytes += line.length;
    this.kick();
  }

  /** Starts the write loop unless it runs; lines queued after its last look start it again. */
  private kick(): void {
    this.writing ??= this.drain().finally(() => {
      this.writing = null;
      if (this.queue.length > 0 && !this.closed) this.kick();
    });
  }

  /** Writes what is queued, then stops; the next line starts it again. */
  private async drain(): Promise<void> {
    if (!this.started) {
      this.started = true;
      // A previous recording under the same name is kept: rotated away like a full file.
      if (await exists(this.options.path)) await this.rotate();
      await this.openFile();
    }
    while (this.queue.length > 0) {
      if (!this.file) await this.openFile();
      if (!this.file) {
        this.dropQueued('write_error');
        return;
      }
      const room = this.options.maxBytes - this.fileBytes - (this.gz ? GZIP_SLACK : 0);
      const take = this.takeLines(Math.min(room, CHUNK_BYTES));
      if (take.lines === 0) {
        if (this.fileBytes > this.headerBytes) {
          await this.rotate();
          continue;
        }
        // Even an empty file has no room for the next line.
        this.queuedBytes -= this.queue.shift()!.length;
        this.metrics.drop('too_large');
        continue;
      }
      try {
        const data = this.gz ? await gzip(take.text) : Buffer.from(take.text, 'utf8');
        await this.file.write(data);
        this.fileBytes += data.length;
        this.metrics.wrote(data.length);
        this.metrics.recorded(take.lines);
      } catch (err) {
        this.writeFailed(err, take.lines);
      }
    }
  }

  /** Up to `max` bytes of whole queued lines (bytes counted as UTF-16 units: lines are JSON of ASCII ids and names). */
  private takeLines(max: number): { text: string; lines: number } {
    let bytes = 0;
    let n = 0;
    while (n < this.queue.length && bytes + Buffer.byteLength(this.queue[n]) <= max) bytes += Buffer.byteLength(this.queue[n++]);
    const lines = this.queue.splice(0, n);
    for (const l of lines) this.queuedBytes -= l.length;
    return { text: lines.join(''), lines: n };
  }

  private async openFile(): Promise<void> {
    try {
      this.file = await open(this.options.path, 'w');
      const header = `${formatRecordHeader({ blockSize: this.options.blockSize, startedAt: this.startedAt, source: this.options.source })}\n`;
      const data = this.gz ? await gzip(header) : Buffer.from(header, 'utf8');
      await this.file.write(data);
      this.fileBytes = data.length;
      this.headerBytes = data.length;
      this.metrics.wrote(data.length);
    } catch (err) {
      await this.file?.close().catch(() => undefined);
      this.file = null;
      this.writeFailed(err, 0);
    }
  }

  /** FILE -> FILE.1 -> ... -> FILE.<files-1>; the oldest is replaced (deleted). The next write opens a new FILE. */
  private async rotate(): Promise<void> {
    const { path, files } = this.options;
    try {
      await this.file?.close();
      this.file = null;
      if (files <= 1) await rm(path, { force: true });
      else {
        for (let i = files - 1; i >= 1; i--) {
          const from = i === 1 ? path : `${path}.${i - 1}`;
          if (await exists(from)) await rename(from, `${path}.${i}`);
        }
      }
      this.metrics.rotated();
    } catch (err) {
      this.writeFailed(err, 0);
    }
  }

  private writeFailed(err: unknown, lines: number): void {
    if (lines > 0) this.metrics.drop('write_error', lines);
    if (!this.loggedError) {
      this.loggedError = true;
      this.log.error(
        { err, path: this.options.path },
        'cannot write the --record file: requests are not recorded (router_record_dropped_total)',
      );
    }
  }

  private dropQueued(reason: 'write_error'): void {
    this.metrics.drop(reason, this.queue.length);
    this.queue.length = 0;
    this.queuedBytes = 0;
  }

  /** Writes what is queued and closes the file (shutdown). Later requests are not recorded. */
  async close(): Promise<void> {
    while (this.writing) await this.writing;
    this.closed = true;
    this.pending.clear();
    await this.file?.close().catch(() => undefined);
    this.file = null;
  }
}

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}
