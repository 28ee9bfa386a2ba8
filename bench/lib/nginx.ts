/**
 * nginx as a plain reverse proxy for benchmarks: a temporary prefix with its own config, run in the foreground as the
 * current user (`master_process off`: one process doing all the work, so its CPU is one pid's, as kvroute's is),
 * proxy_pass to one upstream with keepalive connections, no buffering of streamed answers, no access log.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const NGINX_PATHS = ['/usr/sbin/nginx', '/usr/local/sbin/nginx', '/usr/local/nginx/sbin/nginx'];
export const NGINX_INSTALL_HINT = 'apt-get update && apt-get install -y nginx';

export function findNginx(explicit?: string): string | null {
  if (explicit) return existsSync(explicit) ? explicit : null;
  return NGINX_PATHS.find((p) => existsSync(p)) ?? null;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export interface RunningNginx {
  readonly url: string;
  readonly pid: number;
  readonly child: ChildProcess;
  stop(): Promise<void>;
}

export function nginxConfig(port: number, upstreamPort: number, prefix: string): string {
  return `worker_processes 1;
master_process off;
daemon off;
pid ${join(prefix, 'nginx.pid')};
error_log ${join(prefix, 'error.log')} warn;
events { worker_connections 16384; }
http {
  access_log off;
  client_body_temp_path ${join(prefix, 'body')};
  proxy_temp_path ${join(prefix, 'proxy')};
  fastcgi_temp_path ${join(prefix, 'fastcgi')};
  uwsgi_temp_path ${join(prefix, 'uwsgi')};
  scgi_temp_path ${join(prefix, 'scgi')};
  client_max_body_size 64m;
  client_body_buffer_size 1m;
  keepalive_requests 1000000;
  upstream engine {
    server 127.0.0.1:${upstreamPort};
    keepalive 256;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:${port} backlog=4096;
    location / {
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`;
}

export async function startNginx(binary: string, upstreamPort: number): Promise<RunningNginx> {
  const prefix = mkdtempSync(join(tmpdir(), 'kvroute-nginx-'));
  for (const d of ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']) mkdirSync(join(prefix, d));
  const port = await freePort();
  const conf = join(prefix, 'nginx.conf');
  writeFileSync(conf, nginxConfig(port, upstreamPort, prefix));
  // -e: the start-up error log before the config is read (the compiled-in default may not be writable).
  const child = spawn(binary, ['-p', prefix, '-c', conf, '-e', join(prefix, 'error.log')], { stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  child.stderr?.on('data', (d: Buffer) => {
    err += d.toString();
  });
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 10_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`nginx exited with ${child.exitCode}: ${err.trim()}`);
    try {
      const r = await fetch(`${url}/v1/models`);
      await r.text();
      break;
    } catch {
      if (Date.now() > deadline) throw new Error(`nginx did not answer on ${url}: ${err.trim()}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  return {
    url,
    pid: child.pid as number,
    child,
    stop: async () => {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        child.kill('SIGQUIT');
        await exited;
      }
      rmSync(prefix, { recursive: true, force: true });
    },
  };
}
