/** Roles through the admin API: a prefill worker added at run time makes the fleet disaggregated for its model. */
import { afterEach, describe, expect, it } from 'vitest';
import type { RunningServer } from '../../src/server/app.ts';
import { json, post, serve } from './helpers.ts';

let s: RunningServer | undefined;
afterEach(async () => {
  await s?.close(100);
});

describe('admin API and roles', () => {
  it('POST /admin/workers takes role, engine and bootstrap; GET shows them; a bad role is a 400', async () => {
    s = await serve({ adminToken: 'tok' });
    const auth = { authorization: 'Bearer tok' };
    const added = await post(
      `${s.url}/admin/workers`,
      { url: 'http://127.0.0.1:9', id: 'p0', role: 'prefill', engine: 'sglang', bootstrap: 9100, models: ['m'] },
      auth,
    );
    expect(added.status).toBe(201);
    expect(await json(added)).toMatchObject({ id: 'p0', role: 'prefill', engine: 'sglang', bootstrap: 9100 });
    const spec = await post(`${s.url}/admin/workers`, { spec: 'http://127.0.0.1:10,id=d0,role=decode,model=m' }, auth);
    expect((await json(spec)).role).toBe('decode');
    expect(s.dispatcher.worker('p0')?.role).toBe('prefill');
    const bad = await post(`${s.url}/admin/workers`, { url: 'http://127.0.0.1:11', role: 'prefiller' }, auth);
    expect(bad.status).toBe(400);
    expect((await json(bad)).error.message).toContain('role="prefiller" must be prefill, decode or both');
    const listed = await json(await fetch(`${s.url}/admin/workers`, { headers: auth }));
    expect(listed.workers.map((w: { id: string; role: string }) => `${w.id}:${w.role}`)).toEqual(['p0:prefill', 'd0:decode']);
  });
});
