/**
 * A strict fake engine for disaggregated serving, written from the engines' documented protocols only (vLLM's
 * NixlConnector proxy flow and nixl_connector_usage; SGLang's PD disaggregation docs and its load balancer), apart from
 * kvroute's mock engine. It accepts a leg only if it is exactly what the protocol says and answers 400 naming the rule
 * otherwise; every violation is also recorded. Test-only: it computes nothing, it checks.
 */
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { isDeepStrictEqual } from 'node:util';

export interface CheckerWorld {
  /** The body the client sends next (the legs are checked against it). */
  client: Record<string, unknown> | null;
  readonly violations: string[];
  /** vLLM: kv_transfer_params text answered per X-Request-Id. */
  readonly answered: Map<string, string>;
  /** SGLang: rooms whose decode leg arrived. */
  readonly decodeRooms: Map<string, () => void>;
  readonly seen: { prefill: number; decode: number };
}

export function checkerWorld(): CheckerWorld {
  return { client: null, violations: [], answered: new Map(), decodeRooms: new Map(), seen: { prefill: 0, decode: 0 } };
}

const VLLM_P_PARAMS = {
  do_remote_decode: true,
  do_remote_prefill: false,
  remote_engine_id: null,
  remote_block_ids: null,
  remote_host: null,
  remote_port: null,
};

/** The exact text of a top-level value, found by a tiny independent scanner (strings and nesting respected). */
function valueText(json: string, key: string): string | undefined {
  const needle = `"${key}"`;
  let depth = 0;
  for (let i = 0; i < json.length; i++) {
    const c = json[i];
    if (c === '"') {
      let j = i + 1;
      while (j < json.length && json[j] !== '"') j += json[j] === '\\' ? 2 : 1;
      if (depth === 1 && json.slice(i, j + 1) === needle) {
        let k = j + 1;
        while (/\s|:/.test(json[k])) k++;
        let d = 0;
        let e = k;
        for (; e < json.length; e++) {
          const x = json[e];
          if (x === '"') {
            e++;
            while (e < json.length && json[e] !== '"') e += json[e] === '\\' ? 2 : 1;
            continue;
          }
          if (x === '{' || x === '[') d++;
          else if (x === '}' || x === ']') {
            if (d === 0) break;
            d--;
            if (d === 0) {
              e++;
              break;
            }
          } else if (x === ',' && d === 0) break;
        }
        return json.slice(k, e).trim();
      }
      i = j;
      continue;
    }
    if (c === '{' || c === '[') depth++;
    else if (c === '}' || c === ']') depth--;
  }
  return undefined;
}

function answer(stream: boolean, chat: boolean, cached: number, promptTokens: number, extraJson = ''): { type: string; text: string } {
  const usage = {
    prompt_tokens: promptTokens,
    completion_tokens: 2,
    total_tokens: promptTokens + 2,
    prompt_tokens_details: { cached_tokens: cached },
  };
  if (!stream) {
    const choice = chat
      ? { index: 0, message: { role: 'assistant', content: 'ok ok' }, finish_reason: 'length' }
      : { index: 0, text: 'ok ok', finish_reason: 'length' };
    const body = JSON.stringify({
      id: 'chk',
      object: chat ? 'chat.completion' : 'text_completion',
      created: 1,
      model: 'm',
      choices: [choice],
      usage,
    });
    return { type: 'application/json', text: extraJson ? `${body.slice(0, -1)},"kv_transfer_params":${extraJson}}` : body };
  }
  const obj = chat ? 'chat.completion.chunk' : 'text_completion';
  const tok = (t: string) =>
    `data: ${JSON.stringify({ id: 'chk', object: obj, created: 1, model: 'm', choices: [chat ? { index: 0, delta: { content: t }, finish_reason: null } : { index: 0, text: t, finish_reason: null }] })}\n\n`;
  return {
    type: 'text/event-stream',
    text: `${tok('ok')}${tok(' ok')}data: ${JSON.stringify({ id: 'chk', object: obj, created: 1, model: 'm', choices: [], usage })}\n\ndata: [DONE]\n\n`,
  };
}

export interface CheckerEngine {
  readonly url: string;
  readonly bootstrapPort: number;
  close(): Promise<void>;
}

/**
 * One fake engine. `cached` is the prefix hit a prefill reports; the decode side reports `decodeCached` (what a real
 * decode engine counts for the KV it received).
 */
