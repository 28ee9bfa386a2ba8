/**
 * The HTTP listener every serve process runs (the router's, and each `--processes` shell's): client timeouts against
 * slow senders, keep-alive, requests in flight counted until their response closes, a deep accept backlog, and a
 * graceful drain on shutdown. The handler is the caller's.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { ServeConfig } from '../config/serve.ts';
import { httpServerTimeouts } from '../runtime/security/index.ts';

export interface Listener {
  readonly server: Server;
  /** Requests accepted and not yet answered in full. */
  inFlight(): number;
  /** Listens; resolves with the base URL (a wildcard host is reported as 127.0.0.1). */
  listen(port: number, host: string): Promise<string>;
  /** Stops accepting, lets requests in flight finish until `graceMs` has passed, then closes every connection. */
  drain(graceMs: number): Promise<void>;
}

export function createListener(
  config: Pick<ServeConfig, 'headerTimeoutMs' | 'bodyTimeoutMs'>,
  handle: (req: IncomingMessage, res: ServerResponse) => void,
): Listener {
  let inFlight = 0;
  const server = createServer(
    {
      keepAliveTimeout: 65_000,
      // Slow clients (slowloris) are cut while sending their request; responses may stream for as long as they take.
      ...httpServerTimeouts({ headersTimeoutMs: config.headerTimeoutMs, requestTimeoutMs: config.bodyTimeoutMs }),
    },
    (req, res) => {
      inFlight++;
      let counted = true;
      const done = () => {
        if (counted) {
          counted = false;
          inFlight--;
        }
      };
      res.on('close', done);
      res.on('finish', done);
      handle(req, res);
    },
  );
  server.maxRequestsPerSocket = 0;
  return {
    server,
    inFlight: () => inFlight,
    listen: (port, host) => listen(server, port, host),
    async drain(graceMs) {
      server.close();
      server.closeIdleConnections();
      const deadline = Date.now() + graceMs;
      while (inFlight > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25));
      server.closeAllConnections();
    },
  };
}

export function listen(server: Server, port: number, host: string): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    server.once('error', reject);
    // A deeper accept backlog than node's 511, so a connection storm queues in the kernel instead of being dropped.
    server.listen({ port, host, backlog: 4096 }, () => {
      server.off('error', reject);
      const p = (server.address() as AddressInfo).port;
      const h = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host;
      resolve(`http://${h.includes(':') ? `[${h}]` : h}:${p}`);
    });
  });
}
