/**
 * The IPC of `kvroute serve --processes N` (src/server/cluster/protocol.ts): what the primary accepts from a shell. A
 * message that fails shellMessageProblem is dropped and counted by the primary (router_shell_messages_dropped_total),
 * and a request it names is refused, never left waiting and never a crash.
 */
import { describe, expect, it } from 'vitest';
import { Outbox, PRIMARY_PACKED, SHELL_PACKED, shellMessageProblem, Unpacker } from '../../src/server/cluster/protocol.ts';

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

describe('Outbox and Unpacker', () => {
  type M = { readonly k: string } & Record<string, unknown>;
  const outbox = (packed: ReadonlySet<string>) => {
    const sent: unknown[] = [];
    return { sent, box: new Outbox<M>((m) => sent.push(m), packed) };
  };

  it('packs a turn of per-request messages into one kvr.packed that unpacks to them, typed arrays, Sets and undefined kept', () => {
    const { sent, box } = outbox(SHELL_PACKED);
    const submit = {
      k: 'kvr.submit',
      id: 'r1',
      api: 'completions',
      sub: {
        requestId: 'r1',
        model: 'm',
        seqHashes: BigUint64Array.of(2n ** 64n - 1n, 7n),
        promptTokens: 40,
        roles: new Set(['decode']),
        pinKey: undefined,
      },
      lora: null,
    };
    const tokens = { k: 'kvr.submit', id: 'r2', api: 'chat', sub: { requestId: 'r2', model: 'm', tokens: Uint32Array.of(1, 2, 3) } };
    const finish = { k: 'kvr.finish', id: 'r0', report: { outcome: 'ok', cachedTokens: 32 }, outputTokens: 2, firstToken: true };
    box.push(submit);
    box.push(tokens);
    box.push(finish);
    box.flush();
    expect(sent).toHaveLength(1);
    const packed = sent[0] as { k: string; b: Uint8Array };
    expect(packed.k).toBe('kvr.packed');
    const msgs = new Unpacker().unpack(packed.b);
    // What node's structured clone (the 'advanced' channel) would have delivered.
    expect(msgs).toEqual([structuredClone(submit), structuredClone(tokens), structuredClone(finish)]);
    const sub = (msgs[0] as typeof submit).sub;
    expect(sub.seqHashes).toBeInstanceOf(BigUint64Array);
    expect(sub.seqHashes[0]).toBe(2n ** 64n - 1n);
    expect(sub.roles).toBeInstanceOf(Set);
    expect('pinKey' in sub).toBe(true);
    expect((msgs[1] as typeof tokens).sub.tokens).toBeInstanceOf(Uint32Array);
    expect(shellMessageProblem(msgs[0], 16)).toBeNull();
  });

  it('sends a turn with another kind as it is; each pack stands alone (many shapes, read in any order)', () => {
    const { sent, box } = outbox(PRIMARY_PACKED);
    const read = (m: { k: string; b?: Uint8Array; msgs?: unknown[] }, inbox = new Unpacker()) =>
      m.k === 'kvr.packed' ? inbox.unpack(m.b) : m.k === 'kvr.batch' ? (m.msgs as unknown[]) : [m];
    // Many shapes (msgpackr's record extension in sequential mode lost track past 32): every pack read by one unpacker,
    // and each again by a fresh one, last first.
    const steps = Array.from({ length: 200 }, (_, i) => ({
      k: 'kvr.step',
      id: `r${i}`,
      step: { kind: 'dispatch', [`f${i % 50}`]: i },
      workers: [],
    }));
    const inbox = new Unpacker();
    for (const step of steps) {
      box.push(step);
      box.flush();
    }
    expect(sent.every((m) => (m as { k: string }).k === 'kvr.packed')).toBe(true);
    expect(sent.flatMap((m) => read(m as { k: string }, inbox))).toEqual(steps);
    expect([...sent].reverse().flatMap((m) => read(m as { k: string }))).toEqual([...steps].reverse());
    sent.length = 0;
    // kvr.close is never packed (a shell not started yet reads it alone): its turn goes as a plain batch.
    box.push({ k: 'kvr.step', id: 'x', step: { kind: 'aborted' }, workers: [] });
    box.push({ k: 'kvr.close', graceMs: 5 });
    box.flush();
    expect(sent[0]).toHaveProperty('k', 'kvr.batch');
    expect(read(sent.shift() as { k: string })).toHaveLength(2);
    // A value msgpackr cannot write (a symbol): sent as it is; the next turn is packed again.
    const big = { k: 'kvr.step', id: 'big', step: { kind: 'dispatch', n: Symbol('n') }, workers: [] };
    box.push(big);
    box.flush();
    expect(sent.shift()).toBe(big);
    box.push(steps[7]);
    box.flush();
    expect(read(sent.shift() as { k: string }, inbox)).toEqual([steps[7]]);
  });

  it('a finish takes the place of the message queued last (a whole answer: its first token and its end)', () => {
    const { sent, box } = outbox(SHELL_PACKED);
    const first = { k: 'kvr.firstToken', id: 'r1' };
    box.push(first);
    expect(box.last()).toBe(first);
    box.replaceLast({ k: 'kvr.finish', id: 'r1', report: { outcome: 'ok' }, firstToken: true });
    box.flush();
    expect(new Unpacker().unpack((sent[0] as { b: Uint8Array }).b)).toEqual([
      { k: 'kvr.finish', id: 'r1', report: { outcome: 'ok' }, firstToken: true },
    ]);
    expect(box.last()).toBeUndefined();
  });

  it('refuses bytes that are not a packed list', () => {
    expect(() => new Unpacker().unpack('abc')).toThrow('kvr.packed without its bytes');
    expect(() => new Unpacker().unpack(new Uint8Array([0x01]))).toThrow('kvr.packed that is not a list');
    expect(() => new Unpacker().unpack(new Uint8Array([0xc1, 0xff, 0x00]))).toThrow();
  });
});