export async function startChecker(
  world: CheckerWorld,
  o: { flavor: 'vllm' | 'sglang'; role: 'prefill' | 'decode'; cached?: number; decodeCached?: number; bootstrapPort?: number },
): Promise<CheckerEngine> {
  const bootstrapPort = o.bootstrapPort ?? 8998;
  const fail = (rule: string) => {
    world.violations.push(`${o.flavor} ${o.role}: ${rule}`);
    return rule;
  };
  const handle = async (req: IncomingMessage, raw: string): Promise<{ status: number; type: string; text: string }> => {
    const chat = req.url === '/v1/chat/completions';
    if (req.method !== 'POST' || (!chat && req.url !== '/v1/completions')) return { status: 404, type: 'text/plain', text: 'no route' };
    const body = JSON.parse(raw) as Record<string, unknown>;
    const client = world.client;
    if (!client) return { status: 400, type: 'text/plain', text: fail('no client request expected') };
    const promptTokens = 100;
    if (o.flavor === 'vllm') {
      const id = req.headers['x-request-id'];
      if (typeof id !== 'string' || id === '') return { status: 400, type: 'text/plain', text: fail('X-Request-Id missing') };
      if (o.role === 'prefill') {
        world.seen.prefill++;
        if (!isDeepStrictEqual(body.kv_transfer_params, VLLM_P_PARAMS))
          return { status: 400, type: 'text/plain', text: fail('prefill kv_transfer_params are not the P request') };
        if (body.stream !== false) return { status: 400, type: 'text/plain', text: fail('prefill must not stream') };
        if (body.max_tokens !== 1) return { status: 400, type: 'text/plain', text: fail('prefill max_tokens must be 1') };
        if ('max_completion_tokens' in client && body.max_completion_tokens !== 1)
          return { status: 400, type: 'text/plain', text: fail('prefill max_completion_tokens must be 1') };
        for (const k of ['stream_options', 'min_tokens', 'min_completion_tokens']) {
          if (k in body) return { status: 400, type: 'text/plain', text: fail(`prefill must not carry ${k}`) };
        }
        const { kv_transfer_params: _k, stream: _s, max_tokens: _m, max_completion_tokens: _mc, ...rest } = body;
        const {
          stream: _cs,
          max_tokens: _cm,
          max_completion_tokens: _cmc,
          stream_options: _so,
          min_tokens: _mt,
          min_completion_tokens: _mct,
          ...clientRest
        } = client;
        if (!isDeepStrictEqual(rest, clientRest))
          return { status: 400, type: 'text/plain', text: fail('prefill body is not the client body') };
        // Opaque params with forms a re-serialising proxy would change (a float's trailing zero, a u64, spacing).
        const params = `{ "do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [[3, 4, 5]], "remote_engine_id": "chk-p", "remote_request_id": ${JSON.stringify(id)}, "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1, "future": {"ratio": 1.50, "epoch": 18446744073709551615} }`;
        world.answered.set(id, params);
        const a = answer(false, chat, o.cached ?? 0, promptTokens, params);
        return { status: 200, ...a };
      }
      world.seen.decode++;
      const sent = world.answered.get(id);
      if (sent === undefined) return { status: 400, type: 'text/plain', text: fail('decode X-Request-Id matches no prefill leg') };
      if (valueText(raw, 'kv_transfer_params') !== sent)
        return { status: 400, type: 'text/plain', text: fail('decode kv_transfer_params are not the prefill answer’s, verbatim') };
      const { kv_transfer_params: _k, ...rest } = body;
      if (!isDeepStrictEqual(rest, client))
        return { status: 400, type: 'text/plain', text: fail('decode body is not the client’s original body') };
      return { status: 200, ...answer(body.stream === true, chat, o.decodeCached ?? promptTokens - 1, promptTokens) };
    }
    // SGLang
    const room = valueText(raw, 'bootstrap_room');
    if (room === undefined || !/^\d+$/.test(room) || BigInt(room) >= 1n << 63n)
      return { status: 400, type: 'text/plain', text: fail('bootstrap_room must be an integer in [0, 2^63)') };
    if (body.bootstrap_host !== '127.0.0.1')
      return { status: 400, type: 'text/plain', text: fail('bootstrap_host is not the prefill host') };
    if (typeof body.bootstrap_port !== 'number') return { status: 400, type: 'text/plain', text: fail('bootstrap_port missing') };
    const { bootstrap_host: _h, bootstrap_port: _p, bootstrap_room: _r, stream_options: so, ...rest } = body;
    const { stream_options: cso, ...clientRest } = client;
    if (!isDeepStrictEqual(rest, clientRest))
      return { status: 400, type: 'text/plain', text: fail('body is not the client body plus the bootstrap fields') };
    if (
      so !== undefined &&
      !isDeepStrictEqual(so, cso) &&
      !(body.stream === true && (so as { include_usage?: unknown }).include_usage === true)
    ) {
      return { status: 400, type: 'text/plain', text: fail('stream_options changed') };
    }
    if (o.role === 'decode') {
      world.seen.decode++;
      world.decodeRooms.get(room)?.();
      world.decodeRooms.set(room, () => {});
      return { status: 200, ...answer(body.stream === true, chat, o.decodeCached ?? promptTokens - 1, promptTokens) };
    }
    world.seen.prefill++;
    if (body.bootstrap_port !== bootstrapPort)
      return { status: 400, type: 'text/plain', text: fail('bootstrap_port is not this prefill’s') };
    // The prefill's bootstrap waits for its room's decode side: legs sent one after the other would never meet.
    const met = world.decodeRooms.has(room)
      ? true
      : await new Promise<boolean>((resolve) => {
          const t = setTimeout(() => resolve(false), 3000);
          world.decodeRooms.set(room, () => {
            clearTimeout(t);
            resolve(true);
          });
        });
    if (!met) return { status: 500, type: 'text/plain', text: fail('no decode leg for the room: the legs were not sent concurrently') };
    return { status: 200, ...answer(body.stream === true, chat, o.cached ?? 0, promptTokens) };
  };
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const raw = Buffer.concat(chunks).toString('utf8');
      if (req.method === 'GET') {
        res.writeHead(req.url === '/health' ? 200 : 404).end();
        return;
      }
      handle(req, raw)
        .catch((err: Error) => ({ status: 400, type: 'text/plain', text: fail(`not JSON: ${err.message}`) }))
        .then((r) => {
          res.writeHead(r.status, { 'content-type': r.type });
          res.end(r.text);
        });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    bootstrapPort,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
