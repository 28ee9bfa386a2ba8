/**
 * Settings of the commands that stand beside an engine rather than the router (`kvroute relay`, `kvroute mocker`):
 * the ones both take are defined here once, with the kinds of value only they hold (ZMQ endpoints, a polynomial's
 * coefficients). Both read their flags only: KVROUTE_* variables configure the router.
 */
import { z } from 'zod';
import { numberText, ZMQ_ENDPOINT } from './parsers.ts';
import { choice, type Kind, optional, text, withDefault } from './settings.ts';

/** A ZMQ endpoint: bound (`tcp://*:5557`, ipc://, inproc://; "none" when `none`) or `connectable` (tcp://host:port). */
export function zmqEndpoint(options: { none?: boolean; connectable?: boolean } = {}): Kind<z.ZodString> {
  if (options.connectable) return text({ pattern: /^tcp:\/\/[^:/*]+:\d+$/, accepts: 'a tcp://host:port endpoint' });
  const pattern = options.none ? new RegExp(`^none$|${ZMQ_ENDPOINT.source}`) : ZMQ_ENDPOINT;
  return text({ pattern, accepts: `a ZMQ endpoint like tcp://*:5557${options.none ? ' (or "none")' : ''}` });
}

type Triple = z.ZodTuple<[z.ZodNumber, z.ZodNumber, z.ZodNumber], null>;

/** Three comma-separated numbers ("a2,a1,a0"). */
export function triple(): Kind<Triple> {
  return {
    schema: z.tuple([z.number(), z.number(), z.number()]),
    accepts: '3 comma-separated numbers',
    range: '',
    fromText: (t) => t.split(',').map((x) => numberText(x) ?? x),
    show: (v) => (v as number[]).join(','),
    arg: 'value',
  };
}

export const ROLES = ['prefill', 'decode', 'both'] as const;

/** Defined once, taken by relay and mocker (mocker gives some a default of its own). */
export const ENGINE_SIDE = {
  model: optional(text(), { flag: '--model <name>', env: '', help: 'served model name' }),
  role: optional(choice(ROLES), {
    flag: '--role <role>',
    env: '',
    help: 'disaggregated serving: the prefill or decode side of a pair, or both (aggregated)',
  }),
  topic: withDefault(text({ allowEmpty: true }), '', {
    flag: '--topic <topic>',
    env: '',
    help: "ZMQ topic of the KV event messages (the mocker sends it as every message's topic frame; the relay subscribes to it as a prefix)",
  }),
};
