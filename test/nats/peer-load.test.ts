/**
 * PeerLoad's publishing: a turn's lifecycle messages leave at the end of the turn, in order (one socket write for all
 * of them in the NATS client), a bye goes out at once after what was queued, and a failing send is counted without
 * losing the messages after it.
 */
import { describe, expect, it } from 'vitest';
import { KvRouter } from '../../src/core/router.ts';
import type { RouteDecision } from '../../src/core/types.ts';
import { PeerLoad } from '../../src/transport/nats/peer-load.ts';
import { decodeLoad } from '../../src/transport/nats/protocol.ts';

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

function peerLoad(send: (data: Uint8Array) => void): PeerLoad {
  return new PeerLoad({ router: new KvRouter({ blockSize: 16 }), replicaId: 'r1', send, now: () => 0, peerTtlMs: 5000, log: quiet });
}

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
