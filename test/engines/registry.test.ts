/**
 * The engine registry (src/engines/index.ts) is the one engine list: every registered engine is accepted where an
 * engine is named (worker specs, pod annotations, NATS registry entries), each adapter is filed under its own name,
 * and no source file outside src/engines spells the list again (the drift this registry ended: the relay and
 * Kubernetes discovery once lacked trtllm).
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parseWorkerSpec } from '../../src/config/worker-spec.ts';
import { selectorFromLabels } from '../../src/config/k8s.ts';
import { podVerdict } from '../../src/discovery/k8s/pods.ts';
import { ENGINE_NAMES, engineAdapter, engineAdapters, engineNamesText, isEngineName } from '../../src/engines/index.ts';
import { decodeWorkerEntry, encodeWorkerEntry } from '../../src/transport/nats/protocol.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

function sources(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir)) {
    const p = join(dir, e);
    if (statSync(p).isDirectory()) out.push(...sources(p));
    else if (p.endsWith('.ts')) out.push(p);
  }
  return out;
}

describe('the engine registry', () => {
  it('files each adapter under its name; the names text lists them all', () => {
    expect(ENGINE_NAMES).toEqual(['vllm', 'sglang', 'trtllm']);
    for (const n of ENGINE_NAMES) expect(engineAdapter(n).name).toBe(n);
    expect(engineAdapters().map((a) => a.name)).toEqual(ENGINE_NAMES);
    expect(engineNamesText()).toBe('vllm, sglang or trtllm');
    expect(isEngineName('trtllm')).toBe(true);
    expect(isEngineName('toString')).toBe(false);
    expect(engineAdapter().name).toBe('vllm');
  });

  it('every registered engine is accepted by worker specs, pod annotations and registry entries', () => {
    const pod = (engine: string) => ({
      metadata: { name: 'p0', labels: { app: 'llm' }, annotations: { 'kvroute.io/engine': engine } },
      status: { phase: 'Running', podIP: '10.0.0.9', conditions: [{ type: 'Ready', status: 'True' }] },
    });
    for (const engine of ENGINE_NAMES) {
      expect(parseWorkerSpec(`http://h:8000,engine=${engine}`).engine).toBe(engine);
      const v = podVerdict(pod(engine), selectorFromLabels({ app: 'llm' }), { ports: [8000], eventsPort: 0, replayPort: 0 });
      expect(v.kind === 'worker' && v.specs[0].engine).toBe(engine);
      const entry = {
        workerId: 'w',
        url: null,
        model: null,
        blockSize: 16,
        dpRanks: [0],
        relayId: 'r',
        heartbeatAt: 1,
        role: 'prefill' as const,
        engine,
      };
      expect(decodeWorkerEntry(encodeWorkerEntry(entry))?.engine).toBe(engine);
    }
    expect(() => parseWorkerSpec('http://h:8000,engine=tgi')).toThrow('must be vllm, sglang or trtllm');
  });

  it('no source file outside src/engines spells the engine list or tests an engine by name', () => {
    const names = ENGINE_NAMES.map((n) => `'${n}'`);
    const offenders: string[] = [];
    for (const file of sources(join(ROOT, 'src'))) {
      const rel = relative(ROOT, file);
      // The registry's own folder, and the union the core needs (src/core may not import src/engines).
      if (rel.startsWith('src/engines/') || rel === 'src/core/types.ts') continue;
      readFileSync(file, 'utf8')
        .split('\n')
        .forEach((line, i) => {
          const spelled = names.filter((n) => line.includes(n)).length;
          const compares = /\b(engine|protocol|flavou?r)\s*[!=]==\s*'(vllm|sglang|trtllm)'/.test(line);
          if (spelled >= 2 || compares) offenders.push(`${rel}:${i + 1}: ${line.trim()}`);
        });
    }
    expect(offenders).toEqual([]);
  });
});
