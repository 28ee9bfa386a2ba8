/**
 * The IPC of `kvroute serve --processes N` (src/server/cluster/protocol.ts): what the primary accepts from a shell. A
 * message that fails shellMessageProblem is dropped and counted by the primary (router_shell_messages_dropped_total),
 * and a request it names is refused, never left waiting and never a crash.
 */
import { describe, expect, it } from 'vitest';
import { shellMessageProblem } from '../../src/server/cluster/protocol.ts';

const sub = (over: Record<string, unknown> = {}) => ({ requestId: 'r1', model: 'm', tokens: Uint32Array.of(1, 2, 3), ...over });

describe('shellMessageProblem', () => {
  it('accepts the messages a shell sends', () => {
    expect(shellMessageProblem({ k: 'kvr.submit', id: 'r1', sub: sub() })).toBeNull();
    expect(shellMessageProblem({ k: 'kvr.submit', id: 'r1', sub: sub({ tokens: [1, 2] }) })).toBeNull();
    expect(
      shellMessageProblem({ k: 'kvr.submit', id: 'r1', sub: sub({ tokens: undefined, seqHashes: new BigUint64Array(2) }) }),
    ).toBeNull();
    expect(shellMessageProblem({ k: 'kvr.failed', id: 'r1', error: 'reset' })).toBeNull();
    expect(shellMessageProblem({ k: 'kvr.cancel', id: 'r1' })).toBeNull();
    expect(shellMessageProblem({ k: 'kvr.finish', id: 'r1', report: { outcome: 'ok' } })).toBeNull();
    const metrics = { json: '[]', totals: {} };
    expect(shellMessageProblem({ k: 'kvr.routed', decision: { requestId: 'r1', worker: 'w0', api: 'completions' } })).toBeNull();
    expect(shellMessageProblem({ k: 'kvr.cacheInfo', id: 3, cache: null, metrics })).toBeNull();
    expect(shellMessageProblem({ k: 'kvr.snapshot', metrics })).toBeNull();
    expect(shellMessageProblem({ k: 'kvr.ready' })).toBeNull();
  });

  it('names what is wrong with a malformed one', () => {
    expect(shellMessageProblem(null)).toBe('not an object');
    expect(shellMessageProblem('kvr.submit')).toBe('not an object');
    expect(shellMessageProblem({ k: 7 })).toBe('no kvr.* kind');
    expect(shellMessageProblem({ k: 'kvr.nonsense' })).toBe('unknown kind kvr.nonsense');
    expect(shellMessageProblem({ k: 'kvr.submit', sub: sub() })).toBe('kvr.submit without a request id');
    expect(shellMessageProblem({ k: 'kvr.submit', id: 'r1' })).toBe('kvr.submit without a submission');
    expect(shellMessageProblem({ k: 'kvr.submit', id: 'r2', sub: sub() })).toBe('kvr.submit whose submission names another request');
    expect(shellMessageProblem({ k: 'kvr.submit', id: 'r1', sub: sub({ model: undefined }) })).toBe('kvr.submit without a model');
    expect(shellMessageProblem({ k: 'kvr.submit', id: 'r1', sub: sub({ tokens: 'abc' }) })).toBe('kvr.submit without token ids');
    expect(shellMessageProblem({ k: 'kvr.submit', id: 'r1', sub: sub({ tokens: undefined }) })).toBe('kvr.submit without token ids');
    expect(shellMessageProblem({ k: 'kvr.failed', id: 'r1' })).toBe('kvr.failed without an error');
    expect(shellMessageProblem({ k: 'kvr.finish', id: 'r1' })).toBe('kvr.finish without a report');
    expect(shellMessageProblem({ k: 'kvr.metrics', calls: [['apiRequest', 'chat']] })).toBe('unknown kind kvr.metrics');
    expect(shellMessageProblem({ k: 'kvr.routed', decision: { requestId: 'r1' } })).toBe('kvr.routed without a decision');
    expect(shellMessageProblem({ k: 'kvr.cacheInfo', id: 'x' })).toBe('kvr.cacheInfo without an id');
    const noRegistry = 'a shell metrics snapshot without its registry';
    expect(shellMessageProblem({ k: 'kvr.cacheInfo', id: 3, cache: null })).toBe(noRegistry);
    expect(shellMessageProblem({ k: 'kvr.snapshot', metrics: { json: [], totals: {} } })).toBe(noRegistry);
  });
});
