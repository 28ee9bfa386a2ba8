/**
 * A second gRPC stack on Envoy's side: Python's grpcio (gRPC's C core, the stack Envoy's google_grpc client is built
 * on), from Debian's python3-grpcio. Found as the system's (/usr/bin/python3 that can `import grpc`), else Debian's
 * packages are downloaded with `apt-get download` and unpacked into node_modules/.cache (nothing installed
 * system-wide), as test/fixtures/test-binaries.ts does for nats-server. The messages are protobuf bytes the package's
 * own proto definitions encode (grpc-js's serializers): Python carries them over TLS as bytes, so this checks the
 * transport, TLS and framing of a stack other than grpc-js.
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const CACHE = fileURLToPath(new URL('../../node_modules/.cache/kvroute-test/python-grpcio/', import.meta.url));
const PYTHON = '/usr/bin/python3';
/** python3-grpcio and the libraries it links that a slim Debian may lack. */
const PACKAGES = ['python3-grpcio', 'python3-protobuf', 'libprotobuf32', 'libre2-9', 'libc-ares2', 'libabsl20220623'];

export interface PythonGrpc {
  readonly python: string;
  readonly env: Record<string, string>;
}

function importsGrpc(env: Record<string, string>): boolean {
  return spawnSync(PYTHON, ['-c', 'import grpc'], { env: { ...process.env, ...env } }).status === 0;
}

/** Python with grpcio: the system's, or Debian's packages unpacked into the cache. Throws with what to install. */
export function ensurePythonGrpc(): PythonGrpc {
  const help = "the Python gRPC interop test needs Debian's python3-grpcio (apt-get install python3-grpcio)";
  if (!existsSync(PYTHON)) throw new Error(`${PYTHON} not found; ${help}`);
  if (importsGrpc({})) return { python: PYTHON, env: {} };
  const root = join(CACHE, 'root');
  const env = {
    PYTHONPATH: join(root, 'usr/lib/python3/dist-packages'),
    LD_LIBRARY_PATH: join(root, 'usr/lib/x86_64-linux-gnu'),
  };
  if (existsSync(root) && importsGrpc(env)) return { python: PYTHON, env };
  const work = join(CACHE, `download-${process.pid}`);
  mkdirSync(work, { recursive: true });
  try {
    const download = () => spawnSync('apt-get', ['download', '-q', ...PACKAGES], { cwd: work, encoding: 'utf8' });
    let r = download();
    if (r.status !== 0 && process.getuid?.() === 0) {
      spawnSync('apt-get', ['update', '-qq'], { encoding: 'utf8' });
      r = download();
    }
    if (r.status !== 0) throw new Error(`\`apt-get download ${PACKAGES.join(' ')}\` failed (${r.stderr.trim()}); ${help}`);
    const unpacked = join(work, 'root');
    for (const deb of readdirSync(work).filter((f) => f.endsWith('.deb'))) {
      const x = spawnSync('dpkg-deb', ['-x', join(work, deb), unpacked], { encoding: 'utf8' });
      if (x.status !== 0) throw new Error(`could not unpack ${deb}: ${x.stderr.trim()}; ${help}`);
    }
    rmSync(root, { recursive: true, force: true });
    renameSync(unpacked, root);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  if (!importsGrpc(env)) throw new Error(`grpcio unpacked into ${root} does not import; ${help}`);
  return { python: PYTHON, env };
}

/**
 * One ext_proc stream from Python over TLS: fetches the server's certificate (trust on first use, as a gateway that
 * does not verify its picker), opens a secure channel naming it `serverName`, writes `messages`, reads `expect`
 * answers (or to the stream's end), and prints them. Also a plaintext health check.
 */
const SCRIPT = `
import sys, json, ssl, grpc
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
req = json.loads(sys.stdin.read())
if mode == 'health':
    ch = grpc.insecure_channel('%s:%d' % (host, port))
    call = ch.unary_unary('/grpc.health.v1.Health/Check')
    print(json.dumps([call(bytes.fromhex(req['message']), timeout=10).hex()]))
    sys.exit(0)
pem = ssl.get_server_certificate((host, port)).encode()
creds = grpc.ssl_channel_credentials(root_certificates=pem)
ch = grpc.secure_channel('%s:%d' % (host, port), creds, options=[('grpc.ssl_target_name_override', req['serverName'])])
call = ch.stream_stream('/envoy.service.ext_proc.v3.ExternalProcessor/Process')
out = []
it = call(iter([bytes.fromhex(m) for m in req['messages']]), timeout=20)
for answer in it:
    out.append(answer.hex())
    if len(out) >= req['expect']:
        it.cancel()
        break
print(json.dumps(out))
`;

export function runPython(py: PythonGrpc, mode: 'process' | 'health', address: string, input: unknown): Promise<Buffer[]> {
  const i = address.lastIndexOf(':');
  const proc = spawn(py.python, ['-c', SCRIPT, mode, address.slice(0, i), address.slice(i + 1)], {
    env: { ...process.env, ...py.env },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  proc.stdout.on('data', (d: Buffer) => {
    out += d.toString();
  });
  proc.stderr.on('data', (d: Buffer) => {
    err += d.toString();
  });
  proc.stdin.end(JSON.stringify(input));
  return new Promise((resolve, reject) => {
    proc.once('exit', (code) => {
      if (code !== 0) reject(new Error(`python grpc client exited ${code}: ${err}`));
      else resolve((JSON.parse(out) as string[]).map((h) => Buffer.from(h, 'hex')));
    });
  });
}
