import { KvRouter } from '../src/core/router.ts';
import { performance } from 'node:perf_hooks';
const r = new KvRouter({ blockSize: 16 } as any);
r.addSource({ worker: 'a' } as any, { mode: 'events' });
const key = r.sourceKeys()[0];
const N = 1_000_000, CH = 64;
let id = 1n; let h = 1n;
for (let c = 0; c < N / CH; c++) {
  const ids: bigint[] = []; const sh = new BigUint64Array(CH);
  for (let j = 0; j < CH; j++) { ids.push(id++); sh[j] = (h++ * 0x9e3779b97f4a7c15n) & 0xffffffffffffffffn; }
  r.applyEvents(key, [{ kind: 'stored', parent: null, engineIds: ids, tokens: null, blockSize: 16, seqHashes: sh }]);
}
const snap = r.snapshot().source(key)!;
console.log(snap.engineIds.length);
for (let k = 0; k < 3; k++) {
let t = performance.now(); r.resetSource(key); console.log('clear', performance.now() - t);
t = performance.now(); r.restoreSource(snap); console.log('restore', performance.now() - t);
}
