/**
 * `kvroute epp` serves ext_proc over TLS by default, as the reference picker does (llm-d/llm-d-router
 * pkg/epp/server/options.go @ebab6879: --secure-serving true, a self-signed certificate unless --cert-path names a
 * folder with tls.crt and tls.key; --metrics-cert-dir and --metrics-client-ca-file for the metrics port), and gRPC
 * health in plaintext on its own port for kubelet probes. Played from Envoy's side with two gRPC stacks: grpc-js and
 * Python's grpcio (gRPC's C core), both over TLS. Certificate files are replaced while the picker runs: new
 * connections get the new certificate; files that do not load leave the last good pair in use.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { get } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import selfsigned from 'selfsigned';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DESTINATION_HEADER, type ProcessingResponse, protocols } from '../../src/epp/protocol.ts';
import { type MockerHandle, startMocker } from '../../src/mocker/server.ts';
import { randomTokens } from '../server/helpers.ts';
import { EnvoySide } from './envoy-side.ts';
import { type EppProcess, eventually, metric, startEpp } from './picker.ts';
import { ensurePythonGrpc, runPython } from './python-grpc.ts';

const procs: EppProcess[] = [];
const clients: EnvoySide[] = [];
let engine: MockerHandle;
let worker: string[];

beforeAll(async () => {
  engine = await startMocker({ model: 'm', speedup: 50, seed: 3 });
  worker = ['-w', `${engine.url},events=${engine.zmqEndpoint},id=w0,model=m`];
}, 30_000);

afterAll(async () => {
  for (const c of clients) c.close();
  await Promise.all(procs.map((p) => p.stop()));
  await engine?.close();
});

async function epp(args: string[]): Promise<EppProcess> {
  const p = await startEpp([...worker, ...args], { tls: true });
  procs.push(p);
  return p;
}

function side(address: string, options: ConstructorParameters<typeof EnvoySide>[1] = {}): EnvoySide {
  const c = new EnvoySide(address, options);
  clients.push(c);
  return c;
}

const body = () => JSON.stringify({ model: 'm', prompt: randomTokens(40, Math.floor(Math.random() * 1e6)), max_tokens: 2 });

async function pair(dir: string): Promise<{ cert: Buffer; key: Buffer }> {
  const pems = await selfsigned.generate([{ name: 'commonName', value: 'localhost' }], { keyType: 'ec' });
  writeFileSync(join(dir, 'tls.key'), pems.private);
  writeFileSync(join(dir, 'tls.crt'), pems.cert);
  return { cert: Buffer.from(pems.cert), key: Buffer.from(pems.private) };
}

/** Whether a client trusting only `ca` gets a pick from the picker. */
async function picksTrusting(address: string, ca: Buffer): Promise<boolean> {
  const c = side(address, { ca, serverName: 'localhost' });
  try {
    const r = await c.roundTrip({ body: body() });
    return 'picked' in r && r.response.status === 200;
  } catch {
    return false;
  } finally {
    c.close();
  }
}

describe('kvroute epp over TLS', () => {
  let picker: EppProcess;

  beforeAll(async () => {
    picker = await epp([]);
  }, 30_000);

  it('serves ext_proc over TLS with a self-signed certificate by default; a plaintext client gets nothing', async () => {
    expect(picker.tls).toBe('TLS (self-signed certificate)');
    const envoy = side(picker.address, { tls: true });
    await eventually(async () => (await envoy.check('readiness')).status === 1);
    const r = await envoy.roundTrip({ body: body() });
    if (!('picked' in r)) throw new Error(`immediate: ${JSON.stringify(r.immediate)}`);
    expect(r.picked.headers[DESTINATION_HEADER]).toBe(new URL(engine.url).host);
    expect(r.response.status).toBe(200);
    const plain = side(picker.address);
    const s = plain.stream();
    await expect(s.request({ body: body() })).rejects.toThrow();
    expect((await s.status).code).toBe(grpc.status.UNAVAILABLE);
  });

  it('answers gRPC health in plaintext on --grpc-health-port: liveness, readiness, inference-extension', async () => {
    const health = side(picker.healthAddress);
    for (const service of ['liveness', 'readiness', 'inference-extension', 'envoy.service.ext_proc.v3.ExternalProcessor']) {
      expect((await health.check(service)).status, service).toBe(1);
    }
    expect((await health.check('nope')).error?.code).toBe(grpc.status.NOT_FOUND);
  });

  it('a second gRPC stack (Python grpcio, C core) gets the pick over TLS and health in plaintext', async () => {
    const py = ensurePythonGrpc();
    const { ExternalProcessor, Health } = protocols();
    const method = ExternalProcessor.service.Process;
    const b = Buffer.from(body());
    const messages = [
      {
        request_headers: {
          headers: {
            headers: [':method', ':path', 'content-type'].map((key, i) => ({
              key,
              raw_value: Buffer.from(['POST', '/v1/completions', 'application/json'][i]),
            })),
          },
          end_of_stream: false,
        },
        protocol_config: { request_body_mode: 4, response_body_mode: 4 },
      },
      { request_body: { body: b, end_of_stream: true } },
    ].map((m) => method.requestSerialize(m).toString('hex'));
    const answers = (await runPython(py, 'process', picker.address, { messages, expect: 2, serverName: 'localhost' })).map(
      (a) => method.responseDeserialize(a) as ProcessingResponse,
    );
    const set = answers[0].request_headers?.response?.header_mutation?.set_headers ?? [];
    const dest = set.find((h) => h.header.key === DESTINATION_HEADER);
    expect(Buffer.from(dest?.header.raw_value ?? '').toString()).toBe(new URL(engine.url).host);
    const streamed = answers[1].request_body?.response?.body_mutation?.streamed_response;
    expect(Buffer.from(streamed?.body ?? '').toString()).toBe(b.toString());
    expect(streamed?.end_of_stream).toBe(true);
    const check = Health.service.Check;
    const [h] = await runPython(py, 'health', picker.healthAddress, {
      message: check.requestSerialize({ service: 'inference-extension' }).toString('hex'),
    });
    expect((check.responseDeserialize(h) as { status: number }).status).toBe(1);
  }, 60_000);
});

