/** P/D fields of a worker: the spec string, the object form (config file, admin API) and the NATS registry entry. */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfigFile } from '../../src/config/serve.ts';
import { parseWorkerSpec, workerFromUnknown } from '../../src/config/worker-spec.ts';
import { decodeWorkerEntry, encodeWorkerEntry } from '../../src/transport/nats/protocol.ts';

describe('worker role and bootstrap port', () => {
  it('parses role= and bootstrap= in a spec string and in the object form', () => {
    expect(parseWorkerSpec('http://p0:30000,engine=sglang,role=prefill,bootstrap=9001')).toMatchObject({
      url: 'http://p0:30000',
      engine: 'sglang',
      role: 'prefill',
      bootstrap: 9001,
    });
    expect(workerFromUnknown({ url: 'http://d0:8000', role: 'decode' })).toEqual({ url: 'http://d0:8000', role: 'decode' });
    expect(parseWorkerSpec('http://a:1')).toEqual({ url: 'http://a:1' });
  });

  it('engine=trtllm in the spec string and the object form; a bad engine names the choices', () => {
    expect(parseWorkerSpec('http://t0:8000,engine=trtllm,role=prefill')).toMatchObject({ engine: 'trtllm', role: 'prefill' });
    expect(workerFromUnknown({ url: 'http://t0:8000', engine: 'trtllm' })).toEqual({ url: 'http://t0:8000', engine: 'trtllm' });
    expect(() => parseWorkerSpec('http://a:1,engine=tensorrt')).toThrow('worker option engine="tensorrt" must be vllm, sglang or trtllm');
  });

  it('refuses a bad role or port with a message naming the option', () => {
    expect(() => parseWorkerSpec('http://a:1,role=prefiller')).toThrow('worker option role="prefiller" must be prefill, decode or both');
    expect(() => parseWorkerSpec('http://a:1,bootstrap=0')).toThrow('worker option bootstrap=0 must be a port in [1, 65535]');
    expect(() => parseWorkerSpec('http://a:1,bootstrap=x')).toThrow('must be a port');
    expect(() => workerFromUnknown({ url: 'http://a:1', bootstrap: 70000 })).toThrow('must be a port');
  });

  it('the config file gives roles and the P/D settings; a bad threshold is refused', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvroute-pd-'));
    const good = join(dir, 'pd.yaml');
    writeFileSync(
      good,
      'workers:\n  - {url: "http://p0:30000", role: prefill, engine: sglang, bootstrap: 8999}\n  - "http://d0:30001,role=decode,engine=sglang"\ndisaggMinUncachedTokens: 64\ndecodeOverlapCredit: 0.5\n',
    );
    const c = await loadConfigFile(good);
    expect(c.workers?.map((w) => w.role)).toEqual(['prefill', 'decode']);
    expect([c.disaggMinUncachedTokens, c.decodeOverlapCredit]).toEqual([64, 0.5]);
    const bad = join(dir, 'bad.yaml');
    writeFileSync(bad, 'disaggMinUncachedTokens: -1\n');
    await expect(loadConfigFile(bad)).rejects.toThrow(/disagg-min-uncached-tokens/);
  });

  it('the registry entry carries role, engine and bootstrap port, and entries of older relays still decode', () => {
    const base = { workerId: 'p0', url: 'http://p0:30000', model: 'm', blockSize: 16, dpRanks: [0], relayId: 'x', heartbeatAt: 1 };
    const e = decodeWorkerEntry(encodeWorkerEntry({ ...base, role: 'prefill', engine: 'sglang', bootstrapPort: 8998 }));
    expect(e).toMatchObject({ role: 'prefill', engine: 'sglang', bootstrapPort: 8998 });
    const old = decodeWorkerEntry(encodeWorkerEntry(base));
    expect(old?.workerId).toBe('p0');
    expect(old?.role).toBeUndefined();
    // A value this version does not know is dropped, not the entry.
    const odd = decodeWorkerEntry(new TextEncoder().encode(JSON.stringify({ ...base, role: 'router', bootstrapPort: -1 })));
    expect(odd?.workerId).toBe('p0');
    expect([odd?.role, odd?.bootstrapPort]).toEqual([undefined, undefined]);
  });
});
