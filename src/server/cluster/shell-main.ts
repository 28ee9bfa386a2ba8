/** Entry of an HTTP shell process under `kvroute serve --processes N` (forked by ./primary.ts). */
import type { PrimaryMessage } from './protocol.ts';
import { runShell } from './shell.ts';

let started = false;
process.on('message', (m: PrimaryMessage) => {
  if (started) return; // runShell reads every message from here on
  // The router began to stop before this shell started (a replacement still booting): it holds nothing, it just goes.
  if (m.k === 'kvr.close') process.exit(0);
  if (m.k !== 'kvr.start') return;
  started = true;
  runShell(m.config, m.primaryUrl).catch((err: unknown) => {
    // The primary says it, once, as the start-up failure it is.
    process.send?.({ k: 'kvr.startFailed', message: (err as Error).message }, undefined, {}, () => process.exit(1));
  });
});
process.send?.({ k: 'kvr.ready' });
