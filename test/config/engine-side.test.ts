/** The kinds of value only the engine-side commands hold (ZMQ endpoints, polynomial coefficients), as the family checks them. */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { triple, zmqEndpoint } from '../../src/config/engine-side.ts';
import { bytes, optional, resolveSettings } from '../../src/config/settings.ts';

const schema = z.strictObject({
  bound: optional(zmqEndpoint(), { flag: '--bound <ep>', env: '', help: 'a bound endpoint' }),
  orNone: optional(zmqEndpoint({ none: true }), { flag: '--or-none <ep>', env: '', help: 'a bound endpoint or none' }),
  events: optional(zmqEndpoint({ connectable: true }), { flag: '--events <ep>', env: '', help: 'a connectable endpoint' }),
  poly: optional(triple(), { flag: '--poly <a,b,c>', env: '', help: 'coefficients' }),
  maxBytes: optional(bytes(), { flag: '--max-bytes <n>', env: '', help: 'a size' }),
});

const flags = (values: Record<string, string>) => resolveSettings(schema, { flags: values }).config;

describe('engine-side kinds', () => {
  it('accept what engines write', () => {
    expect(flags({ bound: 'tcp://*:5557', orNone: 'none', events: 'tcp://gpu1:5557', poly: '1,-2.5,3e-7', maxBytes: '1gb' })).toEqual({
      bound: 'tcp://*:5557',
      orNone: 'none',
      events: 'tcp://gpu1:5557',
      poly: [1, -2.5, 3e-7],
      maxBytes: 1024 ** 3,
    });
    expect(flags({ bound: 'ipc:///tmp/kv', orNone: 'inproc://kv' })).toMatchObject({ bound: 'ipc:///tmp/kv', orNone: 'inproc://kv' });
  });

  it.each([
    [{ bound: 'none' }, '--bound must be a ZMQ endpoint like tcp://*:5557, got "none" (from --bound)'],
    [{ orNone: 'localhost:5557' }, '--or-none must be a ZMQ endpoint like tcp://*:5557 (or "none"), got "localhost:5557" (from --or-none)'],
    [{ orNone: 'nonesuch' }, '--or-none must be a ZMQ endpoint like tcp://*:5557 (or "none"), got "nonesuch" (from --or-none)'],
    [{ events: 'tcp://*:5557' }, '--events must be a tcp://host:port endpoint, got "tcp://*:5557" (from --events)'],
    [{ events: 'ipc:///tmp/kv' }, '--events must be a tcp://host:port endpoint, got "ipc:///tmp/kv" (from --events)'],
    [{ poly: '1,2' }, '--poly must be 3 comma-separated numbers, got "1,2" (from --poly)'],
    [{ poly: '1,2,3,4' }, '--poly must be 3 comma-separated numbers, got "1,2,3,4" (from --poly)'],
    [{ poly: '1,x,3' }, '--poly must be 3 comma-separated numbers, got "x" (from --poly)'],
    [{ maxBytes: '0' }, '--max-bytes must be a size like 32mb, 512kb or 1048576, got "0" (from --max-bytes)'],
  ])('%j is refused in one line naming the flag', (values, message) => {
    expect(() => flags(values)).toThrow(message);
  });
});
