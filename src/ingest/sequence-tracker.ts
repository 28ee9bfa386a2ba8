/**
 * Per-source ordering of event batches by the engine's sequence number (docs/protocols.md §2). Pure: no I/O, no timers.
 * The shell feeds it live and replayed batches and executes what it returns:
 *
 * - in order -> `deliver`;
 * - gap -> `replay` of [expected, first held) while later live batches are held (bounded);
 * - replay delivers the missing range -> the held batches follow in order;
 * - replay unavailable, incomplete or starting past the gap (buffer too old), or the hold overflowing -> `reset` the
 *   source (clear it: it is cold, not wrong) and continue from what is held;
 * - a live seq that does not increase -> the engine restarted (seq starts from 0 at every start) -> `reset`;
 * - the first batch after a lost connection that does not continue the sequence -> `reset` too: a restarted engine
 *   that published more batches than the old one before we reconnected looks like a gap, and replaying "the gap" from
 *   the new process would mix two lives.
 *
 * A `reset` is always emitted before the batches that follow it, so clearing then applying keeps the index exact.
 */

export type ResetReason =
  | 'restart'
  | 'reconnect_gap'
  | 'replay_unavailable'
  | 'replay_too_old'
  | 'replay_incomplete'
  | 'gap_without_replay'
  | 'hold_overflow'
  | 'undecodable_batch';

export type TrackerOutput<T> =
  | { readonly kind: 'deliver'; readonly seq: bigint; readonly item: T }
  | { readonly kind: 'replay'; readonly fromSeq: bigint; readonly untilSeq: bigint; readonly ticket: number }
  | { readonly kind: 'reset'; readonly reason: ResetReason };

export interface SequenceTrackerOptions {
  /** Whether the engine has a replay endpoint. Without one every gap is a reset. */
  readonly replay: boolean;
  /** Live batches held while a replay runs; past this the replay is abandoned and the source reset. */
  readonly maxHeld?: number;
  /**
   * When the first batch seen has seq > 0 (the router started after the engine), ask for [0, seq) to learn the blocks
   * the engine already holds, as far as its replay buffer reaches. Default true.
   */
  readonly catchUp?: boolean;
}

export interface TrackerCounters {
  delivered: number;
  gaps: number;
  replaysRequested: number;
  replayedBatches: number;
  resets: number;
  held: number;
  probes: number;
}

export class SequenceTracker<T> {
  private expected: bigint | null = null;
  private lastLive: bigint | null = null;
  private readonly held = new Map<bigint, T>();
  private replaying = false;
  private suspectRestart = false;
  private replayUntil = 0n;
  /** Whether anything was delivered since the last reset (a reset of an empty source is a no-op). */
  private dirty = false;
  private ticket = 0;
  private readonly maxHeld: number;
  private readonly catchUp: boolean;
  readonly counters: TrackerCounters = { delivered: 0, gaps: 0, replaysRequested: 0, replayedBatches: 0, resets: 0, held: 0, probes: 0 };

  constructor(private readonly options: SequenceTrackerOptions) {
    this.maxHeld = options.maxHeld ?? 10_000;
    this.catchUp = options.catchUp ?? true;
  }

  /** The next seq the source is waiting for (null before the first batch). */
  get nextSeq(): bigint | null {
    return this.expected;
  }

  get isReplaying(): boolean {
    return this.replaying;
  }

  get heldCount(): number {
    return this.held.size;
  }

  /** The connection to the engine was lost: the engine may come back as a new process. */
  disconnected(): void {
    if (this.lastLive !== null) this.suspectRestart = true;
  }

  /** A batch from the live subscription. */
  live(seq: bigint, item: T): TrackerOutput<T>[] {
    const out: TrackerOutput<T>[] = [];
    if (this.lastLive !== null && seq <= this.lastLive) {
      // Live seqs only grow while the engine lives; going back means a new engine process with an empty cache.
      this.abandon();
      this.expected = null;
      this.reset(out, 'restart');
    } else if (this.suspectRestart && seq !== this.lastLive! + 1n) {
      this.abandon();
      this.expected = null;
      this.reset(out, 'reconnect_gap');
    }
    this.suspectRestart = false;
    this.lastLive = seq;
    if (this.expected === null) {
      this.expected = this.catchUp && this.options.replay && seq > 0n ? 0n : seq;
    }
    if (seq < this.expected) return out; // unreachable in practice: kept for safety on a fresh replay window
    if (seq === this.expected && !this.replaying) {
      this.deliver(out, seq, item);
      this.expected = seq + 1n;
      return out;
    }
    this.held.set(seq, item);
    this.counters.held = this.held.size;
    if (this.held.size > this.maxHeld) {
      this.stopReplay();
      this.reset(out, 'hold_overflow');
      this.expected = this.minHeld();
      this.drain(out, false);
      return out;
    }
    if (!this.replaying) this.drain(out, true);
    return out;
  }

