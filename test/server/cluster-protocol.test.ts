/**
 * The IPC of `kvroute serve --processes N` (src/server/cluster/protocol.ts): what the primary accepts from a shell. A
 * message that fails shellMessageProblem is dropped and counted by the primary (router_shell_messages_dropped_total),
 * and a request it names is refused, never left waiting and never a crash.
 */
import { describe, expect, it } from 'vitest';
import { Outbox, shellMessageProblem } from '../../src/server/cluster/protocol.ts';

/** The primary's check at the default block size. */
const problem = (m: unknown) => shellMessageProblem(m, 16);
const sub = (over: Record<string, unknown> = {}) => ({ requestId: 'r1', model: 'm', tokens: Uint32Array.of(1, 2, 3), ...over });

describe('shellMessageProblem', () => {
  it('accepts the messages a shell sends', () => {
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 'completions', sub: sub() })).toBeNull();
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 'completions', sub: sub({ tokens: [1, 2] }) })).toBeNull();
    // Hashed in the shell: one hash per full block (40 tokens: 2 blocks of 16 and 8 in a partial block), and the adapter.
    const hashed = sub({ tokens: undefined, seqHashes: new BigUint64Array(2), promptTokens: 40 });
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 'chat', sub: hashed, lora: null })).toBeNull();
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 'chat', sub: hashed, lora: 'adapter-a' })).toBeNull();
    expect(
      problem({
        k: 'kvr.submit',
        id: 'r1',
        api: 'chat',
        sub: { ...hashed, seqHashes: new BigUint64Array(0), promptTokens: 15 },
        lora: null,
      }),
    ).toBeNull();
    expect(problem({ k: 'kvr.failed', id: 'r1', error: 'reset' })).toBeNull();
    expect(problem({ k: 'kvr.cancel', id: 'r1' })).toBeNull();
    expect(problem({ k: 'kvr.finish', id: 'r1', report: { outcome: 'ok' } })).toBeNull();
    // A whole answer's first token comes with its finish.
    expect(problem({ k: 'kvr.finish', id: 'r1', report: { outcome: 'ok' }, outputTokens: 2, firstToken: true })).toBeNull();
    expect(problem({ k: 'kvr.firstToken', id: 'r1' })).toBeNull();
    const metrics = { json: '[]', totals: {} };
    expect(problem({ k: 'kvr.cacheInfo', id: 3, cache: null, metrics })).toBeNull();
    expect(problem({ k: 'kvr.snapshot', metrics })).toBeNull();
    expect(problem({ k: 'kvr.ready' })).toBeNull();
  });

  it('names what is wrong with a malformed one', () => {
    expect(problem(null)).toBe('not an object');
    expect(problem('kvr.submit')).toBe('not an object');
    expect(problem({ k: 7 })).toBe('no kvr.* kind');
    expect(problem({ k: 'kvr.nonsense' })).toBe('unknown kind kvr.nonsense');
    expect(problem({ k: 'kvr.submit', sub: sub() })).toBe('kvr.submit without a request id');
    expect(problem({ k: 'kvr.submit', id: 'r1' })).toBe('kvr.submit without a submission');
    expect(problem({ k: 'kvr.submit', id: 'r2', sub: sub() })).toBe('kvr.submit whose submission names another request');
    expect(problem({ k: 'kvr.submit', id: 'r1', sub: sub({ model: undefined }) })).toBe('kvr.submit without a model');
    // The API the request came in on (what /debug/state's recent decisions show).
    expect(problem({ k: 'kvr.submit', id: 'r1', sub: sub() })).toBe('kvr.submit without an api');
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 7, sub: sub() })).toBe('kvr.submit without an api');
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 'completions', sub: sub({ tokens: 'abc' }) })).toBe('kvr.submit without token ids');
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 'completions', sub: sub({ tokens: undefined }) })).toBe(
      'kvr.submit without token ids',
    );
    // Block hashes of the wrong type or length, without their prompt length or adapter, or beside token ids.
    const hashed = (over: Record<string, unknown>) =>
      sub({ tokens: undefined, seqHashes: new BigUint64Array(2), promptTokens: 40, ...over });
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 'completions', sub: hashed({ seqHashes: [1n, 2n] }), lora: null })).toBe(
      'kvr.submit whose block hashes are not a BigUint64Array',
    );
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 'completions', sub: hashed({ seqHashes: new Uint32Array(2) }), lora: null })).toBe(
      'kvr.submit whose block hashes are not a BigUint64Array',
    );
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 'completions', sub: hashed({ promptTokens: 48 }), lora: null })).toBe(
      'kvr.submit with 2 block hashes for 48 tokens (3 full blocks of 16)',
    );
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 'completions', sub: hashed({ promptTokens: 31 }), lora: null })).toBe(
      'kvr.submit with 2 block hashes for 31 tokens (1 full blocks of 16)',
    );
    expect(shellMessageProblem({ k: 'kvr.submit', id: 'r1', api: 'completions', sub: hashed({}), lora: null }, 32)).toBe(
      'kvr.submit with 2 block hashes for 40 tokens (1 full blocks of 32)',
    );
    for (const promptTokens of [undefined, -16, 40.5, '40']) {
      expect(problem({ k: 'kvr.submit', id: 'r1', api: 'completions', sub: hashed({ promptTokens }), lora: null })).toBe(
        'kvr.submit with block hashes but no prompt length',
      );
    }
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 'completions', sub: hashed({}) })).toBe(
      'kvr.submit with block hashes but no adapter they were seeded with',
    );
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 'completions', sub: hashed({}), lora: 7 })).toBe(
      'kvr.submit with block hashes but no adapter they were seeded with',
    );
    expect(problem({ k: 'kvr.submit', id: 'r1', api: 'completions', sub: hashed({ tokens: Uint32Array.of(1) }), lora: null })).toBe(
      'kvr.submit without token ids',
    );
    expect(problem({ k: 'kvr.failed', id: 'r1' })).toBe('kvr.failed without an error');
    expect(problem({ k: 'kvr.finish', id: 'r1' })).toBe('kvr.finish without a report');
    expect(problem({ k: 'kvr.finish', id: 'r1', report: { outcome: 'ok' }, firstToken: 1 })).toBe(
      'kvr.finish whose firstToken is not true',
    );
    expect(problem({ k: 'kvr.firstToken' })).toBe('kvr.firstToken without a request id');
    // Kinds a shell no longer sends: request metrics (recorded in the shells) and routed decisions (noted by the primary).
    expect(problem({ k: 'kvr.metrics', calls: [['apiRequest', 'chat']] })).toBe('unknown kind kvr.metrics');
    expect(problem({ k: 'kvr.routed', decision: { requestId: 'r1', worker: 'w0' } })).toBe('unknown kind kvr.routed');
    expect(problem({ k: 'kvr.cacheInfo', id: 'x' })).toBe('kvr.cacheInfo without an id');
    const noRegistry = 'a shell metrics snapshot without its registry';
    expect(problem({ k: 'kvr.cacheInfo', id: 3, cache: null })).toBe(noRegistry);
    expect(problem({ k: 'kvr.snapshot', metrics: { json: [], totals: {} } })).toBe(noRegistry);
  });
});

describe('Outbox', () => {
  it("sends a turn's messages as one batch; a finish takes the place of the message queued last", () => {
    const sent: unknown[] = [];
    const box = new Outbox<{ readonly k: string; readonly id: string } & Record<string, unknown>>((m) => sent.push(m));
    const first = { k: 'kvr.firstToken', id: 'r1' };
    box.push({ k: 'kvr.submit', id: 'r2' });
    box.push(first);
    expect(box.last()).toBe(first);
    // A whole answer: its first token and its end, one message.
    box.replaceLast({ k: 'kvr.finish', id: 'r1', report: { outcome: 'ok' }, firstToken: true });
    box.flush();
    expect(sent).toEqual([
      {
        k: 'kvr.batch',
        msgs: [
          { k: 'kvr.submit', id: 'r2' },
          { k: 'kvr.finish', id: 'r1', report: { outcome: 'ok' }, firstToken: true },
        ],
      },
    ]);
    expect(box.last()).toBeUndefined();
    // Nothing queued: the replacement is sent as a message of its own.
    box.replaceLast(first);
    box.flush();
    expect(sent[1]).toBe(first);
  });
});
