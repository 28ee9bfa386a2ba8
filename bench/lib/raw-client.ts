/**
 * A minimal HTTP/1.1 client for load generation: keep-alive sockets, one request in flight per socket, requests written
 * as prebuilt bytes, answers delimited by Content-Length or the chunked terminator (the servers under test send one or
 * the other). Several times cheaper per request than a general client, so a latency probe at thousands of requests per
 * second measures the server, not itself. Not a general client: no redirects, no pipelining, no trailers.
 */
import { connect, type Socket } from 'node:net';

const HEADER_END = Buffer.from('\r\n\r\n');
const CHUNKED_END = Buffer.from('0\r\n\r\n');

interface Conn {
  socket: Socket;
  busy: boolean;
  buf: Buffer;
  done: ((status: number) => void) | null;
  fail: ((err: Error) => void) | null;
}

export class RawClient {
  private readonly idle: Conn[] = [];
  private readonly all = new Set<Conn>();
  private readonly waiting: ((c: Conn) => void)[] = [];

  constructor(
    private readonly host: string,
    private readonly port: number,
    private readonly maxConnections = 256,
  ) {}

  static fromUrl(url: string, maxConnections?: number): RawClient {
    const u = new URL(url);
    return new RawClient(u.hostname, Number(u.port), maxConnections);
  }

  /** The bytes of one POST with a JSON body. */
  static post(path: string, body: string): Buffer {
    const b = Buffer.from(body);
    return Buffer.concat([
      Buffer.from(`POST ${path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: ${b.length}\r\n\r\n`),
      b,
    ]);
  }

  private open(): Conn {
    const c: Conn = { socket: connect(this.port, this.host), busy: false, buf: Buffer.alloc(0), done: null, fail: null };
    c.socket.setNoDelay(true);
    c.socket.on('data', (d: Buffer) => {
      c.buf = c.buf.length === 0 ? d : Buffer.concat([c.buf, d]);
      this.check(c);
    });
    const broken = (err: Error) => {
      this.all.delete(c);
      const i = this.idle.indexOf(c);
      if (i >= 0) this.idle.splice(i, 1);
      c.fail?.(err);
      c.done = null;
      c.fail = null;
    };
    c.socket.on('error', broken);
    c.socket.on('close', () => broken(new Error('connection closed')));
    this.all.add(c);
    return c;
  }

  private check(c: Conn): void {
    const he = c.buf.indexOf(HEADER_END);
    if (he < 0 || !c.done) return;
    const head = c.buf.subarray(0, he).toString('latin1');
    const status = Number(head.slice(9, 12));
    const m = /\r\ncontent-length: *(\d+)/i.exec(head);
    let complete: boolean;
    if (m) complete = c.buf.length >= he + 4 + Number(m[1]);
    else complete = c.buf.length >= he + 4 + 5 && c.buf.subarray(c.buf.length - 5).equals(CHUNKED_END);
    if (!complete) return;
    const done = c.done;
    c.buf = Buffer.alloc(0);
    c.done = null;
    c.fail = null;
    c.busy = false;
    done(status);
    const next = this.waiting.shift();
    if (next) next(c);
    else this.idle.push(c);
  }

  private acquire(): Promise<Conn> {
    const c = this.idle.pop();
    if (c) return Promise.resolve(c);
    if (this.all.size < this.maxConnections) return Promise.resolve(this.open());
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  /** Sends the request bytes; resolves with the status once the whole answer is in. */
  async send(request: Buffer): Promise<number> {
    const c = await this.acquire();
    c.busy = true;
    return new Promise<number>((resolve, reject) => {
      c.done = resolve;
      c.fail = reject;
      c.socket.write(request);
    });
  }

  close(): void {
    for (const c of this.all) c.socket.destroy();
    this.all.clear();
    this.idle.length = 0;
  }
}
