/** Entry of an HTTP shell process under `kvroute serve --processes N` (forked by ./primary.ts). */
import type { PrimaryMessage } from './protocol.ts';
import { runShell } from './shell.ts';

process.once('message', (m: PrimaryMessage) => {
  if (m.k !== 'kvr.start') return;
  runShell(m.config, m.primaryUrl).catch((err: unknown) => {
    // The primary says it, once, as the start-up failure it is.
    process.send?.({ k: 'kvr.startFailed', message: (err as Error).message }, undefined, {}, () => process.exit(1));
  });
});
process.send?.({ k: 'kvr.ready' });
