/**
 * Flow-control settings in their text forms: a priority band (`--band NAME[,max-priority=N][,ttl-ms=MS][,sheddable]
 * [,order=fcfs|edf]`, or an object in a config file) and `NAME=VALUE` maps (tenant weights, token budgets). Each is
 * checked by one zod schema whatever its source.
 */
import { z } from 'zod';
import type { BandSpec } from '../core/dispatch/flow.ts';

export const BAND_SPEC_GRAMMAR = 'NAME[,max-priority=N][,ttl-ms=MS][,sheddable][,order=fcfs|edf]';
const NAME = /^[A-Za-z0-9_.-]{1,64}$/;
const show = (v: unknown) => (typeof v === 'string' ? `"${v}"` : JSON.stringify(v));

const bandObject = z
  .strictObject(
    {
      name: z.string().regex(NAME, { error: (iss) => `band name ${show(iss.input)} must be 1 to 64 characters of [A-Za-z0-9_.-]` }),
      maxPriority: z.number({ error: 'max-priority must be a number' }).optional(),
      ttlMs: z.int({ error: 'ttl-ms must be an integer >= 1' }).min(1, { error: 'ttl-ms must be an integer >= 1' }).optional(),
      sheddable: z.boolean({ error: 'sheddable must be true or false' }).optional(),
      order: z.enum(['fcfs', 'edf'], { error: (iss) => `order=${show(iss.input)} must be fcfs or edf` }).optional(),
    },
    {
      error: (iss) => (iss.code === 'unrecognized_keys' ? `unknown band option ${iss.keys.join(', ')}` : `a band is ${BAND_SPEC_GRAMMAR}`),
    },
  )
  .transform(
    (b): BandSpec => ({
      name: b.name,
      maxPriority: b.maxPriority ?? Number.POSITIVE_INFINITY,
      ...(b.ttlMs !== undefined ? { ttlMs: b.ttlMs } : {}),
      ...(b.sheddable !== undefined ? { sheddable: b.sheddable } : {}),
      ...(b.order !== undefined ? { order: b.order } : {}),
    }),
  );

function bandFields(spec: string): Record<string, unknown> | string {
  const [name, ...opts] = spec.split(',').map((s) => s.trim());
  if (!name) return `empty band spec; expected ${BAND_SPEC_GRAMMAR}`;
  const out: Record<string, unknown> = { name };
  for (const o of opts) {
    if (o === 'sheddable') {
      out.sheddable = true;
      continue;
    }
    const eq = o.indexOf('=');
    const key = eq < 0 ? o : o.slice(0, eq);
    const value = o.slice(eq + 1);
    if (eq < 0) return `band option "${o}" in "${spec}" must be key=value (or sheddable)`;
    if (key === 'max-priority') out.maxPriority = value === '' ? value : Number(value);
    else if (key === 'ttl-ms') out.ttlMs = value === '' ? value : Number(value);
    else if (key === 'order') out.order = value;
    else return `unknown band option "${key}" in "${spec}" (known: max-priority, ttl-ms, sheddable, order)`;
  }
  return out;
}

export const bandSchema = z.preprocess((value, ctx) => {
  if (typeof value !== 'string') return value;
  const fields = bandFields(value);
  if (typeof fields === 'string') {
    ctx.issues.push({ code: 'custom', message: fields, input: value });
    return z.NEVER;
  }
  return fields;
}, bandObject);

/** `NAME=NUMBER` (a flag, a variable) or an object `{NAME: NUMBER}` (a config file); `*` names every other tenant. */
export function numberMapSchema(what: string, min: number) {
  const entry = z.string().transform((t, ctx) => {
    const eq = t.indexOf('=');
    const name = t.slice(0, eq);
    const n = Number(t.slice(eq + 1));
    if (eq <= 0 || !(name === '*' || NAME.test(name)) || !Number.isFinite(n) || n < min) {
      ctx.issues.push({ code: 'custom', message: `${what} must be NAME=NUMBER with NUMBER >= ${min}, got ${show(t)}`, input: t });
      return z.NEVER;
    }
    return [name, n] as const;
  });
  return z.union([
    z.array(entry).transform((pairs) => Object.fromEntries(pairs) as Record<string, number>),
    z.record(z.string().regex(/^(\*|[A-Za-z0-9_.-]{1,64})$/), z.number().min(min)),
  ]);
}
