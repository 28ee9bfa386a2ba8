/**
 * A start-up that awaits a promise nothing can settle (no socket, timer or thread keeps the loop alive) makes Node exit
 * with status 13, "unsettled top-level await", and print nothing: the worst way for a server to fail. This guard turns
 * that exit into one line on stderr saying what happened and what to do.
 */

/** Node's exit status for a top-level await left pending when the event loop emptied. */
export const UNSETTLED_TOP_LEVEL_AWAIT = 13;

/** Arms the guard for a command; call the returned function once the command's start-up has settled. */
export function guardStartup(label: () => string): () => void {
  let settled = false;
  process.on('exit', () => {
    if (settled || process.exitCode !== UNSETTLED_TOP_LEVEL_AWAIT) return;
    // Pipes, files and terminals are written synchronously on Linux, so the line is out before the process is gone.
    process.stderr.write(
      `${label()}: start-up stalled waiting for something that can never finish (exit ${UNSETTLED_TOP_LEVEL_AWAIT}); ` +
        'this is a bug in kvroute: please report it with the output of the same command run with KVROUTE_DEBUG=1\n',
    );
  });
  return () => {
    settled = true;
  };
}
