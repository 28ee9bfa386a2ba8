/**
 * The cheapest reverse proxy Node itself can be, for reference in bench:capacity: node:http server, one undici Pool to
 * the upstream, the body passed through unread (no JSON, no routing, no metrics), the answer streamed back. What it
 * costs per request is the floor under any proxy written on Node's HTTP stack, kvroute included.
 *
 *   node --import tsx bench/lib/bare-proxy.ts <upstream-url>     prints "PORT <n>" when listening on 127.0.0.1
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Pool } from 'undici';

const upstream = process.argv[2];
const pool = new Pool(upstream, { connections: 4096, pipelining: 1 });
const server = createServer((req, res) => {
  const parts: Buffer[] = [];
  req.on('data', (c: Buffer) => parts.push(c));
  req.on('end', () => {
    pool
      .request({ method: 'POST', path: req.url ?? '/', headers: { 'content-type': 'application/json' }, body: Buffer.concat(parts) })
      .then((up) => {
        res.writeHead(up.statusCode, { 'content-type': String(up.headers['content-type'] ?? 'application/json') });
        up.body.on('data', (c: Buffer) => res.write(c));
        up.body.on('end', () => res.end());
      })
      .catch(() => {
        res.writeHead(502);
        res.end();
      });
  });
});
server.keepAliveTimeout = 65_000;
server.listen({ port: 0, host: '127.0.0.1', backlog: 4096 }, () => {
  process.stdout.write(`PORT ${(server.address() as AddressInfo).port}\n`);
});
