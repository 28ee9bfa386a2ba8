/** GET /v1/models, answered by the router: the engines' cards merged across workers. */
import { describe, expect, it } from 'vitest';
import { startMocker } from '../../src/mocker/server.ts';
import { json, post, serve } from './helpers.ts';

describe('/v1/models across workers', () => {
  it('one card per model as the engines give it, LoRA adapters with their parent, the smallest max_model_len', async () => {
    const a = await startMocker({
      model: 'base',
      loraModules: ['sql-lora'],
      engine: { maxModelLen: 8192 },
      zmqEndpoint: null,
      replayEndpoint: null,
    });
    const b = await startMocker({ model: 'base', engine: { maxModelLen: 4096 }, zmqEndpoint: null, replayEndpoint: null });
    const s = await serve({ workers: [{ url: a.url }, { url: b.url }] });
    try {
      const m = await json(await fetch(`${s.url}/v1/models`));
      const byId = Object.fromEntries(m.data.map((c: { id: string }) => [c.id, c]));
      expect(Object.keys(byId).sort()).toEqual(['base', 'sql-lora']);
      expect(byId.base).toMatchObject({ owned_by: 'vllm', root: 'base', parent: null, max_model_len: 4096 });
      expect(byId['sql-lora']).toMatchObject({ parent: 'base', max_model_len: 8192 });
      // The adapter routes only to the worker that has it.
      const r = await post(`${s.url}/v1/completions`, { model: 'sql-lora', prompt: 'select', max_tokens: 1 });
      expect(r.status).toBe(200);
      expect(r.headers.get('x-kvroute-worker')).toBe(new URL(a.url).host);
    } finally {
      await s.close(200);
      await Promise.all([a.close(), b.close()]);
    }
  });
});
