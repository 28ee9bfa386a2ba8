import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { SequenceTracker, type TrackerOutput } from '../../src/ingest/sequence-tracker.ts';

const ticketOf = (out: TrackerOutput<string>[]): { ticket: number } => {
  const r = out.find((o) => o.kind === 'replay');
  if (r?.kind !== 'replay') throw new Error('expected a replay request');
  return r;
};

const summary = (out: TrackerOutput<string>[]) =>
  out.map((o) => (o.kind === 'deliver' ? `d${o.seq}` : o.kind === 'reset' ? `reset:${o.reason}` : `replay:${o.fromSeq}-${o.untilSeq}`));

describe('SequenceTracker', () => {
  it('delivers in order, starting wherever the engine is when replay is off', () => {
    const t = new SequenceTracker<string>({ replay: false });
    expect(summary(t.live(7n, 'a'))).toEqual(['d7']);
    expect(summary(t.live(8n, 'b'))).toEqual(['d8']);
  });

  it('gap -> replay of the missing range, later batches held until it arrives', () => {
    const t = new SequenceTracker<string>({ replay: true });
    t.live(0n, 'a');
    const out = t.live(3n, 'd');
    expect(summary(out)).toEqual(['replay:1-3']);
    const ticket = (out[0] as { ticket: number }).ticket;
    expect(summary(t.live(4n, 'e'))).toEqual([]);
    expect(t.heldCount).toBe(2);
    expect(summary(t.replayed(ticket, 1n, 'b'))).toEqual(['d1']);
    // The replay stream carries everything >= start: 3 and 4 come from it or from the held copies, never twice.
    expect(summary(t.replayed(ticket, 2n, 'c'))).toEqual(['d2', 'd3', 'd4']);
    expect(summary(t.replayed(ticket, 3n, 'd'))).toEqual([]);
    expect(summary(t.replayEnded(ticket, true))).toEqual([]);
    expect(summary(t.live(5n, 'f'))).toEqual(['d5']);
    expect(t.counters).toMatchObject({ gaps: 1, replaysRequested: 1, resets: 0 });
  });

  it('a gap that opens while a replay streams gets its own replay, not a reset', () => {
    const t = new SequenceTracker<string>({ replay: true });
    t.live(0n, 'a');
    const r = ticketOf(t.live(2n, 'c'));
    expect(summary(t.replayed(r.ticket, 1n, 'b'))).toEqual(['d1', 'd2']);
    // Batch 3 is lost while the replay (a snapshot up to 2) is still streaming.
    expect(summary(t.live(4n, 'e'))).toEqual([]);
    const out = t.replayEnded(r.ticket, true);
    expect(summary(out)).toEqual(['replay:3-4']);
    const r2 = ticketOf(out);
    expect(summary(t.replayed(r2.ticket, 3n, 'd'))).toEqual(['d3', 'd4']);
    expect(summary(t.replayEnded(r2.ticket, true))).toEqual([]);
    expect(t.counters.resets).toBe(0);
  });

  it('a tail probe recovers a lost last batch and never resets', () => {
    const t = new SequenceTracker<string>({ replay: true });
    expect(t.probe()).toEqual([]); // nothing known yet
    t.live(0n, 'a');
    const out = t.probe();
    expect(summary(out)).toEqual(['replay:1-1']);
    const p = ticketOf(out);
    expect(t.probe()).toEqual([]); // one at a time
    expect(summary(t.replayed(p.ticket, 1n, 'b'))).toEqual(['d1']);
    expect(summary(t.replayEnded(p.ticket, true))).toEqual([]);
    const p2 = ticketOf(t.probe());
    expect(summary(t.live(2n, 'c'))).toEqual([]); // held while the probe runs
    expect(summary(t.replayEnded(p2.ticket, false))).toEqual(['d2']);
    expect(t.counters).toMatchObject({ probes: 2, resets: 0 });
  });

  it('replay unavailable -> reset, then the held batches', () => {
    const t = new SequenceTracker<string>({ replay: true });
    t.live(0n, 'a');
    const r = ticketOf(t.live(2n, 'c'));
    t.live(3n, 'd');
    expect(summary(t.replayEnded(r.ticket, false))).toEqual(['reset:replay_unavailable', 'd2', 'd3']);
    expect(summary(t.live(4n, 'e'))).toEqual(['d4']);
  });

  it('replay starting past the gap (buffer too old) -> reset before the first replayed batch', () => {
    const t = new SequenceTracker<string>({ replay: true });
    t.live(0n, 'a');
    const r = ticketOf(t.live(5n, 'f'));
    expect(summary(t.replayed(r.ticket, 3n, 'd'))).toEqual(['reset:replay_too_old', 'd3']);
    expect(summary(t.replayed(r.ticket, 4n, 'e'))).toEqual(['d4', 'd5']);
    expect(summary(t.replayEnded(r.ticket, true))).toEqual([]);
  });

  it('replay that ends without covering the gap -> reset', () => {
    const t = new SequenceTracker<string>({ replay: true });
    t.live(0n, 'a');
    const r = ticketOf(t.live(3n, 'd'));
    expect(summary(t.replayed(r.ticket, 1n, 'b'))).toEqual(['d1']);
    expect(summary(t.replayEnded(r.ticket, true))).toEqual(['reset:replay_incomplete', 'd3']);
  });

  it('seq going backwards -> restart -> reset; stale replay results are ignored', () => {
    const t = new SequenceTracker<string>({ replay: true });
    t.live(0n, 'a');
    t.live(1n, 'b');
    const r = ticketOf(t.live(5n, 'f'));
    expect(summary(t.live(0n, 'new-a'))).toEqual(['reset:restart', 'd0']);
    expect(summary(t.replayed(r.ticket, 2n, 'c'))).toEqual([]);
    expect(summary(t.replayEnded(r.ticket, false))).toEqual([]);
    expect(summary(t.live(1n, 'new-b'))).toEqual(['d1']);
  });

  it('after a lost connection, a batch that does not continue the sequence resets (a new engine life)', () => {
    const t = new SequenceTracker<string>({ replay: true });
    t.live(0n, 'a');
    t.live(1n, 'b');
    t.disconnected();
    expect(summary(t.live(2n, 'c'))).toEqual(['d2']); // a blip without loss: nothing to do
    t.disconnected();
    // The restarted engine published 0..4 before we reconnected: not a gap to replay, a new life to catch up with.
    const out = t.live(5n, 'new-f');
    expect(summary(out)).toEqual(['reset:reconnect_gap', 'replay:0-5']);
    expect(summary(t.live(6n, 'new-g'))).toEqual([]);
  });

  it('catches up from seq 0 when first seeing an engine mid-stream', () => {
    const t = new SequenceTracker<string>({ replay: true });
    const out = t.live(3n, 'd');
    expect(summary(out)).toEqual(['replay:0-3']);
    const ticket = (out[0] as { ticket: number }).ticket;
    t.replayed(ticket, 0n, 'a');
    t.replayed(ticket, 1n, 'b');
    expect(summary(t.replayed(ticket, 2n, 'c'))).toEqual(['d2', 'd3']);
  });

  it('a catch-up replay that starts past seq 0 at startup is not a reset (nothing was known)', () => {
    const t = new SequenceTracker<string>({ replay: true });
    const r = ticketOf(t.live(5000n, 'x'));
    expect(summary(t.replayed(r.ticket, 3000n, 'old'))).toEqual(['d3000']);
    expect(t.counters.resets).toBe(0);
  });

  it('hold overflow abandons the replay and resets', () => {
    const t = new SequenceTracker<string>({ replay: true, maxHeld: 3 });
    t.live(0n, 'a');
    const r = ticketOf(t.live(2n, 'c'));
    t.live(3n, 'd');
    t.live(4n, 'e');
    expect(summary(t.live(5n, 'f'))).toEqual(['reset:hold_overflow', 'd2', 'd3', 'd4', 'd5']);
    expect(summary(t.replayed(r.ticket, 1n, 'b'))).toEqual([]);
  });

  it('property: whatever the arrival order and replay behaviour, delivered seqs are consecutive between resets', () => {
    fc.assert(
      fc.property(
        fc.array(fc.record({ op: fc.integer({ min: 0, max: 9 }), seq: fc.bigInt({ min: 0n, max: 40n }) }), { maxLength: 200 }),
        (ops) => {
          const t = new SequenceTracker<string>({ replay: true, maxHeld: 8 });
          let last: bigint | null = null;
          let ticket = -1;
          let liveSeq = 0n;
          for (const { op, seq } of ops) {
            let out: TrackerOutput<string>[];
            if (op < 5) {
              liveSeq += BigInt(op % 3);
              out = t.live(liveSeq, 'x');
              liveSeq++;
            } else if (op < 7) out = t.live(seq, 'x');
            else if (op < 9) out = t.replayed(ticket, seq, 'r');
            else out = t.replayEnded(ticket, seq % 2n === 0n);
            for (const o of out) {
              if (o.kind === 'reset') last = null;
              else if (o.kind === 'replay') ticket = o.ticket;
              else {
                if (last !== null && o.seq !== last + 1n) return false;
                last = o.seq;
              }
            }
            if (t.heldCount > 9) return false;
          }
          return true;
        },
      ),
      { numRuns: 300 },
    );
  });
});
