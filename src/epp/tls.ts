/**
 * TLS for the endpoint picker's listeners, as the reference picker serves them (llm-d/llm-d-router
 * pkg/epp/server/options.go @ebab6879: --secure-serving on by default; --cert-path a folder with tls.crt and tls.key,
 * else a self-signed certificate; --metrics-cert-dir the same for the metrics port). A key pair given as files is read
 * again whenever either file changes (a Kubernetes Secret mount swaps both at once), and a pair that does not load is
 * logged and ignored: the last good one stays in use.
 *
 * The self-signed certificate comes from the `selfsigned` package (X.509 built in JavaScript, so it needs no openssl
 * binary, which the slim Node image lacks). Gateways reach their picker without verifying it (Istio's DestinationRule
 * `insecureSkipVerify: true`, the Inference Extension's guides), so only its key matters.
 */
import { readFile } from 'node:fs/promises';
import { createSecureContext, type SecureContextOptions } from 'node:tls';
import { join } from 'node:path';
import { hostname } from 'node:os';
import * as grpc from '@grpc/grpc-js';

export interface KeyPair {
  readonly cert: Buffer;
  readonly key: Buffer;
}

export interface TlsLog {
  info(o: object, m: string): void;
  warn(o: object, m: string): void;
}

/** How often the certificate files are read again (they change rarely; a rotation is picked up within this). */
export const RELOAD_INTERVAL_MS = 1000;

/** A fresh self-signed certificate for this host (ECDSA P-256, valid a year), in PEM. */
export async function selfSignedPair(): Promise<KeyPair> {
  const names = [...new Set(['localhost', hostname()])];
  // Loaded here, not at start: the package (X.509 in JavaScript, ~140 files) is only needed when a certificate is made.
  const { default: selfsigned } = await import('selfsigned');
  const pems = await selfsigned.generate([{ name: 'commonName', value: 'kvroute-epp' }], {
    keyType: 'ec',
    curve: 'P-256',
    notAfterDate: new Date(Date.now() + 365 * 24 * 3600 * 1000),
    algorithm: 'sha256',
    extensions: [
      {
        name: 'subjectAltName',
        altNames: [
          ...names.map((value) => ({ type: 2 as const, value })),
          { type: 7 as const, ip: '127.0.0.1' },
          { type: 7 as const, ip: '::1' },
        ],
      },
    ],
  });
  return { cert: Buffer.from(pems.cert), key: Buffer.from(pems.private) };
}

/** tls.crt and tls.key of a folder (the layout of a kubernetes.io/tls Secret), checked to load together. */
export async function readPair(dir: string): Promise<KeyPair> {
  const [cert, key] = await Promise.all([readFile(join(dir, 'tls.crt')), readFile(join(dir, 'tls.key'))]);
  createSecureContext({ cert, key }); // throws on a pair that does not match or does not parse
  return { cert, key };
}

/**
 * A key pair that follows its files: `onChange` gets each new good pair. `close` stops watching. The first read must
 * succeed (a picker started with a bad certificate fails at start, with the reason).
 */
export async function watchedPair(
  dir: string,
  log: TlsLog,
  what: string,
  onChange: (pair: KeyPair) => void,
): Promise<{ pair: KeyPair; close(): void }> {
  let current = await readPair(dir).catch((err: Error) => {
    throw new Error(`${what}: cannot load tls.crt and tls.key from ${dir}: ${err.message}`);
  });
  let reading = false;
  let lastError = '';
  const timer = setInterval(() => {
    if (reading) return;
    reading = true;
    readPair(dir)
      .then((next) => {
        lastError = '';
        if (next.cert.equals(current.cert) && next.key.equals(current.key)) return;
        current = next;
        onChange(next);
        log.info({ dir }, `${what}: certificate reloaded`);
      })
      .catch((err: Error) => {
        // Half-written during a rotation, or removed: keep serving the last good pair, say so once per problem.
        if (err.message !== lastError)
          log.warn({ dir, error: err.message }, `${what}: certificate files do not load; keeping the last good pair`);
        lastError = err.message;
      })
      .finally(() => {
        reading = false;
      });
  }, RELOAD_INTERVAL_MS);
  timer.unref();
  return { pair: current, close: () => clearInterval(timer) };
}

/** grpc-js server credentials whose key pair can be replaced while the server runs (new connections use the new one). */
class ReloadableCredentials extends grpc.ServerCredentials {
  constructor(pair: KeyPair) {
    super({}, { cert: pair.cert, key: pair.key });
  }

  replace(pair: KeyPair): void {
    this.updateSecureContextOptions({ cert: pair.cert, key: pair.key } satisfies SecureContextOptions);
  }

  _equals(other: grpc.ServerCredentials): boolean {
    return other === this;
  }
}

export interface ServingTls {
  readonly credentials: grpc.ServerCredentials;
  /** For the start-up line: "plaintext", "TLS (self-signed certificate)", "TLS (certificate from DIR, reloaded ...)". */
  readonly describe: string;
  close(): void;
}

/** The ext_proc port's credentials from the settings: plaintext, a self-signed certificate, or watched files. */
export async function extProcCredentials(
  options: { readonly secure: boolean; readonly certPath?: string },
  log: TlsLog,
): Promise<ServingTls> {
  if (!options.secure) return { credentials: grpc.ServerCredentials.createInsecure(), describe: 'plaintext', close: () => {} };
  if (options.certPath === undefined) {
    const pair = await selfSignedPair();
    return { credentials: new ReloadableCredentials(pair), describe: 'TLS (self-signed certificate)', close: () => {} };
  }
  let creds: ReloadableCredentials | undefined;
  const watched = await watchedPair(options.certPath, log, 'ext_proc TLS', (pair) => creds?.replace(pair));
  creds = new ReloadableCredentials(watched.pair);
  return { credentials: creds, describe: `TLS (certificate from ${options.certPath}, reloaded when it changes)`, close: watched.close };
}
