import { describe, expect, it } from 'vitest';
import { ClientCancel } from '../../src/runtime/cancel.ts';

describe('ClientCancel (a request’s "the client left" without an AbortController per request)', () => {
  it('runs each listener still added once when the client leaves, and none removed before', () => {
    const c = new ClientCancel();
    const calls: string[] = [];
    const a = () => calls.push('a');
    const b = () => calls.push('b');
    c.flowSignal.addEventListener('abort', a, { once: true });
    c.flowSignal.addEventListener('abort', b, { once: true });
    c.flowSignal.removeEventListener('abort', a);
    expect(c.flowSignal.aborted).toBe(false);
    c.abort();
    c.abort();
    expect(c.flowSignal.aborted).toBe(true);
    expect(calls).toEqual(['b']);
  });

  it('gives a real AbortSignal on demand: aborted with it, or already aborted when made after', () => {
    const before = new ClientCancel();
    const signal = before.signal;
    expect(signal).toBeInstanceOf(AbortSignal);
    expect(before.signal).toBe(signal);
    let fired = 0;
    signal.addEventListener('abort', () => fired++);
    before.abort();
    expect(signal.aborted).toBe(true);
    expect(fired).toBe(1);
    const after = new ClientCancel();
    after.abort();
    expect(after.signal.aborted).toBe(true);
  });

  it('runs every listener and aborts the real signal when one listener throws, then throws its error', () => {
    const c = new ClientCancel();
    const signal = c.signal;
    const calls: string[] = [];
    c.flowSignal.addEventListener('abort', () => {
      calls.push('a');
      throw new Error('listener a failed');
    });
    c.flowSignal.addEventListener('abort', () => calls.push('b'));
    expect(() => c.abort()).toThrow('listener a failed');
    expect(calls).toEqual(['a', 'b']);
    expect(signal.aborted).toBe(true);
    expect(c.flowSignal.aborted).toBe(true);
  });
});