  /** A batch from the replay stream `ticket`. Stale tickets are ignored. */
  replayed(ticket: number, seq: bigint, item: T): TrackerOutput<T>[] {
    const out: TrackerOutput<T>[] = [];
    if (ticket !== this.ticket || !this.replaying || this.expected === null) return out;
    if (seq < this.expected) return out; // already delivered (the stream includes everything >= start)
    this.counters.replayedBatches++;
    if (seq > this.expected) {
      // The engine's buffer no longer holds the start of the gap.
      this.reset(out, 'replay_too_old');
      this.expected = seq;
    }
    this.deliver(out, seq, item);
    this.expected = seq + 1n;
    this.held.delete(seq);
    this.takeHeld(out);
    return out;
  }

  /** The replay stream `ticket` ended: `ok` false when it timed out or failed. */
  replayEnded(ticket: number, ok: boolean): TrackerOutput<T>[] {
    const out: TrackerOutput<T>[] = [];
    if (ticket !== this.ticket || !this.replaying) return out;
    this.replaying = false;
    this.ticket++;
    this.takeHeld(out);
    if (ok && this.held.size > 0 && this.expected !== null && this.expected >= this.replayUntil) {
      // The replay covered its range; a gap that opened while it streamed (after the engine's snapshot) is new.
      this.drain(out, true);
      return out;
    }
    if (this.held.size > 0) {
      this.reset(out, ok ? 'replay_incomplete' : 'replay_unavailable');
      this.expected = this.minHeld();
      // No new replay right after a failure: the next gap (if any) waits for new live traffic.
      this.drain(out, false);
    }
    return out;
  }

  /**
   * Asks for anything at or after the next expected seq: a lost *last* batch is otherwise only noticed when the
   * engine publishes again. Nothing to do while a replay runs or before the first batch. Never resets by itself.
   */
  probe(): TrackerOutput<T>[] {
    if (this.expected === null || this.replaying || !this.options.replay) return [];
    this.replaying = true;
    this.ticket++;
    this.replayUntil = this.expected;
    this.counters.probes++;
    return [{ kind: 'replay', fromSeq: this.expected, untilSeq: this.expected, ticket: this.ticket }];
  }

  /**
   * The publisher announced a new lifetime (the wide frame's epoch changed): a new engine process, whatever its seq
   * says. Everything held or replaying belongs to the old one.
   */
  newPublisher(): TrackerOutput<T>[] {
    const out: TrackerOutput<T>[] = [];
    this.abandon();
    this.expected = null;
    this.lastLive = null;
    this.suspectRestart = false;
    this.reset(out, 'restart');
    return out;
  }

  /** Forces a reset (for example an undecodable batch: its content is lost). */
  forceReset(reason: ResetReason): TrackerOutput<T>[] {
    const out: TrackerOutput<T>[] = [];
    this.reset(out, reason);
    return out;
  }

  private deliver(out: TrackerOutput<T>[], seq: bigint, item: T): void {
    out.push({ kind: 'deliver', seq, item });
    this.counters.delivered++;
    this.dirty = true;
  }

  private reset(out: TrackerOutput<T>[], reason: ResetReason): void {
    // Nothing delivered since the last reset: the source is already empty (for example a catch-up replay at startup
    // that begins past seq 0), so a reset would only be a misleading alarm.
    if (!this.dirty) return;
    this.dirty = false;
    out.push({ kind: 'reset', reason });
    this.counters.resets++;
  }

  private stopReplay(): void {
    if (this.replaying) {
      this.replaying = false;
      this.ticket++;
    }
  }

  /** Forgets the replay and the held batches (they belong to a dead engine process). */
  private abandon(): void {
    this.stopReplay();
    this.held.clear();
    this.counters.held = 0;
  }

  /** Delivers held batches contiguous with `expected`. */
  private takeHeld(out: TrackerOutput<T>[]): void {
    while (this.expected !== null && this.held.has(this.expected)) {
      const item = this.held.get(this.expected)!;
      this.held.delete(this.expected);
      this.deliver(out, this.expected, item);
      this.expected++;
    }
    this.counters.held = this.held.size;
  }

  private minHeld(): bigint {
    let min: bigint | null = null;
    for (const s of this.held.keys()) if (min === null || s < min) min = s;
    return min ?? this.expected ?? 0n;
  }

  /** Delivers what is contiguous; at the first gap asks for a replay, or resets and skips it. */
  private drain(out: TrackerOutput<T>[], mayReplay: boolean): void {
    for (;;) {
      this.takeHeld(out);
      if (this.held.size === 0 || this.replaying) return;
      this.counters.gaps++;
      const first = this.minHeld();
      if (mayReplay && this.options.replay) {
        this.replaying = true;
        this.ticket++;
        this.counters.replaysRequested++;
        this.replayUntil = first;
        out.push({ kind: 'replay', fromSeq: this.expected!, untilSeq: first, ticket: this.ticket });
        return;
      }
      this.reset(out, this.options.replay ? 'replay_unavailable' : 'gap_without_replay');
      this.expected = first;
    }
  }
}