describe('kvroute epp --cert-path', () => {
  it('serves the given certificate and picks up a replaced one; files that do not load keep the last good pair', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvroute-epp-tls-'));
    const a = await pair(dir);
    const picker = await epp(['--cert-path', dir]);
    expect(picker.tls).toBe(`TLS (certificate from ${dir}, reloaded when it changes)`);
    expect(await picksTrusting(picker.address, a.cert)).toBe(true);
    const other = await selfsigned.generate([{ name: 'commonName', value: 'localhost' }], { keyType: 'ec' });
    expect(await picksTrusting(picker.address, Buffer.from(other.cert))).toBe(false);
    // The Secret is rotated: new connections get certificate B.
    const b = await pair(dir);
    await eventually(() => picksTrusting(picker.address, b.cert), 15_000);
    expect(await picksTrusting(picker.address, a.cert)).toBe(false);
    // A half-written rotation: a key that does not match; B stays in use, and the picker says why.
    writeFileSync(join(dir, 'tls.key'), a.key);
    await eventually(async () => picker.output().includes('certificate files do not load'), 15_000);
    expect(await picksTrusting(picker.address, b.cert)).toBe(true);
  }, 90_000);

  it('a certificate that does not load at start is a one-line start-up error', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvroute-epp-tls-'));
    writeFileSync(join(dir, 'tls.crt'), 'not a certificate');
    writeFileSync(join(dir, 'tls.key'), 'not a key');
    await expect(epp(['--cert-path', dir])).rejects.toThrow(/cannot load tls.crt and tls.key/);
  });
});

describe('kvroute epp --metrics-cert-dir', () => {
  const fetchTls = (url: string, options: { ca: Buffer; cert?: Buffer; key?: Buffer }) =>
    new Promise<{ status: number; text: string }>((resolve, reject) => {
      get(url, { ...options, servername: 'localhost', checkServerIdentity: () => undefined }, (res) => {
        let text = '';
        res.on('data', (d: Buffer) => {
          text += d.toString();
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
      }).on('error', reject);
    });

  it('serves /metrics over HTTPS, and with --metrics-client-ca-file only to a client certificate it signed', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvroute-epp-mtls-'));
    const server = await pair(dir);
    const client = await selfsigned.generate([{ name: 'commonName', value: 'prometheus' }], { keyType: 'ec' });
    const caFile = join(dir, 'client-ca.crt');
    writeFileSync(caFile, client.cert);
    const picker = await epp(['--metrics-cert-dir', dir, '--metrics-client-ca-file', caFile]);
    expect(picker.metricsUrl.startsWith('https://')).toBe(true);
    const ok = await fetchTls(`${picker.metricsUrl}/metrics`, {
      ca: server.cert,
      cert: Buffer.from(client.cert),
      key: Buffer.from(client.private),
    });
    expect(ok.status).toBe(200);
    expect(metric(ok.text, 'epp_streams_active')).toBe(0);
    await expect(fetchTls(`${picker.metricsUrl}/metrics`, { ca: server.cert })).rejects.toThrow();
  }, 60_000);
});
