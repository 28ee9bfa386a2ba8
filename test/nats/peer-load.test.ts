/**
 * PeerLoad's publishing: a turn's lifecycle messages leave at the end of the turn, in order (one socket write for all
 * of them in the NATS client), a bye goes out at once after what was queued, and a failing send is counted without
 * losing the messages after it. Protocol 2: once every peer has said version 2, a turn's steps leave as one frame that
 * a peer folds exactly as it folds the single messages; a protocol-1 peer keeps the single messages coming; a frame
 * or message that cannot be decoded is a counted drop, never a throw.
 */
import fc from 'fast-check';
import { Packr } from 'msgpackr';
import { describe, expect, it } from 'vitest';
import { KvRouter } from '../../src/core/router.ts';
import type { RouteDecision } from '../../src/core/types.ts';
import { PeerLoad } from '../../src/transport/nats/peer-load.ts';
import { decodeLoad, encodeLoad, encodeLoadFrame, type LoadStep } from '../../src/transport/nats/protocol.ts';

const quiet = { info: () => {}, warn: () => {}, error: () => {} };
const turn = () => new Promise((resolve) => setImmediate(resolve));

function decision(requestId: string): RouteDecision {
  return {
    kind: 'routed',
    requestId,
    source: 0 as unknown as RouteDecision['source'],
    sourceKey: 'w0:0',
    policy: 'kv',
    promptTokens: 32,
    islBlocks: 2,
    overlapBlocks: 1,
    bestOverlapBlocks: 1,
    candidates: [],
    seqHashes: new BigUint64Array([1n, 2n]),
  };
}

function peerLoad(send: (data: Uint8Array) => void, replicaId = 'r1', router = new KvRouter({ blockSize: 16 })): PeerLoad {
  return new PeerLoad({ router, replicaId, send, now: () => 0, peerTtlMs: 5000, log: quiet });
}

/** A router with sources w0..w3 (the decisions' source keys). */
function routerWithSources(): KvRouter {
  const r = new KvRouter({ blockSize: 16 });
  for (let w = 0; w < 4; w++) r.addSource({ workerId: `w${w}`, dpRank: 0 });
  return r;
}

/** What a peer's router shows of the load: per source, active requests and prefill tokens. */
function loadView(r: KvRouter): unknown {
  return r
    .state()
    .sources.map((s) => ({ source: s.source, requests: s.activeRequests, blocks: s.activeBlocks, prefill: s.activePrefillTokens }));
}

const packr = new Packr({ useRecords: false });

describe('PeerLoad publishing', () => {
  it("sends a turn's messages at the end of the turn, in order", async () => {
    const sent: Uint8Array[] = [];
    const p = peerLoad((d) => sent.push(d));
    p.routed(decision('a'));
    p.firstToken('a');
    p.routed(decision('b'));
    p.finished('a');
    expect(sent).toHaveLength(0);
    await turn();
    expect(sent.map((d) => decodeLoad(d))).toMatchObject([
      { kind: 'added', requestId: 'a', sourceKey: 'w0:0', promptTokens: 32 },
      { kind: 'first_token', requestId: 'a' },
      { kind: 'added', requestId: 'b' },
      { kind: 'finished', requestId: 'a' },
    ]);
    expect(p.stats.lifecyclePublished).toBe(4);
    // The next turn's messages go in the next turn's flush.
    p.finished('b');
    await turn();
    expect(sent.map((d) => decodeLoad(d)?.kind)).toEqual(['added', 'first_token', 'added', 'finished', 'finished']);
  });

  it('says bye at once, after what was queued, and publishes nothing after it', async () => {
    const sent: Uint8Array[] = [];
    const p = peerLoad((d) => sent.push(d));
    p.routed(decision('a'));
    p.bye();
    expect(sent.map((d) => decodeLoad(d)?.kind)).toEqual(['added', 'bye']);
    p.finished('a');
    p.hello();
    await turn();
    expect(sent).toHaveLength(2);
  });

  it('counts a send that throws and still sends the messages after it', async () => {
    const sent: string[] = [];
    let calls = 0;
    const p = peerLoad((d) => {
      calls++;
      if (calls === 1) throw new Error('connection closed');
      sent.push(decodeLoad(d)?.kind ?? '?');
    });
    p.routed(decision('a'));
    p.firstToken('a');
    p.finished('a');
    await turn();
    expect(sent).toEqual(['first_token', 'finished']);
    expect(p.stats).toMatchObject({ lifecyclePublished: 2, lifecyclePublishErrors: 1 });
  });
});

