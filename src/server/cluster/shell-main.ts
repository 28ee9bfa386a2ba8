/** Entry of an HTTP shell process under `kvroute serve --processes N` (forked by ./primary.ts). */
import type { PrimaryMessage } from './protocol.ts';
import { runShell } from './shell.ts';

process.once('message', (m: PrimaryMessage) => {
  if (m.k !== 'kvr.start') return;
  runShell(m.config, m.primaryUrl).catch((err: unknown) => {
    process.stderr.write(`kvroute serve (HTTP shell ${process.pid}): ${(err as Error).message}\n`);
    process.exit(1);
  });
});
process.send?.({ k: 'kvr.ready' });