/** `sender` in frames mode: it has ticked twice and its only peer (`peer`) said protocol 2. */
function framing(sender: PeerLoad, peerId: string): void {
  sender.onMessage(encodeLoad({ kind: 'heartbeat', replica: peerId }));
  sender.tick();
  sender.tick();
}

function decisionOn(requestId: string, worker: number, blocks: number, overlap: number): RouteDecision {
  return {
    ...decision(requestId),
    sourceKey: `w${worker}`,
    promptTokens: blocks * 16,
    islBlocks: blocks,
    overlapBlocks: overlap,
    seqHashes: BigUint64Array.from({ length: blocks }, (_, i) => BigInt(worker * 1000 + i + 1)),
  };
}

describe('load frames (protocol 2)', () => {
  it("sends a turn's steps as one frame, which a peer folds as it folds the single messages", async () => {
    // The same turns sent by one replica in single messages (protocol 1) and by another in frames.
    const turns: ((p: PeerLoad) => void)[] = [
      (p) => {
        p.routed(decisionOn('a', 0, 4, 1));
        p.routed(decisionOn('b', 1, 6, 0));
        p.firstToken('a');
        p.publishSession('s1', 'w1', 99);
      },
      (p) => {
        p.routed(decisionOn('c', 0, 2, 2));
        p.finished('b');
        p.firstToken('c');
      },
      (p) => {
        p.finished('a');
        p.routed(decisionOn('d', 3, 8, 3));
      },
    ];
    const views: Record<string, unknown[]> = { singles: [], frames: [] };
    const sessions: Record<string, unknown[]> = { singles: [], frames: [] };
    const counts: Record<string, number> = {};
    for (const mode of ['singles', 'frames'] as const) {
      const peerRouter = routerWithSources();
      const peer = new PeerLoad({
        router: peerRouter,
        replicaId: 'peer',
        send: () => {},
        now: () => 0,
        peerTtlMs: 5000,
        log: quiet,
        onSession: (...a) => sessions[mode].push(a),
      });
      const sender = peerLoad((d) => peer.onMessage(d), 'r1');
      if (mode === 'frames') framing(sender, 'peer');
      for (const t of turns) {
        t(sender);
        await turn();
        views[mode].push(loadView(peerRouter));
      }
      expect(sender.stats.lifecycleSteps).toBe(9);
      expect(peer.stats).toMatchObject({ remoteAdded: 4, lifecycleDropped: 0 });
      counts[mode] = sender.stats.lifecycleFrames;
    }
    // Frames: one per turn; the peer's load after every turn is the same as with single messages.
    expect(counts).toEqual({ singles: 0, frames: 3 });
    expect(views.frames).toEqual(views.singles);
    expect(sessions.frames).toEqual([['s1', 'w1', 99]]);
    expect(sessions.singles).toEqual(sessions.frames);
    expect(views.frames[2]).toContainEqual({ source: 'w3', requests: 1, blocks: 8, prefill: 5 * 16 });
  });

  it('keeps single messages before two ticks and while a protocol-1 peer is around', async () => {
    const sent: Uint8Array[] = [];
    const p = peerLoad((d) => sent.push(d));
    p.onMessage(encodeLoad({ kind: 'heartbeat', replica: 'new' }));
    p.tick();
    p.routed(decision('a'));
    await turn();
    // One tick: not every peer heard yet.
    expect(p.framesOk()).toBe(false);
    expect(decodeLoad(sent[sent.length - 1])).toMatchObject({ kind: 'added', requestId: 'a' });
    p.tick();
    expect(p.framesOk()).toBe(true);
    // A reconnect says hello again: two more ticks before frames (a protocol-1 replica may have started meanwhile).
    p.hello();
    expect(p.framesOk()).toBe(false);
    p.tick();
    p.tick();
    expect(p.framesOk()).toBe(true);
    // A protocol-1 replica's heartbeat says no version: back to single messages, which protocol 1 reads.
    p.onMessage(packr.pack(['h', 'old']));
    expect(p.framesOk()).toBe(false);
    sent.length = 0;
    p.routed(decision('b'));
    p.finished('a');
    await turn();
    expect(sent.map((d) => decodeLoad(d)).filter((m) => m?.kind !== 'heartbeat' && m?.kind !== 'hello')).toMatchObject([
      { kind: 'added', requestId: 'b' },
      { kind: 'finished', requestId: 'a' },
    ]);
    // It leaves (bye): frames again, which protocol 1's decoder (decodeLoad) answers null for instead of throwing.
    p.onMessage(packr.pack(['bye', 'old']));
    sent.length = 0;
    p.finished('b');
    await turn();
    expect(sent).toHaveLength(1);
    expect(decodeLoad(sent[0])).toBeNull();
    expect(p.stats.lifecycleFrames).toBe(1);
  });

  it('splits a turn into frames well under the NATS max payload', async () => {
    const sent: Uint8Array[] = [];
    const p = peerLoad((d) => sent.push(d));
    framing(p, 'peer');
    // 40 requests of 8,192 blocks (64 KiB of hashes each, a 131,072-token prompt at block size 16).
    for (let i = 0; i < 40; i++) p.routed(decisionOn(`q${i}`, i % 4, 8192, 0));
    await turn();
    expect(sent.length).toBeGreaterThan(1);
    for (const d of sent) expect(d.byteLength).toBeLessThan(512 * 1024);
    const peerRouter = routerWithSources();
    const peer = peerLoad(() => {}, 'peer', peerRouter);
    for (const d of sent) peer.onMessage(d);
    expect(peer.stats.remoteAdded).toBe(40);
  });

  it('drops and counts a frame or message it cannot decode, without folding any of its steps', () => {
    const peerRouter = routerWithSources();
    const peer = peerLoad(() => {}, 'peer', peerRouter);
    const good: LoadStep[] = [
      {
        kind: 'added',
        replica: 'r1',
        requestId: 'a',
        sourceKey: 'w0',
        seqHashes: new BigUint64Array([1n, 2n]),
        promptTokens: 32,
        overlapBlocks: 0,
      },
      { kind: 'first_token', replica: 'r1', requestId: 'a' },
    ];
    const steps = (flat: unknown[]) => packr.pack(['B', 'r1', 2, packr.pack(flat)]);
    const bad: Uint8Array[] = [
      packr.pack(['B', 'r1', 3, packr.pack([1, 'a'])]), // another frame version
      packr.pack(['B', 'r1', 2, 'not bytes']),
      steps([0, 'a', 'w0', new Uint8Array(7), 32, 0]), // hashes not a multiple of 8 bytes
      steps([0, 'a', 'w0', new Uint8Array(16), -1, 0]),
      steps([0, 'a', 'w0', new Uint8Array(16), 32]), // truncated step
      steps([1, 'a', 9, 'x']), // unknown step kind after a good one
      steps([2, 7]),
      steps([3, 's', 'w0', 'soon']),
      packr.pack(['B', 'r1', 2, new Uint8Array([0x93, 0x01])]), // steps cut short
      packr.pack(['a', 'r1', 'q']), // a protocol-1 added without its fields
      new Uint8Array([0xc1]),
    ];
    // Every prefix of a good frame too.
    const frame = encodeLoadFrame('r1', good);
    for (let n = 0; n < frame.byteLength; n++) bad.push(frame.subarray(0, n));
    for (const d of bad) expect(() => peer.onMessage(d)).not.toThrow();
    expect(peer.stats.lifecycleDropped).toBe(bad.length);
    expect(peer.stats.remoteAdded).toBe(0);
    expect(peerRouter.state().inFlight).toBe(0);
    // The good frame itself folds.
    peer.onMessage(frame);
    expect(peer.stats.remoteAdded).toBe(1);
    expect(peer.stats.lifecycleDropped).toBe(bad.length);
  });

  it('never throws on random bytes or random frames', () => {
    const peer = peerLoad(() => {}, 'peer', routerWithSources());
    fc.assert(
      fc.property(
        fc.oneof(
          fc.uint8Array({ maxLength: 60 }),
          fc
            .array(fc.oneof(fc.integer({ min: -1, max: 4 }), fc.string({ maxLength: 4 }), fc.uint8Array({ maxLength: 24 }), fc.double()), {
              maxLength: 14,
            })
            .map((flat) => packr.pack(['B', 'r1', 2, packr.pack(flat)])),
        ),
        (d) => {
          peer.onMessage(d);
        },
      ),
      { numRuns: 500, seed: 29 },
    );
  });

  it('skips its own frames (NATS echoes them) without counting them as dropped', () => {
    const p = peerLoad(() => {}, 'r1', routerWithSources());
    p.onMessage(encodeLoadFrame('r1', [{ kind: 'finished', replica: 'r1', requestId: 'x' }]));
    expect(p.stats).toMatchObject({ lifecycleDropped: 0, peers: 0 });
  });
});
